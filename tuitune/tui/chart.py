"""Chart: tok/s per run, or phase times over time (plotext, rendered to text).

The runs chart's axis does not start at zero (bars of rates that differ by 3 % would look equal):
it starts under the smallest run and the title says from where. The phase chart marks each phase
with a letter of its own and puts its legend under the plot, off the lines."""

from __future__ import annotations

import math

from rich.text import Text
from textual.widgets import Static

from tuitune.measure.metrics import MetricsStore
from tuitune.measure.runs import RunBook

MODES = ("runs", "phases", "goodput")


def render(mode: str, store: MetricsStore, book: RunBook, width: int, height: int) -> str:
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(max(20, width), max(6, height))
    plt.theme("clear")
    if mode == "runs":
        runs = [r for r in book.runs if math.isfinite(r.median)]
        if not runs:
            return "no benchmark runs yet: press b"
        labels = [f"#{r.id}" + ("*" if r.id == book.baseline_id else "") for r in runs]
        meds = [r.median for r in runs]
        lo = bar_floor(meds)
        # bars from zero make 97.6 and 94.4 look alike: from just under the smallest, said in the title
        plt.bar(labels, meds, minimum=lo)
        plt.ylim(lo, max(meds) + (max(meds) - lo) * 0.05)
        plt.title(f"median tok/s per run (* base) · axis from {lo:g}")
    elif mode == "goodput":
        curves = [r for r in book.runs if len(r.levels) > 1]
        if not curves:
            return "no run over several concurrency levels yet: press B"
        xs = sorted({lv["concurrency"] for r in curves for lv in r.levels})
        if max(xs) >= 8 * min(xs):
            plt.xscale("log")
        for r in curves:
            pts = [(lv["concurrency"], lv["goodput"]) for lv in r.levels if lv.get("goodput") is not None]
            plt.plot([x for x, _ in pts], [y for _, y in pts], label=f"#{r.id} {r.label}"[:30], marker="dot")
        plt.title("goodput (tok/s, all streams) against concurrency")
        plt.xlabel("concurrent requests")
    else:
        series = [(name, store[name].values()) for name in ("verify_ms", "cycle_ms", "draft_ms", "extend_ms")]
        if not any(v for _, v in series):
            return "no profile windows yet"
        # the legend goes under the plot (plotext's own sits on the lines), each phase with a
        # marker of its own (told apart without colour)
        plt.plotsize(max(20, width), max(5, height - 1))
        shown = [(name, vals) for name, vals in series if vals]
        for name, vals in shown:
            plt.plot(list(range(len(vals))), vals, marker=PHASE_MARKERS[name])
        plt.title("phase times per profile window (ms)")
        return plt.build().rstrip("\n") + "\n" + legend([name for name, _ in shown])
    return plt.build()


PHASE_MARKERS = {"verify_ms": "v", "cycle_ms": "c", "draft_ms": "d", "extend_ms": "e"}


def legend(names: list[str]) -> str:
    """The phase chart's legend, one line under the plot."""
    return "   ".join(f"{PHASE_MARKERS[n]} {n.removesuffix('_ms')}" for n in names) + "   (ms)"


def bar_floor(values: list[float]) -> float:
    """Where the runs chart's axis starts: under the smallest value by half the spread (at least
    5 % of it), rounded down to a round number; 0 when that would be below 0."""
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * 0.5, abs(lo) * 0.05, 1e-9)
    floor = lo - pad
    if floor <= 0:
        return 0.0
    step = 10 ** math.floor(math.log10(pad))
    return math.floor(floor / step) * step


class ChartPanel(Static):
    DEFAULT_CSS = "ChartPanel { border: round $primary; height: 1fr; }"

    def __init__(self, **kw):
        super().__init__("", **kw)
        self.mode = "runs"

    def on_mount(self) -> None:
        self.border_title = "chart (c switches)"

    def toggle(self) -> None:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]

    def draw(self, store: MetricsStore, book: RunBook) -> None:
        w, h = self.content_size.width, self.content_size.height
        if w < 10 or h < 4:
            return
        self.update(Text.from_ansi(render(self.mode, store, book, w, h)))
