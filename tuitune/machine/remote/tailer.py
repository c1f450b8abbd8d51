"""The remote half of ``LogTail``: follows a file by name, like ``tail -F``, with framed output.

Runs on the target with the server's python (stdlib only; sent as ``python -I -S -c SOURCE``, so
nothing is uploaded and the path arrives as an argument, never inside shell code).
Usage: ``python -c SOURCE PATH OFFSET IDENTITY [CHECK]`` (IDENTITY ``dev:inode`` of the file
OFFSET belongs to, or ``-`` when unknown; CHECK ``<n>:<sha256 hex>`` of the n bytes before OFFSET
as the client read them, or ``-``).

Why not ``tail -F``: its notices share the stream with the content, so a log line that reads
like a notice was taken for one; and after a reconnect the old offset was applied to a rotated
file. Here every record is framed, so content can never pass for a notice:

    D <n>\\n<n bytes>    content
    I <dev>:<ino>\\n     the file being read from now on (kept by the client for its reconnects)
    R <why>\\n           the content that follows starts at byte 0 of a new or truncated file
    W <text>\\n          a notice for people (cannot open, waiting for the file)

The file is replaced (rotation) when the name points to another inode; it is truncated when it
is shorter than what was read, or when the bytes before OFFSET are no longer the ones the client
read (CHECK: truncated in place and regrown past OFFSET while nobody watched, same inode, larger
size). A rotated file is read to its end before the new one.
Between reads it sleeps on inotify (the file's directory; libc through ctypes), so a new line
arrives within a millisecond; where inotify is missing it polls every 50 ms at most.
"""

import hashlib
import os
import select
import sys
import time

CHUNK = 256 * 1024
_WATCH = 0x2 | 0x4 | 0x40 | 0x80 | 0x100 | 0x200  # modify, attrib, moved from/to, create, delete


def _inotify():
    """A function that waits on the directory's inotify events (or polls), for ``path``."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        fd = -1
    watched = []

    def wait(path, timeout):
        if fd >= 0 and not watched:
            d = os.path.dirname(os.path.abspath(path)).encode()
            if libc.inotify_add_watch(fd, d, _WATCH) >= 0:
                watched.append(d)
        if not watched:
            time.sleep(timeout)
            return
        if select.select([fd], [], [], max(timeout, 0.25))[0]:
            try:
                while os.read(fd, 65536):
                    pass
            except BlockingIOError:
                pass

    return wait


def _same_bytes(fd, offset, check):
    """Whether the bytes before ``offset`` still hash as ``check`` says ("-": nothing to compare)."""
    if check in ("-", ""):
        return True
    n, _, digest = check.partition(":")
    try:
        n = int(n)
    except ValueError:
        return True
    if n <= 0 or n > offset:
        return True
    os.lseek(fd, offset - n, os.SEEK_SET)
    got, left = [], n
    while left > 0:
        piece = os.read(fd, min(left, CHUNK))
        if not piece:
            return False
        got.append(piece)
        left -= len(piece)
    return hashlib.sha256(b"".join(got)).hexdigest() == digest


def main(path, offset, identity, check="-"):
    out = sys.stdout.buffer

    def emit(record, data=b""):
        out.write(record.encode("utf-8", "replace") + b"\n" + data)
        out.flush()

    def ident(st):
        return "%d:%d" % (st.st_dev, st.st_ino)

    fd, current, pos, first, warned, idle = None, None, 0, True, None, 0.005
    wait = _inotify()
    while True:
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                if warned != e.strerror:
                    emit("W cannot open %s: %s; waiting for it" % (path, e.strerror))
                    warned = e.strerror
                time.sleep(0.1)
                continue
            st = os.fstat(fd)
            current, warned = ident(st), None
            if first and identity not in ("-", current):
                emit("R replaced")
                pos = 0
            elif first and st.st_size < offset:
                emit("R truncated")
                pos = 0
            elif first and not _same_bytes(fd, offset, check):
                emit("R rewritten")
                pos = 0
            elif first:
                pos = offset
            else:
                emit("R replaced")
                pos = 0
            first = False
            emit("I " + current)
            os.lseek(fd, pos, os.SEEK_SET)
        data = os.read(fd, CHUNK)
        if data:
            emit("D %d" % len(data), data)
            pos += len(data)
            idle = 0.005
            continue
        try:
            named = ident(os.stat(path))
        except OSError:
            named = None  # moved away and not recreated yet: keep reading the old file
        if named is not None and named != current:
            os.close(fd)
            fd = None
            continue
        if os.fstat(fd).st_size < pos:
            emit("R truncated")
            pos = 0
            os.lseek(fd, 0, os.SEEK_SET)
            continue
        wait(path, idle)
        idle = min(0.05, idle * 2)


if __name__ == "__main__":
    try:
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "-")
    except (BrokenPipeError, KeyboardInterrupt):
        pass
