"""Headless capture: the live event stream of a preset's server, written to a capture file.

Same session pipeline as the TUI (so a replay shows what the TUI would have shown), no Textual.
On a server that is already running it records from the end of the log (what happens from now
on), unless ``from_start`` (the whole log so far: ``duration`` then counts from when that history
has been read, up to HISTORY_WAIT_S). Stops after ``duration`` seconds counted from ready, after ``cycles``
profiled cycles, or on Ctrl-C / SIGTERM, also in the middle of a relaunch or a benchmark (those
are cancelled; a half-started server is stopped), and always finishes the file cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time

from tuitune import preset as P
from tuitune.base.aio import cancel_and_wait, stop_on_signals, until_stopped
from tuitune.base.errors import TuituneError
from tuitune.base.events import Event, LogLine, Marker, ProfileWindow
from tuitune.experiments.options import RecordOptions
from tuitune.experiments.results import RecordStats
from tuitune.machine.session import Session
from tuitune.machine.telemetry import CaptureThrottle
from tuitune.measure import workload
from tuitune.measure.capture import CaptureWriter, redacted_preset
from tuitune.measure.guard import PREFIX as GUARD_PREFIX
from tuitune.measure.serverinfo import fetch_server_info

CLOSE_S = 1.0  # the longest the clean-up after the capture is closed may take before it is cancelled
HISTORY_WAIT_S = 60.0  # the longest --from-start waits for the log's history before its --duration starts


class RecordError(TuituneError):
    pass


async def record(  # noqa: C901
    preset: P.Preset, o: RecordOptions, *, session: Session | None = None, progress: bool = False
) -> RecordStats:
    """Capture ``preset``'s server to ``o.record`` as ``o`` asks (its stop, relaunch, load, benchmark,
    raw lines, history); ``progress``: a line on stderr, rewritten as it goes (a terminal)."""
    if not o.record:
        raise RecordError("a recording needs its output file (--record OUT)")
    out, duration, cycles, load, bench = o.record, o.duration, o.cycles, o.load, o.bench
    relaunch, raw, from_start = o.relaunch, o.raw, o.from_start
    session = session or Session(preset)
    stop = asyncio.Event()
    restore_signals = stop_on_signals(stop)
    counted = {"cycles": 0, "windows": 0}
    writer: CaptureWriter | None = None
    t0 = time.monotonic()
    finished: list[bool] = []

    def finish() -> None:
        if writer is not None and not finished:
            finished.append(True)
            with contextlib.suppress(ValueError, NameError):  # not subscribed yet
                session.subscribers.remove(sink)
            writer.close()

    async def unless_stopped(coro) -> tuple[bool, object]:
        """Run ``coro`` unless Ctrl-C / SIGTERM comes first: (True, its result), or (False, None)
        once it has been cancelled."""
        task = asyncio.ensure_future(coro)
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done():
            return True, task.result()
        finish()  # the capture is complete and closed before any cleanup on the target
        await cancel_and_wait(task, ignore=())
        return False, None

    try:
        status = await session.connect(backlog=None if from_start else 0)
        if not relaunch and not status.running:
            raise RecordError(
                f"{preset.name}: server not running on {session.transport.label}; pass --relaunch to start it"
            )
        info = await _server_info(session) if status.running else {}
        meta = {
            "preset": redacted_preset(P.to_dict(preset)),
            "preset_hash": preset.hash(),
            "target": preset.target.label(),
            "server_version": info.get("version"),
            "raw": raw,
            # what tuitune sends meanwhile (its load, its benchmark); none: the server's own traffic only
            "workload": workload.for_preset(preset).as_dict() if (load or bench) else None,
        }
        writer = CaptureWriter(out, meta)
        gpu_rate = CaptureThrottle(preset.telemetry.record_every_s)  # telemetry at its own, bounded rate

        def sink(events: list[Event]) -> None:
            kept = gpu_rate.filter(events if raw else [e for e in events if not isinstance(e, LogLine)])
            if kept:
                writer.write(kept)
            for e in events:
                if isinstance(e, ProfileWindow):
                    counted["cycles"] += e.cycles
                    counted["windows"] += 1
                elif isinstance(e, Marker) and e.text.startswith(GUARD_PREFIX):
                    sys.stderr.write(f"\ntuitune: {e.text}\n" if progress else f"tuitune: {e.text}\n")
                    sys.stderr.flush()
            if cycles is not None and counted["cycles"] >= cycles:
                stop.set()

        session.subscribe(sink)
        writer.write([session.state])
        if relaunch:
            if not (await unless_stopped(session.relaunch()))[0]:
                return _stats(writer, t0, counted, session)
            version = (await _server_info(session)).get("version")
            if version:
                writer.write([Marker(f"server version {version}", preset.name, preset.hash())])
        if from_start and not relaunch:  # a 1 s recording under load once ended before its history arrived
            done, whole = await unless_stopped(session.tail_caught_up(HISTORY_WAIT_S))
            if not done:  # Ctrl-C while the history is read
                return _stats(writer, t0, counted, session)
            if not whole:
                sys.stderr.write(
                    f"tuitune: the log's history was not all read within {HISTORY_WAIT_S:.0f} s; recording on from where it is\n"
                )
        t0 = time.monotonic()  # --duration counts from ready (and from the history read, --from-start)
        if load:
            await session.set_load(True, load)
        if bench and not (await unless_stopped(session.bench(requests=bench)))[0]:
            return _stats(writer, t0, counted, session)

        def show_progress() -> None:
            if progress and writer is not None:
                el = time.monotonic() - t0
                sys.stderr.write(
                    f"\rrecording {out}: {writer.events} events, {writer.events / max(el, 1e-9):.0f}/s, "
                    f"{el:.0f}s elapsed, {counted['cycles']} cycles   "
                )
                sys.stderr.flush()

        await until_stopped(stop, t0, duration, show_progress)
    finally:
        finish()
        if progress:
            sys.stderr.write("\n")
        with contextlib.suppress(Exception):
            await _bounded(session.close(stop_server=False), CLOSE_S)
        restore_signals()
    return _stats(writer, t0, counted, session)


async def _bounded(coro, seconds: float) -> None:
    """Run ``coro`` for at most ``seconds``, then cancel it (again and again until it ends:
    ``cancel_and_wait``): the recording's clean-up (its load streams, its tail) never holds the
    process past its end, whatever a request or a link is waiting on."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        await cancel_and_wait(task)
    elif not task.cancelled() and task.exception() is not None:
        raise task.exception()


def _stats(writer: CaptureWriter | None, t0: float, counted: dict, session: Session | None = None) -> RecordStats:
    return RecordStats(
        alarms=session.guard.raised if session is not None and session.guard is not None else 0,
        events=writer.events if writer else 0,
        bytes=writer.bytes if writer else 0,
        seconds=time.monotonic() - t0,
        cycles=counted["cycles"],
        windows=counted.get("windows", 0),
    )


async def _server_info(session: Session) -> dict:
    import aiohttp

    if session.url is None:
        return {}
    async with aiohttp.ClientSession() as http:
        return await fetch_server_info(http, session.url)
