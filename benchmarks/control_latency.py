"""Latency of tuitune's hands on the target, through a real sshd on loopback (and locally).

1. Tail latency: a writer appends 1,000 lines (one every 5 ms), each carrying the time it was
   written; tuitune's exactly-once tail delivers them over SSH; p50/p99 of write -> delivery.
2. Relaunch overhead: from the simulator's ready line (millisecond log timestamps) to tuitune
   reporting ready; and from `stop` to the port being free.

    python benchmarks/control_latency.py
"""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuitune.machine.control import ServerControl
from tuitune.machine.ssh import SshTarget
from tuitune.machine.tail import LogTail
from tuitune.machine.transport import LocalTransport, SshTransport
from tuitune.measure.metrics import quantile
from tuitune_support.presets import make_preset
from tuitune_support.sshd import SshServer

ROOT = Path(__file__).resolve().parent.parent


async def tail_latency(t, log: Path, n: int = 1000) -> list[float]:
    log.write_bytes(b"")
    tail = LogTail(t, str(log), python=sys.executable)
    lat: list[float] = []

    async def consume():
        async for batch in tail.batches():
            now = time.time()
            for line in batch.lines:
                lat.append((now - float(line.split()[1])) * 1000)
            if len(lat) >= n:
                return

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.5)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys,time\nf=open(sys.argv[1],'a',buffering=1)\n"
                f"for i in range({n}):\n    f.write('t %.6f %d\\n' % (time.time(), i)); time.sleep(0.005)\n"
            ),
            str(log),
        ]
    )
    await asyncio.wait_for(task, 60)
    writer.wait()
    tail.close()
    return lat


async def relaunch_overhead(t, tmp: Path, runs: int = 5) -> tuple[list[float], list[float]]:
    ready_gap, stop_time = [], []
    p = make_preset(tmp, "bench-relaunch", env={"SGLANG_LOG_MS": "1"}, args={"sim-load-seconds": 0.5, "sim-speedup": 1})
    c = ServerControl(t, p, state_dir=str(tmp / "state"))
    for _ in range(runs):
        reported = {}
        rec, res = await c.relaunch(60, on_phase=lambda ph, el, seen=reported: seen.setdefault(ph, time.time()))
        ready_ts = None
        for line in Path(p.server.log).read_text().splitlines():
            if "fired up and ready" in line:
                ready_ts = dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S.%f").timestamp()
        ready_gap.append((reported["ready"] - ready_ts) * 1000)
        t0 = time.perf_counter()
        await c.stop()
        stop_time.append((time.perf_counter() - t0) * 1000)
    return ready_gap, stop_time


def show(name: str, vals: list[float]) -> None:
    s = sorted(vals)
    print(
        f"{name:<44} n={len(s):<5} p50 {quantile(s, 0.5):7.1f} ms   p99 {quantile(s, 0.99):7.1f} ms   "
        f"max {s[-1]:7.1f} ms"
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        sshd = SshServer(tmp)
        sshd.start()
        try:
            ssh = SshTransport(SshTarget(**sshd.target()))
            await ssh.connect()
            local = LocalTransport()
            show("tail latency, SSH on loopback (1,000 lines)", await tail_latency(ssh, tmp / "a.log"))
            show("tail latency, local (1,000 lines)", await tail_latency(local, tmp / "b.log"))
            for name, t in (("SSH", ssh), ("local", local)):
                gap, stop = await relaunch_overhead(t, tmp / name)
                show(f"ready line -> tuitune reports ready, {name}", gap)
                show(f"stop -> port free, {name}", stop)
            await ssh.close()
        finally:
            sshd.stop()


if __name__ == "__main__":
    asyncio.run(main())
