"""Log pane: bounded, substring filter, follows the end unless the user scrolled away.

Following is explicit state, changed only by what the user does (scrolling up pauses; End, G or
scrolling back to the end resumes), never inferred from scroll positions: a resize, a rebuilt
filter or a panel growing above moves the scroll position without the user asking to stop. A
multi-node server's other nodes have their own buffers; ``show_node`` switches the pane. The
access-log lines of tuitune's own requests (its ``/metrics`` scrapes, health checks, benchmark
requests) are hidden unless asked for: on a real server they are most of the log.
"""

from __future__ import annotations

import re
from collections import deque

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Log

MAX_LINES = 5000
FILTER_HINT = "filter (substring)…  / to focus, Esc to leave"
# What tuitune itself asks a server (scrapes, health checks, its benchmark and detection requests):
# their access-log lines are hidden unless asked for (``toggle_own``)
OWN_PATHS = frozenset(
    (
        "/metrics",
        "/health",
        "/health_generate",
        "/generate",
        "/v1/completions",
        "/v1/models",
        "/server_info",
        "/get_server_info",
        "/get_model_info",
        "/model_info",
        "/version",
        "/sim/state",
    )
)
# uvicorn's access-log line, through which SGLang and vLLM both serve:
# ``INFO:     127.0.0.1:43512 - "GET /metrics HTTP/1.1" 200 OK`` (after any logger prefix)
_ACCESS = re.compile(r'INFO:\s+\S+ - "[A-Z]+ (/[^ ?"]*)[^ "]* HTTP/[0-9.]+" \d{3}\b')


def own_request(line: str) -> bool:
    """An access-log line of a request tuitune itself makes (its path is one of OWN_PATHS)."""
    m = _ACCESS.search(line)
    return m is not None and m.group(1) in OWN_PATHS


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


class FilterInput(Input):
    """The log's filter: focused by `/` (``LogPane.focus_filter``), never by Tab, so that Tab
    through the panels does not land where `j`, `k`, `m` are typed as text (and blank the log)."""

    armed = False

    def allow_focus(self) -> bool:
        return self.armed and super().allow_focus()

    def on_blur(self) -> None:
        self.armed = False


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
        self.show_own = False  # tuitune's own requests' access-log lines (v shows them)
        self.own_hidden = 0  # of the lines seen, how many were hidden as tuitune's own

    def buffer(self, node: int) -> deque[str]:
        return self.lines if node == 0 else self.node_lines.setdefault(node, deque(maxlen=MAX_LINES))

    def compose(self) -> ComposeResult:
        yield FilterInput(placeholder=FILTER_HINT, id="log-filter")
        yield FollowLog(max_lines=MAX_LINES, auto_scroll=True, id="log")

    def on_mount(self) -> None:
        if self.buffer(self.node):
            self.set_filter(self.filter)  # what arrived before the pane was composed

    @property
    def following(self) -> bool:
        return self.query_one(FollowLog).following

    def shows(self, line: str) -> bool:
        return (not self.filter or self.filter in line) and (self.show_own or not own_request(line))

    def add(self, lines: list[str], node: int = 0) -> None:
        self.buffer(node).extend(lines)
        if node != self.node:
            return
        shown = [ln for ln in lines if self.shows(ln)]
        if not self.show_own:
            self.own_hidden += sum(1 for ln in lines if own_request(ln))
        found = self.query(FollowLog)
        if not found:  # not composed yet (an attach's history can come first): on_mount writes the buffer
            return
        if not shown:
            if lines:
                self._subtitle()
            return
        log = found.first()
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
        text = f"filter: {self.filter}" if self.filter else "following"
        if self.filter and not any(self.shows(ln) for ln in self.buffer(self.node)):
            text = f"no line contains {self.filter!r} (/ then clear the filter)"
        if not self.show_own and self.own_hidden:
            text += f" · {self.own_hidden} of tuitune's own requests hidden (v shows)"
        return text

    def _subtitle(self) -> None:
        self.query_one(FollowLog).border_subtitle = self.status
        self.query_one(Input).placeholder = FILTER_HINT if self.following else self.status

    def set_filter(self, text: str) -> None:
        self.filter = text
        log = self.query_one(FollowLog)
        log.clear()
        log.write_lines([ln for ln in self.buffer(self.node) if self.shows(ln)])
        if log.following:
            log.scroll_end(animate=False)
        self._subtitle()

    def toggle_own(self) -> bool:
        """Show or hide the access-log lines of tuitune's own requests; True when now shown."""
        self.show_own = not self.show_own
        self.own_hidden = 0 if self.show_own else sum(1 for ln in self.buffer(self.node) if own_request(ln))
        self.set_filter(self.filter)
        return self.show_own

    def show_node(self, node: int, title: str | None) -> None:
        """Show node ``node``'s log (0: the server's); ``title`` names it, None on one machine."""
        self.node = node
        self.query_one(FollowLog).border_title = title
        self.set_filter(self.filter)

    def focus_filter(self) -> None:
        box = self.query_one(FilterInput)
        box.armed = True
        box.focus()

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
