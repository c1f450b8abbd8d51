"""Helpers for Textual Pilot tests of the TUI: a wait on the app's clock, the live simulator's
terminal size and its wait for a ready server, and the messages the app says."""

from __future__ import annotations

import time

from tuitune.tui.screens import RelaunchScreen

SIZE_LIVE = (140, 44)  # the terminal of the Pilot tests against the live simulator


async def until(pilot, cond, timeout: float = 20.0, what: str = "condition"):
    """A Pilot test's wait: the app runs (pauses of 50 ms) until cond() holds, on the clock."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_ready(app, pilot, session):
    """Until the session's server is ready and no relaunch view is open (30 s)."""
    await until(
        pilot, lambda: session.state.state == "ready" and not isinstance(app.screen, RelaunchScreen), 30, "server ready"
    )


def collect_says(app) -> list[str]:
    """Every message the app says from now on (``app.say`` still shows them), in order."""
    said: list[str] = []
    real_say = app.say

    def say(msg, *a, **kw):
        said.append(msg)
        return real_say(msg, *a, **kw)

    app.say = say
    return said
