"""Runs table: one row per benchmark, Δ against the baseline with a significance mark."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import DataTable

from tuitune.measure.runs import RunBook, delta_mark


def legend(book: RunBook) -> str:
    """What the Δ marks mean (RunBook.delta: stats.compare of the requests), on the table's border."""
    return f"▲▼ p<0.05 and ratio CI beyond ±{book.min_effect:.0%} · ≈ not both · n/c not comparable"


COLUMNS = ("#", "conc", "tok/s", "95% CI", "Δ vs base", "accept", "cycle ms", "failed", "gpus", "config (vs baseline)")


def gpu_mark(note: str | None) -> str:
    """The telemetry warning of a run, short: ⚠ power cap / ⚠ straggler."""
    if not note:
        return ""
    words = [w for w in ("power", "thermal", "HW slowdown", "straggler") if w in note] or ["held back"]
    return "⚠ " + words[0] + (f" +{len(words) - 1}" if len(words) > 1 else "")  # the column stays narrow


class RunsTable(DataTable):
    # at least three rows once there are runs (border 2 + header 1 + 3), whatever the terminal height
    DEFAULT_CSS = """
    RunsTable { height: auto; max-height: 12; border: round $primary; scrollbar-size-horizontal: 0; }
    RunsTable.-has-runs { min-height: 6; }
    """
    BINDINGS = [Binding("j", "cursor_down", show=False), Binding("k", "cursor_up", show=False)]

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns(*COLUMNS)
        self.border_title = "runs (b bench, m mark baseline)"

    shown = 0  # rows drawn last time: a new run moves the selection to it (m then marks it)

    def show(self, book: RunBook, stale: str | None) -> None:
        keep = self.cursor_row if len(book.runs) <= self.shown else len(book.runs) - 1
        self.shown = len(book.runs)
        self.clear()
        for run in book.runs:
            base = run.id == book.baseline_id
            lo, hi = run.ci
            mark = delta_mark(book.delta(run))
            style = "green" if "▲" in mark else ("red" if "▼" in mark else "")
            summary = book.config_summary(run)
            self.add_row(
                Text(f"{run.id}{' ★' if base else ''}", style="bold" if base else ""),
                run.concurrency_text,
                f"{run.median:.1f}",
                f"{lo:.1f}–{hi:.1f}",
                Text(mark, style=style),
                f"{run.accept_len:.2f}" if run.accept_len else "—",
                f"{run.cycle_ms:.2f}" if run.cycle_ms else "—",
                str(run.failed) if run.failed else "",
                Text(gpu_mark(run.gpu_note), style="bold yellow"),
                Text(summary if len(summary) <= 48 else summary[:47] + "…"),
                key=str(run.id),
            )
        self.set_class(bool(book.runs), "-has-runs")
        if book.runs:
            self.move_cursor(row=min(max(keep, 0), len(book.runs) - 1))
        compared = len(book.runs) > 1 and book.baseline is not None
        self.border_subtitle = f"baseline STALE: {stale}" if stale else (legend(book) if compared else "")
        self.styles.border_subtitle_color = "red" if stale else None
