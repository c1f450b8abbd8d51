"""Log pane: bounded, substring filter, follows the end unless the user scrolled away.

Following is explicit state, changed only by what the user does (scrolling up pauses; End, G or
scrolling back to the end resumes), never inferred from scroll positions: a resize, a rebuilt
filter or a panel growing above moves the scroll position without the user asking to stop. A
multi-node server's other nodes have their own buffers; ``show_node`` switches the pane.
"""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Log

MAX_LINES = 5000
FILTER_HINT = "filter (substring)…  / to focus, Esc to leave"


class FollowLog(Log):
    BINDINGS = [Binding("k", "scroll_up", show=False), Binding("j", "scroll_down", show=False)]
    following = True

    class Moved(Message):
        """The user paused or resumed following."""

    def _set_following(self, on: bool) -> None:
        if on != self.following:
            self.following = on
            self.auto_scroll = on
            self.post_message(self.Moved())

    def _user_up(self) -> None:
        if self.max_scroll_y > 0:
            self._set_following(False)

    def _user_down(self) -> None:
        if self.scroll_target_y >= self.max_scroll_y:
            self._set_following(True)

    def action_scroll_up(self) -> None:
        self._user_up()
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self._user_up()
        super().action_page_up()

    def action_scroll_home(self) -> None:
        self._user_up()
        super().action_scroll_home()

    def _on_mouse_scroll_up(self, event) -> None:
        self._user_up()
        super()._on_mouse_scroll_up(event)

    def action_scroll_down(self) -> None:
        super().action_scroll_down()
        self._user_down()

    def action_page_down(self) -> None:
        super().action_page_down()
        self._user_down()

    def _on_mouse_scroll_down(self, event) -> None:
        super()._on_mouse_scroll_down(event)
        self._user_down()

    def action_scroll_end(self) -> None:
        self.follow()

    def follow(self) -> None:
        self._set_following(True)
        self.scroll_end(animate=False, immediate=True)

    def on_resize(self) -> None:
        if self.following:
            self.scroll_end(animate=False)


class LogPane(Vertical):
    DEFAULT_CSS = """
    LogPane { height: 1fr; }
    LogPane Input { height: 1; border: none; padding: 0 1; background: $boost; }
    LogPane Input:focus { border: none; background: $accent 30%; }
    LogPane Log { height: 1fr; overflow-x: hidden; }
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
        yield Input(placeholder=FILTER_HINT, id="log-filter")
        yield FollowLog(max_lines=MAX_LINES, auto_scroll=True, id="log")

    @property
    def following(self) -> bool:
        return self.query_one(FollowLog).following

    def add(self, lines: list[str], node: int = 0) -> None:
        self.buffer(node).extend(lines)
        if node != self.node:
            return
        shown = [ln for ln in lines if self.filter in ln] if self.filter else lines
        if not shown:
            return
        log = self.query_one(FollowLog)
        log.write_lines(shown)
        if log.following:
            log.scroll_end(animate=False)
        else:
            self.new_while_paused += len(shown)
        self._subtitle()

    @property
    def status(self) -> str:
        if not self.following:
            return f"paused · {self.new_while_paused} new · End/G to follow"
        return f"filter: {self.filter}" if self.filter else "following"

    def _subtitle(self) -> None:
        self.query_one(FollowLog).border_subtitle = self.status
        self.query_one(Input).placeholder = FILTER_HINT if self.following else self.status

    def set_filter(self, text: str) -> None:
        self.filter = text
        log = self.query_one(FollowLog)
        log.clear()
        lines = self.buffer(self.node)
        log.write_lines([ln for ln in lines if text in ln] if text else list(lines))
        if log.following:
            log.scroll_end(animate=False)
        self._subtitle()

    def show_node(self, node: int, title: str | None) -> None:
        """Show node ``node``'s log (0: the server's); ``title`` names it, None on one machine."""
        self.node = node
        self.query_one(FollowLog).border_title = title
        self.set_filter(self.filter)

    def follow(self) -> None:
        self.query_one(FollowLog).follow()
        self.new_while_paused = 0
        self._subtitle()

    def on_follow_log_moved(self, event: FollowLog.Moved) -> None:
        event.stop()
        if self.following:
            self.new_while_paused = 0
        self._subtitle()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-filter":
            self.set_filter(event.value)
