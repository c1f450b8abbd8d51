"""asyncio helpers shared by the core (no UI)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable

RECANCEL_S = 0.25  # a task not ended this long after its cancel is cancelled again


def cancelled_since(before: int) -> bool:
    """Whether the running task has been asked to cancel since it read ``before`` off its
    ``cancelling()``: the test that lets a caller re-raise a cancel that a library turned into an
    ordinary exception (a timeout, a dropped connection) which the caller's own handler then caught."""
    me = asyncio.current_task()
    return me is not None and me.cancelling() > before


def cancelling() -> int:
    """The running task's count of cancel requests (0 outside a task)."""
    me = asyncio.current_task()
    return me.cancelling() if me is not None else 0


async def cancel_and_wait(
    *tasks: asyncio.Future | None, ignore: tuple[type[BaseException], ...] = (Exception,)
) -> None:
    """Cancel ``tasks`` and wait until every one has ended, however it ended (its own cancel and
    ``ignore`` are dropped; anything else is raised). A task still running RECANCEL_S after its
    cancel is cancelled again, and again, until it ends: a cancel swallowed somewhere under it (a
    library that turned it into a timeout its caller caught) does not leave the caller waiting
    forever for a task that never ends (issue 42). A cancel of the caller that arrives meanwhile
    (Ctrl-C during a relaunch's clean-up) is not swallowed: it is raised once the children have
    ended. One that was already under way when we were called (clean-up in a ``finally`` after
    Ctrl-C) does not cut the clean-up short."""
    live = [t for t in tasks if t is not None]
    me = asyncio.current_task()
    before = me.cancelling() if me is not None else 0
    for t in live:
        t.cancel()
    pending, interrupted = set(live), False
    while pending:
        try:
            # unlike `await t`, passes no cancel on to t
            _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
        except asyncio.CancelledError:
            interrupted = True
        for t in pending:  # a cancel that something under the task swallowed: it gets another
            t.cancel()
    for t in live:
        exc = None if t.cancelled() else t.exception()
        if exc is not None and not isinstance(exc, ignore):
            raise exc
    if interrupted or (me is not None and me.cancelling() > before):
        raise asyncio.CancelledError


async def to_the_end(aw) -> tuple:
    """Await ``aw`` to its end even when the caller is cancelled meanwhile: (its result, whether a
    cancel came). For the steps that, cut half-way, would lose track of a server (stopping one,
    starting one and writing its record): the caller does its clean-up with the result, then raises
    the cancel. Should ``aw`` fail after a cancel came, the cancel is what is raised."""
    task = asyncio.ensure_future(aw)
    cut = False
    while True:
        try:
            return await asyncio.shield(task), cut
        except asyncio.CancelledError:
            if task.done():  # the step itself was cancelled, not its caller
                raise
            cut = True
        except BaseException:
            if cut:
                raise asyncio.CancelledError from None
            raise


def stop_on_signals(stop: asyncio.Event) -> Callable[[], None]:
    """SIGINT and SIGTERM set ``stop`` (a headless command that ends cleanly: ``--record``, `watch`);
    returns what puts the handlers back."""
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGINT, signal.SIGTERM)
    for sig in sigs:
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)

    def undo() -> None:
        for sig in sigs:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)

    return undo


async def until_stopped(
    stop: asyncio.Event, t0: float, duration: float | None, tick: Callable[[], None] | None = None
) -> None:
    """Wait until ``stop`` is set or ``duration`` seconds have passed since monotonic ``t0`` (None:
    no end), calling ``tick`` every half second meanwhile (progress, notes)."""
    while not stop.is_set():
        left = None if duration is None else duration - (time.monotonic() - t0)
        if left is not None and left <= 0:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5 if left is None else min(0.5, left))
        if tick is not None:
            tick()


def dump_tasks(file=None) -> None:
    """Print where every thread and every asyncio task of the running loop is waiting (SIGUSR1:
    `kill -USR1 PID` on a tuitune that seems stuck says on what, and it goes on running). On a
    terminal (the TUI's screen) it goes to ~/.cache/tuitune/dumps/tuitune-PID.txt instead."""
    import faulthandler
    import os
    import sys
    from pathlib import Path

    out = file or sys.stderr
    if file is None and sys.stderr.isatty():  # the TUI draws on that terminal: a file, not the screen
        path = Path.home() / ".cache" / "tuitune" / "dumps" / f"tuitune-{os.getpid()}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            dump_tasks(f)
        return
    out.write("tuitune: SIGUSR1: the threads, then the tasks and where each waits\n")
    out.flush()
    faulthandler.dump_traceback(file=out, all_threads=True)
    loop = asyncio._get_running_loop()  # the handler runs on the loop's thread, between its callbacks
    tasks = list(asyncio.all_tasks(loop)) if loop is not None else []
    pumps = [t for t in tasks if "/textual/" in getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")]
    if pumps:  # Textual's own: a message pump a widget, its timers
        out.write(f"--- ({len(pumps)} of Textual's own tasks, message pumps and timers, left out)\n")
    for task in tasks:
        if task not in pumps:
            out.write(f"--- {task!r}\n")
            task.print_stack(file=out)
    out.flush()
