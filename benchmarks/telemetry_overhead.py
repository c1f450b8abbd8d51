"""CPU cost of GPU telemetry: the collector streaming 8 GPUs every 500 ms over SSH on loopback.

A real sshd on loopback, tuitune's SshTransport, the collector reading the simulator's nvidia-smi
companion (8 GPUs) for SECONDS; this process does nothing else, so its CPU time is the collector's
(asyncssh, decoding, parsing, events). The sshd session's CPU is shown too; the companion stands
in for nvidia-smi, whose own cost on a GPU box is the driver's, not tuitune's.

    python benchmarks/telemetry_overhead.py [SECONDS] [PERIOD_MS]
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuitune.base.events import GpuSample
from tuitune.machine.ssh import SshTarget
from tuitune.machine.telemetry import Collector, command_prefix
from tuitune.machine.transport import SshTransport
from tuitune_support.sshd import SshServer

ROOT = Path(__file__).resolve().parent.parent


TICK = os.sysconf("SC_CLK_TCK")


def sshd_cpu_s(pid: int) -> float:
    """utime + stime of the listener's descendant sshd processes (the session serving our stream)."""
    total, todo = 0.0, [str(pid)]
    while todo:
        for child in subprocess.run(["pgrep", "-P", todo.pop()], capture_output=True, text=True).stdout.split():
            todo.append(child)
            try:
                stat = Path(f"/proc/{child}/stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                if stat.split("(", 1)[1].startswith("sshd"):
                    total += (int(fields[11]) + int(fields[12])) / TICK
            except (OSError, IndexError, ValueError):
                pass
    return total


async def measure(seconds: float, period_ms: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        sshd = SshServer(Path(d))
        sshd.start()
        try:
            t = SshTransport(SshTarget(**sshd.target()))
            await t.connect()
            ticks: list[int] = []
            prefix = command_prefix(
                f"env PYTHONPATH={ROOT} {{python}} -m tuitune.sim.nvidia_smi --sim-gpus 8", sys.executable, 0
            )
            c = Collector(
                t, prefix, lambda evs: ticks.extend(e.seq for e in evs if isinstance(e, GpuSample)), period_ms=period_ms
            )
            task = asyncio.ensure_future(c.run())
            while not ticks:  # start-up (probe, first tick) is not the steady state
                await asyncio.sleep(0.05)
            cpu0, wall0, ssh0, n0 = time.process_time(), time.perf_counter(), sshd_cpu_s(sshd.proc.pid), len(ticks)
            await asyncio.sleep(seconds)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            ssh_cpu, n = sshd_cpu_s(sshd.proc.pid) - ssh0, len(ticks) - n0
            c.close()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await t.close()
        finally:
            sshd.stop()
    print(f"telemetry over SSH on loopback, 8 GPUs every {period_ms} ms, {wall:.0f} s: {n} samples ({n / 8:.0f} ticks)")
    print(f"  collector (tuitune process): {cpu * 1000 / wall:.1f} ms CPU per s = {cpu / wall:.2%} of one core")
    print(f"  sshd session on the target:  {ssh_cpu * 1000 / wall:.1f} ms CPU per s = {ssh_cpu / wall:.2%} of one core")


if __name__ == "__main__":
    asyncio.run(
        measure(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0, int(sys.argv[2]) if len(sys.argv) > 2 else 500)
    )
