"""The load driver: warm-up, then the measured requests at a concurrency, on a clock of their own.

One request and its clock are ``measure/request.py``; what a run's results say is
``measure/benchrun.py``; what the server says of itself ``measure/serverinfo.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.benchrun import BenchRun
from tuitune.measure.request import OPENAI_APIS, RequestResult, client_session, run_request
from tuitune.measure.serverinfo import detect_api, fetch_server_info, served_model, sim_shares


async def run_bench(
    cfg: BenchConfig,
    on_result: Callable[[int, RequestResult], Awaitable[None] | None] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchRun:
    """Warm-up requests (discarded), then ``requests`` measured ones at ``concurrency``.

    Above concurrency 1 the warm-up is one wave of ``concurrency`` short requests, so that the
    server has run this batch size (its CUDA graph, its KV blocks) before the clock starts.

    The requests run on their own thread and event loop (the clock's loop), so that nothing else
    of the calling program stamps their chunks late: a session's loop also tails the log, scrapes
    /metrics and spawns its liveness checks, and a fork waits for its child to exec; on a loaded
    machine (2 cores, other work) that loop stalled 0.3-2.9 s at a time, a whole 128-token stream
    then arrived in one read, first and last token at the same instant, and the request had no
    decode rate. ``on_result`` runs on the caller's loop; ``stop`` is read at each request; a
    cancelled caller cancels the requests."""
    loop = asyncio.get_running_loop()
    delivered: list[concurrent.futures.Future] = []  # appended on the clock's thread, read after it ended

    def deliver(i: int, r: RequestResult) -> None:  # on the clock's thread
        if on_result is None:
            return

        async def call() -> None:
            maybe = on_result(i, r)
            if asyncio.iscoroutine(maybe):
                await maybe

        delivered.append(asyncio.run_coroutine_threadsafe(call(), loop))

    clock = _ClockThread(_run_bench(cfg, deliver, stop))
    try:
        run = await asyncio.shield(clock.future)
    except asyncio.CancelledError:
        clock.cancel()
        await asyncio.wait([clock.future], timeout=10)
        raise
    finally:
        done = await asyncio.gather(*(asyncio.wrap_future(f) for f in delivered), return_exceptions=True)
    for e in done:
        if isinstance(e, BaseException):
            raise e  # on_result's own error, as when it ran inline
    return run


class _ClockThread:
    """One coroutine run to completion on a thread of its own with its own event loop; its result
    (or exception) in ``future``, awaitable from the caller's loop."""

    def __init__(self, coro) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task | None = None
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()
        started = threading.Event()

        def settle(result=None, error: BaseException | None = None) -> None:
            if self.future.done():
                return
            if isinstance(error, asyncio.CancelledError):
                self.future.cancel()
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(coro)
            started.set()
            outcome: tuple = (None, None)
            try:
                outcome = (self.loop.run_until_complete(self.task), None)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's loop as it is
                outcome = (None, e if not isinstance(e, asyncio.CancelledError) else asyncio.CancelledError())
            finally:
                try:
                    caller.call_soon_threadsafe(settle, *outcome)
                except RuntimeError:  # the caller's loop is gone (its program is exiting): nobody waits
                    pass
                try:
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                finally:
                    self.loop.close()

        self.thread = threading.Thread(target=main, name="tuitune-bench-clock", daemon=True)
        self.thread.start()
        started.wait()

    def cancel(self) -> None:
        if self.task is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:  # the loop closed meanwhile: nothing left to cancel
                pass


async def _run_bench(
    cfg: BenchConfig,
    on_result: Callable[[int, RequestResult], None],
    stop: asyncio.Event | None,
) -> BenchRun:
    """run_bench's requests, on the clock's loop."""
    import aiohttp

    run = BenchRun(cfg, started=time.time())
    t0 = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=max(4, cfg.concurrency * 2), force_close=False)
    async with client_session(connector=connector) as session:
        if cfg.api == "auto":
            cfg.api = await detect_api(session, cfg.url) or "native"  # unreachable: the requests say so
        if cfg.api in OPENAI_APIS and cfg.model is None:
            cfg.model = await served_model(session, cfg.url)
        if cfg.warmup and cfg.concurrency > 1:
            wave = replace(cfg, max_tokens=min(cfg.max_tokens, 64))
            warm = await asyncio.gather(
                *(
                    run_request(session, wave, cfg.prompts.item(i).prompt)
                    for i in range(max(cfg.warmup, cfg.concurrency))
                )
            )
        else:
            warm = []
            for i in range(cfg.warmup):
                warm.append(await run_request(session, *cfg.for_item(i)))
                last = warm[-1]
                if not last.ok and last.error and last.error.startswith(("cannot connect", "server disconnected")):
                    break
        down = [
            r for r in warm if not r.ok and r.error and r.error.startswith(("cannot connect", "server disconnected"))
        ]
        if down:
            run.results.append(down[0])  # server not up: fail fast instead of timing out each request
            run.wall_s = time.perf_counter() - t0
            return run
        # the simulator's own counters before the measured requests (a real server has none)
        before = ((await fetch_server_info(session, cfg.url)).get("sim") or {}) if cfg.concurrency > 1 else {}
        t_measured = time.perf_counter()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(cfg.requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty() and not (stop and stop.is_set()):
                i = queue.get_nowait()
                r = await run_request(session, *cfg.for_item(cfg.warmup + i))
                run.results.append(r)
                on_result(i, r)

        await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, cfg.requests))))
        run.measured_s = time.perf_counter() - t_measured
        run.server = await fetch_server_info(session, cfg.url)
        run.sim_late_share, run.sim_lag_share = sim_shares(before, run.server.get("sim") or {})
    run.wall_s = time.perf_counter() - t0
    return run
