"""Waiting for a started server to be ready, and what its start-up log confirmed.

Ready means /health answers 200 *and* the port's listening socket belongs to the started process
or one of its children; the log only names phases and causes (and the NCCL variables NCCL echoed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.aio import cancel_and_wait
from tuitune.base.events import Event, NcclEnv, ServerError
from tuitune.engines import CAUSE_ORDER, CAUSE_TEXT
from tuitune.machine.errors import LinkLost, TransportError
from tuitune.machine.host import Host
from tuitune.machine.record import ServerRecord
from tuitune.machine.tail import LogTail
from tuitune.measure.parse import parse_line

HEALTH_TIMEOUT_S = 120.0  # once HTTP answers, the longest wait for /health 200 (a phase limit)


@dataclass
class ReadyResult:
    ok: bool
    elapsed_s: float
    phase: str
    cause: str | None = None
    message: str | None = None
    log_tail: list[str] = field(default_factory=list)
    errors: list[ServerError] = field(default_factory=list)
    nccl_env: dict[str, str] = field(default_factory=dict)
    ready_line_at: float | None = None  # monotonic time the ready line was read
    reported_at: float | None = None


def classify(errors: list[ServerError]) -> tuple[str, str] | None:
    """The most telling cause among error events: (category, message)."""
    for cat in CAUSE_ORDER:
        for e in errors:
            if e.category == cat and (cat != "traceback" or len(errors) == 1):
                return cat, e.message
    return None


async def wait_ready(  # noqa: C901, PLR0915
    host: Host,
    rec: ServerRecord,
    timeout_s: float = 900.0,
    on_phase: Callable[[str, float], None] | None = None,
    on_line: Callable[[str, Event | None], None] | None = None,
    health_timeout_s: float = HEALTH_TIMEOUT_S,
    deadline: float | None = None,
) -> ReadyResult:
    """Poll /health until ready, dead or timed out; the log only names phases and causes.

    Ready means /health answers 200 *and* the port's listening socket belongs to ``rec.pid``
    or one of its children (a 200 from another server on the port proves nothing). Once
    HTTP is up (the socket is ours, or /health answers at all), /health must turn 200
    within ``health_timeout_s``.

    ``timeout_s`` (counted from ``deadline - timeout_s`` when a launch passes its deadline)
    and the phase limit are deadlines for every wait inside: a /health request that hangs
    and the checks on the target are cut to them, so the answer comes on time. A link lost
    meanwhile is not a death: the polls go on (the transport reconnects) until the deadline.
    """
    import aiohttp

    t0 = time.monotonic()
    end = t0 + timeout_s if deadline is None else deadline
    res = ReadyResult(ok=False, elapsed_s=0.0, phase="starting")
    lines: list[str] = []
    http_up = asyncio.Event()
    ready_line = asyncio.Event()
    done = asyncio.Event()

    def set_phase(name: str) -> None:
        res.phase = name
        if on_phase:
            on_phase(name, time.monotonic() - t0)

    set_phase("starting")
    seen: set[str] = set()
    tail = LogTail(host.t, rec.log, python=host.preset.python())
    shown = redact.Redactor(host.preset)

    async def follow() -> None:
        async for batch in tail.batches():
            for line in batch.lines:
                lines.append(shown(line))
                if len(lines) > 200:
                    del lines[:100]
                ev = parse_line(line)
                if on_line:
                    on_line(line, ev)
                if ev is None:
                    if (phase := host.preset.engine.phase(line, seen)) is not None:
                        seen.add(phase)
                        set_phase(phase)
                    continue
                if isinstance(ev, ServerError):
                    res.errors.append(ev)
                elif isinstance(ev, NcclEnv):
                    res.nccl_env[ev.name] = ev.value
                elif ev.kind == "http_up":
                    set_phase("http up")
                    http_up.set()
                elif ev.kind == "ready":
                    res.ready_line_at = time.monotonic()
                    ready_line.set()

    local_port = await host.t.forward_port(rec.port)
    url = host.t.url(local_port) + "/health"

    async def health(session, limit: float) -> int | None:
        left = limit - time.monotonic()
        if left <= 0:
            return None
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=min(5.0, left))) as r:
                return r.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def watch() -> None:  # noqa: C901
        http_since: float | None = None
        last: int | None = None
        owned = False  # a listening socket on the port belongs to rec.pid or its children
        loop = asyncio.get_running_loop()

        def limit() -> float:
            return end if http_since is None else min(end, http_since + health_timeout_s)

        def over() -> bool:
            """Whether a deadline has passed; then ``res`` says which."""
            now = time.monotonic()
            if http_since is not None and now >= http_since + health_timeout_s:
                res.message = (
                    f"HTTP has been up for {now - http_since:.0f} s but /health never answered "
                    f"200 (last answer: {last or 'none'}; phase limit {health_timeout_s:.0f} s)"
                )
                res.cause = "unhealthy"
                return True
            if now >= end:
                res.message = f"not ready after {timeout_s:.0f} s (phase: {res.phase})"
                res.cause = "timeout"
                return True
            return False

        async with aiohttp.ClientSession() as session:
            while not done.is_set():
                if over():
                    return
                waiter = asyncio.ensure_future(ready_line.wait())
                await asyncio.wait({waiter}, timeout=max(0.0, min(0.5, limit() - time.monotonic())))
                waiter.cancel()
                if over():
                    return
                cut = limit()
                try:
                    # every wait of this poll ends by the deadline (loop time is monotonic time)
                    async with asyncio.timeout_at(loop.time() + (cut - time.monotonic())):
                        if owned:  # our process holds the listening socket: only /health is left
                            status = await health(session, cut)
                            if status == 200:
                                res.ok = True
                                return
                            living = await host.alive(rec.pid)
                        else:  # one round trip per poll: the checks on the target run side by side
                            status, owned, living = await asyncio.gather(
                                health(session, cut), host.owns_port(rec.pid), host.alive(rec.pid)
                            )
                            if status == 200 and owned:
                                res.ok = True
                                return
                except TimeoutError:
                    continue  # the deadline came during the poll: said at the top
                except LinkLost:
                    await asyncio.sleep(min(0.5, max(0.0, limit() - time.monotonic())))
                    continue  # no answer is not "dead": ask again once the link is back
                last = status if status is not None else last
                if http_since is None and (status is not None or http_up.is_set() or owned):
                    http_since = time.monotonic()
                    if res.phase != "http up":
                        set_phase("http up")
                if not living:
                    await asyncio.sleep(0.3)  # let the last lines of the log arrive
                    return

    follower = asyncio.ensure_future(follow())
    try:
        await watch()
    finally:
        done.set()
        tail.close()
        await cancel_and_wait(follower, ignore=(TransportError,))
    res.elapsed_s = time.monotonic() - t0
    res.log_tail = lines[-40:]
    if res.ok:
        res.reported_at = time.monotonic()
        set_phase("ready")
    elif res.cause is None:
        found = classify(res.errors)
        res.cause, detail = found if found else ("exited", "the process exited without an error line")
        res.message = shown(f"server exited during start ({CAUSE_TEXT.get(res.cause, res.cause)}): {detail}")[:400]
        set_phase("failed")
    return res


NCCL_ECHO_LEVELS = ("INFO", "TRACE")  # NCCL prints the variables it applied only at these levels


def _nccl_vars(preset: P.Preset) -> dict[str, str]:
    return {
        k: v for k, v in preset.env.items() if k.startswith("NCCL_") and k not in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS")
    }


def nccl_confirmation(preset: P.Preset, seen: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """(variable, applied | missing | different | unconfirmed, value NCCL echoed) for each NCCL_*
    in the preset; "unconfirmed" when NCCL_DEBUG is not INFO, since NCCL then echoes nothing."""
    echoes = str(preset.env.get("NCCL_DEBUG", "")).upper() in NCCL_ECHO_LEVELS
    out = []
    for k, v in _nccl_vars(preset).items():
        got = seen.get(k)
        if not echoes:
            state = "unconfirmed"
        else:
            state = "missing" if got is None else ("applied" if got.strip() == v.strip() else "different")
        out.append((k, state, got))
    return out


def nccl_note(preset: P.Preset, seen: dict[str, str]) -> str | None:
    """One sentence when NCCL's confirmation is impossible or suspiciously absent, else None."""
    want = _nccl_vars(preset)
    if not want:
        return None
    if str(preset.env.get("NCCL_DEBUG", "")).upper() not in NCCL_ECHO_LEVELS:
        return (
            f"NCCL_DEBUG=INFO is needed to confirm that NCCL applied the preset's {len(want)} NCCL "
            f"variable(s); add it to the preset's env"
        )
    if not seen:
        return (
            f"NCCL echoed none of the preset's {len(want)} NCCL variable(s) although NCCL_DEBUG=INFO is "
            f"set: they may not have reached the server (see `tuitune status` for drift), or no NCCL "
            f"communicator was created"
        )
    return None
