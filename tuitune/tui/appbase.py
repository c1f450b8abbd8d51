"""What the app's concerns share: the session's state on this screen (the preset as loaded and the
operator's draft, the runs, what is in progress), notifications, and the refresh that draws the
session's buffered events on the panels (from a 10 Hz timer, never once per log line).

`TuituneApp` (app.py) is this class with its concerns mixed in: `ServerActions` (serveractions),
`BenchActions` (benchactions), `PresetActions` (presetactions). Each is a subclass of `AppBase`, so
Textual finds their actions, workers and message handlers on the app as before, and mypy checks
them against the state declared here.
"""

from __future__ import annotations

import time
from pathlib import Path

from textual.app import App
from textual.notifications import SeverityLevel
from textual.widgets import TabbedContent
from textual.worker import Worker

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.events import Event, GpuSample, LogLine, Marker, ProfileWindow, ServerState, TelemetryState
from tuitune.measure.guard import PREFIX as GUARD_PREFIX
from tuitune.measure.runs import RunBook
from tuitune.tui.advisor import AdvisorPanel
from tuitune.tui.chart import ChartPanel
from tuitune.tui.config import ConfigPanel
from tuitune.tui.cycle import CyclePanel
from tuitune.tui.gpus import GpuPanel
from tuitune.tui.header import StatusHeader
from tuitune.tui.logpane import LogPane
from tuitune.tui.runs import RunsTable
from tuitune.tui.screens import RelaunchScreen
from tuitune.tui.settings import UserConfig, load_user_config


