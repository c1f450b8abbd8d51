"""Chart: tok/s per run, or phase times over time (plotext, rendered to text)."""

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
        plt.bar(labels, [r.median for r in runs])
        plt.title("decode tok/s per run (median; * = baseline)")
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
        for name, vals in series:
            if vals:
                plt.plot(list(range(len(vals))), vals, label=name)
        plt.title("phase times per profile window (ms)")
    return plt.build()


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
