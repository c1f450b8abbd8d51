"""Helpers for Textual Pilot tests of the TUI: a wait on the app's clock, and the messages it says."""

from __future__ import annotations

import time


async def until(pilot, cond, timeout: float = 20.0, what: str = "condition"):
    """A Pilot test's wait: the app runs (pauses of 50 ms) until cond() holds, on the clock."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def collect_says(app) -> list[str]:
    """Every message the app says from now on (``app.say`` still shows them), in order."""
    said: list[str] = []
    real_say = app.say

    def say(msg, *a, **kw):
        said.append(msg)
        return real_say(msg, *a, **kw)

    app.say = say
    return said
