"""Cycle panel: draft / verify / extend bars for the current window, and fixed-range sparklines."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from tuitune.measure.guard import AcceptanceGuard
from tuitune.measure.metrics import MetricsStore

BAR_WIDTH = 36  # at most; narrower terminals get shorter bars, never wrapped ones
BAR_TEXT = 7 + 21  # the name before a bar, the figures after it
WAITING = "waiting for the first profile window…"
BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float, hi: float, width: int) -> str:
    """One character per value (the last ``width``), scaled to the fixed range [lo, hi]."""
    span = hi - lo if hi > lo else 1.0
    out = []
    for v in values[-width:]:
        frac = min(1.0, max(0.0, (v - lo) / span))
        out.append(BLOCKS[min(len(BLOCKS) - 1, int(frac * len(BLOCKS)))])
    return "".join(out)


SPARKS = (("accept_len", "accept len", "{:.2f}"), ("tok_s", "tok/s", "{:.1f}"), ("verify_ms", "verify ms", "{:.2f}"))


def phase_bars(draft: float, verify: float, extend: float, cycle: float, width: int = BAR_WIDTH) -> Text:
    t = Text()
    for name, value, style in (("draft", draft, "cyan"), ("verify", verify, "magenta"), ("extend", extend, "yellow")):
        share = value / cycle if cycle > 0 else 0.0
        cells = share * width
        full = int(cells)
        bar = "█" * full + (" ▏▎▍▌▋▊▉"[int((cells - full) * 8)] if full < width else "")
        t.append(f"{name:<7}", style="bold")
        t.append(f"{bar:<{width + 1}}", style=style)
        t.append(f"{value:8.2f} ms {share:6.1%}\n")
    return t


def position_row(rates: tuple[float, ...]) -> Text:
    """Acceptance at each draft position (vLLM reports it), one bar cell a position."""
    t = Text("accept by position ", style="bold")
    for i, r in enumerate(rates, 1):
        t.append(f" {i} ")
        t.append(BLOCKS[min(len(BLOCKS) - 1, int(max(0.0, min(1.0, r)) * len(BLOCKS)))], style="green")
        t.append(f" {r:.2f}")
    return t


def batch_distribution(hist: tuple[tuple[int, int], ...] | None, width: int = 24) -> str:
    """A profile window's batch sizes ((batch size, cycles) pairs) as labelled bars."""
    counts = list(hist or ())
    total = sum(n for _, n in counts)
    if not total:
        return ""
    counts.sort(key=lambda c: -c[1])
    shown = counts[:4]  # the common sizes; a long tail would not fit one line
    parts = [f"{bs}: {'█' * max(1, round(n / total * width / len(shown)))} {n / total:.0%}" for bs, n in shown]
    rest = total - sum(n for _, n in shown)
    return "   ".join(parts) + (f"   other {rest / total:.0%}" if rest else "")


def guard_line(text: Text, guard: AcceptanceGuard | None) -> None:
    """The acceptance guard's alarms (and what it set aside), when it has any: a quiet guard takes no line."""
    if guard is None:
        return
    if guard.active:  # a few words each, on one line (the whole sentences were said as warnings)
        text.append("\nACCEPTANCE ", style="bold red")
        text.append(" · ".join(a.short or a.kind for a in guard.active.values()), style="bold red")
    elif guard.notes:
        text.append(f"\nguard: {guard.notes[-1]}", style="dim")


