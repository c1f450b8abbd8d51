"""How long a session takes to notice that its ready server died (the TUI's "exited: cause").

The simulator is launched through a Session (locally, and through a real sshd on loopback), then
SIGKILLed; the time from the kill to the session's state turning "exited" is measured, 10 times
each. Target: within 2 s (the watcher polls every 0.5 s).

    python benchmarks/exit_detection.py
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path

from tuitune.machine.session import Session
from tuitune.measure.metrics import quantile
from tuitune_support.presets import make_preset
from tuitune_support.sshd import SshServer

ROOT = Path(__file__).resolve().parent.parent


async def detection_times(tmp: Path, target, n: int = 10) -> list[float]:
    p = make_preset(tmp, "exit", target=target)
    session = Session(p, state_dir=str(tmp / "state"))
    await session.connect()
    out = []
    try:
        for _ in range(n):
            await session.relaunch()
            os.killpg(session.state.pid, signal.SIGKILL)  # the target is this machine in both cases
            t0 = time.monotonic()
            while session.state.state != "exited":
                await asyncio.sleep(0.01)
            out.append(time.monotonic() - t0)
    finally:
        await session.close(stop_server=True)
    return out


def show(name: str, xs: list[float]) -> None:
    xs = sorted(xs)
    print(f"{name:<6} kill -> exited: median {quantile(xs, 0.5):.2f} s, max {xs[-1]:.2f} s (n={len(xs)})")


async def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        show("local", await detection_times(tmp, None))
        (tmp / "sshd").mkdir()
        sshd = SshServer(tmp / "sshd")
        sshd.start()
        try:
            show("ssh", await detection_times(tmp, sshd.target()))
        finally:
            sshd.stop()


if __name__ == "__main__":
    asyncio.run(main())
