"""A session: one preset's server, seen as one stream of events, plus the controls.

The session owns the transport, the server control, the log tail, the metrics store and the
background load. Subscribers receive lists of events (one list per tail batch or state change),
never one call per line. The TUI and the recorder are both just subscribers; a replayed capture
feeds the same ``publish`` path, so nothing downstream can tell live from replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable

import msgspec

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.aio import cancel_and_wait, cancelled_since
from tuitune.base.events import (
    BenchSummary,
    DecodeStats,
    Event,
    LinkState,
    LogLine,
    Marker,
    ProfileWindow,
    ServerError,
    ServerState,
)
from tuitune.engines import CAUSE_TEXT
from tuitune.machine import switch, telemetry
from tuitune.machine.cluster import control_for, stop_started
from tuitune.machine.control import Controller, ServerControl, Status
from tuitune.machine.errors import ControlError, refuse_not_ours
from tuitune.machine.readiness import ReadyResult, classify, nccl_confirmation, nccl_note
from tuitune.machine.record import ServerRecord
from tuitune.machine.tail import LogTail, file_size
from tuitune.machine.transport import Transport, TransportError, for_preset
from tuitune.measure import promscrape, workload
from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.benchrun import BenchRun
from tuitune.measure.guard import AcceptanceGuard
from tuitune.measure.parse import parse_line
from tuitune.measure.request import RequestResult, client_session, run_request
from tuitune.measure.stream import EventStream, LoadState
from tuitune.measure.workload import WorkloadError

ATTACH_BACKLOG = 256 * 1024  # bytes of an already-running server's log read on attach
HISTORY_S = 60.0  # the longest the guard stays quiet while an attach reads the log's history
WATCH_S = 0.5  # how often a ready server is checked (alive? relaunched elsewhere?): seen within 2 s


class Session(EventStream):
    live = True

    def __init__(
        self,
        preset: P.Preset,
        transport: Transport | None = None,
        state_dir: str | None = None,
        ready_timeout_s: float = 900.0,
    ):
        super().__init__()
        self.preset = preset
        self.running_preset: P.Preset | None = None  # what the live server was launched from (or holds: hold)
        self.holds = switch.HoldState()  # a step count held live in this launch (docs/switch.md)
        self.transport = transport or for_preset(preset)
        self.transport.on_link = self._on_link
        self.control: Controller = control_for(self.transport, preset, state_dir)
        self._node_tasks: list[asyncio.Task] = []  # a multi-node server: other nodes' tails, the watch
        self.ready_timeout_s = ready_timeout_s
        self.state = ServerState("stopped")
        self.link = LinkState("connecting")
        self.load: LoadState = LoadState()
        self.record: ServerRecord | None = None
        self.url: str | None = None
        self.last_ready: ReadyResult | None = None
        self._tail: LogTail | None = None
        self._tail_task: asyncio.Task | None = None
        self._scrape_task: asyncio.Task | None = None  # /metrics, while the log is followed
        self.tail_state = "stopped"  # the live tail: following, reconnecting, closed, or stopped: WHY
        self._load_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self._errors: list[ServerError] = []  # error lines since the server became ready
        self.telemetry: telemetry.Collector | None = None
        self._telemetry_task: asyncio.Task | None = None
        self._relaunch_lock = asyncio.Lock()
        self.launched = False  # a server this session started runs (stop_started: Ctrl-C's clean-up)
        self.cleanup: str | None = None  # what a relaunch cut short did with its half-started server
        self.read_only = False  # attached to a server tuitune did not start: watched, never relaunched or stopped
        self.guard = AcceptanceGuard()  # acceptance against the launch's first cycles (or a capture: watch --against)
        self._history_task: asyncio.Task | None = None  # the guard quiet while an attach reads the log's history

    @property
    def label(self) -> str:
        n = len(self.node_labels())
        return self.transport.label + (f" +{n - 1} node{'s' if n > 2 else ''}" if n > 1 else "")

    def node_labels(self) -> list[str]:
        """Each node's machine (one entry on one machine)."""
        return [c.t.label for c in self.control.nodes]

    # ---- events ---------------------------------------------------------------------------
    def _set_state(
        self,
        state: str,
        phase: str | None = None,
        detail: str | None = None,
        pid: int | None = None,
        elapsed: float | None = None,
    ) -> None:
        self.state = ServerState(state, phase, detail, pid, elapsed)
        self.publish([self.state])

    def _on_link(self, state: str, attempt: int, detail: str | None) -> None:
        self.link = LinkState(state, attempt, detail)
        self.publish([self.link])

    # ---- attach / tail --------------------------------------------------------------------
    async def connect(self, backlog: int | None = ATTACH_BACKLOG) -> Status:
        """Attach to the preset's running server (reading the last ``backlog`` bytes of its log
        first, None: all of it), or
        see that there is none; a server that another preset started is left alone."""
        await self.transport.connect()
        self.start_telemetry()
        st = await self.control.status()
        foreign = self.control.foreign(st.record) if st.running and st.ours else None
        self.read_only = st.running and not st.ours
        if foreign:
            self._set_state("stopped", detail=foreign.split("; pass --any")[0])
        elif st.running and st.record:
            self.record = st.record
            self.running_preset = self.preset if st.same_hash else None
            if st.record.switch and st.ours and (ack := await switch.Switch(self.transport, st.record.port).state()):
                self.running_preset = self.holds.applied(ack, self.running_preset)  # a hold set elsewhere
            await self._open_url()
            if self.read_only:
                self._set_state("ready", "attached read-only", detail=st.note, pid=st.record.pid)
            else:
                self._set_state("ready", "attached", pid=st.record.pid)
            # the history teaches the guard its baseline; alarms are for what comes after
            self.guard_quiet = backlog != 0
            await self.follow(from_end=True, backlog=backlog)
            if self.guard_quiet:
                self._history_task = asyncio.ensure_future(self._history_read())
            await self._serve(from_end=True)
        else:
            self._set_state("stopped", detail=st.note)
        return st

    async def _history_read(self) -> None:
        try:
            await self.tail_caught_up(HISTORY_S)
        finally:
            self.guard_quiet = False

    async def _open_url(self) -> str:
        port = await self.transport.forward_port(self.preset.server.port)
        self.url = self.transport.url(port)
        return self.url

    async def follow(self, from_end: bool = False, backlog: int | None = ATTACH_BACKLOG) -> None:
        """(Re)start tailing the server's log; with ``from_end``, only the last ``backlog`` bytes
        of what is already there are read. Link losses are retried forever (``tail_state`` says
        "reconnecting" meanwhile); only an error that retrying cannot fix ends the tail."""
        await self.stop_follow()
        offset = 0
        if from_end and backlog is not None:
            offset = max(0, await file_size(self.transport, self.preset.server.log) - backlog)
        self._tail = LogTail(
            self.transport,
            self.preset.server.log,
            offset=offset,
            python=self.preset.python(),
            on_state=self._on_tail_state,
        )
        skip_first = offset > 0 and bool(backlog)  # we started mid-line
        tail = self._tail
        shown = redact.Redactor(self.preset)

        async def run() -> None:
            nonlocal skip_first
            try:
                async for batch in tail.batches():
                    lines = batch.lines[1:] if skip_first and not batch.reset else batch.lines
                    skip_first = False
                    events: list[Event] = []
                    if batch.reset:
                        events.append(Marker("log truncated or replaced; following the new file"))
                    for line in lines:
                        events.append(LogLine(shown(line)))
                        ev = parse_line(line)
                        if ev is not None:
                            ev = shown.event(ev)
                            events.append(ev)
                            if isinstance(ev, ServerError):
                                self._errors = [*self._errors[-19:], ev]
                    if events:
                        self.publish(events)
            except TransportError as e:
                self.tail_state = f"stopped: {e}"
                self.link = LinkState("lost", 0, str(e))
                self.publish([self.link])

        self._tail_task = asyncio.ensure_future(run())
        self._scrape_task = asyncio.ensure_future(
            promscrape.watch(lambda: self.url if self.state.state == "ready" else None, self.publish)
        )

    def _on_tail_state(self, state: str) -> None:
        self.tail_state = state

    @property
    def tail_running(self) -> bool:
        """Whether the live tail is still following (or reconnecting); "follow again" restarts it if not."""
        return self._tail_task is not None and not self._tail_task.done()

    def start_telemetry(self) -> None:
        """GPU telemetry beside the log (idempotent); its events flow like every other event."""
        tel = self.preset.telemetry
        if not tel.enabled or self._telemetry_task is not None:
            return
        self.telemetry = telemetry.Collector(
            self.transport, telemetry.for_preset(self.preset), self.publish, period_ms=tel.period_ms
        )
        self._telemetry_task = asyncio.ensure_future(self.telemetry.run())

    async def stop_follow(self) -> None:
        if self._tail is not None:
            self._tail.close()
        tasks = (self._tail_task, self._scrape_task)
        self._tail = self._tail_task = self._scrape_task = None
        await cancel_and_wait(*tasks)

    # ---- relaunch -------------------------------------------------------------------------
    async def relaunch(self, preset: P.Preset | None = None) -> ReadyResult:
        """Preflight, stop, start, wait ready; raises ControlError/TransportError on failure.

        A preflight refusal touches nothing: the old server keeps running and the old preset stays.
        """
        if why := self.refusal():
            raise ControlError(why, 2)
        async with self._relaunch_lock:
            new = preset or self.preset
            control = control_for(self.transport, new, self.control.state_dir)
            t0 = time.monotonic()
            was_loaded = self.load.on
            self._set_state("starting", "preflight")
            self.publish([Marker(f"relaunch: {new.name}", new.name, new.hash())])

            await self._unwatch()

            async def before_stop() -> None:
                if self.load.on:
                    await self.set_load(False)
                await self.stop_follow()
                await self.stop_nodes()
                self._set_state("stopping")

            async def after_start(rec) -> None:
                old = self.control
                self.preset, self.control, self.record = new, control, rec
                self.holds.reset()  # a new launch holds nothing
                self.launched = True
                if old is not control:
                    await old.close()  # a multi-node control's links to its nodes; node 0's is the session's
                self.store.clear()
                if self.guard is not None:
                    self.guard.reset()
                self._set_state("starting", "launching", pid=rec.pid)
                await self.follow()

            try:
                rec, res = await control.relaunch(
                    self.ready_timeout_s,
                    before_stop=before_stop,
                    after_start=after_start,
                    allowed={self.preset.name, new.name},
                    on_phase=lambda ph, el: self._set_state(
                        "starting", ph, pid=self.record.pid if self.record else None, elapsed=el
                    ),
                )
            except (ControlError, TransportError) as e:
                self.last_ready = None
                self._set_state("failed", detail=str(e))
                raise
            except asyncio.CancelledError:
                self.cleanup = control.cleanup  # the half-started server, stopped by the relaunch
                raise
            assert res is not None  # it waited: ready, or an error was raised
            self.last_ready = res
            self.running_preset = new
            if control.warnings:
                self.publish([Marker(f"warning: {w}", new.name, new.hash()) for w in control.warnings])
            await self._open_url()
            self._set_state("ready", "ready", pid=rec.pid, elapsed=time.monotonic() - t0)
            await self._serve()
            if was_loaded:
                await self.set_load(True, self.load.concurrency)
            return res

    def refusal(self) -> str | None:
        """Why this session may not relaunch or stop the server (one sentence), or None: a server
        tuitune did not start is watched read-only until `tuitune adopt PRESET`."""
        if not self.read_only:
            return None
        pid = self.record.pid if self.record else None
        return refuse_not_ours(self.preset, self.transport.label, pid)

    async def stop_server(self) -> str:
        if why := self.refusal():
            raise ControlError(why, 2)
        await self._unwatch()
        await self.set_load(False)
        await self.stop_nodes()
        msg = await self.control.stop()
        self.launched = False
        self._set_state("stopped", detail=msg)
        return msg

    async def stop_started(self, say: Callable[[str], None] | None = None) -> None:
        """An interrupted experiment's clean-up (Ctrl-C, SIGTERM): the server this session started is
        stopped, a server it found running is left alone; what was done is handed to ``say`` in a
        sentence (nothing when it started none, or none of it runs)."""
        said = self.cleanup
        if self.launched:
            await self._unwatch()
            await self.set_load(False)
            await self.stop_nodes()
            # (None when none runs: a relaunch cut short stopped its half-started server, and said so)
            said = await stop_started(self.control, self.preset.name) or said
            self.launched = False
            self._set_state("stopped", detail=said)
        if said and say is not None:
            say(said)

    # ---- watching a ready server ------------------------------------------------------------
    async def _serve(self, from_end: bool = False) -> None:
        """Watch the ready server: one machine's process is polled here (died? replaced?); a
        multi-node server's other nodes are followed and watched as a whole (``watch_nodes``)."""
        if len(self.control.nodes) > 1:
            await self.watch_nodes(from_end=from_end)
        else:
            self._watch()

    def _watch(self) -> None:
        self._errors = []
        if self._watch_task is None or self._watch_task.done():
            self._watch_task = asyncio.ensure_future(self._watch_loop())

    async def _unwatch(self) -> None:
        task, self._watch_task = self._watch_task, None
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)

    async def _watch_loop(self) -> None:
        """While ready: notice that the process died (with the cause the log gave) or that someone
        else (another tuitune, `tuitune launch` from a shell) replaced it, instead of showing a
        frozen "ready". After an exit it keeps looking: a relaunch elsewhere is picked up."""
        while self.record is not None and self.state.state in ("ready", "exited"):
            await asyncio.sleep(WATCH_S)
            if self._relaunch_lock.locked():
                return  # our own relaunch: it watches again once ready
            try:
                node = self.control.nodes[0]
                rec, alive = await node.watch_tick(self.record.pid)
                replaced = rec is not None and rec.pid != self.record.pid and await node.alive(rec.pid)
            except TransportError:
                # a link lost during a check is no answer about the server (the transport raises
                # LinkLost, never a "not running"): the link state says why; check again once
                # it is back, the tail's own resume reconnecting meanwhile
                continue
            if self._relaunch_lock.locked() or self.state.state not in ("ready", "exited"):
                return
            if replaced and rec is not None:
                await self._adopt(rec, self.record.pid)
            elif not alive and self.state.state == "ready":
                await asyncio.sleep(0.2)  # let the last lines of its log arrive (for the cause)
                pid = self.record.pid
                cause = self._exited(pid, stopped_elsewhere=rec is None)
                if rec is not None and rec.pid == pid:
                    with contextlib.suppress(ControlError, TransportError):
                        await node.note_exit(pid, cause)  # `tuitune status` names it later

    def _exited(self, pid: int, stopped_elsewhere: bool) -> str:
        found = classify(self._errors)
        cause = (
            f"{CAUSE_TEXT.get(found[0], found[0])}: {found[1]}"
            if found
            else "stopped by another tuitune or `tuitune stop`"
            if stopped_elsewhere
            else "killed, or exited without an error line in the log"
        )
        self.publish([Marker(f"server {pid} exited ({cause})", self.preset.name, self.preset.hash())])
        self._set_state("exited", "exited", detail=cause[:300], pid=pid)
        self.running_preset = None
        self.holds.reset()
        return cause

    async def _adopt(self, rec: ServerRecord, old: int) -> None:
        """Another client relaunched the server on our port (``old``: the pid we followed): follow
        the new one and say so."""
        same = rec.preset_hash == self.preset.hash()
        self.record = rec
        self.running_preset = self.preset if same else None
        self.holds.reset()
        who = getattr(rec, "client", None) or "another tuitune or a `tuitune launch`"
        msg = f"server relaunched by {who}: pid {old} → {rec.pid}, preset {rec.preset}" + (
            "" if same else " (not this configuration: the differences are unknown until you relaunch)"
        )
        self.store.clear()
        if self.guard is not None:
            self.guard.reset()
        # the state first, then the notice: whoever reads the notice finds the new server in the state
        # (under load, following its log took long enough for a reader to see the old pid, exited)
        self._set_state("ready", "relaunched elsewhere", detail=msg, pid=rec.pid)
        self.publish([Marker(f"warning: {msg}", rec.preset, rec.preset_hash)])
        await self.follow()

    def nccl_report(self) -> tuple[list[tuple[str, str, str | None]], str | None]:
        """NCCL's confirmation of the preset's NCCL variables, and a sentence when it cannot be trusted."""
        nodes = self.control.nccl_by_node(self.last_ready) if self.last_ready else [(self.preset, {})]
        if len(nodes) == 1:
            return nccl_confirmation(*nodes[0]), nccl_note(*nodes[0])
        rows, notes = [], []  # every node confirms from its own log
        for i, (node, env) in enumerate(nodes):
            rows += [(f"node {i} {k}", state, got) for k, state, got in nccl_confirmation(node, env)]
            notes += [f"node {i}: {n}" for n in [nccl_note(node, env)] if n]
        return rows, "; ".join(notes) or None

    # ---- the other nodes of a multi-node server --------------------------------------------
    async def watch_nodes(self, from_end: bool = False) -> None:
        """Follow every other node's log (lines for the log pane, errors into the stream) and fail
        the server the moment any node dies; the watch stops the other nodes first."""
        await self.stop_nodes()
        self._node_tasks = [
            asyncio.ensure_future(self._follow_node(i, c, from_end)) for i, c in enumerate(self.control.nodes) if i
        ]
        self._node_tasks.append(asyncio.ensure_future(self._watch_cluster()))

    async def _watch_cluster(self) -> None:
        try:
            res = await self.control.watch()
        except (ControlError, TransportError) as e:
            self.publish([Marker(f"warning: watching the nodes failed: {e}")])
            return
        if res is None:
            return  # the nodes' servers are not all known: nothing to watch
        self.last_ready = None
        self._set_state("failed", detail=res.message)

    async def _follow_node(self, i: int, c: ServerControl, from_end: bool) -> None:
        log = c.preset.server.log
        offset = max(0, await file_size(c.t, log) - ATTACH_BACKLOG) if from_end else 0
        tail = LogTail(c.t, log, offset=offset)
        shown = redact.Redactor(c.preset)
        try:
            async for batch in tail.batches():
                events: list[Event] = []
                for line in batch.lines:
                    events.append(LogLine(shown(line), node=i))
                    ev = parse_line(line)
                    if ev is not None and ev.kind == "error":  # a node's errors are the server's
                        events.append(msgspec.structs.replace(shown.event(ev), rank=f"node{i}"))
                self.publish(events)
        except TransportError as e:
            self.publish([Marker(f"warning: node {i}'s log: {e}")])
        finally:
            tail.close()

    async def stop_nodes(self) -> None:
        tasks, self._node_tasks = self._node_tasks, []
        await cancel_and_wait(*tasks)

    # ---- benchmark and load ---------------------------------------------------------------
    def bench_config(self, overrides: dict | None = None, label: str = "") -> BenchConfig:
        """What ``bench`` runs with these overrides: the preset's bench section with them on top."""
        return BenchConfig.for_preset(self.url or "", self.preset, overrides, label)

    async def bench(
        self,
        label: str = "",
        on_result: Callable[[int, RequestResult], Awaitable[None] | None] | None = None,
        **overrides,
    ) -> BenchRun:
        """One benchmark run (a ``Bencher``, tuitune.measure.levels, as a bare URL is)."""
        if self.url is None:
            await self._open_url()
        cfg = self.bench_config(overrides, label)
        was_loaded = self.load.on
        if was_loaded:
            await self.set_load(False)  # a benchmark measures alone
        await self.tail_caught_up()  # lines logged before the benchmark are no part of it
        cycles: list[float] = []
        batch: list[int] = []
        self.start_telemetry()
        gpus = telemetry.RunWatch()  # capping / straggler state while the run measures

        def collect(events: list[Event]) -> None:
            cycles.extend(e.cycle_ms for e in events if isinstance(e, ProfileWindow) and math.isfinite(e.cycle_ms))
            batch.extend(e.running_req for e in events if isinstance(e, DecodeStats) and e.running_req)
            gpus.feed(events)

        self.subscribe(collect)
        try:
            run = await run_bench(cfg, on_result)
        finally:
            self.subscribers.remove(collect)
            if was_loaded:
                await self.set_load(True, self.load.concurrency)
        run.cycle_ms = sum(cycles) / len(cycles) if cycles else None
        run.batch_sizes = batch
        run.env_drift = await self._env_drift()
        run.gpu_note = gpus.note()
        s = run.summary()
        tok = s.get("tok_s") or {}
        acc = s.get("accept_len") or {}
        ttft = s.get("ttft_ms") or {}
        ci = tok.get("ci95", [float("nan")] * 2)
        self.publish(
            [
                BenchSummary(
                    cfg.label,
                    tok.get("median", float("nan")),
                    ci[0],
                    ci[1],
                    acc.get("mean"),
                    ttft.get("median"),
                    s["requests"],
                    s["failed"],
                    run.gpu_note,
                )
            ]
        )
        return run

    async def tail_caught_up(self, timeout_s: float = 3.0) -> bool:
        """Wait (bounded) until the tail has delivered what the log held when called (an attach
        reads a backlog, whose decode lines would otherwise count as the benchmark's; a recording
        from the start waits for the whole history). False if it had not within ``timeout_s``, or
        the log's size could not be read."""
        if self._tail is None:
            return False
        try:
            size = await asyncio.wait_for(file_size(self.transport, self.preset.server.log), timeout_s)
        except (TransportError, TimeoutError):
            return False
        deadline = time.monotonic() + timeout_s
        while self._tail is not None and self._tail.offset < size and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return self._tail is not None and self._tail.offset >= size

    async def _env_drift(self) -> list[str] | None:
        """The variables in which the measured server's real environment differs from its preset
        (the seeds' silent failure), or None when it cannot be read."""
        with contextlib.suppress(ControlError, TransportError):
            st = await self.control.status()
            if st.running:
                return [d.key.removeprefix("env.") for d in st.drift if d.key.startswith("env.")]
        return None

    async def set_load(self, on: bool, concurrency: int | None = None) -> None:
        """Keep ``concurrency`` streams of requests running so that the server decodes."""
        if concurrency:
            self.load.concurrency = max(1, concurrency)
        task, self._load_task = self._load_task, None
        await cancel_and_wait(task)
        self.load.on = on
        if on:
            self._load_task = asyncio.ensure_future(self._load_loop())
        self.publish([Marker(f"load {'on' if on else 'off'} ({self.load.concurrency} stream(s))")])

    async def _load_loop(self) -> None:
        try:
            work = workload.for_preset(self.preset)
        except WorkloadError as e:
            self.load.on = False
            self.load.last_error = f"bench.prompts: {e}"
            self.publish([Marker(f"load off: bench.prompts: {e}")])
            return

        async def stream(i: int) -> None:
            async with client_session() as session:
                n = i
                while True:  # until set_load cancels it
                    if self.url is None or self.state.state != "ready":
                        await asyncio.sleep(0.5)
                        continue
                    cfg = BenchConfig(
                        self.url,
                        max_tokens=self.preset.bench.max_tokens,
                        api=self.preset.bench.api,
                        model=self.preset.engine.served_model(self.preset),
                        workload=work,
                    )
                    r = await run_request(session, *cfg.for_item(n))
                    if cancelled_since(0):  # asked to stop while the request ended anyway: stop
                        raise asyncio.CancelledError
                    n += 1
                    self.load.requests += 1
                    if not r.ok:
                        self.load.failed += 1
                        self.load.last_error = r.error
                        await asyncio.sleep(1.0)  # a down server is not hammered

        await asyncio.gather(*(stream(i) for i in range(self.load.concurrency)))

    # ---- the switch (docs/switch.md) -------------------------------------------------------
    @property
    def held(self) -> int | None:
        return self.holds.held

    @property
    def launched_preset(self) -> P.Preset | None:
        """What the running server was launched from (``running_preset`` less any hold)."""
        return self.holds.unheld or self.running_preset

    async def hold(
        self, steps: int | None, timeout_s: float = 30.0, allow_any: bool = False, preset: P.Preset | None = None
    ) -> switch.Ack:
        """Hold ``steps`` (None: release) in the running launch, live, through the engine's own switching
        code; an idle server is nudged with short requests until it answers. ``preset``: the launch's
        preset with that step count (the TUI's draft), what the server runs while the hold lasts."""
        url = self.url or await self._open_url()
        nudge = switch.Nudge(url, self.preset.bench.api, self.preset.engine.served_model(self.preset))
        ack = await switch.hold_running(self.control, steps, nudge, timeout_s, allow_any)
        self.running_preset = self.holds.applied(ack, self.running_preset, preset)
        what = f"held {self.preset.engine.step_name} {ack.held}" if ack.held is not None else "released"
        self.publish([Marker(f"switch: {what} (command {ack.seq})")])
        return ack

    # ---- shutdown -------------------------------------------------------------------------
    async def close(self, stop_server: bool = False) -> None:
        task, self._history_task = self._history_task, None
        await cancel_and_wait(task)
        await self._unwatch()
        await self.set_load(False)
        await self.stop_follow()
        await self.stop_nodes()
        await telemetry.stop(self.telemetry, self._telemetry_task)
        self.telemetry = self._telemetry_task = None
        if stop_server:
            with contextlib.suppress(ControlError, TransportError):
                await self.control.stop()
        await self.control.close()
        await self.transport.close()
