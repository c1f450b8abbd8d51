"""The tuitune app: wires a session (live or replayed) to the panels. No domain logic here.

Events from the session are buffered and the screen is refreshed from a 10 Hz timer, never once
per log line. Connecting, relaunching, benchmarking run in workers; the UI never blocks.

Why one module of this size: Textual binds actions, key bindings and the command palette to the
App class; the panels are their own modules, and the actions here only call the session.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Input, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.events import Event, GpuSample, LogLine, Marker, ProfileWindow, ServerState, TelemetryState
from tuitune.machine.errors import ControlError
from tuitune.machine.transport import TransportError
from tuitune.measure.benchformat import level_row
from tuitune.measure.guard import PREFIX as GUARD_PREFIX
from tuitune.measure.levels import bench_levels, plan_levels
from tuitune.measure.runs import RunBook, delta_mark
from tuitune.measure.workload import WorkloadError
from tuitune.tui.advisor import AdvisorPanel, apply_to_config
from tuitune.tui.chart import ChartPanel
from tuitune.tui.config import ConfigPanel
from tuitune.tui.cycle import CyclePanel
from tuitune.tui.gpus import GpuPanel
from tuitune.tui.header import StatusHeader
from tuitune.tui.help import HelpScreen
from tuitune.tui.logpane import LogPane
from tuitune.tui.runs import RunsTable
from tuitune.tui.screens import ConfirmScreen, OpenScreen, QuitScreen, RelaunchScreen, SaveScreen
from tuitune.tui.settings import UserConfig, did_you_mean, load_user_config, remember_theme

REFRESH_S = 0.1


class TuituneCommands(Provider):
    """Every action of tuitune in the command palette, listed as soon as it opens, each with its key
    (as the keymap has it): a key forgotten is found by name ("advisor", "baseline", "save" …)."""

    # (title, action, binding id whose key is shown, what it does)
    COMMANDS = (
        ("Help: tuitune's keys and a first tour", "help", "tuitune.help", "keys by task, the first five minutes"),
        ("Load: on or off", "toggle_load", "tuitune.load", "a steady background load, so the server decodes"),
        ("Load: one more stream", "load_more", "tuitune.load_more", "the batch size the cycle panel shows"),
        ("Load: one stream fewer", "load_less", "tuitune.load_less", "the batch size the cycle panel shows"),
        ("Bench at the preset's concurrency", "bench", "tuitune.bench", "a row in the runs table"),
        ("Bench over concurrency levels", "bench_levels", "tuitune.bench_levels", "the goodput curve"),
        ("Bench at the load's concurrency", "bench_at_load", None, "as many streams as the load runs"),
        ("Mark the selected run as the baseline", "mark_baseline", "tuitune.mark_baseline", "Δ is against it"),
        ("Clear the runs table", "clear_runs", None, "forget every benchmark row"),
        ("Show the runs table", "focus_runs", None, "j/k select a run (Tab moves between panels)"),
        ("Show the log", "show_tab('log')", "tuitune.tab_log", "the log tab"),
        ("Show the chart", "show_tab('chart')", "tuitune.tab_chart", "the chart tab"),
        ("Show the advisor", "show_tab('advisor')", "tuitune.tab_advisor", "predicted goodput of the neighbours"),
        ("Next tab", "toggle_tab", "tuitune.tab", "log → chart → advisor"),
        ("Switch chart", "chart", "tuitune.chart", "tok/s per run / phase times / goodput curve"),
        ("Apply the advisor's top suggestion", "apply_advice", "tuitune.apply_advice", "into the config panel"),
        ("Edit the configuration", "edit", "tuitune.edit", "the config panel; Esc leaves"),
        ("Show or hide the config panel", "toggle_config", None, "below 140 columns it is collapsed"),
        ("Relaunch with the edited configuration", "relaunch", "tuitune.relaunch", "Esc cancels a start"),
        ("Reload the preset from its file", "revert", None, "discard the edits"),
        ("Open a preset", "open", "tuitune.open", "a diff against the current configuration first"),
        ("Save the configuration as a preset", "save", "tuitune.save", "to your presets directory, or a path"),
        ("GPU panel: rows, summary or hidden", "toggle_gpus", "tuitune.gpus", "one row per GPU, a line, or off"),
        ("Filter the log", "focus_filter", "tuitune.filter", "by substring; Esc leaves"),
        ("Follow the log again", "follow_log", "tuitune.follow", "after scrolling up"),
        ("Next node's log", "next_node", "tuitune.next_node", "a multi-node server"),
        ("NCCL confirmation", "nccl_report", None, "what NCCL said it applied"),
        ("Stop the server…", "confirm_stop_server", None, "asks first; the session stays open"),
        ("Replay: play or pause", "pause", "tuitune.pause", "the capture's clock"),
        ("Replay: 10 s forward", "seek(10)", "tuitune.seek_fwd", "in the capture"),
        ("Replay: 10 s back", "seek(-10)", "tuitune.seek_back", "in the capture"),
        (
            "Show or hide tuitune's own requests in the log",
            "toggle_own_requests",
            "tuitune.own_requests",
            "its /metrics, /health and bench requests",
        ),
    )

    def _available(self) -> Iterator[tuple[str, str, str]]:
        app = self.app
        if not isinstance(app, TuituneApp):  # the provider is TuituneApp's own (its COMMANDS)
            return
        for title, action, bid, help_ in self.COMMANDS:
            if app.check_action(action.split("(")[0], ()) is not False:
                key = app.key_of(bid) if bid else ""
                yield title, action, (f"{key} · {help_}" if key else help_)

    async def discover(self) -> Hits:
        for title, action, help_ in self._available():
            yield DiscoveryHit(title, lambda a=action: self.app.run_action(a), help=help_)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, action, help_ in self._available():
            score = max(matcher.match(title), matcher.match(help_) * 0.5)
            if score > 0:
                yield Hit(score, matcher.highlight(title), lambda a=action: self.app.run_action(a), help=help_)


NARROW_COLS = 140  # below this the config panel collapses (e shows it) so the left side stays readable
WIDE_FOOTER_COLS = 120  # below this the footer is compact
SHORT_ROWS = 30  # below this the cycle panel drops its sparklines (bars, runs and log keep their rows)
TALL_TABS = ("tab-chart", "tab-advisor")  # on a short terminal these hide the panels above them


class TuituneApp(App[None]):
    CSS = """
    Screen { layout: vertical; }
    #main { height: 1fr; }
    #left { width: 1fr; }
    TabbedContent { height: 1fr; min-height: 4; }
    TabPane { padding: 0; }
    /* collapsed: hidden unless asked for, then laid over the right side (the panels keep their width) */
    #main { layers: base overlay; }
    .-narrow #config { display: none; }
    .-narrow.-show-config #config { display: block; layer: overlay; dock: right; width: 52; max-width: 80%; }
    /* a short terminal keeps the bars, the runs and the log; the sparklines make room */
    .-short CyclePanel .spark-row { display: none; }
    /* the chart and advisor tabs on a short terminal: the panels above make room (a plot's rows,
       the advisor's running configuration and its neighbours) */
    .-short.-tall-tab #cycle, .-short.-tall-tab #gpus, .-short.-tall-tab #runs { display: none; }
    """
    TITLE = "tuitune"
    COMMANDS = App.COMMANDS | {TuituneCommands}
    # The footer shows, in this order, what the first five minutes need (`?` and `q` first: a narrow
    # footer drops what does not fit from the end); the rest is in the help (`?`) and the palette.
    BINDINGS = [
        Binding("question_mark", "help", "help", id="tuitune.help"),
        Binding("q", "quit_app", "quit", id="tuitune.quit"),
        Binding("ctrl+q", "quit_app", "quit", show=False, priority=True, id="tuitune.quit_ctrl"),
        Binding("l", "toggle_load", "load", id="tuitune.load"),
        Binding("b", "bench", "bench", id="tuitune.bench"),
        Binding("g", "toggle_tab", "tabs", id="tuitune.tab"),
        Binding("a", "apply_advice", "apply", id="tuitune.apply_advice"),
        Binding("r", "relaunch", "relaunch", id="tuitune.relaunch"),
        Binding("m", "mark_baseline", "base", id="tuitune.mark_baseline"),
        Binding("s", "save", "save", id="tuitune.save"),
        Binding("e", "edit", "edit", id="tuitune.edit"),
        Binding("o", "open", "open", show=False, id="tuitune.open"),
        Binding("c", "chart", "chart", show=False, id="tuitune.chart"),
        Binding("t", "toggle_gpus", "gpus", show=False, id="tuitune.gpus"),
        Binding("slash", "focus_filter", "filter", show=False, id="tuitune.filter"),
        Binding("1", "show_tab('log')", "log", show=False, id="tuitune.tab_log"),
        Binding("2", "show_tab('chart')", "chart tab", show=False, id="tuitune.tab_chart"),
        Binding("3", "show_tab('advisor')", "advisor", show=False, id="tuitune.tab_advisor"),
        Binding("B", "bench_levels", "bench levels", show=False, id="tuitune.bench_levels"),
        Binding("plus", "load_more", "load +", show=False, id="tuitune.load_more"),
        Binding("minus", "load_less", "load −", show=False, id="tuitune.load_less"),
        Binding("n", "next_node", "node", show=False, id="tuitune.next_node"),
        # End and G follow the log from any focus (an input keeps End for its own cursor)
        Binding("end", "follow_log", "follow", show=False, priority=True, id="tuitune.follow_end"),
        Binding("G", "follow_log", "follow", show=False, id="tuitune.follow"),
        Binding("v", "toggle_own_requests", "own requests", show=False, id="tuitune.own_requests"),
        Binding("space", "pause", "pause", show=False, id="tuitune.pause"),
        Binding("right", "seek(10)", "+10s", show=False, id="tuitune.seek_fwd"),
        Binding("left", "seek(-10)", "−10s", show=False, id="tuitune.seek_back"),
        Binding("escape", "leave_input", show=False, id="tuitune.escape"),
    ]
    LIVE_ONLY = {
        "relaunch",
        "bench",
        "bench_levels",
        "bench_at_load",
        "toggle_load",
        "load_more",
        "load_less",
        "stop_server",
        "confirm_stop_server",
    }
    REPLAY_ONLY = {"pause", "seek"}

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

    # ---- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield CyclePanel(self.redraw_cycle, id="cycle")
                yield GpuPanel(id="gpus")
                yield RunsTable(id="runs")
                with TabbedContent(id="tabs"):
                    with TabPane("log", id="tab-log"):
                        yield LogPane(id="logpane")
                    with TabPane("chart", id="tab-chart"):
                        yield ChartPanel(id="chart")
                    with TabPane("advisor", id="tab-advisor"):
                        yield AdvisorPanel(id="advisor")
            yield ConfigPanel(id="config")
        narrow = self.size.width < WIDE_FOOTER_COLS
        yield Footer(compact=narrow, show_command_palette=not narrow)

    def on_mount(self) -> None:
        # the main screen's widgets (App.query_one would search whatever screen is on top)
        self.header = self.query_one(StatusHeader)
        self.cycle = self.query_one(CyclePanel)
        self.gpu_panel = self.query_one(GpuPanel)
        self.runs_table = self.query_one(RunsTable)
        self.logpane = self.query_one(LogPane)
        self.chart = self.query_one(ChartPanel)
        self.advisor = self.query_one(AdvisorPanel)
        self.config = self.query_one(ConfigPanel)
        self.tabs = self.query_one(TabbedContent)
        self.footer = self.query_one(Footer)
        self._apply_user_config()
        self.cycle.hint = "l load · b bench · r relaunch" if self.live else "space play/pause · ←/→ seek"
        if self.draft is not None:
            self.config.load(self.draft)
        self._layout_for(self.size.width)
        self.set_interval(REFRESH_S, self.refresh_views)
        self.refresh_views()
        self.start_session()

    def _apply_user_config(self) -> None:
        cfg = self.user_config
        errors = list(cfg.errors)
        if cfg.keymap:
            known = self._binding_ids()
            for bid in cfg.keymap:
                if bid not in known:
                    errors.append(
                        f"{cfg.path or 'config'}: keymap: no binding with id {bid!r}"
                        f"{did_you_mean(bid, known)}; it is ignored"
                    )
            self.set_keymap({k: v for k, v in cfg.keymap.items() if k in known})
        if cfg.theme:
            if cfg.theme in self.available_themes:
                self.theme = cfg.theme
            else:
                errors.append(
                    f"{cfg.path or 'config'}: theme {cfg.theme!r} is not a theme"
                    f"{did_you_mean(cfg.theme, self.available_themes)}; using {self.theme}"
                )
        for err in errors:
            self.say(err, "warning")
        self._theme_ready = True

    def _binding_ids(self) -> set[str]:
        from tuitune.tui import screens

        ids = {b.id for b in self.BINDINGS if isinstance(b, Binding) and b.id}
        for cls in (
            screens.RelaunchScreen,
            screens.SaveScreen,
            screens.OpenScreen,
            screens.QuitScreen,
            screens.ConfirmScreen,
            HelpScreen,
        ):
            ids |= {b.id for b in cls.BINDINGS if isinstance(b, Binding) and b.id}
        return ids

    _theme_ready = False
    footer: Footer | None = None

    def watch_theme(self, theme: str) -> None:
        """Remember a theme chosen in the UI (palette: "Change theme") for the next start."""
        if self._theme_ready and self.user_config.path is not None and theme != self.user_config.theme:
            self.user_config.theme = theme
            try:
                remember_theme(self.user_config.path, theme)
            except OSError as e:
                self.say(f"{self.user_config.path}: cannot remember the theme ({e.strerror or e})", "warning")

    def on_resize(self, event) -> None:
        self._layout_for(event.size.width, event.size.height)  # self.size may still be the old one

    def _layout_for(self, width: int, height: int | None = None) -> None:
        self.set_class(width < NARROW_COLS, "-narrow")
        self.set_class((self.size.height if height is None else height) < SHORT_ROWS, "-short")
        if getattr(self, "gpu_panel", None) is not None:  # its display is its own (set inline), not the CSS's
            self.gpu_panel.make_room(self.has_class("-tall-tab") and self.has_class("-short"))
        wide = width >= WIDE_FOOTER_COLS
        if self.footer is not None and self.footer.show_command_palette != wide:
            # narrow: less padding and no palette key (? lists it), so the first five minutes' keys fit 80
            self.footer.compact = not wide
            self.footer.show_command_palette = wide
            self.footer.refresh(recompose=True)

    def say(self, message: str, severity: SeverityLevel = "information") -> None:
        self.messages.append(message)
        self.notify(message, severity=severity, timeout=6 if severity != "error" else 12)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker's unexpected error (workers catch the expected ones) becomes a notification:
        the TUI stays up, and the message is one sentence, never a traceback."""
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            e = event.worker.error
            self.say(str(e) or type(e).__name__, "error")

    def check_action(self, action: str, parameters) -> bool | None:
        if not self.live and action in self.LIVE_ONLY:
            return False
        if self.live and action in self.REPLAY_ONLY:
            return False
        return True

    # ---- session lifecycle ----------------------------------------------------------------
    @work(exclusive=True, group="session", exit_on_error=False)
    async def start_session(self) -> None:
        try:
            status = await self.session.connect()
        except (ControlError, TransportError) as e:
            self.say(str(e), "error")
            return
        if not self.live:
            return
        if len(labels := self.session.node_labels()) > 1:
            self.show_node(0, labels)
        running = bool(status and status.running)
        if self.autostart == "launch" or (not running and self.autostart == "launch-if-stopped"):
            self.action_relaunch()
        elif not running:
            self.say(f"{self.session.preset.name}: server not running — press r to launch it", "warning")
        elif not status.ours:
            self.say(f"{self.session.preset.name}: {status.note} (pid {status.record.pid})", "warning")
        elif status.drift:
            self.say(
                f"running server differs from the preset in {len(status.drift)} setting(s): "
                + "; ".join(str(d) for d in status.drift[:3]),
                "warning",
            )
        if self.load_on_start:
            await self.session.set_load(True)

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

    # ---- config edits ---------------------------------------------------------------------
    def on_config_panel_edited(self, message: ConfigPanel.Edited) -> None:
        panel = self.config
        self.draft_errors = dict(message.errors)
        if not message.errors:
            assert panel.base is not None  # the panel reports edits only once it holds a preset
            try:
                self.draft = P.with_changes(panel.base, message.changes)
            except P.PresetError as e:
                self.draft_errors["preset"] = str(e)
        self.update_diff()

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

    # ---- actions --------------------------------------------------------------------------
    def action_relaunch(self) -> None:
        if why := self.session_refusal():
            self.say(why, "error")
            return
        if self.draft_errors:
            self.say("fix the configuration first: " + next(iter(self.draft_errors.values())), "error")
            return
        if self.relaunch_worker is not None and self.relaunch_worker.state == WorkerState.RUNNING:
            self.say("a relaunch is already in progress", "warning")
            return
        # what arrived before this relaunch (the running server's lines, the launch it came from, not
        # yet drawn on a busy machine) goes to the log pane now, not to the new launch's view
        self.refresh_views()
        draft = self.draft
        assert draft is not None  # relaunch is live only, and a live session has a preset
        self.relaunch_screen = RelaunchScreen(
            draft.name, redact.Redactor(draft)(P.launch_command(draft)), self.cancel_relaunch
        )
        self.push_screen(self.relaunch_screen)
        self.relaunch_worker = self.run_relaunch(draft)

    @work(group="relaunch", exit_on_error=False)
    async def run_relaunch(self, preset: P.Preset) -> None:
        screen = self.relaunch_screen
        assert screen is not None  # action_relaunch pushes it before it starts this worker
        try:
            await self.session.relaunch(preset)
        except ControlError as e:
            screen.done(False, str(e), e.log_tail)
            self.say(str(e), "error")
            return
        except TransportError as e:
            screen.done(False, str(e))
            self.say(str(e), "error")
            return
        except asyncio.CancelledError:
            self.say("relaunch cancelled; the half-started server was stopped", "warning")
            if not screen.finished:
                screen.done(False, "cancelled")
            raise
        self.refresh_views()  # the new server's lines not drawn yet (a busy machine) go to its view first
        screen.done(True)
        self.opened_not_launched = False
        if self.draft == preset:  # else the user edited while it started: keep the newer edits
            self.config.load(preset)
            self.draft = preset
        self._dirty_runs = True
        self.say(f"{preset.name} ready")

    def redraw_cycle(self) -> None:
        """The cycle panel is drawn again at the next refresh (a resize, data before its compose)."""
        self._dirty_cycle = True

    def cancel_relaunch(self) -> None:
        if self.relaunch_worker is not None:
            self.relaunch_worker.cancel()

    def action_apply_advice(self) -> None:
        """The advisor's ``▶`` into the config panel; a gain inside the running configuration's
        interval, or a measurement (``▷``: the running one is predicted best), is asked about first."""
        sug = self.advisor.suggestion()
        best = sug.config
        if best is None:
            if self.advisor.rows:
                self.say("the running configuration is predicted best: nothing to apply", "warning")
            else:
                self.say("no advice yet: the advisor needs profile windows of the running server", "warning")
            return
        label = self.advisor.engine.config_label(best)

        def apply(yes: bool | None = True) -> None:
            if yes:
                apply_to_config(self.config, best)
                self.say(f"config panel set to {label}: press r to relaunch with it")

        if sug.kind == "gain":
            apply()
            return
        question = (
            f"{label} is predicted {sug.gain:+.1%}, inside the running configuration's 95 % interval: "
            "not a sure gain. Put it into the config panel anyway (then r, b to measure it)?"
            if sug.kind == "within"
            else f"The running configuration is predicted best ({label}: {sug.gain:+.1%}). "
            f"{label} is the measurement worth making next: put it into the config panel to measure it?"
        )
        self.say(question.split(". ")[0], "warning")
        self.push_screen(ConfirmScreen(question, "Apply [y]", "y"), apply)

    def action_bench(self) -> None:
        self._start_bench(None)

    def action_bench_levels(self) -> None:
        self._start_bench(self.user_config.bench_levels)

    def action_bench_at_load(self) -> None:
        self._start_bench([self.session.load.concurrency])

    def _start_bench(self, levels: list[int] | None) -> None:
        if self.bench_running:
            self.say("a benchmark is already running", "warning")
            return
        st = self.session.state
        if st.state != "ready":
            why = f"{st.state}: {st.detail}" if st.detail else st.state
            self.say(f"the server is not ready ({why[:160]}): relaunch (r) first", "warning")
            return
        self.run_bench(levels)

    @work(group="bench", exit_on_error=False)
    async def run_bench(self, levels: list[int] | None = None) -> None:
        """One run at the preset's concurrency, or one run over several levels (a goodput curve)."""
        preset = self.session.running_preset or self.session.preset
        levels = levels or [preset.bench.concurrency]
        try:
            plan = plan_levels(self.session, levels, label=preset.name)
        except WorkloadError as e:
            self.say(f"benchmark: bench.prompts: {e}", "error")
            return
        self.bench_running = True
        n = sum(c.requests for c in plan)  # 2+ per stream
        done: list[float] = []
        finished = 0  # runs that ended, ok or not
        self.bench_progress = (finished, n, None)
        self.say(
            f"benchmark: {preset.bench.warmup} warm-up + {n} requests of {preset.bench.max_tokens} tokens at "
            f"concurrency {', '.join(map(str, levels))}, workload {plan[0].prompts.label}…"
        )

        logged = self.session.store["decode_accept_len"]
        logged_from = logged.appended

        def progress(_i: int, r) -> None:
            if r.ok and r.decode_tok_s is not None:
                done.append(r.decode_tok_s)
            med = sorted(done)[len(done) // 2] if done else None
            nonlocal finished
            finished += 1
            self.bench_progress = (finished, n, med)

        try:
            runs = await bench_levels(self.session, levels, label=preset.name, on_level=lambda _cfg: progress)
        except (ControlError, TransportError, WorkloadError) as e:
            self.say(str(e), "error")
            return
        finally:
            self.bench_running = False
            self.bench_progress = None
        if not any(run.ok for run in runs):
            errors = "; ".join(e for run in runs for e in run.summary()["errors"])
            self.say(f"benchmark: no request succeeded ({errors[:200]}); no row added", "error")
            return
        first = runs[0]
        summary = first.summary()
        if not (summary.get("accept_len") or {}).get("mean") and preset.is_speculative:
            # vLLM's responses carry no acceptance: the server's own figure, as the cycle panel
            # shows it (its SpecDecoding lines or /metrics), over the run or else the last one
            vals = logged.since(logged_from) or ([logged.last()] if logged.last() is not None else [])
            if vals:
                summary["accept_len"] = {"mean": sum(vals) / len(vals), "source": "server log"}
        r = self.book.add(
            preset.name,
            preset,
            first.tok_s(),
            summary,
            first.cycle_ms,
            started=self.clock(),
            env_drift=first.env_drift,
            gpu_note=next((run.gpu_note for run in runs if run.gpu_note), None),
            levels=[level_row(run.summary()) for run in runs] if len(runs) > 1 else None,
        )
        self._dirty_runs = True
        if len(runs) > 1:
            self.chart.mode = "goodput"
        delta = self.book.delta(r)
        mark = delta_mark(delta)
        why = (delta or {}).get("why")
        self.say(
            f"run #{r.id}: {r.median:.1f} tok/s"
            + ("" if mark == "—" else f", {mark} vs baseline")
            + (f" ({why})" if why else "")
            + (f", {r.failed} failed" if r.failed else "")
            + (f"; GPUs held back: {r.gpu_note}" if r.gpu_note else ""),
            "error" if r.failed else "information",
        )

    def action_mark_baseline(self) -> None:
        table = self.runs_table
        if not self.book.runs:
            self.say("no runs yet: press b to benchmark", "warning")
            return
        row = table.cursor_row if table.cursor_row is not None else len(self.book.runs) - 1
        run = self.book.runs[max(0, min(row, len(self.book.runs) - 1))]
        try:
            self.book.mark_baseline(run.id)
        except ValueError as e:
            self.say(str(e), "warning")
            return
        self._dirty_runs = True
        self.refresh_views()
        self.say(f"run #{run.id} is the baseline")

    async def action_toggle_load(self) -> None:
        await self.session.set_load(not self.session.load.on)
        self.refresh_views()  # show the effect of a key now, not at the next tick

    async def action_load_more(self) -> None:
        await self.session.set_load(True, self.session.load.concurrency + 1)
        self.refresh_views()

    async def action_load_less(self) -> None:
        await self.session.set_load(self.session.load.on, max(1, self.session.load.concurrency - 1))
        self.refresh_views()

    def action_save(self) -> None:
        if self.draft_errors:
            self.say("fix the configuration first: " + next(iter(self.draft_errors.values())), "error")
            return
        draft = self.draft
        if draft is None:
            self._no_preset("save")
            return
        default = (
            str(self.preset_path) if self.preset_path and self.preset_path.parent != P.shipped_dir() else draft.name
        )
        self._ask_save(default, draft.description or "")

    def _ask_save(self, target: str, description: str) -> None:
        """The save dialog; a name that would hide a shipped preset is asked about first (No goes
        back to the dialog as typed)."""
        draft = self.draft  # the dialog is modal: the draft stays this one while it is open
        assert draft is not None

        def done(answer: tuple[str, str] | None) -> None:
            if not answer:
                return
            target, description = answer
            path = Path(target).expanduser()
            if path.suffix not in (".yaml", ".yml"):
                path = P.user_dir() / f"{target}.yaml"
            shipped = P.shadowed(path.stem) if path.parent == P.user_dir() and not path.exists() else None
            if shipped is None:
                self._save(path, description)
                return

            def confirmed(yes: bool | None) -> None:
                if yes:
                    self._save(path, description)
                else:
                    self._ask_save(target, description)

            self.push_screen(
                ConfirmScreen(
                    f"{path.stem} is a shipped preset's name. Yours, saved as {path}, would hide it: "
                    f"`tuitune {path.stem}` and every command given the name {path.stem} find yours first. "
                    "Save it anyway?",
                    "Save anyway [y]",
                    "y",
                    no_label="Another name [Esc]",
                ),
                confirmed,
            )

        def hides(name: str) -> Path | None:
            path = Path(name).expanduser()
            if path.suffix in (".yaml", ".yml"):
                return None if path.parent != P.user_dir() or path.exists() else P.shadowed(path.stem)
            return None if (P.user_dir() / f"{name}.yaml").exists() else P.shadowed(name)

        self.push_screen(
            SaveScreen(
                target,
                description,
                lambda d: stale_description(self.loaded, draft, d),
                hides,
                fix=lambda d: rewrite_description(self.loaded, draft, d),
                slot=self._slot_note,
            ),
            done,
        )

    def _renamed(self, name: str) -> P.Preset:
        """The draft saved under ``name``: a log path that names the old preset names the new one (two
        presets writing one log would read each other's lines); the port stays (one server slot)."""
        draft = self.draft
        assert draft is not None
        old = draft.name
        changes: dict = {"name": name}
        log = str(draft.server.log)
        if name != old and old and old in Path(log).name:
            changes["server.log"] = str(Path(log).with_name(Path(log).name.replace(old, name, 1)))
        return P.with_changes(draft, changes)

    def _slot_note(self, target: str) -> str:
        """What the save dialog says of the server a preset saved under ``target`` would use."""
        draft = self.draft
        assert draft is not None
        name = Path(target).expanduser().stem if target.strip() else draft.name
        p = self._renamed(name)
        same = "" if name == draft.name else f" (the port is {draft.name}'s: one of them runs at a time)"
        return f"port {p.server.port}, log {p.server.log}{same}"

    def _save(self, path: Path, description: str) -> None:
        try:
            saved = P.save(P.with_changes(self._renamed(path.stem), {"description": description or None}), path)
        except (OSError, P.PresetError) as e:
            self.say(f"{path}: cannot save ({e})", "error")
            return
        self.loaded = P.load(saved)
        self.draft = self.loaded
        self.preset_path = saved
        self.config.load(self.draft)
        hidden = P.shadowed(saved.stem) if saved.parent == P.user_dir() else None
        self.say(f"saved {saved}" + (f" (it hides the shipped {saved.stem})" if hidden else ""))

    def _no_preset(self, what: str) -> None:
        """Saving, opening and reverting need a preset; a replay of a capture may have none."""
        self.say(f"nothing to {what}: the capture this replay plays holds no preset", "warning")

    def action_open(self) -> None:
        loaded, draft = self.loaded, self.draft
        if loaded is None or draft is None:
            self._no_preset("open a preset against")
            return
        here = (loaded.target.label(), loaded.server.port)  # the dialog is modal: loaded stays this one

        def done(path: Path | None) -> None:
            if path is None:
                return
            try:
                p = P.load(path)
            except P.PresetError as e:
                self.say(str(e), "error")
                return
            if (p.target.label(), p.server.port) != here:
                # a session follows one server (its port's state file, log and forward): loading a
                # preset for another one here would leave that server untracked
                self.say(
                    f"{p.name} runs on {p.target.label()} port {p.server.port}; this session follows "
                    f"{here[0]} port {here[1]}. Quit and run `tuitune {path}` to work on it, or "
                    f"change its port to {here[1]} to try it here",
                    "error",
                )
                return
            self.loaded = self.draft = p
            self.opened_not_launched = True
            self.preset_path = path
            self.config.load(p)
            self.update_diff()
            self.say(f"loaded {p.name}: press r to launch it")

        self.push_screen(OpenScreen(draft, here), done)

    def action_revert(self) -> None:
        if self.loaded is None:
            self._no_preset("revert to")
            return
        self.draft = self.loaded
        self.draft_errors = {}
        self.config.load(self.loaded)
        self.update_diff()

    def action_chart(self) -> None:
        chart = self.chart
        tabs = self.tabs
        if tabs.active == "tab-chart":
            chart.toggle()
        tabs.active = "tab-chart"
        self._last_chart = 0.0

    TABS = ("log", "chart", "advisor")

    def action_toggle_tab(self) -> None:
        """The next tab: log → chart → advisor → log."""
        now = self.tabs.active.removeprefix("tab-")
        self.action_show_tab(self.TABS[(self.TABS.index(now) + 1) % len(self.TABS)] if now in self.TABS else "log")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # by key or by mouse: the chart and advisor tabs on a short terminal hide the panels above
        self.set_class(event.pane.id in TALL_TABS, "-tall-tab")
        self.gpu_panel.make_room(event.pane.id in TALL_TABS and self.has_class("-short"))
        if event.pane.id == "tab-chart":
            self._last_chart = 0.0
            self.call_after_refresh(self.refresh_views)  # drawn at its new size, not a second later

    def action_show_tab(self, name: str) -> None:
        self.tabs.active = f"tab-{name}"
        if name == "chart":
            self._last_chart = 0.0
        elif name == "advisor":
            self.advisor.refresh_model(force=True)

    def action_show_log(self) -> None:
        self.action_show_tab("log")

    def action_show_chart(self) -> None:
        self.action_show_tab("chart")

    def action_focus_runs(self) -> None:
        self.runs_table.focus()

    def action_focus_filter(self) -> None:
        self.tabs.active = "tab-log"
        self.logpane.focus_filter()

    def action_edit(self) -> None:
        self.add_class("-show-config")
        self.config.query_one("#spec-algorithm").focus()

    def action_toggle_config(self) -> None:
        if self.has_class("-show-config"):
            self.remove_class("-show-config")
            self.set_focus(None)
        else:
            self.action_edit()

    def action_toggle_gpus(self) -> None:
        self.say(f"GPU panel: {self.gpu_panel.cycle_mode()}")

    def action_leave_input(self) -> None:
        self.remove_class("-show-config")  # a collapsed panel goes away again
        self.set_focus(None)

    def action_next_node(self) -> None:
        """A multi-node server: show the next node's log in the log pane."""
        labels = self.session.node_labels()
        if len(labels) < 2:
            self.say("one machine: there is no other node's log", "warning")
            return
        self.show_node((self.logpane.node + 1) % len(labels), labels)

    def show_node(self, node: int, labels: list[str]) -> None:
        self.logpane.show_node(node, f"node {node} of {len(labels)} · {labels[node]}  (n: next node)")

    def action_toggle_own_requests(self) -> None:
        shown = self.logpane.toggle_own()
        self.say(
            "log: tuitune's own requests shown (v hides them)"
            if shown
            else "log: tuitune's own requests hidden (/metrics, /health, bench; v shows them)"
        )

    def action_follow_log(self) -> None:
        if isinstance(self.focused, Input):
            self.focused.action_end()  # End in an input moves its cursor (G is typed: not a binding there)
            return
        self.logpane.follow()
        if self.live and self.session.record is not None and not self.session.tail_running:
            self.run_worker(self.session.follow(from_end=True), exclusive=True, group="follow")
            self.say("following the log again")

    def action_clear_runs(self) -> None:
        self.book = RunBook(max_age_s=self.book.max_age_s)
        self._dirty_runs = True

    def action_nccl_report(self) -> None:
        rows, note = self.session.nccl_report() if self.live else ([], None)
        if not rows:
            self.say("no NCCL variables in this preset to confirm")
            return
        self.say(
            "; ".join(f"{k}: {state}" for k, state, _ in rows) + (f" ({note})" if note else ""),
            "warning" if note else "information",
        )

    def session_refusal(self) -> str | None:
        """Why the live session may not relaunch or stop its server (a server started by hand)."""
        refusal = getattr(self.session, "refusal", None)
        return refusal() if self.live and refusal is not None else None

    def action_confirm_stop_server(self) -> None:
        if why := self.session_refusal():
            self.say(why, "error")
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.run_worker(self.action_stop_server(), group="stop", exit_on_error=False)

        self.push_screen(
            ConfirmScreen(
                f"Stop the server of {self.session.preset.name} (pid {self.session.state.pid or '?'})?",
                "Stop it [s]",
                "s",
            ),
            done,
        )

    async def action_stop_server(self) -> None:
        try:
            self.say(await self.session.stop_server())
        except (ControlError, TransportError) as e:
            self.say(str(e), "error")

    def action_pause(self) -> None:
        self.session.set_paused(not self.session.paused)

    def action_seek(self, seconds: int) -> None:
        self.session.seek(self.session.now + seconds)
        self._dirty_cycle = True

    def key_of(self, binding_id: str) -> str:
        """The key a binding has now (the keymap may have moved it), as the footer shows it."""
        for b in self.BINDINGS:
            if isinstance(b, Binding) and b.id == binding_id:
                key = self._keymap.get(binding_id, b.key).split(",")[0]
                return self.get_key_display(Binding(key, b.action, key_display=b.key_display))
        return ""

    def action_help(self) -> None:
        """tuitune's help (not Textual's key panel): keys by task and the tour; ? again closes it."""
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
            return
        self.push_screen(HelpScreen(self.key_of, lambda action: self.check_action(action, ()) is not False))

    def action_show_help_panel(self) -> None:
        self.action_help()  # Textual's own panel (its "Keys" command, F1) would list cursor keys first

    def get_system_commands(self, screen):
        """Textual's palette commands, with Quit going through tuitune's dialog and Keys replaced
        by tuitune's help."""
        for cmd in super().get_system_commands(screen):
            if cmd.title == "Keys":
                yield SystemCommand("Keys", "tuitune's keys by task and a first tour (?)", self.action_help)
            elif cmd.title == "Quit":
                yield SystemCommand(
                    "Quit", "quit tuitune (q); asks first while a server of this session runs", self.action_quit_app
                )
            else:
                yield cmd

    async def action_quit(self) -> None:
        self.action_quit_app()  # the palette's "Quit" too goes through the dialog

    def action_quit_app(self) -> None:
        if isinstance(self.screen, QuitScreen):
            return
        st = self.session.state.state if self.live else None
        if st not in ("ready", "starting"):  # nothing of ours runs: nothing to ask
            self.run_worker(self._close_session(False), group="quit", exit_on_error=False)
            return

        def done(choice: str | None) -> None:
            if choice in ("leave", "stop"):
                self.run_worker(self._close_session(choice == "stop"), group="quit", exit_on_error=False)

        self.push_screen(
            QuitScreen(self.session.preset.name, starting=st == "starting", default_stop=self.stop_on_quit), done
        )

    async def _close_session(self, stop_server: bool) -> None:
        self.cancel_relaunch()  # a start in progress is stopped, never left half-started
        try:
            await self.session.close(stop_server=stop_server)
        except (ControlError, TransportError) as e:
            self.messages.append(str(e))
        except Exception as e:  # noqa: BLE001 - whatever the clean-up hit, quitting still quits
            self.messages.append(f"closing the session failed: {type(e).__name__}: {e}")
        finally:
            self.exit()


# a number as a word: not a digit inside a name ("EAGLE-3", "H200", "Kimi-K2.5"), nor the start of "3.5"
NUMBER = re.compile(r"(?<![\w.])(?<!\w-)\d+(?:\.\d+)?(?!\w|\.\d)")


def mentions(description: str, value) -> bool:
    """Whether ``description`` mentions ``value``: a number as a number (2 matches "2 steps" and
    "2.0", not "EAGLE-3"), anything else as a whole word."""
    if value is None or isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return bool(re.search(rf"(?<![\w.-]){re.escape(str(value))}(?![\w-])", description))
    return any(float(m) == number for m in NUMBER.findall(description))


def key_words(key: str) -> list[str]:
    """The words a description names a setting by, plural "s" off: "draft", "token" for
    speculative.num_draft_tokens."""
    return [w.rstrip("s") for w in re.split(r"[._-]", key.rsplit(".", 1)[-1].lower()) if len(w) >= 3 and w != "num"]


def mentions_as(description: str, value, key: str) -> bool:
    """``value`` written next to a word of ``key`` ("3 draft tokens" for speculative.num_draft_tokens)."""
    words = key_words(key)
    tokens = re.findall(r"[\w.]+", description.lower())
    for i, tok in enumerate(tokens):
        if mentions(tok, value):
            near = tokens[max(0, i - 2) : i] + tokens[i + 1 : i + 3]
            if any(t.startswith(w) for t in near for w in words):
                return True
    return False


def _spans(description: str, value) -> list[tuple[int, int]]:
    """Where ``description`` mentions ``value`` (as ``mentions`` reads it)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        pattern = re.compile(rf"(?<![\w.-]){re.escape(str(value))}(?![\w-])")
        return [m.span() for m in pattern.finditer(description)]
    return [m.span() for m in NUMBER.finditer(description) if float(m.group()) == number]


def rewrite_description(loaded: P.Preset | None, draft: P.Preset, description: str) -> str | None:
    """The description with each changed value it mentions put right (the save dialog's ctrl+r):
    the mention beside a word of the key ("4 steps" for num_steps), else the only mention; None when
    there is nothing to fix, or a mention cannot be placed surely (twice, none beside the key) or put
    right (the setting was unset, or is on/off)."""
    if not description or loaded is None:
        return None
    out, changed = description, False
    derived = P.derived_keys(draft)
    for key, old, new in P.diff(loaded, draft):
        if not (mentions_as(out, old, key) if key in derived else mentions(out, old)):
            continue
        if new is None or isinstance(new, bool):
            return None
        words = key_words(key)
        spans = _spans(out, old)
        near = [(a, b) for a, b in spans if any(w in out[max(0, a - 16) : b + 16].lower() for w in words)]
        pick = near if len(near) == 1 else spans if len(spans) == 1 and key not in derived else []
        if not pick:
            return None
        a, b = pick[0]
        out, changed = out[:a] + str(new) + out[b:], True
    return out if changed else None


def stale_description(loaded: P.Preset | None, draft: P.Preset, description: str | None = None) -> str:
    """Why the description may no longer match: a changed setting whose old value it mentions (a
    value derived from another setting only where it is named: "3 draft tokens", not the 3 of a
    "3 steps" that is already right)."""
    desc = draft.description or "" if description is None else description
    if not desc or loaded is None:
        return ""
    derived = P.derived_keys(draft)
    for key, old, new in P.diff(loaded, draft):
        if mentions_as(desc, old, key) if key in derived else mentions(desc, old):
            return f"the description mentions {old}, but {key} is now {'(unset)' if new is None else new}: update it?"
    return ""