class AppBase(App[None]):
    """The session, the drafts and the runs as this screen holds them, and the panels they are drawn on."""

    # the main screen's panels, looked up once it is mounted (TuituneApp.on_mount)
    header: StatusHeader
    cycle: CyclePanel
    gpu_panel: GpuPanel
    runs_table: RunsTable
    logpane: LogPane
    chart: ChartPanel
    advisor: AdvisorPanel
    config: ConfigPanel
    tabs: TabbedContent

    def __init__(
        self,
        session,
        *,
        autostart: str | None = None,
        load_on_start: bool = False,
        user_config: UserConfig | None = None,
        preset_path: Path | None = None,
        clock=time.time,
        stop_on_quit: bool = False,
    ):
        super().__init__()
        self.stop_on_quit = stop_on_quit  # the quit dialog's default (the demo owns its simulator)
        self.session = session
        self.live = session.live
        self.autostart = autostart  # "launch": (re)launch at start; "attach": attach, offer to launch
        self.load_on_start = load_on_start
        self.user_config = user_config or load_user_config()
        self.preset_path = preset_path
        self.clock = clock
        self.loaded: P.Preset | None = session.preset  # as in the file
        self.draft: P.Preset | None = session.preset  # with the operator's edits
        self.draft_errors: dict[str, str] = {}
        self.book = RunBook(max_age_s=self.user_config.baseline_max_age_min * 60)
        self.pending: list[Event] = []
        self.relaunch_screen: RelaunchScreen | None = None
        self.relaunch_worker: Worker[None] | None = None
        self.bench_running = False
        self.bench_progress: tuple[int, int, float | None] | None = None  # done, total, median tok/s so far
        self._diff_for: tuple | None = None  # (running preset, draft) the diff was drawn for
        self._dirty_cycle = True
        self._dirty_runs = True
        self._last_stale: str | None = None
        self._last_chart = 0.0
        self.messages: list[str] = []  # notifications shown, for tests and the log
        self.opened_not_launched = False  # `o` loaded a preset that has not been launched yet
        session.subscribe(self.pending.extend)

    def say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.messages.append(message)
        self.notify(message, severity=severity, timeout=6 if severity != "error" else 12)

    # ---- periodic refresh -----------------------------------------------------------------
    def refresh_views(self) -> None:  # noqa: C901
        events, self.pending[:] = list(self.pending), []
        lines = [ev.text for ev in events if isinstance(ev, LogLine) and not ev.node]
        for node in sorted({ev.node for ev in events if isinstance(ev, LogLine) and ev.node}):
            self.logpane.add([ev.text for ev in events if isinstance(ev, LogLine) and ev.node == node], node)
        if lines:
            self.logpane.add(lines)
        screen = (
            self.relaunch_screen if self.relaunch_screen is not None and not self.relaunch_screen.finished else None
        )
        if screen is not None:
            # the relaunch view shows the new server's lines only: those of the old one (its
            # shutdown, a last request) arrive before the new process is launched
            fresh = []
            for ev in events:
                if isinstance(ev, ServerState) and ev.state == "starting" and ev.phase == "launching":
                    screen.launched = True
                elif screen.launched and isinstance(ev, LogLine) and not ev.node:
                    fresh.append(ev.text)
            if fresh:
                screen.add_lines(fresh)
        for ev in events:
            if isinstance(ev, ServerState):
                self._dirty_cycle = True  # the store may have been cleared (a relaunch here or elsewhere)
            if isinstance(ev, (ProfileWindow,)) or ev.kind in ("decode", "vllm_spec", "metrics"):
                self._dirty_cycle = True
            elif isinstance(ev, Marker) and ev.text.startswith("warning: "):
                self.say(ev.text.removeprefix("warning: "), "warning")
            elif isinstance(ev, Marker) and ev.text.startswith(GUARD_PREFIX):
                self._dirty_cycle = True
                cleared = ev.text.startswith(GUARD_PREFIX + "cleared: ")
                self.say(ev.text, "information" if cleared else "warning")
            elif (
                isinstance(ev, ServerState)
                and self.relaunch_screen is not None
                and not self.relaunch_screen.finished
                and ev.state == "starting"
            ):
                self.relaunch_screen.set_phase(ev)
            elif isinstance(ev, ServerState) and ev.state == "exited":
                self.say(f"server {ev.pid} exited: {ev.detail}; r relaunches it", "error")
        s = self.session
        if s.preset is not None:  # a replay of a capture without its preset keeps the default
            self.advisor.engine = s.preset.engine  # the running server's engine decides the moves
            self.advisor.topks = s.preset.engine.search_topks(s.preset)  # and its algorithm (NGRAM: chains)
        self.advisor.feed(events)
        self.advisor.refresh_model(s.load.concurrency if s.load is not None and s.load.on else None)
        telemetry = [ev for ev in events if isinstance(ev, (GpuSample, TelemetryState))]
        if telemetry:
            self.gpu_panel.update_from(s.store.gpus, bool(s.load and s.load.on), telemetry)
            for ev in telemetry:
                if isinstance(ev, TelemetryState) and ev.state in ("unavailable", "stopped") and ev.detail:
                    self.say(ev.detail, "warning")
        if self.live:  # a dead server's GPUs: the last figures, greyed out, not live-looking
            st = s.state.state
            self.gpu_panel.set_stale(None if st in ("ready", "starting", "stopping") else f"server {st}")
        self.header.show(
            s.label,
            self.draft.name if self.draft else "?",
            self.modified,
            s.state,
            s.link,
            s.load,
            s.record.started if s.record else None,
            self.clock(),
            bench=self.bench_progress,
            engine=self.draft.engine.label if self.draft else None,
            not_running=self._not_running(),
            held=self._held_mark(),
        )
        if self._diff_for is None or self._diff_for[0] is not s.running_preset or self._diff_for[1] is not self.draft:
            self.update_diff()
        if self._dirty_cycle:
            self._dirty_cycle = False
            self.cycle.refresh_from(
                s.store,
                bool(self.draft and self.draft.is_speculative),
                self.draft.engine.label if self.draft else "SGLang",
                s.guard,
            )
        stale = self.stale_reason()
        if self._dirty_runs or stale != self._last_stale:
            self._dirty_runs = False
            self._last_stale = stale
            self.runs_table.show(self.book, stale)
        now = time.monotonic()
        if now - self._last_chart > 1.0 and self.tabs.active == "tab-chart":
            self._last_chart = now
            self.chart.draw(s.store, self.book)

    def _held_mark(self) -> str | None:
        """ "K 4": the step count held live in the session's launch (a replay holds none)."""
        held = getattr(self.session, "held", None)
        return None if held is None or self.draft is None else f"{self.draft.engine.step_name} {held}"

    def _not_running(self) -> str | None:
        """After `o`: the header's "loaded, not running" (naming what the server runs) until the
        loaded preset is launched."""
        if not self.opened_not_launched:
            return None
        run = self.session.running_preset
        if run is not None and self.loaded is not None and not P.diff(run, self.loaded, include_bench=False):
            return None  # launched since (here or by another client)
        up = self.session.state.state in ("ready", "starting")
        return run.name if run is not None and up else ""

    def stale_reason(self) -> str | None:
        return self.book.stale_reason(self.clock())

    @property
    def modified(self) -> bool:
        return bool(self.loaded and self.draft and P.diff(self.loaded, self.draft))

    def update_diff(self) -> None:
        """ "Differs from the running server": running → draft, redrawn whenever either changes
        (an edit, a relaunch here or elsewhere, open, revert, save)."""
        running, draft = self.session.running_preset, self.draft
        self._diff_for = (running, draft)
        lines = []
        if running is not None and draft is not None:
            for k, a, b in P.diff(running, draft, include_bench=False):
                a, b, note = redact.pair(k, a, b)
                lines.append(f"{k}: {'(unset)' if a is None else a} → {'(unset)' if b is None else b}{note}")
        self.config.show_diff(lines)

    def redraw_cycle(self) -> None:
        """The cycle panel is drawn again at the next refresh (a resize, data before its compose)."""
        self._dirty_cycle = True

    def show_node(self, node: int, labels: list[str]) -> None:
        self.logpane.show_node(node, f"node {node} of {len(labels)} · {labels[node]}  (n: next node)")
