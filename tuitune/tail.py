"""Exactly-once log tail over any transport, with ``tail -F`` semantics.

The remote side is ``tail -c +OFFSET -F FILE`` with stderr merged into stdout, so tail's own
notices ("file truncated", "has been replaced", "has appeared") arrive in order with the content
(glibc's error() flushes stdout first). ``offset`` counts the bytes of content up to the last
complete line handed out; after a reconnect the tail resumes from it, so no line is lost and none
is repeated. A partial last line is held until its newline arrives. If the file shrank while the
link was down, the remote script says so with the same notice and the tail starts from byte 0.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

from .preset import shell_path
from .transport import LinkLost, Transport, TransportError

_NOTICE_WORDS = (b"file truncated", b"has been replaced", b"has appeared", b"has become inaccessible",
                 b"cannot open", b"no longer exists", b"cannot follow")
_RESETS = (b"file truncated", b"has been replaced", b"has appeared")
MAX_LINE = 1024 * 1024


def _notices(chunk: bytes):
    """(start, end) of each of tail's notices in a chunk: from the first "tail: " of a line to its
    newline, when the rest of that line names a notice. Each line is looked at once, so the cost is
    linear (a regular expression here took 91 s on 256 KiB of "tail: ")."""
    pos = chunk.find(b"tail: ")
    while pos >= 0:
        nl = chunk.find(b"\n", pos)
        if nl < 0:
            return
        if any(w in chunk[pos:nl] for w in _NOTICE_WORDS):
            yield pos, nl + 1
        pos = chunk.find(b"tail: ", nl + 1)


async def file_size(t: Transport, path: str) -> int:
    """Size of a file on the target in bytes (0 when it does not exist yet)."""
    r = await t.run(f"stat -c %s {shell_path(path)} 2>/dev/null", timeout=30)
    text = r.stdout.strip()
    return int(text) if r.ok and text.isdigit() else 0


@dataclass(frozen=True, slots=True)
class TailBatch:
    lines: list[str]
    offset: int  # content bytes consumed so far (resume point)
    reset: bool = False  # the file was truncated or replaced before these lines


class LogTail:
    def __init__(self, transport: Transport, path: str, offset: int = 0, max_line: int = MAX_LINE,
                 retry_delay: float = 0.5):
        self.transport = transport
        self.path = path
        self.offset = offset
        self.max_line = max_line
        self.retry_delay = retry_delay
        self.truncated_lines = 0  # lines cut at max_line
        self.resets = 0
        self._partial = bytearray()
        self._skipping = False
        self._pending_skip = 0
        self._closed = False

    def command(self) -> str:
        f = shell_path(self.path)
        return (f"size=$(stat -c %s {f} 2>/dev/null || echo -1); start={self.offset + 1}; "
                f"if [ \"$size\" -ge 0 ] && [ \"$size\" -lt {self.offset} ]; then "
                f"echo \"tail: {self.path}: file truncated\"; start=1; fi; "
                f"exec tail -c +$start -F {f} 2>&1")

    def close(self) -> None:
        self._closed = True

    async def batches(self) -> AsyncIterator[TailBatch]:
        while not self._closed:
            try:
                async for chunk in self.transport.stream(self.command()):
                    batch = self.feed(chunk)
                    if batch is not None:
                        yield batch
                    if self._closed:
                        return
            except LinkLost:
                if self._closed:
                    return
                self._drop_partial()
                await self.transport.reconnect()
                continue
            except TransportError:
                raise
            if self._closed:
                return
            # tail ended without a link error (killed on the target): start it again
            self._drop_partial()
            await asyncio.sleep(self.retry_delay)

    def _drop_partial(self) -> None:
        """Forget bytes after the last newline: they are re-read from ``offset``."""
        self._partial.clear()
        self._skipping = False

    def feed(self, chunk: bytes) -> TailBatch | None:
        """Consume raw tail output; return the complete lines it finished (pure, testable)."""
        lines: list[str] = []
        reset = False
        pos = 0
        for start, end in _notices(chunk):
            self._content(chunk[pos:start], lines)
            if any(r in chunk[start:end] for r in _RESETS):
                self.offset = 0
                self._drop_partial()
                self.resets += 1
                reset = True
            pos = end
        self._content(chunk[pos:], lines)
        if not lines and not reset:
            return None
        return TailBatch(lines, self.offset, reset)

    def _content(self, data: bytes, lines: list[str]) -> None:
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
