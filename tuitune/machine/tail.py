"""Exactly-once log tail over any transport, with ``tail -F`` semantics.

The remote side is ``tailer.py`` (sent as ``python -c``, the path passed as an argument): it
follows the file by name and frames its output, so content and notices can never be confused
(a log line that reads "tail: x: file truncated" is just a line). ``offset`` counts the bytes of
content up to the last complete line handed out and ``identity`` names the file (device and
inode) they came from; after a reconnect the tail resumes from ``offset`` only when the name
still points to that file, it is not shorter, and the bytes just before ``offset`` are still the
ones that were read (a SHA-256 of the last ``CHECK_WINDOW`` bytes: a file truncated in place and
regrown past the old offset while the link was down keeps its inode and passes the size check),
otherwise it starts again from byte 0 and says so (``reset``). No line is lost and none is
repeated. A partial last line is held until its newline arrives.

A lost link is retried without end (``Transport.resume``, the one policy of every follower), so
``tuitune logs -f``, ``--record`` and the TUI all follow across an outage of any length.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import resources

from tuitune.machine.transport import LinkLost, Transport
from tuitune.preset import shell_path

MAX_LINE = 1024 * 1024
CHECK_WINDOW = 64 * 1024  # bytes before the offset whose checksum a resumed tail compares
_TAILER = resources.files("tuitune.machine.remote").joinpath("tailer.py").read_text()


async def file_size(t: Transport, path: str) -> int:
    """Size of a file on the target in bytes (0 when it does not exist yet). Where a tail is to
    start: a link lost meanwhile is waited out as every follower waits it out (``resume``)."""
    while True:
        try:
            r = await t.run(f"stat -c %s -- {shell_path(path)} 2>/dev/null", timeout=30)
            break
        except LinkLost:
            await t.resume()
    text = r.stdout.strip()
    return int(text) if r.ok and text.isdigit() else 0


@dataclass(frozen=True, slots=True)
class TailBatch:
    lines: list[str]
    offset: int  # content bytes consumed so far (resume point)
    reset: bool = False  # the file was truncated or replaced before these lines


class LogTail:
    """``state`` is "starting", "following", "reconnecting" or "closed"; ``on_state`` hears changes.

    A lost link is retried without end (``Transport.resume``); only an error that retrying cannot
    fix (authentication, a host key, a closed transport) ends the iteration, raised.
    """

    def __init__(
        self,
        transport: Transport,
        path: str,
        offset: int = 0,
        max_line: int = MAX_LINE,
        retry_delay: float = 0.5,
        python: str = "python3",
        on_state: Callable[[str], None] | None = None,
    ):
        self.transport = transport
        self.path = path
        self.offset = offset
        self.identity = "-"  # dev:inode of the file ``offset`` belongs to, "-" while unknown
        self.max_line = max_line
        self.retry_delay = retry_delay
        self.python = python
        self.on_state = on_state
        self.state = "starting"
        self.notice: str | None = None  # the tailer's last notice for people (cannot open …)
        self.truncated_lines = 0  # lines cut at max_line
        self.resets = 0
        self._buf = bytearray()  # framing bytes not parsed yet
        self._need = 0  # content bytes still due in the current D record
        self._partial = bytearray()
        self._skipping = False
        self._pending_skip = 0
        self._closed = False
        self._window = b""  # the last CHECK_WINDOW content bytes before ``offset``, as read
        self._open = b""  # content bytes read after ``offset`` (the partial line; its last CHECK_WINDOW)

    def command(self) -> str:
        """The remote command: every value is quoted; the path is an argument, never shell code."""
        return (
            f"{shell_path(self.python)} -I -S -c {shlex.quote(_TAILER)} "
            f"{shell_path(self.path)} {int(self.offset)} {shlex.quote(self.identity)} "
            f"{shlex.quote(self.check())} 2>/dev/null"
        )

    def check(self) -> str:
        """``<n>:<sha256>`` of the last n bytes before ``offset`` as this tail read them ("-" when
        it read none yet): the tailer starts again from byte 0 when the file holds others there."""
        if not self._window:
            return "-"
        return f"{len(self._window)}:{hashlib.sha256(self._window).hexdigest()}"

    def close(self) -> None:
        self._closed = True
        self._set_state("closed")

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            if self.on_state is not None:
                self.on_state(state)

    async def batches(self) -> AsyncIterator[TailBatch]:
        while not self._closed:
            self._reset_framing()
            try:
                self._set_state("following")
                async for chunk in self.transport.stream(self.command()):
                    batch = self.feed(chunk)
                    if batch is not None:
                        yield batch
                    if self._closed:
                        return
            except LinkLost:
                if self._closed:
                    return
                self._set_state("reconnecting")
                if not await self.transport.resume(lambda: self._closed):
                    return
                continue
            if self._closed:
                return
            # the tailer ended without a link error (killed on the target, no python): start it again
            await asyncio.sleep(self.retry_delay)

    def _reset_framing(self) -> None:
        """A new tailer starts: forget bytes after the last newline (re-read from ``offset``)."""
        self._buf.clear()
        self._need = 0
        self._partial.clear()
        self._skipping = False
        self._open = b""

    def feed(self, chunk: bytes) -> TailBatch | None:
        """Consume the tailer's framed output; return the complete lines it finished (pure, testable)."""
        lines: list[str] = []
        reset = False
        self._buf += chunk
        pos = 0
        buf = self._buf
        while pos < len(buf):
            if self._need:
                take = min(self._need, len(buf) - pos)
                self._content(bytes(buf[pos : pos + take]), lines)
                self._need -= take
                pos += take
                continue
            nl = buf.find(b"\n", pos, pos + 4096)
            if nl < 0:
                if len(buf) - pos > 4096:  # no record header is this long: remote noise, dropped
                    pos = len(buf)
                break
            kind, _, arg = bytes(buf[pos:nl]).decode("utf-8", "replace").partition(" ")
            pos = nl + 1
            if kind == "D" and arg.isdigit():
                self._need = int(arg)
            elif kind == "I":
                self.identity = arg
            elif kind == "R":
                self.offset = 0
                self._window = self._open = b""
                self._partial.clear()
                self._skipping = False
                self.resets += 1
                reset = True
            else:  # W, or anything the remote shell said (never content)
                self.notice = (arg if kind == "W" else f"{kind} {arg}").strip()[:300]
        del buf[:pos]
        if not lines and not reset:
            return None
        return TailBatch(lines, self.offset, reset)

    def _remember(self, data: bytes) -> None:
        """Keep the window of bytes before ``offset`` up to date with this piece of content."""
        nl = data.rfind(b"\n")
        if nl < 0:
            self._open = (self._open + data)[-CHECK_WINDOW:]
            return
        done = data[: nl + 1]
        if len(done) >= CHECK_WINDOW:
            self._window = done[-CHECK_WINDOW:]
        else:
            self._window = (self._window + self._open + done)[-CHECK_WINDOW:]
        self._open = data[nl + 1 :][-CHECK_WINDOW:]

    def _content(self, data: bytes, lines: list[str]) -> None:
        self._remember(data)
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                rest = data[start:]
                if not self._skipping:
                    self._partial += rest
                    if len(self._partial) > self.max_line:
                        lines.append(self._partial[: self.max_line].decode("utf-8", "replace") + " …[line truncated]")
                        self.truncated_lines += 1
                        self._skipping = True
                        self._pending_skip = len(self._partial)
                        self._partial.clear()
                else:
                    self._pending_skip += len(rest)
                return
            piece = data[start:nl]
            if self._skipping:
                self.offset += self._pending_skip + len(piece) + 1
                self._skipping = False
            else:
                full = bytes(self._partial) + piece if self._partial else piece
                self._partial.clear()
                self.offset += len(full) + 1
                if len(full) > self.max_line:
                    self.truncated_lines += 1
                    lines.append(full[: self.max_line].decode("utf-8", "replace") + " …[line truncated]")
                else:
                    lines.append(full.decode("utf-8", "replace").rstrip("\r"))
            start = nl + 1
