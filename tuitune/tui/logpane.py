"""Log pane: bounded, substring filter, pauses following when scrolled up and counts new lines.

A multi-node server's other nodes have their own buffers; ``show_node`` switches the pane."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Input, Log

MAX_LINES = 5000


class FollowLog(Log):
    """A Log that knows whether the user scrolled away from the end (then it stops following)."""

    paused = False
    _resetting = False

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new < old and not self._resetting:
            self.paused = True  # only a user scrolls up: writing only ever moves down
        elif new >= self.max_scroll_y - 1:
            self.paused = False
        self.auto_scroll = not self.paused


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane { height: 1fr; }
    LogPane Input { height: 1; border: none; padding: 0 1; background: $boost; }
    LogPane Log { height: 1fr; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lines: deque[str] = deque(maxlen=MAX_LINES)  # node 0's: the server's own log
        self.node_lines: dict[int, deque[str]] = {}
        self.node = 0  # the node shown
        self.filter = ""
        self.new_while_paused = 0

    def buffer(self, node: int) -> deque[str]:
        return self.lines if node == 0 else self.node_lines.setdefault(node, deque(maxlen=MAX_LINES))

    def compose(self) -> ComposeResult:
        yield Input(placeholder="filter (substring)…  / to focus, Esc to leave", id="log-filter")
        yield FollowLog(max_lines=MAX_LINES, auto_scroll=True, id="log")


    @property
    def following(self) -> bool:
        return not self.query_one(FollowLog).paused

    def add(self, lines: list[str], node: int = 0) -> None:
        self.buffer(node).extend(lines)
        if node != self.node:
            return
        shown = [ln for ln in lines if self.filter in ln] if self.filter else lines
        if not shown:
            return
        log = self.query_one(FollowLog)
        follow = self.following
        log.write_lines(shown)
        if follow:
            self.new_while_paused = 0
        else:
            self.new_while_paused += len(shown)
        self._subtitle()

    @property
    def status(self) -> str:
        if self.new_while_paused:
            return f"paused: {self.new_while_paused} new line(s), End to follow"
        return f"filter: {self.filter}" if self.filter else ""

    def _subtitle(self) -> None:
        self.query_one(Input).placeholder = self.status or "filter (substring)…  / to focus, Esc to leave"
        self.query_one(FollowLog).border_subtitle = self.status

    def set_filter(self, text: str) -> None:
        self.filter = text
        log = self.query_one(FollowLog)
        log._resetting = True
        log.clear()
        log.paused = False
        log.auto_scroll = True
        lines = self.buffer(self.node)
        log.write_lines([ln for ln in lines if text in ln] if text else list(lines))
        log._resetting = False
        self.new_while_paused = 0
        self._subtitle()

    def show_node(self, node: int, title: str | None) -> None:
        """Show node ``node``'s log (0: the server's); ``title`` names it, None on one machine."""
        self.node = node
        self.query_one(FollowLog).border_title = title
        self.set_filter(self.filter)

    def follow(self) -> None:
        log = self.query_one(FollowLog)
        log.paused = False
        log.auto_scroll = True
        log.scroll_end(animate=False)
        self.new_while_paused = 0
        self._subtitle()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-filter":
            self.set_filter(event.value)
