"""`tuitune watch PRESET`: the acceptance guard, headless, on a running server (cron, CI, a shell).

It attaches (read-only where tuitune did not start the server), reads the log's history to learn the
launch's own baseline (or compares with a capture: ``--against``), then says every alarm the guard
raises or clears, one line each with its time, until ``duration`` ends, an alarm is raised (with
``until_alarm``), the server exits, or Ctrl-C / SIGTERM. The result says whether any alarm was
raised: the command exits 1 then, so that cron or CI can act on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from tuitune import preset as P
from tuitune.base.aio import stop_on_signals, until_stopped
from tuitune.base.errors import TuituneError
from tuitune.base.events import Event, Marker, ServerState
from tuitune.machine.session import Session
from tuitune.measure.guard import DROP, PREFIX, AcceptanceGuard, Baseline

HISTORY_BYTES = 4_000_000  # of the log read first: the launch's first cycles, where the log is not larger
HISTORY_WAIT_S = 60.0


class WatchError(TuituneError):
    code = 3


async def watch(  # noqa: PLR0913
    preset: P.Preset,
    *,
    baseline: Baseline | None = None,
    drop: float = DROP,
    duration: float | None = None,
    until_alarm: bool = False,
    load: int | None = None,
    window: int | None = None,
    say: Callable[[str], None] = print,
    session: Session | None = None,
) -> dict:
    session = session or Session(preset)
    guard = AcceptanceGuard(drop=drop, baseline=baseline)
    if window:  # the probe's cycles a window holds (a quiet server needs fewer to say anything)
        guard.recent["probe"], guard.learn["probe"] = window, window * 5 // 4
    session.guard = guard
    stop = asyncio.Event()
    restore_signals = stop_on_signals(stop)
    said: list[str] = []
    exited: list[str] = []
    t0 = time.monotonic()

    def stamp() -> str:
        return time.strftime("%H:%M:%S")

    def sink(events: list[Event]) -> None:
        for e in events:
            if isinstance(e, Marker) and e.text.startswith(PREFIX):
                said.append(e.text)
                say(f"{stamp()} {e.text}")
                if until_alarm and not e.text.startswith(PREFIX + "cleared: "):
                    stop.set()
            elif isinstance(e, ServerState) and e.state == "exited":
                exited.append(e.detail or "exited")
                stop.set()

    try:
        session.subscribe(sink)
        st = await session.connect(backlog=HISTORY_BYTES)
        if not st.running:
            raise WatchError(f"{preset.name}: no server is running on {session.transport.label}: nothing to watch")
        if not await session.tail_caught_up(HISTORY_WAIT_S):
            say(
                f"{stamp()} the log's history was not all read within {HISTORY_WAIT_S:.0f} s: watching on from where it is"
            )
        session.guard_quiet = False
        base = guard.current_baseline()
        where = (
            f"baseline {base[1].accept:.2f} ({base[0].where})"
            if base is not None
            else (
                f"baseline from {baseline.where} once this server's figures come"
                if baseline is not None
                else "baseline: the launch's first cycles (learning)"
            )
        )
        say(f"{stamp()} watching {preset.name} on {session.label}: {where}; alarm {drop * 100:.0f} % under it")
        for note in guard.notes:
            say(f"{stamp()} note: {note}")
        if load:
            await session.set_load(True, load)
        noted = [len(guard.notes)]

        def say_notes() -> None:
            for note in guard.notes[noted[0] :]:
                say(f"{stamp()} note: {note}")
            noted[0] = len(guard.notes)

        await until_stopped(stop, t0, duration, say_notes)
    finally:
        with contextlib.suppress(ValueError):
            session.subscribers.remove(sink)
        await session.close(stop_server=False)
        restore_signals()
    current = guard.current_baseline()
    return {
        "preset": preset.name,
        "seconds": round(time.monotonic() - t0, 1),
        "alarms_raised": guard.raised,
        "active": [a.text for a in guard.active.values()],
        "markers": said,
        "status": guard.status,
        "baseline": {"where": current[0].where, "accept_len": round(current[1].accept, 3)} if current else None,
        "notes": guard.notes,
        "exited": exited[0] if exited else None,
    }