class CyclePanel(Vertical):
    DEFAULT_CSS = """
    CyclePanel { height: auto; border: round $primary; padding: 0 1; }
    CyclePanel #bars { height: auto; }
    CyclePanel .spark-row { height: 1; }
    CyclePanel .spark-label { width: 12; }
    CyclePanel .spark { width: 1fr; color: $accent; }
    CyclePanel .spark-range { width: 26; text-align: right; color: $text-muted; }
    """

    hint = ""  # the first-run hint, shown until the first profile window arrives

    def __init__(self, redraw: Callable[[], None], *, id: str | None = None) -> None:
        """``redraw()``: has the app draw the panel again at its next refresh (the data is the app's)."""
        super().__init__(id=id)
        self.redraw = redraw

    def compose(self) -> ComposeResult:
        yield Static(self._waiting(), id="bars")
        for key, label, _ in SPARKS:
            with Horizontal(classes="spark-row"):
                yield Static(label, classes="spark-label")
                yield Static("", id=f"spark-{key}", classes="spark")
                yield Static("", id=f"range-{key}", classes="spark-range")

    def on_mount(self) -> None:
        self.border_title = "cycle"

    def on_resize(self) -> None:
        self.redraw()  # bar widths follow the panel's width

    def _waiting(self) -> Text:
        t = Text(WAITING)
        if self.hint:
            t.append(f"  {self.hint}", style="bold")
        return t

    def refresh_from(  # noqa: C901
        self, store: MetricsStore, speculative: bool, engine: str = "SGLang", guard: AcceptanceGuard | None = None
    ) -> None:
        found = self.query("#bars")
        if not found:  # not composed yet (a launch that is ready before the panel is): the next tick draws it
            self.redraw()
            return
        bars = found.first(Static)
        p = store.last_profile
        d = store.last_decode
        per_pos = store.last_per_position
        room = bars.size.width or (self.size.width - 4 if self.size.width > 4 else 100)
        if p is not None:
            text = phase_bars(p.draft_ms, p.verify_ms, p.extend_ms, p.cycle_ms, max(8, min(BAR_WIDTH, room - BAR_TEXT)))
            summary = f"cycle {p.cycle_ms:.2f} ms · accept len {p.accept_len:.2f} · "
            text.append(summary, style="bold")
            text.append(f"{p.tok_s:.1f} tok/s", style="bold green")
            used = len(summary) + len(f"{p.tok_s:.1f} tok/s")
            # the most telling extras first; what does not fit on the line is left out
            extra: list[str] = []
            for item in (
                ([f"steps {p.steps} topk {p.topk}"] if p.steps is not None else [])
                + ([f"bs {p.bs}"] if p.bs else [])
                + [f"{p.cycles} cycles"]
                + ([f"{p.drafter} drafter"] if p.drafter else [])
                + (["host clock (CPU engine)"] if p.sync == "cpu" else [])
            ):
                if used + len(", ".join([*extra, item])) + 3 <= room:
                    extra.append(item)
            if extra:
                text.append(f" ({', '.join(extra)})", style="dim")
            if per_pos:
                text.append("\n")
                text.append(position_row(per_pos))
            dist = batch_distribution(p.batch_sizes)
            if dist:
                text.append("\nbatch sizes ", style="bold")
                text.append(dist)
            second = [f for f in store.sources.figures() if f.compared]
            if second:  # SGLang's own counters beside the probe's (tuitune.measure.sources)
                text.append("\nserver's own ", style="bold")
                for i, f in enumerate(second):
                    rel = f"{f.ratio - 1:+.0%}" if f.ratio is not None else "?"
                    text.append(
                        ("  " if i else "") + f"{f.name} {f.server:.3g} (probe {rel})",
                        style="bold red" if f.disagrees else "",
                    )
                if any(f.disagrees for f in second):
                    text.append("  DISAGREE (>10 %)", style="bold red")
            guard_line(text, guard)
            bars.update(text)
            self.border_title = "cycle (EAGLE3_PROFILE)"
        elif d is not None:
            t = Text()
            t.append(f"decode {d.gen_throughput:.1f} tok/s", style="bold green")
            accept = d.accept_len
            if accept is None and speculative and store["decode_accept_len"].values():
                accept = store["decode_accept_len"].values()[-1]  # vLLM: from its SpecDecoding lines
            if accept is not None:
                t.append(f"   accept len {accept:.2f}")
                if d.accept_rate is not None:
                    t.append(f"   accept rate {d.accept_rate:.2f}")
                if per_pos:
                    t.append("\n")
                    t.append(position_row(per_pos))
                t.append(
                    "\nno EAGLE3_PROFILE lines: set `profile: true` in the preset (the probe) for "
                    "draft / verify / extend times",
                    style="dim",
                )
            else:
                t.append("\nbaseline server (no speculation): decode throughput only", style="dim")
            guard_line(t, guard)
            bars.update(t)
            self.border_title = f"cycle ({engine} decode lines)"
        else:
            bars.update(self._waiting())
        for key, _, fmt in SPARKS:
            series = (
                store[key]
                if p is not None or key not in ("accept_len", "tok_s")
                else store["decode_accept_len" if key == "accept_len" else "gen_throughput"]
            )
            values = series.values()
            spark = self.query_one(f"#spark-{key}", Static)
            lo, hi = series.display_range()
            spark.update(sparkline(values, lo, hi, max(8, spark.size.width or 60)))
            rng = self.query_one(f"#range-{key}", Static)
            if values:
                rng.update(f"{fmt.format(values[-1])}  [{fmt.format(lo)} … {fmt.format(hi)}]")
            else:
                rng.update("—")
