"""The command palette's tuitune commands: every action with its key, listed as soon as it opens."""

from __future__ import annotations

from collections.abc import Iterator

from textual.command import DiscoveryHit, Hit, Hits, Provider


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
        from tuitune.tui.app import TuituneApp  # here: app.py imports this module for its COMMANDS

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
