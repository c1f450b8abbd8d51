"""GPU panel: one compact row per GPU (utilisation and power bars, memory, SM clock against its
maximum, temperature, a utilisation sparkline, flags), or one summary line when space is short.

It stays hidden until telemetry arrives (a replay without telemetry looks as before). The key
cycles full -> summary line -> hidden; a terminal too short for the rows gets the summary line.
When the server is not running (it exited, failed or was stopped) the last figures stay, greyed
out and marked stale (``set_stale``), not as if live.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

from tuitune.base.events import Event, GpuSample, TelemetryState
from tuitune.machine.telemetry import gpu_flags
from tuitune.measure.metrics import GpuStore
from tuitune.tui.cycle import sparkline

MODES = ("full", "summary", "hidden")
MIN_HEIGHT_FOR_ROWS = 36  # below this many terminal rows, the panel shrinks to its summary line
FLAG_STYLE = {
    "power cap": "bold yellow",
    "power brake": "bold red",
    "SW thermal": "bold red",
    "HW thermal": "bold red",
    "HW slowdown": "bold red",
    "straggler": "bold magenta",
    "idle under load": "bold red",
}


def bar(frac: float, width: int) -> str:
    """A horizontal bar of ``width`` cells, eighths for the last one."""
    cells = max(0.0, min(1.0, frac)) * width
    full = int(cells)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[int((cells - full) * 8)] if full < width else "")).ljust(width)


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else fmt.format(v)


def gpu_row(g, flags: list[str], width: int) -> Text:
    s: GpuSample = g.last
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{s.index:<2}", style="bold")
    util = s.util
    t.append(bar((util or 0) / 100, 6), style="green")
    t.append(f"{_num(util, '{:3.0f}'):>3}% ")
    frac = (s.power / s.power_limit) if s.power is not None and s.power_limit else 0.0
    t.append(bar(frac, 5), style="red" if frac >= 0.95 else "yellow")
    t.append(f"{_num(s.power, '{:4.0f}'):>4}W ")
    mem = f"{_num(s.mem_used and s.mem_used / 1024, '{:.0f}')}/{_num(s.mem_total and s.mem_total / 1024, '{:.0f}')}G"
    t.append(f"{mem:>8} ")
    clock_style = "yellow" if s.sm_clock and s.sm_clock_max and s.sm_clock < 0.9 * s.sm_clock_max and util else ""
    t.append(f"{_num(s.sm_clock, '{:.0f}'):>4}/{_num(s.sm_clock_max, '{:.0f}'):<4} ", style=clock_style)
    t.append(f"{_num(s.temp, '{:.0f}'):>3}° ", style="red" if (s.temp or 0) >= 85 else "")
    words = ", ".join(flags)
    spark_w = max(4, width - len(t.plain) - max(len(words), 9) - 1)
    t.append(f"{sparkline(g.series['util'].values(), 0, 100, spark_w):<{spark_w}} ", style="cyan")
    for i, f in enumerate(flags):
        t.append(("," if i else "") + f, style=FLAG_STYLE.get(f, "bold"))
    return t


def summary_line(gpus: list, flags: dict[int, list[str]]) -> Text:
    samples = [g.last for g in gpus]
    utils = [s.util for s in samples if s.util is not None]
    power = sum(s.power for s in samples if s.power is not None)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{len(samples)} GPU(s)  ", style="bold")
    t.append(f"util {sum(utils) / len(utils):.0f}% avg (min {min(utils):.0f}%)  " if utils else "util —  ")
    t.append(f"power {power:.0f} W  ")
    rx = [s.pcie_rx + (s.pcie_tx or 0) for s in samples if s.pcie_rx is not None]
    if rx:
        t.append(f"PCIe {sum(rx) / 1000:.1f} GB/s  ")
    marked: dict[str, list[int]] = {}
    for i, fs in flags.items():
        for f in fs:
            marked.setdefault(f, []).append(i)
    for f, idx in marked.items():
        t.append(f"{f} GPU {','.join(map(str, idx))}  ", style=FLAG_STYLE.get(f, "bold"))
    return t


class GpuPanel(Static):
    DEFAULT_CSS = "GpuPanel { height: auto; border: round $primary; padding: 0 1; display: none; }"

    def __init__(self, **kw):
        super().__init__("", **kw)
        self.mode = "full"
        self.state: TelemetryState | None = None
        self.flags: dict[int, list[str]] = {}
        self.rows = 0  # GPU rows drawn last time (0 in summary mode)
        self.stale: str | None = None  # why the figures are not live (the server died): drawn grey
        self._last: tuple[GpuStore, bool] | None = None

    def set_stale(self, reason: str | None) -> None:
        """Mark the figures as not live (``reason``, e.g. "server exited") or live again (None);
        the panel is redrawn from its last samples, greyed out and said so in its subtitle."""
        if reason != self.stale:
            self.stale = reason
            if self._last is not None:
                self.update_from(*self._last, [])

    def update(self, content="", **kw) -> None:
        if getattr(self, "stale", None) and isinstance(content, Text):
            content = content.copy()
            content.stylize("dim")
            content.append(f"\nstale: {self.stale}; the figures above are from before", style="bold yellow")
        super().update(content, **kw)

    def on_mount(self) -> None:
        self.border_title = "gpus"

    making_room = False  # the app's chart or advisor tab on a short terminal: hidden while shown

    def make_room(self, on: bool) -> None:
        self.making_room = on
        self.display = self._shown() and self.state is not None and self.state.state != "unavailable"

    def _shown(self) -> bool:
        return self.mode != "hidden" and not self.making_room

    def cycle_mode(self) -> str:
        self.mode = MODES[(MODES.index(self.mode) + 1) % len(MODES)]
        self.display = self._shown() and self.state is not None
        return self.mode

    def effective_mode(self) -> str:
        if self.mode == "full" and self.app.size.height < MIN_HEIGHT_FOR_ROWS:
            return "summary"
        return self.mode

    def update_from(self, store: GpuStore, load_on: bool, events: Sequence[Event]) -> None:
        for ev in events:
            if isinstance(ev, TelemetryState):
                self.state = ev
            elif self.state is None and isinstance(ev, GpuSample):  # a capture that starts mid-stream
                self.state = TelemetryState("on")
        if self.state is None or self.state.state == "unavailable":
            self.display = False
            return
        self.display = self._shown()
        self._last = (store, load_on)
        gpus = store.current()
        self.flags = gpu_flags(store, load_on)
        st = self.state
        self.border_subtitle = "" if st.state == "on" else f"{st.state}: {st.detail or ''}"[:60]
        if self.stale:
            self.border_subtitle = f"stale: {self.stale}"[:60]
        first = gpus[0].last if gpus else None  # the GPUs that answered the last tick: each has a sample
        name = first.name if first is not None and first.name else "GPU"
        self.border_title = f"gpus · {len(gpus)} × {name}" if gpus else "gpus"
        if not self.display:
            return
        if not gpus:
            self.rows = 0
            self.update(Text(st.detail or "waiting for the first sample…", style="dim"))
            return
        if self.effective_mode() == "summary":
            self.rows = 0
            self.update(summary_line(gpus, self.flags))
            return
        # hidden until now, the panel has no size yet: its column's width, less border and padding
        width = max(
            40, self.content_region.width or (self.parent.size.width - 4 if isinstance(self.parent, Widget) else 0)
        )
        out = Text()
        for i, g in enumerate(gpus):
            if i:
                out.append("\n")
            out.append_text(gpu_row(g, self.flags.get(g.index, []), width))
        self.rows = len(gpus)
        self.update(out)
