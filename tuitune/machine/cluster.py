"""One server on several machines (SGLang multi-node), launched, watched and stopped as one.

A multi-node preset expands into one single-machine preset per node (``Preset.node_presets``);
each node gets the ordinary ``ServerControl`` over its own transport, so its state file, port
lock, ownership rules and stop are exactly those of a one-machine server. This module runs them
in step:

* every node's lock is held for the whole relaunch or stop (taken in node order);
* preflight runs on every node at once and must pass everywhere before anything is stopped;
* stop = every node at once, each waiting until its port is free, then node 0's dist-init port;
* start = every node at once: SGLang's nodes need no order (docs.sglang.io, Multi-Node
  Deployment, starts them independently), torch.distributed's store on node 0 holds start-up
  until every rank joined;
* ready = node 0's ``/health`` (owned by its process, as on one machine) and every node alive;
* any node dying, while starting or serving, fails the server: the cause names the node and
  shows its last log lines, and the other nodes are stopped, so none is left holding GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.aio import cancel_and_wait
from tuitune.base.events import NcclEnv, ServerError
from tuitune.engines import CAUSE_TEXT
from tuitune.machine.control import Controller, NodeView, ServerControl, Status
from tuitune.machine.errors import ControlError
from tuitune.machine.readiness import HEALTH_TIMEOUT_S, ReadyResult, classify
from tuitune.machine.record import STATE_DIR, ServerRecord
from tuitune.machine.transport import Transport, TransportError, for_preset
from tuitune.measure.parse import parse_line

POLL_S = 0.5  # how often the other nodes' processes are checked while starting and serving
TAIL_LINES = 40
# A node that failed only because a peer went away says so (NCCL's remote error): not the cause.
FOLLOWER_MARKS = ("ncclRemoteError", "remote process exit")


def control_for(transport: Transport, preset: P.Preset, state_dir: str | None = None) -> Controller:
    """The control of ``preset``'s server: one machine's, or every node's in step."""
    state = state_dir or STATE_DIR
    if preset.is_multinode:
        return ClusterControl(transport, preset, state)
    return ServerControl(transport, preset, state)


@contextlib.asynccontextmanager
async def controlling(
    transport: Transport, preset: P.Preset, state_dir: str | None = None
) -> AsyncIterator[Controller]:
    """``control_for`` for one use: a multi-node control's links to the other nodes are closed after."""
    c = control_for(transport, preset, state_dir)
    try:
        yield c
    finally:
        await c.close()


async def stop_started(control: Controller, name: str) -> str | None:
    """What an interrupted experiment does with a server it started (``control``'s, of the preset
    called ``name``): stop it, in a sentence for the interruption's message; None when none runs
    (a relaunch cut short stops its half-started server itself). Never raises a failure to stop:
    says it, with the command that stops the server."""
    try:
        st = await control.status()
        if not st.running or st.record is None:
            return None
        await control.stop()
    except (ControlError, TransportError) as e:
        return f"stopping the server it started ({name}) failed ({e}); `tuitune stop {name}` stops it"
    return f"the server it started ({name}, pid {st.record.pid}) was stopped"


