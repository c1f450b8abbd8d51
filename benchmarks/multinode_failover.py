"""A multi-node server losing a node: how long until tuitune reports it failed, and until no node is
left running. Two simulator nodes on this machine (the shipped two-node preset on free ports),
driven by a Session as the TUI drives it; node 1's process group is SIGKILLed while serving.

    python benchmarks/multinode_failover.py [--trials N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

from tuitune import preset as P
from tuitune.machine.session import Session
from tuitune.measure.metrics import quantile
from tuitune_support.ports import free_port
from tuitune_support.procs import sim_pids

ROOT = Path(__file__).resolve().parent.parent


def two_nodes(tmp: Path) -> P.Preset:
    data = P.to_dict(P.load(P.find("sim-2node-eagle3")))
    data["server"].update(port=free_port(), dist_init_port=free_port(), log=str(tmp / "n0.log"))
    data["server"]["args"]["sim-load-seconds"] = 0.3
    data["target"]["nodes"][1]["server"].update(port=free_port(), log=str(tmp / "n1.log"))
    return P.from_dict(data)


async def trial(tmp: Path) -> tuple[float, float]:
    s = Session(two_nodes(tmp))
    try:
        await s.transport.connect()
        await s.relaunch()
        os.killpg(s.control.records[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        while s.state.state != "failed":
            await asyncio.sleep(0.01)
        failed = time.monotonic() - t0
        while sim_pids(str(tmp)):
            await asyncio.sleep(0.01)
        return failed, time.monotonic() - t0
    finally:
        await s.close()


async def main(trials: int) -> None:
    reported, clean = [], []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as d:
            a, b = await trial(Path(d))
            reported.append(a * 1000)
            clean.append(b * 1000)
    for name, xs in (
        ("node killed -> server reported failed (others stopped)", reported),
        ("node killed -> no node process left", clean),
    ):
        print(f"{name}: p50 {quantile(xs, 0.5):.0f} ms, max {max(xs):.0f} ms over {len(xs)} trials")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    asyncio.run(main(ap.parse_args().trials))
