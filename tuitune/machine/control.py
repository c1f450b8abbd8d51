"""Server control on the target: start, stop, relaunch (lock -> preflight -> stop -> start -> wait
ready), adopt, and report (status, drift, why a server exited).

``ServerControl`` is the ``Host`` of one preset's server (host.py: its link, the small questions
asked of the target) and composes the rest, each in a module of its own: the port's lock
(lock.py), the preflight checks (preflight.py), the state record and drift (record.py), and
readiness (readiness.py). Every change of state on the target goes through here, under the lock.
The scripts it sends to the target are files of ``machine/remote/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.aio import to_the_end
from tuitune.base.events import ServerError
from tuitune.engines import CAUSE_TEXT
from tuitune.machine import lock, readiness
from tuitune.machine.errors import ControlError, not_ours, refuse_not_ours
from tuitune.machine.host import LIVE_SH, Host, script, shell_arg
from tuitune.machine.preflight import Preflight
from tuitune.machine.readiness import HEALTH_TIMEOUT_S, ReadyResult, classify
from tuitune.machine.record import STATE_DIR, Drift, ServerRecord, StateFile, compute_drift, hand_started, still_ours
from tuitune.machine.switch import Switch
from tuitune.machine.transport import Transport, TransportError
from tuitune.measure.parse import parse_line

# the stop script (remote/stop.sh): TERM, wait, KILL, wait for the port, clear the state
_STOP_SH = script("stop.sh").replace("@LIVE_SH@", LIVE_SH)


@dataclass
class Status:
    running: bool
    record: ServerRecord | None = None
    uptime_s: float | None = None
    drift: list[Drift] = field(default_factory=list)
    same_hash: bool | None = None
    note: str | None = None
    nodes: list[NodeView] = field(default_factory=list)  # each node of a multi-node server (none on one machine)
    ours: bool = True  # False: a live server tuitune did not start (started by hand): read-only until adopted

    def to_dict(self) -> dict:
        rec = asdict(self.record) if self.record else None
        if rec is not None:
            rec["argv"], rec["env"] = redact.argv(rec["argv"]), redact.env(rec["env"])
            rec["cause"] = redact.text(rec["cause"]) if rec["cause"] else None
        return {
            "running": self.running,
            "ours": self.ours,
            "record": rec,
            "uptime_s": self.uptime_s,
            "same_hash": self.same_hash,
            "note": self.note,
            "drift": [asdict(d.shown()) for d in self.drift],
            **({"nodes": [n.to_dict() for n in self.nodes]} if self.nodes else {}),
        }


@dataclass
class NodeView:
    """One node of a multi-node server as ``status`` sees it."""

    index: int
    label: str
    status: Status

    def to_dict(self) -> dict:
        return {"node": self.index, "target": self.label, **self.status.to_dict()}


class Controller(Protocol):
    """The control of one server: ``ServerControl`` on one machine, ``ClusterControl``
    (tuitune.machine.cluster) on several in step. The session and the commands hold one of these
    and never ask which: what differs between the two is a member here."""

    t: Transport  # node 0's link (the caller's)
    preset: P.Preset
    state_dir: str
    warnings: list[str]  # what the last relaunch (or status) found worth saying
    cleanup: str | None  # what a failed or cancelled relaunch did with its server
    preflight_s: float | None  # how long the last relaunch's checks took

    @property
    def help_cached(self) -> bool | None:
        """The engine's flag listing came from the target's cache (None: not listed yet)."""
        ...

    @property
    def nodes(self) -> Sequence[ServerControl]:
        """Each node's own control, node 0 first (only itself on one machine)."""
        ...

    def foreign(self, rec: ServerRecord | None, allowed: set[str] | None = None) -> str | None: ...

    def locked(self, action: str) -> contextlib.AbstractAsyncContextManager[None]: ...

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
    ) -> tuple[ServerRecord, ReadyResult | None]: ...

    async def stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = False) -> str: ...

    async def status(self, pid: int | None = None) -> Status: ...

    def nccl_by_node(self, res: ReadyResult) -> list[tuple[P.Preset, dict[str, str]]]:
        """Each node's preset with the NCCL variables its log confirmed after ``res``'s start."""
        ...

    async def watch(self) -> ReadyResult | None:
        """While serving: returns when the server failed as a whole (why attached), or None at once
        when there is nothing to watch beyond its one process (which its session polls)."""
        ...

    async def close(self) -> None:
        """Close the links this control opened itself (node 0's belongs to the caller)."""
        ...


