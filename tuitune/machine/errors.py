"""The target side's errors, imported by every module of it (and nothing of it imported here): the
transport's two, shared by the transport and the SSH route, and server control's ``ControlError``
with the sentences that refuse to touch a server tuitune did not start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuitune.base.errors import TuituneError

if TYPE_CHECKING:
    from tuitune import preset as P


class TransportError(TuituneError):
    """A one-sentence failure of the link or of a command's plumbing (not its exit status)."""


class LinkLost(TransportError):
    """The connection dropped; ``reconnect()`` may bring it back.

    Also what a command whose connection died while it ran raises: its exit status never came
    back, so there is no answer to read (an SSH channel closed without one is not "exit 255",
    which a liveness check would take for "not running")."""


class ControlError(TuituneError):
    """One sentence; ``code`` 2 for bad input (preflight refusals), 1 for failed work."""

    def __init__(self, message: str, code: int = 1, log_tail: list[str] | None = None):
        super().__init__(message, code)
        self.log_tail = log_tail or []


def not_ours(preset: P.Preset) -> str:
    """What every command and view says of a live server on the preset's port that tuitune did not
    start: it is watched read-only until the operator adopts it."""
    return f"running, not started by tuitune: attach read-only, or {preset.adopt_hint()}"


def refuse_not_ours(preset: P.Preset, label: str, pid: int | None = None) -> str:
    """The one sentence that refuses to relaunch or stop a server tuitune did not start."""
    who = f" (pid {pid})" if pid else ""
    other = "" if preset.discovered else f" (or `tuitune stop {preset.name} --pid PID`)"
    return (
        f"port {preset.server.port} on {label} is in use by a server tuitune did not start{who}, watched "
        f"read-only; {preset.adopt_hint()} makes it tuitune's to relaunch or stop{other}"
    )
