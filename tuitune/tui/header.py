"""Status line: target, preset (modified?), server state, link state, load."""

from __future__ import annotations

import time

from rich.text import Text
from textual.widgets import Static

STATE_STYLE = {
    "ready": "bold green",
    "starting": "bold yellow",
    "stopping": "yellow",
    "failed": "bold red",
    "exited": "bold red",
    "stopped": "dim",
    "replay": "bold cyan",
}


CAUSE_MAX = 70  # of the header line; the whole message is in the notification and the log
NARROW = 100  # columns below which the header leaves out what is usual


def _dur(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class StatusHeader(Static):
    DEFAULT_CSS = "StatusHeader { height: 1; background: $boost; padding: 0 1; }"

    @staticmethod
    def _state(t: Text, state, started: float | None, now: float, held: str | None) -> None:
        """The server's state: its phase while starting, pid, uptime and a live hold when ready, the
        cause when it failed or exited."""
        st = state.state
        t.append(st, style=STATE_STYLE.get(st, ""))
        if st == "starting" and state.phase:
            t.append(f": {state.phase}")
            if state.elapsed_s is not None:
                t.append(f" {state.elapsed_s:.1f}s")
        elif st == "ready" and state.pid:
            t.append(f" · pid {state.pid}")
            if started:
                t.append(f" · up {_dur(now - started)}")
            if held:  # a step count held live in the launch (docs/switch.md)
                t.append(f" · held {held}", style="bold yellow")
        elif st in ("failed", "exited") and state.detail:
            cause = state.detail if len(state.detail) <= CAUSE_MAX else state.detail[: CAUSE_MAX - 1] + "…"
            t.append(f": {cause}", style="red")
        elif st == "replay" and state.phase == "end":
            t.append(" (end)")

    def show(  # noqa: PLR0913
        self,
        target: str,
        preset: str,
        modified: bool,
        state,
        link,
        load,
        started: float | None,
        now: float | None = None,
        bench: tuple[int, int, float | None] | None = None,
        engine: str | None = None,
        not_running: str | None = None,
        held: str | None = None,
    ) -> None:
        """``not_running``: the preset shown was loaded (`o`) but not launched; the value names the
        preset the server runs ("" when none or unknown), so the header does not pass it for the
        running one. ``held``: the step count held live in the launch ("K 4"), None when none."""
        now = time.time() if now is None else now
        # narrow (80 columns): what is usual goes (the name, a connected link) so that the load fits
        narrow = 0 < self.size.width < NARROW
        t = Text()
        if not narrow:
            t.append("tuitune ", style="bold")
        t.append(f"{target} ", style="cyan")
        t.append("│ ")
        t.append(preset, style="bold")
        if modified:
            t.append(" (modified)", style="bold magenta")
        if not_running is not None:
            t.append(" (loaded, not running", style="bold yellow")
            if not_running and not narrow:
                t.append(f"; server runs {not_running}", style="yellow")
            t.append(")", style="bold yellow")
        if engine:
            t.append(f" · {engine}", style="cyan")
        t.append(" │ ")
        self._state(t, state, started, now, held)
        ls = link.state
        if not (narrow and ls == "connected"):
            t.append(" │ link ")
            t.append(
                f"{ls}" + (f" ({link.attempt})" if ls == "reconnecting" else ""),
                style="green" if ls in ("connected", "replay") else ("yellow" if ls == "reconnecting" else "red"),
            )
        if bench is not None:
            done, total, med = bench
            t.append(" │ bench ")
            t.append(f"{done}/{total}" + (f" · {med:.1f} tok/s" if med is not None else ""), style="bold yellow")
        elif load is not None:
            t.append(" │ load ")
            t.append(f"on ×{load.concurrency}" if load.on else "off", style="green" if load.on else "dim")
        self.update(t)
