"""The port's lock on the target: one launch, stop, adopt or exit record at a time per port.

The lock lives as long as one remote process (``remote.py lock``), so a client that dies or loses
its link releases it; a second caller is told who holds it (the holder's note: action, preset,
client, since)."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from tuitune.machine.errors import ControlError
from tuitune.machine.host import Host

LOCK_ANSWER_S = 60.0  # the lock helper answers in milliseconds; a python that hangs at start does not
HELPER_EXITED = "ERROR the lock helper exited"
OWN_RELEASE_S = 3.0  # how long a lock this process let go may still read as held (its helper dying)
_HELD: set[tuple[str, str]] = set()  # (target, lock path) this process holds now


def _lock_note(line: str) -> dict | None:
    """The holder's note in a BUSY answer (action, preset, client, since), if it is one."""
    try:
        note = json.loads(line[4:]) if line.startswith("BUSY") else None
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


def _lock_answer(head: bytes) -> str | None:
    """The lock helper's answer (LOCKED, BUSY …, ERROR …) among the complete lines received; any
    other line is the remote shell's (a login script's noise: pyenv's rehash racing another
    session printed "rm: cannot remove …" first, and that line was taken for the answer)."""
    for raw in head.split(b"\n")[:-1]:
        text = raw.decode("utf-8", "replace").strip()
        if text.startswith(("LOCKED", "BUSY", "ERROR")):
            return text
    return None


@contextlib.asynccontextmanager
async def locked(
    host: Host, state_dir: str, action: str, helper_exited: Callable[[], Awaitable[None]]
) -> AsyncIterator[None]:
    """Hold the target's lock for the preset's port while changing what runs on it; a second
    caller is told who holds it. ``helper_exited`` is awaited when the helper died without an
    answer (a wrong server.python: its check raises its own sentence, not the lock's)."""
    client = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    info = json.dumps(
        {"action": action, "preset": host.preset.name, "client": client, "since": time.strftime("%H:%M:%S")}
    )
    path = f"{state_dir}/servers/{host.preset.server.port}.lock"
    key = (host.t.label, path)
    deadline = time.monotonic() + OWN_RELEASE_S
    while True:
        stream, line = await _ask_lock(host, path, info)
        if line.startswith("LOCKED"):
            break
        await stream.aclose()
        if line.startswith(HELPER_EXITED):
            await helper_exited()
        # our own lock, let go a moment ago: over SSH its helper dies just after the channel closes
        releasing = (
            (_lock_note(line) or {}).get("client") == client and key not in _HELD and time.monotonic() < deadline
        )
        if not releasing:
            raise ControlError(_busy_message(host, line), 1)
        await asyncio.sleep(0.05)
    _HELD.add(key)
    try:
        yield
    finally:
        _HELD.discard(key)
        await stream.aclose()


async def _ask_lock(host: Host, path: str, info: str) -> tuple[AsyncGenerator[bytes, None], str]:
    """The lock helper's stream (open: it holds the lock while it runs) and its answer line."""
    # a helper that dies without answering (a wrong server.python) still ends with an answer line:
    # the stream itself stays open (the lifeline) and would be waited on forever
    stream = host.t.stream(host.remote("lock", path, info) + f' || echo "{HELPER_EXITED} ($?)"')
    head, line = b"", None
    try:
        async with asyncio.timeout(host.limit(LOCK_ANSWER_S)):
            async for chunk in stream:
                head += chunk
                line = _lock_answer(head)
                if line is not None:
                    break
    except TimeoutError:
        pass  # said below, with whatever the shell printed
    except BaseException:
        await stream.aclose()
        raise
    said = [
        x.strip() for x in head.decode("utf-8", "replace").splitlines() if x.strip() and not x.startswith(HELPER_EXITED)
    ]
    if line is None:  # the helper never answered: what the shell said instead
        line = " ".join(said) or f"no answer in {LOCK_ANSWER_S:.0f} s"
    elif line.startswith(HELPER_EXITED) and said:
        line = f"{line}: {said[-1][:200]}"
    return stream, line


def _busy_message(host: Host, line: str) -> str:
    port = host.preset.server.port
    if not line.startswith("BUSY"):
        return f"{host.t.label}: cannot take the lock for port {port}: {line[-300:] or 'no answer'}"
    try:
        h = _lock_note(line) or {}
        who = f"tuitune {h['action']} of {h['preset']} by {h['client']} (since {h['since']})"
    except KeyError:  # no note, or one without these keys
        who = "another tuitune"
    return f"port {port} on {host.t.label} is busy: {who} holds its lock; try again when it has finished"
