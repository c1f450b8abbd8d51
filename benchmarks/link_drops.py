"""Link drops during --record: is a live server ever reported "exited", and does following resume?

A simulator server runs on this machine, reached over a real OpenSSH sshd on loopback; it is
launched once, then recorded the way `tuitune PRESET --record FILE --load 2` records it (the same
``experiments.record.record``, the session's event stream observed beside the capture). Meanwhile
the link is dropped N times (default 50) at random moments: either every connection's sshd is
killed (the listener stays), or sshd itself is stopped too and started again after a random outage
of up to 4 s. Following resumed after a drop when the recorder's tail has delivered everything the
log held when the link was back (the server keeps logging under the load). At the end the
capture is read back:

- "reported exited": ``server_state exited`` events the recorder wrote while the server (checked
  with kill -0 throughout) was alive the whole time; the goal is 0;
- "following resumed": drops after which the tail caught up (within 90 s), and after which the
  load's requests went on.

    python benchmarks/link_drops.py [--drops 50] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tuitune.experiments.options import RecordOptions
from tuitune.experiments.record import record
from tuitune.machine.control import ServerControl
from tuitune.machine.session import Session
from tuitune.machine.ssh import SshTarget
from tuitune.machine.transport import SshTransport
from tuitune_support.presets import make_preset
from tuitune_support.sshd import SshServer

ROOT = Path(__file__).resolve().parent.parent


def drop(sshd: SshServer, stop_listener: bool) -> None:
    children = subprocess.run(["pgrep", "-P", str(sshd.proc.pid)], capture_output=True, text=True).stdout.split()
    if stop_listener:
        sshd.stop()
    for pid in children:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def tail_offset(session: Session) -> int:
    """Bytes of the log the session's tail has delivered (complete lines)."""
    return session._tail.offset if session._tail is not None else 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


async def soak(tmp: Path, sshd: SshServer, drops: int, rng: random.Random) -> dict:
    p = make_preset(tmp, "drops", target=sshd.target(), args={"decode-log-interval": 4})
    t = SshTransport(SshTarget(**sshd.target()))
    await t.connect()
    control = ServerControl(t, p, state_dir=str(tmp / "state"))
    rec, _ = await control.relaunch(60)
    await t.close()

    session = Session(p, state_dir=str(tmp / "state"))
    cap = tmp / "drops.jsonl"
    recorder = asyncio.ensure_future(record(p, RecordOptions(record=str(cap), load=2), session=session))
    for _ in range(600):
        if session.state.state == "ready" and session.load.on:
            break
        await asyncio.sleep(0.05)

    resumed = load_resumed = 0
    server_died = False
    waits: list[float] = []
    modes = {"connections": 0, "sshd": 0}
    for _ in range(drops):
        await asyncio.sleep(rng.uniform(0.2, 2.0))  # a random point: mid-check, mid-stream, idle
        stop_listener = rng.random() < 0.4
        modes["sshd" if stop_listener else "connections"] += 1
        drop(sshd, stop_listener)
        if stop_listener:
            await asyncio.sleep(rng.uniform(0.0, 4.0))
            sshd.start()
        t0 = time.monotonic()
        requests = session.load.requests
        size = os.stat(p.server.log).st_size  # what the log held when the link came back
        for _ in range(1800):
            if tail_offset(session) >= size:
                break
            await asyncio.sleep(0.05)
        if tail_offset(session) >= size:
            resumed += 1
            waits.append(time.monotonic() - t0)
        for _ in range(600):
            if session.load.requests > requests + 1:
                load_resumed += 1
                break
            await asyncio.sleep(0.05)
        server_died = server_died or not alive(rec.pid)
    recorder.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await recorder
    await session.close()
    t = SshTransport(SshTarget(**sshd.target()))
    await t.connect()
    await ServerControl(t, p, state_dir=str(tmp / "state")).stop()
    await t.close()

    states = [json.loads(x) for x in cap.read_text().splitlines()[1:] if '"server_state"' in x]
    exited = [s for s in states if s.get("state") == "exited"]
    waits.sort()
    return {
        "drops": drops,
        "modes": modes,
        "server_died": server_died,
        "reported_exited": len(exited),
        "resumed": resumed,
        "load_resumed": load_resumed,
        "median_s": waits[len(waits) // 2] if waits else None,
        "max_s": waits[-1] if waits else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--drops", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "sshd").mkdir()
        sshd = SshServer(tmp / "sshd")
        sshd.start()
        try:
            r = asyncio.run(soak(tmp, sshd, ns.drops, random.Random(ns.seed)))
        finally:
            if sshd.proc is not None and sshd.proc.poll() is None:
                sshd.stop()
    print(
        f"{r['drops']} link drops during --record ({r['modes']['connections']} of every connection, "
        f"{r['modes']['sshd']} of sshd itself with an outage of up to 4 s), server alive throughout: "
        f"{not r['server_died']}"
    )
    print(f"  live server reported exited: {r['reported_exited']} time(s) (goal 0)")
    print(
        f"  following resumed: {r['resumed']}/{r['drops']} drops (tail caught up: median "
        f"{r['median_s'] or float('nan'):.1f} s, max {r['max_s'] or float('nan'):.1f} s after the link was back); "
        f"load resumed: {r['load_resumed']}/{r['drops']}"
    )


if __name__ == "__main__":
    main()