class ServerControl(Host):
    def __init__(self, transport: Transport, preset: P.Preset, state_dir: str = STATE_DIR):
        super().__init__(transport, preset)
        self.state_dir = state_dir
        self.record = StateFile(self, state_dir)
        self.checks = Preflight(self)
        self.preflight_s: float | None = None  # how long the last relaunch's checks took
        self.cleanup: str | None = None  # what a failed or cancelled relaunch did with its server

    # ---- the parts: state record (record.py), lock (lock.py), preflight (preflight.py) -----
    @property
    def state_path(self) -> str:
        return self.record.path

    async def read_state(self) -> ServerRecord | None:
        return await self.record.read()

    async def watch_tick(self, pid: int) -> tuple[ServerRecord | None, bool]:
        return await self.record.watch_tick(pid)

    async def write_state(self, rec: ServerRecord) -> None:
        await self.record.write(rec)

    async def clear_state(self) -> None:
        await self.record.clear()

    async def still_ours(self, rec: ServerRecord) -> bool:
        return await still_ours(self, rec)

    async def hand_started(self) -> ServerRecord | None:
        return await hand_started(self)

    def locked(self, action: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold the target's lock for this port while changing what runs on it (lock.py)."""
        return lock.locked(self, self.state_dir, action, self.check_python)

    @property
    def help_cached(self) -> bool | None:
        """The engine's flag listing came from the target's cache (None: not listed yet)."""
        return self.checks.help_cached

    async def server_flags(self) -> set[str]:
        return await self.checks.server_flags()

    async def check_python(self) -> None:
        await self.checks.check_python()

    async def install_probe(self) -> dict:
        return await self.checks.install_probe()

    async def preflight(self, replacing: ServerRecord | None) -> None:
        await self.checks.run(replacing)

    wait_ready = readiness.wait_ready  # (a method: the control is the host it waits on)

    # ---- state ---------------------------------------------------------------------------
    async def note_exit(self, pid: int, cause: str) -> bool:
        """Keep in the state why server ``pid`` exited (``status`` names it later), if the state
        still records that server and it is gone; under the lock (False when another client
        holds it: its launch or stop rewrites the state anyway)."""
        try:
            async with self.locked("record exit"):
                rec = await self.read_state()
                if rec is None or rec.pid != pid or await self.alive(pid):
                    return False
                rec.cause = redact.text(cause)[:300]
                await self.write_state(rec)
                return True
        except ControlError:
            return False

    async def exit_cause(self, rec: ServerRecord) -> str:
        """Why a recorded server is gone: the cause a watcher kept, else the most telling error
        line of the end of its log, else that none was found."""
        if rec.cause:
            return rec.cause
        r = await self.t.run(f"tail -c 262144 -- {P.shell_path(rec.log)} 2>/dev/null", timeout=30)
        lines = r.stdout.splitlines()[1 if len(r.stdout) >= 262144 else 0 :]  # (the first may be cut)
        errors = [ev for ev in map(parse_line, lines) if isinstance(ev, ServerError)]
        found = classify(errors)
        if found is None:
            return "killed, or exited without an error line in the log"
        return redact.Redactor(self.preset)(f"{CAUSE_TEXT.get(found[0], found[0])}: {found[1]}")[:300]

    def foreign(self, rec: ServerRecord | None, allowed: set[str] | None = None) -> str | None:
        """Why acting on ``rec`` would act on another preset's server, or None."""
        names = allowed or {self.preset.name}
        if rec is None or rec.preset in names:
            return None
        return (
            f"the server on port {rec.port} of {self.t.label} (pid {rec.pid}) was started by preset "
            f"{rec.preset}, not {self.preset.name}; pass --any to act on it anyway"
        )

    # ---- start / stop --------------------------------------------------------------------
    async def start(self) -> ServerRecord:
        p = self.preset
        log = P.shell_path(p.server.log)
        # the log is the server's own and may hold a secret it prints (vLLM's api-key at start-up):
        # created private (0600), and made so when it is there already (a device such as /dev/null
        # refuses chmod: that is left as it is)
        switch = Switch(self.t, p.server.port)
        await self.t.run(
            f'mkdir -p -- "$(dirname -- {log})" && (umask 077 && : >>{log}); chmod 600 -- {log} 2>/dev/null; '
            + ("true" if p.switch_steps else switch.clear_command()),  # an old launch's key signs nothing here
            timeout=30,
        )
        # prepared to switch: a new key for this launch, and the two variables that give it to the engine
        env = await switch.prepare() if p.switch_steps else None
        r = await self.t.run(P.launch_command(p, env), timeout=60)
        pid_text = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else []
        if not r.ok or not pid_text or not pid_text[0].isdigit():
            raise ControlError(
                f"{self.t.label}: the launch command failed (exit {r.exit_status}): "
                f"{(r.stderr or r.stdout).strip()[:300]}"
            )
        rec = ServerRecord(
            pid=int(pid_text[0]),
            port=p.server.port,
            preset=p.name,
            preset_hash=p.hash(),
            started=time.time(),
            log=p.server.log,
            argv=p.flags(),
            env=p.launch_env(),  # without the switch's key (a secret; drift is about the preset's own values)
            switch=p.switch_steps,
        )
        await self.write_state(rec)
        return rec

    async def stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = False) -> str:
        """Stop the server tuitune started on this port for this preset (or ``pid``), under the lock."""
        async with self.locked("stop"):
            return await self._stop(pid, grace_s, allow_any)

    async def _stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = True) -> str:
        """TERM the group, wait, KILL; refuses another preset's server unless ``allow_any``."""
        rec = await self.read_state()
        if (
            pid is None
            and not allow_any
            and rec is not None
            and (why := self.foreign(rec))
            and await self.alive(rec.pid)
        ):
            raise ControlError(why, 2)
        target = pid if pid is not None else (rec.pid if rec else None)
        if pid is None and (rec is None or not await self.alive(rec.pid)) and await self.port_busy():
            hand = await self.hand_started()
            raise ControlError(refuse_not_ours(self.preset, self.t.label, hand.pid if hand else None), 2)
        if target is None:
            return "no server started by tuitune on this port"
        if pid is None and rec and not await self.alive(rec.pid):
            await self.clear_state()
            return f"server {rec.pid} was not running (state cleared)"
        if pid is None and rec and not await self.still_ours(rec):
            await self.clear_state()
            return f"server {rec.pid} is gone and its pid now runs another program (state cleared, nothing stopped)"
        steps = max(1, int(grace_s / 0.1))
        port = int(self.preset.server.port)
        clear = self.state_path if rec and rec.pid == target else ""
        # one round trip (remote/stop.sh): TERM, wait, KILL, wait for the port, clear the state;
        # exit 0 stopped, 10 killed, 3 survived, 4 port busy
        r = await self.t.run(
            f"set -- {int(target)} {port} {steps} {shell_arg(clear)}\n{_STOP_SH}", timeout=grace_s + 30
        )
        if r.exit_status == 3:
            raise ControlError(f"process group {target} on {self.t.label} survived SIGKILL")
        if r.exit_status == 4:
            raise ControlError(f"server {target} stopped but port {port} is still in use")
        how = "killed after the grace period" if r.exit_status == 10 else "stopped"
        return f"server {target} {how}; port {self.preset.server.port} free"

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
        """Under the port's lock: preflight (nothing touched if it refuses), stop what runs, start,
        wait until ready (unless ``wait`` is false: then the result is None once the process is
        started).

        Refuses to replace a server that a preset outside ``allowed`` (default: this one) started,
        unless ``allow_any``. Raises ControlError when the server does not become ready (the log
        tail attached); that failure, and a cancellation (Ctrl-C, SIGTERM), stop the half-started
        server first unless ``keep_on_failure``. ``cleanup`` says what happened to it.
        """
        self.warnings = []
        self.cleanup = None
        self.deadline = deadline = time.monotonic() + timeout_s  # every wait of the launch ends by it
        try:
            await self.check_python()  # before the lock: its helper runs with that python
            async with self.locked("launch"):
                current = await self.read_state()
                if (
                    not allow_any
                    and current is not None
                    and (why := self.foreign(current, allowed))
                    and await self.alive(current.pid)
                ):
                    raise ControlError(why, 2)
                t_check = time.monotonic()
                await self.preflight(current)
                self.preflight_s = time.monotonic() - t_check
                if before_stop is not None:
                    await before_stop()
                if current is not None:
                    # stopped to the end, and started and recorded to the end, even under a Ctrl-C:
                    # cut half-way, either would leave a server that nothing tracks
                    msg, cut = await to_the_end(self._stop())
                    if cut:
                        self.cleanup = f"the server it was replacing ({current.preset}, pid {current.pid}) was stopped"
                        raise asyncio.CancelledError
                    if on_stopped is not None:
                        on_stopped(msg)
                rec, cut = await to_the_end(self.start())
                if cut:
                    await to_the_end(self._after_failure(rec, keep_on_failure))
                    raise asyncio.CancelledError
                try:
                    if after_start is not None:
                        await after_start(rec)
                    if not wait:
                        return rec, None
                    res = await self.wait_ready(
                        rec, timeout_s, on_phase=on_phase, health_timeout_s=health_timeout_s, deadline=deadline
                    )
                except asyncio.CancelledError:
                    await to_the_end(self._after_failure(rec, keep_on_failure))
                    raise
                if not res.ok:
                    await self._after_failure(rec, keep_on_failure)
                    raise ControlError(
                        f"{res.message or 'server did not become ready'}; {self.cleanup}", 1, res.log_tail
                    )
                rec.ready_s = round(res.elapsed_s, 2)  # kept: what the next launch of it may take
                await self.write_state(rec)
                return rec, res
        finally:
            self.deadline = None

    async def _after_failure(self, rec: ServerRecord, keep: bool) -> None:
        """Never leave a half-started server behind unknowingly: stop it, or say that it was kept."""
        if keep:
            self.cleanup = f"server {rec.pid} left running (--keep-on-failure)"
            return
        try:
            # the grace before SIGKILL is a wait of the launch too: cut to what is left of its
            # deadline (the whole group and its descendants go either way)
            await self._stop(grace_s=max(0.2, self.limit(5.0)))
            self.cleanup = f"the half-started server {rec.pid} was stopped"
        except (ControlError, TransportError) as e:
            self.cleanup = f"stopping the half-started server {rec.pid} failed: {e}"

    async def adopt(self) -> tuple[ServerRecord, list[Drift]]:
        """Record the server that listens on the preset's port, started by hand, as tuitune's (under
        the port's lock, atomically as a launch writes its record): from then on relaunch and stop
        act on it. Returns the record and the drift between it and the preset; refuses when
        nothing listens, or tuitune already runs a server there."""
        async with self.locked("adopt"):
            rec = await self.read_state()
            if rec is not None and await self.alive(rec.pid) and await self.still_ours(rec):
                raise ControlError(
                    f"the server on port {rec.port} of {self.t.label} (pid {rec.pid}) is tuitune's already "
                    f"(preset {rec.preset}); nothing to adopt",
                    2,
                )
            hand = await self.hand_started()
            if hand is None:
                raise ControlError(
                    f"no server listens on port {self.preset.server.port} of {self.t.label}; nothing to adopt", 1
                )
            view = await self.process_view(hand.pid)
            drift = compute_drift(self.preset, *view) if view is not None else []
            hand.preset = self.preset.name
            hand.preset_hash = "" if drift else self.preset.hash()
            await self.write_state(hand)
            return hand, drift

    # ---- as a Controller: one machine is a server of one node ------------------------------
    @property
    def nodes(self) -> list[ServerControl]:
        return [self]

    def nccl_by_node(self, res: ReadyResult) -> list[tuple[P.Preset, dict[str, str]]]:
        return [(self.preset, res.nccl_env)]

    async def watch(self) -> ReadyResult | None:
        return None  # one process, no nodes to keep in step: the session polls it and reads its log

    async def close(self) -> None:
        return None  # it opens no link of its own

    async def status(self, pid: int | None = None) -> Status:
        rec = await self.read_state()
        if pid is not None and (rec is None or rec.pid != pid):
            rec = ServerRecord(
                pid=pid,
                port=self.preset.server.port,
                preset="(by hand)",
                preset_hash="",
                started=0.0,
                log=self.preset.server.log,
            )
        if (rec is None or (pid is None and not await self.alive(rec.pid))) and await self.port_busy():
            hand = await self.hand_started()
            if hand is not None:
                st = Status(
                    True,
                    hand,
                    uptime_s=time.time() - hand.started if hand.started else None,
                    note=not_ours(self.preset),
                    ours=False,
                )
                if (view := await self.process_view(hand.pid)) is not None:
                    st.drift = compute_drift(self.preset, *view)
                return st
            if rec is None:
                return Status(False, note=f"port {self.preset.server.port} is in use by a program tuitune cannot read")
        if rec is None:
            return Status(False)
        if not await self.alive(rec.pid):
            cause = await self.exit_cause(rec)
            return Status(False, rec, note=f"server {rec.pid} recorded but not running; it exited: {cause}")
        if pid is None and not await self.still_ours(rec):
            return Status(False, rec, note=f"server {rec.pid} recorded, but that pid now runs another program")
        view = await self.process_view(rec.pid)
        st = Status(
            True,
            rec,
            uptime_s=time.time() - rec.started if rec.started else None,
            same_hash=rec.preset_hash == self.preset.hash() if rec.preset_hash else None,
        )
        if view is not None:
            st.drift = compute_drift(self.preset, *view)
        return st
