"""tuitune's own help (`?`): its keys grouped by what you are doing, and a first five minutes tour.

The keys shown are the bindings' current keys (a keymap in the config file moves them here too);
an entry whose action is off in this session (relaunch in a replay, seek live) is left out. The
tour is also docs/tour.md (tests/tui/test_tui_help.py keeps the two saying the same steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static


@dataclass(frozen=True)
class Entry:
    text: str  # what it does, at most TEXT_W characters
    ids: tuple[str, ...] = ()  # binding ids whose keys are shown (the keymap can move them)
    keys: str = ""  # or keys that are not tuitune's bindings (Tab, Esc, Ctrl+P)
    action: str | None = None  # hidden when this action is off here (live vs replay)


KEY_W = 7
TEXT_W = 30

GROUPS: tuple[tuple[str, tuple[Entry, ...]], ...] = (
    (
        "watch",
        (
            Entry("background load on / off", ("tuitune.load",), action="toggle_load"),
            Entry("one load stream more / fewer", ("tuitune.load_more", "tuitune.load_less"), action="load_more"),
            Entry("GPU panel: rows/summary/off", ("tuitune.gpus",)),
            Entry("next tab: log, chart, advisor", ("tuitune.tab",)),
            Entry("log / chart / advisor tab", ("tuitune.tab_log", "tuitune.tab_chart", "tuitune.tab_advisor")),
            Entry("chart: runs, phases, goodput", ("tuitune.chart",)),
            Entry("filter the log (Esc leaves)", ("tuitune.filter",)),
            Entry("follow the log again", ("tuitune.follow", "tuitune.follow_end")),
            Entry("next panel; j k move in it", keys="Tab"),
            Entry("next node's log (multi-node)", ("tuitune.next_node",)),
            Entry("play / pause the replay", ("tuitune.pause",), action="pause"),
            Entry("seek 10 s back / forward", ("tuitune.seek_back", "tuitune.seek_fwd"), action="seek"),
        ),
    ),
    (
        "change and relaunch",
        (
            Entry("edit the configuration", ("tuitune.edit",)),
            Entry("leave a field or the panel", keys="Esc"),
            Entry("relaunch (Esc cancels a start)", ("tuitune.relaunch",), action="relaunch"),
            Entry("open a preset (a diff first)", ("tuitune.open",)),
        ),
    ),
    (
        "measure",
        (
            Entry("bench: a row in the runs table", ("tuitune.bench",), action="bench"),
            Entry("bench over concurrency levels", ("tuitune.bench_levels",), action="bench_levels"),
            Entry("make the selected run the base", ("tuitune.mark_baseline",)),
            Entry("Δ significant / ≈ is not", keys="▲ ▼ ≈"),
        ),
    ),
    (
        "decide",
        (
            Entry("advisor: predicted goodput", ("tuitune.tab_advisor",)),
            Entry("apply its top suggestion", ("tuitune.apply_advice",)),
            Entry("predicted faster; ≈ in the CI", keys="▶ ≈"),
            Entry("running best: measure this", keys="▷"),
            Entry("then relaunch it and bench it", ("tuitune.relaunch", "tuitune.bench"), action="relaunch"),
        ),
    ),
    (
        "save",
        (
            Entry("save as a preset of yours", ("tuitune.save",)),
            Entry("quit (asks if a server runs)", ("tuitune.quit",)),
            Entry("palette: every action by name", keys="^p"),
        ),
    ),
)

# (binding id, what the step does, what to look at): the tour of `tuitune demo` (or your own server)
TOUR: tuple[tuple[str, str], ...] = (
    ("tuitune.load", "load: the server decodes, the cycle panel fills (on in the demo)"),
    ("tuitune.bench", "benchmark: a row of tok/s with its 95% CI; the first is the base ★"),
    ("tuitune.tab_advisor", "the advisor tab: predicted goodput of the neighbouring configs"),
    ("tuitune.apply_advice", "its top suggestion into the config panel (header: modified)"),
    ("tuitune.relaunch", "relaunch with it; the progress view closes when it is ready"),
    ("tuitune.bench", "benchmark again: Δ vs base ▲ faster, ▼ slower, ≈ no clear change"),
    ("tuitune.mark_baseline", "the selected run (the newest; j/k move) becomes the baseline"),
    ("tuitune.save", "save it as a preset of yours (type the name, then Enter)"),
)
TOUR_TITLE = "the first five minutes"


class HelpScreen(ModalScreen[None]):
    """The keys by task in two columns (they fit 80×24 without scrolling), then the tour below."""

    BINDINGS = [
        Binding("escape,question_mark", "close", "close", id="help.close"),
        Binding("q", "app.quit_app", "quit", id="help.quit"),
    ]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                  border: thick $primary; background: $surface; padding: 0 1; }
    HelpScreen Horizontal { height: auto; }
    HelpScreen Vertical { width: 1fr; height: auto; }
    HelpScreen .group { height: auto; }
    HelpScreen #tour { height: auto; margin-top: 1; }
    """

    def __init__(self, key_of, available) -> None:
        """``key_of(binding id)``: its current key as shown; ``available(action)``: on here."""
        super().__init__()
        self.key_of = key_of
        self.available = available

    def entries(self, group: tuple[Entry, ...]) -> list[tuple[str, str]]:
        out = []
        for e in group:
            if e.action and not self.available(e.action):
                continue
            keys = e.keys or " ".join(dict.fromkeys(k for k in map(self.key_of, e.ids) if k))
            if keys:
                out.append((keys, e.text))
        return out

    def group_text(self, title: str, group: tuple[Entry, ...]) -> Content:
        parts: list = [(title, "bold")]
        for keys, text in self.entries(group):
            parts += ["\n ", (f"{keys:<{KEY_W - 1}}", "bold $accent"), text]
        return Content.assemble(*parts)

    def tour_text(self) -> Content:
        parts: list = [(f"{TOUR_TITLE} (tuitune demo, or your own server)", "bold")]
        for i, (bid, text) in enumerate(TOUR, 1):
            parts += [f"\n {i}. ", (f"{self.key_of(bid) or '?':<3}", "bold $accent"), f" {text}"]
        return Content.assemble(*parts)

    def compose(self) -> ComposeResult:
        groups = dict(GROUPS)
        with VerticalScroll(id="help-box"):
            with Horizontal():
                with Vertical(id="help-left"):
                    for title in ("watch", "save"):
                        yield Static(self.group_text(title, groups[title]), classes="group", id=f"help-{title[:5]}")
                with Vertical(id="help-right"):
                    for title in ("change and relaunch", "measure", "decide"):
                        yield Static(self.group_text(title, groups[title]), classes="group", id=f"help-{title[:5]}")
            yield Static(self.tour_text(), id="tour")

    def on_mount(self) -> None:
        box = self.query_one("#help-box")
        box.border_title = "tuitune keys"
        box.border_subtitle = "↓ the first five minutes · Esc closes"
        box.focus()

    def action_close(self) -> None:
        self.dismiss(None)
