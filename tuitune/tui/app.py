"""The tuitune app: wires a session (live or replayed) to the panels. No domain logic here.

Events from the session are buffered and the screen is refreshed from a 10 Hz timer, never once
per log line. Connecting, relaunching, benchmarking run in workers; the UI never blocks.

Textual binds actions, key bindings and the command palette to the App class: this module holds
the class with its layout, keys, user settings and the moves between panels; each other concern is
a class of its own module that `TuituneApp` mixes in (`appbase`: the shared state and the refresh;
`serveractions`: connect, relaunch, stop, quit; `benchactions`: benchmarks, baseline, load;
`presetactions`: edits, advice, save, open, revert). The panels are their own modules, and the
actions only call the session.
"""

from __future__ import annotations

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from tuitune.tui.advisor import AdvisorPanel
from tuitune.tui.benchactions import BenchActions
from tuitune.tui.chart import ChartPanel
from tuitune.tui.config import ConfigPanel
from tuitune.tui.cycle import CyclePanel
from tuitune.tui.gpus import GpuPanel
from tuitune.tui.header import StatusHeader
from tuitune.tui.help import HelpScreen
from tuitune.tui.logpane import LogPane
from tuitune.tui.palette import TuituneCommands
from tuitune.tui.presetactions import PresetActions
from tuitune.tui.runs import RunsTable
from tuitune.tui.serveractions import ServerActions
from tuitune.tui.settings import did_you_mean, remember_theme

REFRESH_S = 0.1
NARROW_COLS = 140  # below this the config panel collapses (e shows it) so the left side stays readable
WIDE_FOOTER_COLS = 120  # below this the footer is compact
SHORT_ROWS = 30  # below this the cycle panel drops its sparklines (bars, runs and log keep their rows)
TALL_TABS = ("tab-chart", "tab-advisor")  # on a short terminal these hide the panels above them


class TuituneApp(ServerActions, BenchActions, PresetActions):
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

    # ---- moving between panels ------------------------------------------------------------
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

    def action_pause(self) -> None:
        self.session.set_paused(not self.session.paused)

    def action_seek(self, seconds: int) -> None:
        self.session.seek(self.session.now + seconds)
        self._dirty_cycle = True

    # ---- keys and help -------------------------------------------------------------------
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
