"""TUI under a flood: the simulator writes about 1,000 profile lines a second (plus as many decode
lines); how long from a key press to the screen showing its effect, and how much CPU tuitune uses.

The app runs headless (Textual's test driver: full layout and rendering, no terminal I/O), the
simulator is a real process. Key: `l` toggles the load; the effect is "load off"/"load on" in the
header. The key event is posted to the app as the terminal driver does (Pilot.press would wait for
the app to go idle, which it never does under a flood). CPU is tuitune's process time over the
measured span (the simulator runs in its own process).

    python benchmarks/tui_responsiveness.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from textual import events

from tuitune.machine.session import Session
from tuitune.measure.metrics import quantile
from tuitune.tui.app import TuituneApp
from tuitune.tui.settings import UserConfig
from tuitune_support.presets import make_preset

ROOT = Path(__file__).resolve().parent.parent


async def main(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        # 20 ms cycles at speedup 20 = 1 ms: with an interval of 1, a profile line per cycle
        p = make_preset(
            tmp, "flood", args={"sim-speedup": 20, "decode-log-interval": 1, "sim-load-seconds": 2}, max_tokens=4000
        )
        s = Session(p, state_dir=str(tmp / "state"))
        app = TuituneApp(s, autostart="launch", load_on_start=True, user_config=UserConfig())
        async with app.run_test(size=(140, 44)):
            while s.state.state != "ready" or not s.load.on:
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)
            n0, t0, c0 = s.store.profile_windows, time.perf_counter(), time.process_time()
            latencies = []
            end = t0 + seconds
            while time.perf_counter() < end:
                want = "load off" if s.load.on else "load on"
                k0 = time.perf_counter()
                app.post_message(events.Key("l", "l"))
                while want not in str(app.header.render()):
                    await asyncio.sleep(0.002)
                latencies.append((time.perf_counter() - k0) * 1000)
                await asyncio.sleep(0.5)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            lines = s.store.profile_windows - n0
            await s.close(stop_server=True)
    lat = sorted(latencies)
    print(f"profile lines handled: {lines / wall:,.0f}/s (plus as many decode lines), for {wall:.1f} s")
    print(
        f"key press -> screen updated: n={len(lat)} p50 {quantile(lat, 0.5):.0f} ms, p90 {quantile(lat, 0.9):.0f} ms, "
        f"max {lat[-1]:.0f} ms (target < 100 ms)"
    )
    print(f"tuitune CPU: {cpu / wall:.2f} cores (target < 0.5)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    asyncio.run(main(ap.parse_args().seconds))