class ClusterControl:
    def __init__(
        self,
        transport: Transport,
        preset: P.Preset,
        state_dir: str = STATE_DIR,
        transports: list[Transport] | None = None,
    ):
        self.preset = preset
        self.node_presets = preset.node_presets()
        ts = transports or [transport] + [for_preset(n) for n in self.node_presets[1:]]
        self.controls = [ServerControl(t, n, state_dir) for t, n in zip(ts, self.node_presets, strict=False)]
        self.t = transport
        self.state_dir = state_dir
        self.warnings: list[str] = []
        self.cleanup: str | None = None
        self.preflight_s: float | None = None  # how long the last relaunch's checks took, every node's at once
        self.records: list[ServerRecord] = []
        self.node_nccl: list[dict[str, str]] = []  # NCCL variables each node's log confirmed

    @property
    def nodes(self) -> list[ServerControl]:
        return self.controls

    @property
    def help_cached(self) -> bool | None:
        """Every node's flag listing came from its cache (False: one was asked of the engine)."""
        got = [c.help_cached for c in self.controls if c.help_cached is not None]
        return all(got) if got else None

    def label(self, i: int) -> str:
        return f"node {i} ({self.controls[i].t.label})"

    async def close(self) -> None:
        """Close the transports this control opened (node 0's belongs to the caller)."""
        for c in self.controls[1:]:
            with contextlib.suppress(Exception):
                await c.t.close()

    async def _gather(self, coros) -> list:
        """Run one coroutine per node at once; the first error (in node order) is raised after
        all have finished, so no node's work is abandoned half-way."""
        results = await asyncio.gather(*coros, return_exceptions=True)
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
        for i, r in enumerate(results):
            if isinstance(r, ControlError):
                raise ControlError(f"{self.label(i)}: {r}", r.code, r.log_tail)
            if isinstance(r, BaseException):
                raise r
        return results

    @contextlib.asynccontextmanager
    async def locked(self, action: str) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for c in self.controls:  # in node order, so two clients never hold halves of each other's
                await stack.enter_async_context(c.locked(action))
            yield

    # ---- relaunch ------------------------------------------------------------------------
    async def preflight(self, current: list[ServerRecord | None]) -> None:
        await self._gather(c.preflight(rec) for c, rec in zip(self.controls, current, strict=False))
        for i, c in enumerate(self.controls):
            self.warnings += [f"{self.label(i)}: {w}" for w in c.warnings]
        head, port = self.controls[0], self.preset.server.dist_init_port
        if await head.port_busy(port) and not (current[0] and await head.alive(current[0].pid)):
            raise ControlError(
                f"{self.label(0)}: dist-init port {port} is in use by a process tuitune did "
                "not start; pick another server.dist_init_port or stop that process",
                2,
            )

    async def _stop_all(self, grace_s: float = 10.0, allow_any: bool = True) -> list[str]:
        msgs = await self._gather(c._stop(grace_s=grace_s, allow_any=allow_any) for c in self.controls)
        await self._dist_port_free()
        return [f"{self.label(i)}: {m}" for i, m in enumerate(msgs)]

    async def _dist_port_free(self, timeout_s: float = 10.0) -> None:
        head, port = self.controls[0], self.preset.server.dist_init_port
        end = time.monotonic() + timeout_s
        while await head.port_busy(port):
            if time.monotonic() > end:
                raise ControlError(f"{self.label(0)}: dist-init port {port} is still in use after the stop")
            await asyncio.sleep(0.2)

    def _allowed(self, i: int, allowed: set[str] | None) -> set[str] | None:
        # a node may replace what the same preset's node started, or a one-machine preset named here
        return {*allowed, *(f"{name}.node{i}" for name in allowed)} if allowed else None

    async def relaunch(  # noqa: PLR0913
        self,
        timeout_s: float = 900.0,
        wait: bool = True,
        on_phase: Callable[[str, float], None] | None = None,
        before_stop: Callable[[], Awaitable[None]] | None = None,
        after_start: Callable[[ServerRecord], Awaitable[None]] | None = None,
        on_stopped: Callable[[str], None] | None = None,
        *,
        allowed: set[str] | None = None,
        allow_any: bool = False,
        keep_on_failure: bool = False,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> tuple[ServerRecord, ReadyResult | None]:
        """As ``ServerControl.relaunch``, on every node; returns node 0's record and readiness."""
        self.warnings = []
        self.cleanup = None
        await self._gather(c.check_python() for c in self.controls)  # before the locks: their helpers need it
        async with self.locked("launch"):
            current = await self._gather(c.read_state() for c in self.controls)
            for i, (c, rec) in enumerate(zip(self.controls, current, strict=False)):
                if not allow_any and (why := c.foreign(rec, self._allowed(i, allowed))) and await c.alive(rec.pid):
                    raise ControlError(f"{self.label(i)}: {why}", 2)
            t_check = time.monotonic()
            await self.preflight(current)
            self.preflight_s = time.monotonic() - t_check
            if before_stop is not None:
                await before_stop()
            if any(rec is not None for rec in current):
                for msg in await self._stop_all():
                    if on_stopped is not None:
                        on_stopped(msg)
            started = await asyncio.gather(*(c.start() for c in self.controls), return_exceptions=True)
            self.records = [r for r in started if isinstance(r, ServerRecord)]
            failed = [(i, r) for i, r in enumerate(started) if isinstance(r, BaseException)]
            if failed:
                await self._after_failure(keep_on_failure)
                i, err = failed[0]
                raise ControlError(f"{self.label(i)}: {err}; {self.cleanup}", 1)
            if after_start is not None:
                await after_start(self.records[0])
            if not wait:
                return self.records[0], None
            try:
                res = await self.wait_ready(self.records, timeout_s, on_phase, health_timeout_s)
            except asyncio.CancelledError:
                await asyncio.shield(self._after_failure(keep_on_failure))
                raise
            if not res.ok:
                await self._after_failure(keep_on_failure)
                raise ControlError(f"{res.message or 'server did not become ready'}; {self.cleanup}", 1, res.log_tail)
            return self.records[0], res

    async def wait_ready(
        self,
        recs: list[ServerRecord],
        timeout_s: float = 900.0,
        on_phase: Callable[[str, float], None] | None = None,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> ReadyResult:
        """Node 0's readiness (its /health, its log's phases and causes) while every other node's
        process is watched; the first node to die ends the wait with its own cause."""
        t0 = time.monotonic()
        head = asyncio.ensure_future(
            self.controls[0].wait_ready(recs[0], timeout_s, on_phase=on_phase, health_timeout_s=health_timeout_s)
        )
        others = asyncio.ensure_future(self.first_death(recs, skip_head=True))
        try:
            await asyncio.wait({head, others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(*(t for t in (head, others) if not t.done()), ignore=(TransportError,))
        if others.done() and not others.cancelled() and others.exception() is None and (gone := others.result()):
            res = await self.node_failure(await self.first_death(recs, once=True) or gone, "start")
        else:
            res = head.result()
            dead = await self.first_death(recs, once=True)
            if dead and (res.ok or dead != [0]):  # another node is (also) gone: find the cause among them
                res = await self.node_failure(dead, "start")
            elif not res.ok:
                res.message = f"{self.label(0)}: {res.message}"
        res.elapsed_s = time.monotonic() - t0
        if res.ok:
            self.node_nccl = await self._gather(self._nccl_seen(i, r) for i, r in enumerate(recs))
            res.nccl_env = self.node_nccl[0]
        return res

    async def first_death(self, recs: list[ServerRecord], skip_head: bool = False, once: bool = False) -> list[int]:
        """The nodes whose process is gone: polled until one is (or checked once: [] if none)."""
        idx = [i for i in range(len(recs)) if not (skip_head and i == 0)]
        while True:
            alive = await asyncio.gather(*(self.controls[i].alive(recs[i].pid) for i in idx))
            dead = [i for i, ok in zip(idx, alive, strict=False) if not ok]
            if dead or once:
                return dead
            await asyncio.sleep(POLL_S)

    async def log_tail(self, i: int, n: int = TAIL_LINES) -> list[str]:
        c = self.controls[i]
        r = await c.t.run(f"tail -n {int(n)} -- {P.shell_path(c.preset.server.log)}", timeout=30)
        shown = redact.Redactor(c.preset)
        return [shown(line) for line in r.stdout.splitlines()]

    async def node_failure(self, dead: list[int], during: str) -> ReadyResult:
        """What killed the server: the first dead node (in node order) that did not merely follow
        another (a rank whose peer went away fails with NCCL's remote error), its cause from its
        own log and its last lines."""
        tails = {i: await self.log_tail(i) for i in dead}
        first = next((i for i in dead if not any(m in line for line in tails[i] for m in FOLLOWER_MARKS)), dead[0])
        lines = tails[first]
        errors = [ev for ev in map(parse_line, lines) if isinstance(ev, ServerError)]
        found = classify(errors)
        cause, detail = found if found else ("exited", "the process exited without an error line")
        also = [self.label(i) for i in dead if i != first]
        msg = f"{self.label(first)} exited during {during} ({CAUSE_TEXT.get(cause, cause)}): {detail}" + (
            f" (then {', '.join(also)})" if also else ""
        )
        return ReadyResult(
            ok=False,
            elapsed_s=0.0,
            phase="failed",
            cause=cause,
            message=msg[:400],
            log_tail=[f"[node {first}] {line}" for line in lines],
            errors=errors,
        )

    async def _nccl_seen(self, i: int, rec: ServerRecord) -> dict[str, str]:
        """The NCCL variables node ``i``'s log echoed (NCCL_DEBUG=INFO), from its start-up lines."""
        c = self.controls[i]
        r = await c.t.run(f"head -c 1048576 -- {P.shell_path(rec.log)}", timeout=30)
        seen: dict[str, str] = {}
        for line in r.stdout.splitlines():
            ev = parse_line(line)
            if isinstance(ev, NcclEnv):
                seen[ev.name] = ev.value
        return seen

    async def _after_failure(self, keep: bool) -> None:
        """Never leave a node running behind a failed server: stop every node, or say they were kept."""
        pids = ", ".join(f"{self.label(i)} pid {r.pid}" for i, r in enumerate(self.records))
        if keep:
            self.cleanup = f"nodes left running (--keep-on-failure): {pids}"
            return
        try:
            await self._stop_all(grace_s=5)
            self.cleanup = "every node was stopped"
        except (ControlError, TransportError) as e:
            self.cleanup = f"stopping the nodes failed: {e}"

    # ---- serving -------------------------------------------------------------------------
    async def watch(self, recs: list[ServerRecord] | None = None) -> ReadyResult | None:
        """While serving: returns when a node dies, after stopping the others (its cause attached);
        None at once when the nodes' records are not all known (nothing to watch)."""
        recs = recs or self.records
        if len(recs) != len(self.controls):
            return None
        dead = await self.first_death(recs)
        await asyncio.sleep(POLL_S)  # a node's peers follow it within moments: see them all
        res = await self.node_failure(await self.first_death(recs, once=True) or dead, "serving")
        async with self.locked("stop"):
            await self._after_failure(False)
        res.message = f"{res.message}; {self.cleanup}"
        return res

    def nccl_by_node(self, res: ReadyResult) -> list[tuple[P.Preset, dict[str, str]]]:
        """Each node's preset and what its own log confirmed (node 0's result alone if none was read)."""
        return list(zip(self.node_presets, self.node_nccl or [res.nccl_env], strict=False))

    def foreign(self, rec: ServerRecord | None, allowed: set[str] | None = None) -> str | None:
        """Why node 0's server (``rec``) belongs to another preset, or None."""
        return self.controls[0].foreign(rec, self._allowed(0, allowed or {self.preset.name}))

    # ---- stop / status -------------------------------------------------------------------
    async def stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = False) -> str:
        if pid is not None:
            raise ControlError("--pid names one process; a multi-node server is stopped as a whole", 2)
        async with self.locked("stop"):
            for i, c in enumerate(self.controls):
                rec = await c.read_state()
                if not allow_any and rec is not None and (why := c.foreign(rec)) and await c.alive(rec.pid):
                    raise ControlError(f"{self.label(i)}: {why}", 2)
            return "; ".join(await self._stop_all(grace_s, allow_any=True))

    async def status(self, pid: int | None = None) -> Status:
        """Node 0's status, running only if every node runs, drift of every node (keys prefixed).
        A server found running on every node is the one ``watch`` then watches."""
        views = await self._gather(c.status(pid if i == 0 else None) for i, c in enumerate(self.controls))
        head = views[0]
        nodes = [NodeView(i, c.t.label, v) for i, (c, v) in enumerate(zip(self.controls, views, strict=False))]
        st = Status(
            running=all(v.running for v in views),
            record=head.record,
            uptime_s=head.uptime_s,
            same_hash=None if any(v.same_hash is None for v in views) else all(v.same_hash for v in views),
            nodes=nodes,
        )
        for i, v in enumerate(views):
            for d in v.drift:
                d.key = f"node{i}.{d.key}"
                st.drift.append(d)
        if st.running:
            self.records = [v.record for v in views if v.record is not None]
        down = [f"{self.label(i)}: {v.note or 'not running'}" for i, v in enumerate(views) if not v.running]
        if down and len(down) < len(views):
            st.note = "partly running: " + "; ".join(down) + " (relaunch or stop it as a whole)"
        elif down:
            st.note = "; ".join(f"{self.label(i)}: {v.note}" for i, v in enumerate(views) if v.note) or None
        return st


if TYPE_CHECKING:  # mypy holds both controls to the interface the session and the commands use

    def _both_are_controllers(t: Transport, p: P.Preset) -> tuple[Controller, Controller]:
        return ServerControl(t, p), ClusterControl(t, p)
