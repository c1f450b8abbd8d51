"""Log pane: bounded, substring filter, follows the end unless the user scrolled away.

Following is explicit state, changed only by what the user does (scrolling up pauses; End, G or
scrolling back to the end resumes), never inferred from scroll positions: a resize, a rebuilt
filter or a panel growing above moves the scroll position without the user asking to stop. A
multi-node server's other nodes have their own buffers; ``show_node`` switches the pane. The
access-log lines of tuitune's own requests (its ``/metrics`` scrapes, health checks, benchmark
requests) are hidden unless asked for: on a real server they are most of the log. A line repeated
(timestamps aside) is shown once with a count that grows in place (``Fold``): SGLang logs one line a
decode step for a request whose client left, which would push every other line off the pane. The
buffers keep every line as it came.
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


# the timestamps the engines print: SGLang's ``[2026-12-04 23:09:59]``, vLLM's ``INFO 12-04 23:09:59``
_STAMP = re.compile(r"\d{2,4}-\d{2}(?:-\d{2})?[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?")


def repeat_key(line: str) -> str:
    """What two lines must share to count as one repeated: the line without its timestamps."""
    return _STAMP.sub("", line).strip()


def fold_marker(n: int) -> str:
    return f"    ⋯ the line above, {n} more time{'s' if n != 1 else ''}"


class Fold:
    """Consecutive repeats of one line shown once, then a marker line counting them, which later
    repeats update in place (``feed``'s first value) instead of adding lines."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.repeats = 0  # of the last line shown, after it

    def feed(self, lines: list[str]) -> tuple[str | None, list[str]]:
        """(the new text of the last line written, or None; the lines to write after it)."""
        update: str | None = None
        out: list[str] = []
        marker_in_out = False
        for ln in lines:
            k = repeat_key(ln)
            if k == self.key:
                self.repeats += 1
                if marker_in_out:
                    out[-1] = fold_marker(self.repeats)
                elif self.repeats == 1:
                    out.append(fold_marker(1))
                    marker_in_out = True
                else:  # the marker was written before this batch: it is the last line shown
                    update = fold_marker(self.repeats)
                continue
            self.key, self.repeats, marker_in_out = k, 0, False
            out.append(ln)
        return update, out


def own_request(line: str) -> bool:
    """An access-log line of a request tuitune itself makes (its path is one of OWN_PATHS)."""
    m = _ACCESS.search(line)
    return m is not None and m.group(1) in OWN_PATHS


class FollowLog(Log):
    BINDINGS = [Binding("k", "scroll_up", show=False), Binding("j", "scroll_down", show=False)]
    following = True

    def replace_last(self, text: str) -> None:
        """The last line's text replaced (a fold's count); nothing when the log is empty."""
        lines = getattr(self, "_lines", None)  # Textual's Log keeps its lines there
        if not lines:
            return
        lines[-1] = text
        self.refresh_lines(len(lines) - 1)

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
        self.fold = Fold()  # of the lines shown

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
        update, shown = self.fold.feed(shown)
        log = found.first()
        if update is not None:
            log.replace_last(update)
        if not shown:
            if lines:
                self._subtitle()
            return
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
        self.fold = Fold()
        log.write_lines(self.fold.feed([ln for ln in self.buffer(self.node) if self.shows(ln)])[1])
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
