"""The transport's two errors, shared by the transport and the SSH route (no other import)."""

from __future__ import annotations


class TransportError(Exception):
    """A one-sentence failure of the link or of a command's plumbing (not its exit status)."""


class LinkLost(TransportError):
    """The connection dropped; ``reconnect()`` may bring it back.

    Also what a command whose connection died while it ran raises: its exit status never came
    back, so there is no answer to read (an SSH channel closed without one is not "exit 255",
    which a liveness check would take for "not running")."""
