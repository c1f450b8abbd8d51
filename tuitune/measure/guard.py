"""The acceptance guard: acceptance that collapses or drifts while a server runs, said as it happens.

Fed the events the TUI sees (the probe's windows; where there is no probe, the engine's own figures:
SGLang's decode line, vLLM's SpecDecoding line), it compares recent acceptance with a baseline, a
capture of a run known to be good (``Baseline.from_capture``: `--against`), else the launch's own
first cycles, and raises an alarm in one sentence when
- the accept length falls more than ``drop`` (default 10 %) below the baseline's;
- a draft position's acceptance collapses (under half the baseline's share, where that was 10 % or more);
- the accept length falls with context length (where the engine logs context: SGLang's decode line);
- speculation goes off without a word: decoding goes on and no speculative cycle comes for
  ``off_after_s``, or the probe's windows say 0 steps (a schedule that chose no speculation).
A drop or a collapse must hold over two disjoint windows running (400 cycles each, or 6 of the
engine's lines): one window crosses a threshold by chance now and then over hours of checks, two
running do not. Each alarm is raised once, and cleared once the figure is back (above half the threshold's distance:
hysteresis, so that a figure at the edge does not flap). The guard never compares what is not
comparable: a baseline whose configuration (steps, topk, draft tokens, drafter) differs from the
server's is set aside with a note, and the launch's own first cycles are used instead.

Pure: no I/O, no clock of its own (the caller passes monotonic seconds); the stream (``EventStream``)
turns its alarms into markers that the TUI, `--record` and `tuitune watch` all see.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tuitune.base.events import DecodeStats, Event, Marker, ProfileWindow, VllmSpec

DROP = 0.10  # the default share below the baseline's accept length that raises the alarm
PREFIX = "acceptance guard: "  # the markers' text starts so (the TUI says them as warnings)
# how much a figure needs, by where it comes from: the probe's windows count cycles, the engine's
# lines count as lines (each sums many decode steps)
# (cycles of one request each: 400 of them put a 10 % drop about three standard errors out)
LEARN = {"probe": 500, "engine": 8}
RECENT = {"probe": 400, "engine": 6}
POSITION_FLOOR = 0.10  # a position the baseline accepted less often than this is not watched
COLLAPSE = 0.5  # a position's share under this fraction of the baseline's is a collapse
OFF_AFTER_S = 30.0
CONTEXT_SPAN = 2.0  # the long-context third's mean context must be this many times the short third's


@dataclass(frozen=True)
class Alarm:
    kind: str  # accept_drop, position, context, spec_off
    text: str  # one sentence
    raised: bool = True  # False: cleared
    short: str = ""  # a few words for a line of the TUI's cycle panel

    def marker(self) -> Marker:
        return Marker(PREFIX + ("" if self.raised else "cleared: ") + self.text)


@dataclass
class _Reading:
    t: float
    source: str  # probe, engine
    accept: float
    weight: float
    counts: tuple[int, ...] | None = None  # request-cycles by accepted length (the probe's v2 windows)
    shares: tuple[float, ...] | None = None  # acceptance by draft position (vLLM's own line)
    ctx: float | None = None  # mean context length of the running requests
    config: tuple | None = None  # (steps, topk, draft tokens, drafter) of a probe window


def pct(x: float) -> str:
    return f"{x * 100:.0f} %"


def _config(w: ProfileWindow) -> tuple | None:
    if w.steps is None and w.draft_tokens is None:
        return None
    return (w.steps, w.topk, w.draft_tokens, w.drafter)


def describe_config(c: tuple | None) -> str:
    if c is None:
        return "an unknown configuration"
    steps, topk, tokens, drafter = c
    what = f"{drafter} " if drafter else ""
    return f"{what}steps {steps} topk {topk} draft tokens {tokens}"


@dataclass
class Figures:
    """Acceptance over a run of readings."""

    accept: float
    weight: float
    source: str
    shares: tuple[float, ...] | None = None  # by draft position
    config: tuple | None = None  # the one configuration they share, None when mixed or unknown

    @staticmethod
    def of(readings: list[_Reading]) -> Figures | None:
        if not readings:
            return None
        w = sum(r.weight for r in readings)
        if w <= 0:
            return None
        accept = sum(r.accept * r.weight for r in readings) / w
        shares: tuple[float, ...] | None = None
        counts = [r.counts for r in readings if r.counts]
        if counts:
            n = max(len(c) for c in counts)
            total = [0] * n
            for c in counts:
                for i, x in enumerate(c):
                    total[i] += x
            all_ = sum(total)
            if all_ > 0 and n > 1:  # position k (1-based) accepted: a length of k + 1 or more
                shares = tuple(sum(total[k:]) / all_ for k in range(1, n))
        else:
            given = [(r.shares, r.weight) for r in readings if r.shares]
            if given:
                n = min(len(s) for s, _ in given)
                ws = sum(x for _, x in given)
                shares = tuple(sum(s[k] * x for s, x in given) / ws for k in range(n))
        configs = {r.config for r in readings}
        config = configs.pop() if len(configs) == 1 else None
        return Figures(accept, w, readings[0].source, shares, config)


@dataclass
class Baseline:
    """What acceptance should be: per source (the probe's, the engine's), from where it was read."""

    figures: dict[str, Figures]
    where: str  # "the first 300 cycles of this launch", "capture good.jsonl (4,210 cycles)"

    @staticmethod
    def from_events(events: list[Event], where: str) -> Baseline | None:
        g = AcceptanceGuard()
        for ev in events:
            g._read(ev, 0.0)
        figs = {src: f for src in ("probe", "engine") if (f := Figures.of([r for r in g._all if r.source == src]))}
        if not figs:
            return None
        return Baseline(figs, where)

    @staticmethod
    def from_capture(path: str) -> Baseline:
        """A capture's acceptance (raises CaptureError for a file that is not one, ValueError for
        one without acceptance)."""
        from pathlib import Path

        from tuitune.measure.capture import read_capture

        cap = read_capture(path)
        events = [r.event for r in cap.records]
        b = Baseline.from_events(events, "")
        if b is None:
            raise ValueError(f"{path} holds no acceptance figure (no profile window, no speculative decode line)")
        f = b.figures.get("probe") or b.figures["engine"]
        unit = "cycles" if f.source == "probe" else "log lines"
        b.where = f"capture {Path(path).name} ({f.weight:,.0f} {unit})"
        return b


@dataclass
class AcceptanceGuard:
    drop: float = DROP
    baseline: Baseline | None = None  # given (a capture); else learned from the launch's first cycles
    off_after_s: float = OFF_AFTER_S
    learn: dict = field(default_factory=lambda: dict(LEARN))
    recent: dict = field(default_factory=lambda: dict(RECENT))

    def __post_init__(self) -> None:
        self.given = self.baseline
        self.raised = 0  # alarms raised since the guard began (across launches)
        self.notes: list[str] = []  # what the guard set aside, said once
        self.reset()

    def reset(self) -> None:
        """A new launch: a learned baseline goes (a given one stays), and every alarm with it."""
        self.learned: Baseline | None = None
        self._all: deque[_Reading] = deque(maxlen=4000)
        self._learning: list[_Reading] = []
        self.active: dict[str, Alarm] = {}
        self.last_spec_t: float | None = None
        self.last_decode_t: float | None = None
        self._ctx: tuple[float, float] | None = None  # (t, mean context) of the last decode line
        self._mismatch_said = False
        self.source: str | None = None

    # ---- reading the events -----------------------------------------------------------------
    def _read(self, ev: Event, t: float) -> _Reading | None:
        r = None
        if isinstance(ev, ProfileWindow):
            ctx = self._ctx[1] if self._ctx is not None and t - self._ctx[0] <= 30.0 else None
            r = _Reading(t, "probe", ev.accept_len, float(ev.cycles), ev.accept_counts, None, ctx, _config(ev))
            if ev.steps == 0:
                r.weight = 0.0  # a window with speculation off says nothing of acceptance
        elif isinstance(ev, DecodeStats):
            if ev.running_req and ev.token:
                self._ctx = (t, ev.token / ev.running_req)
            if ev.gen_throughput and ev.gen_throughput > 0:
                self.last_decode_t = t
            if ev.accept_len is not None:
                ctx = ev.token / ev.running_req if ev.running_req and ev.token else None
                r = _Reading(t, "engine", ev.accept_len, 1.0, ctx=ctx)
        elif isinstance(ev, VllmSpec) and ev.mean_accept_len is not None:
            r = _Reading(t, "engine", ev.mean_accept_len, 1.0, shares=ev.per_position)
        if r is not None:
            self._all.append(r)
        return r

    # ---- the checks ---------------------------------------------------------------------------
    def feed(self, events: list[Event], t: float, quiet: bool = False) -> list[Marker]:
        """Read ``events`` (arrived at monotonic ``t``); the markers of alarms raised or cleared
        (none when ``quiet``: a log's history read to learn from, not to alarm on)."""
        fresh = False
        for ev in events:
            if isinstance(ev, Marker):
                continue
            r = self._read(ev, t)
            if r is None:
                continue
            fresh = True
            if r.weight > 0:  # a speculative cycle (a window of 0 steps is none)
                self.last_spec_t = t
            if r.source == "probe" and self.source != "probe":
                self.source = "probe"  # the probe's windows, once seen, are what the guard reads
                self._learning = [x for x in self._learning if x.source == "probe"]
            elif self.source is None:
                self.source = r.source
            if r.source == self.source and self.learned is None and r.weight > 0:
                self._learning.append(r)
                if sum(x.weight for x in self._learning) >= self.learn[self.source]:
                    unit = "cycles" if self.source == "probe" else "log lines"
                    figs = Figures.of(self._learning)
                    assert figs is not None
                    self.learned = Baseline(
                        {self.source: figs}, f"the first {figs.weight:,.0f} {unit} this guard saw of the launch"
                    )
        if quiet:  # learning only: the first live batch checks everything read so far
            return []
        alarms = self._check(t) if fresh or self.last_decode_t == t else []
        return [a.marker() for a in alarms]

    def current_baseline(self) -> tuple[Baseline, Figures] | None:
        """The baseline in use and its figures for the source read now."""
        if self.source is None:
            return None
        for b in (self.given, self.learned):
            if b is None or self.source not in b.figures:
                continue
            f = b.figures[self.source]
            if b is self.given and not self._comparable(f):
                continue
            return b, f
        return None

    def _comparable(self, f: Figures) -> bool:
        now = self.recent_figures()
        if f.config is None or now is None or now.config is None or f.config == now.config:
            return True
        if not self._mismatch_said:
            self._mismatch_said = True
            self.notes.append(
                f"the baseline ran {describe_config(f.config)}, this server {describe_config(now.config)}: "
                "their accept lengths are not comparable, so the launch's own first cycles are the baseline"
            )
        return False

    def recent_figures(self, skip: int = 0) -> Figures | None:
        """The figures of the newest readings of the source read now that make a window (``recent``);
        ``skip``: of the window before that many windows."""
        if self.source is None:
            return None
        need = self.recent[self.source]
        windows: list[list[_Reading]] = [[]]
        w = 0.0
        for r in reversed(self._all):
            if r.source != self.source:
                continue
            windows[-1].append(r)
            w += r.weight
            if w >= need:
                if len(windows) > skip:
                    return Figures.of(windows[-1][::-1])
                windows.append([])
                w = 0.0
        return None

    def _check(self, t: float) -> list[Alarm]:
        out: list[Alarm] = []
        now = self.recent_figures()
        base = self.current_baseline()
        # speculation off: the windows say 0 steps, or decoding goes on without a speculative cycle
        off = None
        last = self._all[-1] if self._all else None
        if last is not None and last.source == "probe" and last.config is not None and last.config[0] == 0:
            zero = [r for r in list(self._all)[-8:] if r.source == "probe"]
            if zero and all(r.config is not None and r.config[0] == 0 for r in zero):
                off = "the probe's windows say 0 steps: the engine's schedule turned speculation off"
        if (
            off is None
            and self.last_spec_t is not None
            and self.last_decode_t is not None
            and self.last_decode_t - self.last_spec_t >= self.off_after_s
        ):
            off = (
                f"decoding went on for {self.last_decode_t - self.last_spec_t:.0f} s without a speculative cycle: "
                "speculation looks off"
            )
        self._set(
            out,
            "spec_off",
            off,
            cleared=off is None and (self.last_decode_t or 0) <= (self.last_spec_t or 0),
            clear_text="speculative cycles are back",
            short="speculation off",
        )
        if now is None or base is None:
            return out
        b, bf = base
        # a window and the one before it, both: the drop has held over two disjoint windows (noise
        # crosses the threshold in one now and then, over hours of checks; twice running it does not)
        prev = self.recent_figures(skip=1)
        # the accept length against the baseline's
        limit = bf.accept * (1 - self.drop)
        below = (bf.accept - now.accept) / bf.accept if bf.accept > 0 else 0.0
        unit = "cycles" if now.source == "probe" else "log lines"
        text = (
            f"accept length {now.accept:.2f} over the last {now.weight:,.0f} {unit} is {pct(below)} below "
            f"the baseline's {bf.accept:.2f} ({b.where})"
        )
        back = f"accept length {now.accept:.2f} is back within {pct(self.drop / 2)} of the baseline's {bf.accept:.2f}"
        self._set(
            out,
            "accept_drop",
            text if now.accept < limit and prev is not None and prev.accept < limit else None,
            cleared=now.accept >= bf.accept * (1 - self.drop / 2),
            clear_text=back,
            short=f"accept length {now.accept:.2f}, {pct(below)} under {bf.accept:.2f}",
        )
        # a draft position's acceptance collapsing
        pos = short = None
        if now.shares and bf.shares and prev is not None and prev.shares:
            for k, (a, a0, b0) in enumerate(zip(now.shares, prev.shares, bf.shares, strict=False), 1):
                # a position the baseline accepted often enough that half of it is no noise: on
                # cycles, 40 expected in a window (a collapse to half of it: 4 standard errors)
                enough = b0 >= POSITION_FLOOR and (now.source != "probe" or b0 * now.weight >= 40)
                if enough and a < b0 * COLLAPSE and a0 < b0 * COLLAPSE:
                    pos = f"draft position {k} is accepted {pct(a)} of the time, against {pct(b0)} at the baseline ({b.where})"
                    short = f"position {k} {pct(a)} (was {pct(b0)})"
                    break
        self._set(
            out,
            "position",
            pos,
            cleared=pos is None,
            clear_text="every draft position accepts at least half as often as at the baseline again",
            short=short or "",
        )
        # acceptance falling with context length
        ctx = self._context()
        self._set(
            out,
            "context",
            ctx,
            cleared=ctx is None,
            clear_text="accept length no longer falls with context",
            short="falls with context",
        )
        return out

    def _context(self) -> str | None:
        if self.source is None:
            return None
        rs = [r for r in self._all if r.source == self.source and r.ctx is not None and r.weight > 0][-400:]
        need = self.recent[self.source]
        if sum(r.weight for r in rs) < 3 * need:
            return None
        rs.sort(key=lambda r: r.ctx or 0.0)
        third = len(rs) // 3
        short, long_ = rs[:third], rs[-third:]
        if sum(r.weight for r in short) < need / 2 or sum(r.weight for r in long_) < need / 2:
            return None
        fs, fl = Figures.of(short), Figures.of(long_)
        if fs is None or fl is None:
            return None
        cs = sum((r.ctx or 0) * r.weight for r in short) / fs.weight
        cl = sum((r.ctx or 0) * r.weight for r in long_) / fl.weight
        if cl < CONTEXT_SPAN * cs or fl.accept >= fs.accept * (1 - self.drop):
            return None
        return (
            f"accept length falls with context: {fs.accept:.2f} at about {cs:,.0f} tokens, "
            f"{fl.accept:.2f} at about {cl:,.0f}"
        )

    def _set(
        self,
        out: list[Alarm],
        kind: str,
        text: str | None,
        cleared: bool,
        clear_text: str | None = None,
        short: str = "",
    ) -> None:
        if text is not None and kind not in self.active:
            a = Alarm(kind, text, short=short)
            self.active[kind] = a
            self.raised += 1
            out.append(a)
        elif text is None and kind in self.active and cleared:
            a = self.active.pop(kind)
            out.append(Alarm(kind, clear_text or a.text, raised=False))

    # ---- what to show -------------------------------------------------------------------------
    @property
    def status(self) -> str:
        """One line: learning, ok (with the figures), or the alarms."""
        if self.active:
            return "ALARM: " + "; ".join(a.text for a in self.active.values())
        base = self.current_baseline()
        now = self.recent_figures()
        if base is None:
            if self.source is None:
                return "waiting for acceptance figures"
            have = sum(r.weight for r in self._learning)
            unit = "cycles" if self.source == "probe" else "log lines"
            return f"learning the baseline ({have:,.0f} of {self.learn[self.source]} {unit})"
        b, bf = base
        if now is None:
            return f"baseline {bf.accept:.2f} ({b.where}); waiting for recent figures"
        return (
            f"ok: accept length {now.accept:.2f} against {bf.accept:.2f} ({(now.accept / bf.accept - 1) * 100:+.0f} %)"
        )
