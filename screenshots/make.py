"""`make screenshots`: the SVGs in this folder, taken from the live demo as a user sees it.

The shipped demo preset (the simulator, load on) on a free port, in a HOME of its own, driven with
the keys of the first five minutes (b, 3, a, r, b, m …) in one session; each scene is saved at
140×44 (``main.svg``: the config panel stays open), 120×40 (``main-120x40.svg``) and 80×24
(``main-80x24.svg``). The numbers are the simulator's, live: they differ from one run to the next.
tests/tui/test_tui_screenshots.py checks that the files show what the TUI shows today (the profile
format, the footer's keys, the help's groups): when it fails, run `make screenshots`.

    python screenshots/make.py [DIR]        # default: this folder
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from tuitune import preset as P
from tuitune.machine.session import Session
from tuitune.tui.app import TuituneApp
from tuitune.tui.screens import ConfirmScreen, RelaunchScreen
from tuitune.tui.settings import UserConfig
from tuitune_support.ports import free_port
from tuitune_support.scenes import SIZES, file_name


async def until(pilot, cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        await pilot.pause(0.1)
    raise SystemExit(f"screenshots: timed out waiting for {what}")


class Shooter:
    def __init__(self, app: TuituneApp, pilot, out: Path):
        self.app, self.pilot, self.out = app, pilot, out
        self.paths: list[Path] = []

    async def at(self, size: tuple[int, int]) -> None:
        await self.pilot.resize_terminal(*size)
        await self.pilot.pause(0.6)

    async def shot(self, scene: str, size: tuple[int, int]) -> None:
        app = self.app
        app.clear_notifications()  # a toast from the last key would cover the panels
        app.refresh_views()
        await self.pilot.pause(0.4)
        path = self.out / file_name(scene, size)
        app.save_screenshot(str(path))
        self.paths.append(path)
        print(path)

    async def every_size(self, scene: str, prepare=None) -> None:
        for size in SIZES:
            await self.at(size)
            if prepare:
                prepare()
            await self.shot(scene, size)


async def bench(app: TuituneApp, pilot, n: int) -> None:
    await pilot.press("b")
    await until(pilot, lambda: len(app.book.runs) == n and not app.bench_running, 120, f"benchmark run {n}")


async def ready(app: TuituneApp, pilot) -> None:
    s = app.session
    await until(
        pilot, lambda: s.state.state == "ready" and not isinstance(app.screen, RelaunchScreen), 120, "server ready"
    )


async def scenes(app: TuituneApp, pilot, out: Path, control: Path) -> list[Path]:
    s = app.session
    shoot = Shooter(app, pilot, out)
    await ready(app, pilot)
    await until(pilot, lambda: s.load.on and len(app.advisor.windows) >= 40, 60, "profile windows under load")
    await until(pilot, lambda: app.gpu_panel.display and len(s.store.gpus.current()) == 8, 30, "the GPU panel")
    app.set_focus(None)
    await bench(app, pilot, 1)  # the tour: b, the advisor, a, r, b
    await pilot.press("3")
    await until(pilot, lambda: app.advisor.top() is not None, 30, "the advisor's suggestion")
    await pilot.press("a")
    await pilot.pause()
    if isinstance(app.screen, ConfirmScreen):  # not a sure gain, or a measurement: `a` asks first
        await pilot.press("y")
    for size in SIZES:  # each size its own relaunch: the view is up for a few seconds only
        await shoot.at(size)
        await pilot.press("r")
        await until(
            pilot,
            lambda: isinstance(app.screen, RelaunchScreen) and "load" in app.screen.phase_text.lower(),
            60,
            "the relaunch view loading weights",
        )
        await shoot.shot("relaunch", size)
        await ready(app, pilot)
    await until(pilot, lambda: len(app.advisor.windows) >= 20, 60, "profile windows of the new launch")
    await bench(app, pilot, 2)
    app.set_focus(None)
    await pilot.press("1")
    await shoot.every_size("main")
    await pilot.press("3")
    await shoot.every_size("advisor", lambda: app.advisor.refresh_model(force=True))
    await pilot.press("m", "2")  # the newest run becomes the baseline; the chart of the runs
    await shoot.every_size("runs")
    await pilot.press("1", "question_mark")
    await shoot.every_size("help")
    await pilot.press("escape")
    await pilot.press("e")
    panel = app.config
    panel.query_one("#spec-num-steps").value = "3"
    panel.query_one("#set-nccl-proto").value = True
    panel.query_one("#val-nccl-proto").value = "LLL"  # an inline error, as a typo shows
    await pilot.pause(0.3)
    app.set_focus(None)
    await shoot.every_size("config")
    app.action_revert()
    await pilot.press("escape")
    control.write_text(json.dumps({"straggler": 5}))  # the simulated GPU 5 lags its peers
    await pilot.pause(3)
    await bench(app, pilot, 3)  # measured meanwhile: its row says so
    await pilot.press("1")
    app.set_focus(None)
    await shoot.every_size("gpus")
    control.write_text("{}")
    app.config.query_one("#flag-mem-fraction-static").value = "0.99"  # the simulator runs out of memory
    await pilot.pause(0.3)
    await pilot.press("r")
    await until(pilot, lambda: isinstance(app.screen, RelaunchScreen) and app.screen.failed, 60, "the failed start")
    await shoot.every_size("failure")
    await pilot.press("escape")
    return shoot.paths


async def main(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="tuitune-screenshots-"))
    os.environ["HOME"] = str(home)  # the demo's state, logs and config: none of the user's
    os.environ["XDG_CONFIG_HOME"] = str(home / ".config")
    port = free_port()
    control = home / "gpu-control.json"
    control.write_text("{}")
    demo = P.shipped_dir() / "demo.yaml"
    base = P.load(demo)
    preset = P.with_changes(
        base,
        {
            "server.port": port,
            "server.log": f"~/.cache/tuitune/logs/demo-{port}.log",
            "telemetry.command": f"{base.telemetry.command} --sim-control {control}",
        },
    )
    session = Session(preset)
    app = TuituneApp(
        session,
        autostart="launch-if-stopped",
        load_on_start=True,
        preset_path=demo,
        stop_on_quit=True,
        user_config=UserConfig(),
    )
    async with app.run_test(size=SIZES[0]) as pilot:
        try:
            paths = await scenes(app, pilot, out, control)
        finally:
            await session.close(stop_server=True)
    return paths


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent))
