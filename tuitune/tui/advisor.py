"""Advisor panel: what the fitted cost model predicts for the running configuration's neighbours
(steps ±1, other topk, speculation off) at the current load, with intervals; refitted as profile
windows arrive (at most every ``REFIT_S``). ``apply_to_config`` puts the top suggestion into the
config panel's fields, from where `r` relaunches it like any edit.

Marks: ``▶`` a configuration predicted faster than the running one (``●``); when its prediction
lies inside the running configuration's 95 % interval it is marked ``≈`` and the panel says
"within the interval: not a sure gain". A configuration predicted slower never gets ``▶``: when
the running one is predicted best, ``▷`` marks the measurement worth making next
(``advise.suggestion``).
"""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.widgets import Input, Select, Static

from tuitune import engines
from tuitune.base.events import Event, Marker, ProfileWindow, ServerState
from tuitune.decide.advise import Suggestion, neighbours, suggestion
from tuitune.decide.costmodel import fit
from tuitune.decide.launch import Config, FitError, Launch, config_of_window

REFIT_S = 2.0
KEEP = 400  # windows of the current launch used for the fit (the newest)


class AdvisorPanel(Static):
    DEFAULT_CSS = """
    AdvisorPanel { height: 1fr; padding: 0 1; }
    """

    def __init__(self, clock=time.monotonic, **kw):
        super().__init__("waiting for profile windows (format v2, with accept_hist) …", **kw)
        self.clock = clock
        self.windows: deque[ProfileWindow] = deque(maxlen=KEEP)
        self.load: int | None = None  # requests the operator keeps running; None = read from the windows
        self.rows: list = []  # predictions shown, best first
        self.running: Config | None = None
        self.engine: engines.Engine = engines.get("sglang")  # the loaded preset's (app sets it)
        self.topks: tuple[int, ...] | None = None  # the tree widths searched (None: the engine's)
        self.concurrency = 1
        self.note = ""
        self._dirty = False
        self._last_fit = -1e9

    def feed(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, ProfileWindow):
                self.windows.append(ev)
                self._dirty = True
            elif (isinstance(ev, Marker) and ev.text.startswith("relaunch:")) or (
                isinstance(ev, ServerState) and ev.state == "starting" and ev.phase == "launching"
            ):
                self.windows.clear()  # a new launch: the old windows describe another server
                self._dirty = True

    def refresh_model(self, load: int | None = None, force: bool = False) -> None:
        """Refit when new windows arrived (throttled), and redraw."""
        self.load = load
        now = self.clock()
        if not (self._dirty and (force or now - self._last_fit >= REFIT_S)):
            return
        self._dirty = False
        self._last_fit = now
        wins = [w for w in self.windows if w.steps is not None]
        if not wins:
            self.rows, self.running = [], None
            self.update("waiting for profile windows (format v2, with accept_hist) …")
            return
        last = wins[-1]
        running = config_of_window(last)
        assert running is not None  # a window with steps has a configuration
        self.running = running
        bss = sorted(w.bs or 1 for w in wins[-20:])
        self.concurrency = load or bss[len(bss) // 2]
        try:
            model = fit([Launch(running, wins)])
        except FitError as e:
            self.rows = []
            self.update(f"no model yet: {e}")
            return
        preds = [model.predict(c, self.concurrency) for c in neighbours(running, self.topks or self.engine.topks)]
        self.rows = sorted(preds, key=lambda p: -p.goodput.mean)
        self.note = f"baseline from the {model.baseline_source}"
        self.update(self.render_rows())

    def suggestion(self) -> Suggestion:
        """What the panel puts forward: a faster configuration (sure or within the interval), or
        the measurement worth making next when the running one is predicted best."""
        return suggestion(self.rows, self.running) if self.rows else Suggestion("none")

    def top(self) -> Config | None:
        """The configuration the panel marks (``▶`` or ``▷``), None when there is none."""
        return self.suggestion().config

    def render_rows(self) -> Text:
        t = Text()
        t.append(f"predicted goodput at concurrency {self.concurrency} ", style="bold")
        t.append(f"({len(self.windows)} windows of this launch)\n", style="dim")
        run = next((p for p in self.rows if p.config == self.running), None)
        sug = self.suggestion()
        best = sug.config
        # what the marks mean, above the rows (a short terminal cuts the panel's bottom off)
        if sug.kind == "within":
            t.append(f"▶ {sug.gain:+.1%} is within the interval: not a sure gain (a asks first)\n", style="yellow")
        elif sug.kind == "measure":
            t.append("the running configuration is predicted best; ▷ worth measuring next (a asks)\n", style="yellow")
        elif best is None and run is not None:
            t.append("the running configuration is predicted best; nothing to try next\n", style="yellow")
        for p in self.rows:
            gain = p.goodput.mean / run.goodput.mean - 1 if run and run.goodput.mean > 0 else 0.0
            if p.config == best:
                mark = "▶ " if sug.faster else "▷ "
            else:
                mark = "● " if p.config == self.running else "  "
            style = (
                "bold green"
                if p.config == best and sug.kind == "gain"
                else ("bold" if p.config in (self.running, best) else "")
            )
            t.append(
                f"{mark}{self.engine.config_label(p.config):<30} {p.goodput.mean:>9.1f} tok/s  "
                f"[{max(0.0, p.goodput.lo):.0f}–{p.goodput.hi:.0f}] ",
                style=style,
            )
            t.append(f"{gain:+6.1%}" if p.config != self.running else "running", style=style or "dim")
            if p.config == best and sug.kind == "within":
                t.append(" ≈", style="yellow")  # as the runs table's ≈: no clear change
            elif p.config == best and sug.kind == "measure":
                t.append(" measure", style="dim")
            t.append("\n")
        if best is not None:
            label = self.engine.config_label(best)
            t.append(
                f"a: apply {label} to the config panel, then r relaunches   "
                if sug.kind == "gain"
                else f"a: asks, then puts {label} into the config panel   ",
                style="dim",
            )
        t.append(self.note, style="dim")
        return t


def apply_to_config(panel, c: Config) -> None:
    """Put configuration ``c`` into the config panel's speculative fields (its usual edit flow
    checks and reports them)."""
    algo = panel.query_one("#spec-algorithm", Select)
    if not c.speculative:
        algo.value = "none"
        return
    if algo.value == "none":
        base = panel.base
        algo.value = base.speculative.algorithm if base is not None and base.is_speculative else "EAGLE3"
    if algo.value == "NGRAM" and not getattr(panel, "_chain", False):
        # SGLang's NGRAM: the draft token budget is the setting; steps and topk are SGLang's to derive
        fields: tuple = (("#spec-num-steps", ""), ("#spec-eagle-topk", ""), ("#spec-num-draft-tokens", c.draft_tokens))
    else:
        fields = (
            ("#spec-num-steps", c.steps),
            ("#spec-eagle-topk", c.topk),
            ("#spec-num-draft-tokens", c.draft_tokens),
        )
    for wid, v in fields:
        panel.query_one(wid, Input).value = str(v)
