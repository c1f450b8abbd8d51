"""Deterministic scenes of the TUI, replayed from a committed capture (tests/data/demo-capture.jsonl):
the SVG snapshot and layout tests build them here. Support code, outside the package (it reads the
tests' data); the screenshots in screenshots/ are taken from the live demo by screenshots/make.py,
whose scenes, sizes and file names are ``SHOTS``, ``SIZES`` and ``file_name`` here (tests/tui/test_tui_screenshots.py checks
its files)."""

from __future__ import annotations

import random
from pathlib import Path

from tuitune import preset as P
from tuitune.base.events import GpuSample, ServerState, TelemetryState
from tuitune.measure.capture import Replay, read_capture
from tuitune.measure.metrics import summarize
from tuitune.measure.stats import bootstrap_median_ci
from tuitune.tui.app import TuituneApp
from tuitune.tui.screens import RelaunchScreen
from tuitune.tui.settings import UserConfig
from tuitune_support.paths import ROOT

CAPTURE = ROOT / "tests" / "data" / "demo-capture.jsonl"
SIZE = (140, 44)  # wide: the config panel stays open beside the panels
SIZES = ((140, 44), (120, 40), (80, 24))  # 120×40 is what most users have; 80×24 must still work
SCENES = ("main", "relaunch", "runs", "config", "failure", "gpus", "advisor")
SHOTS = ("main", "relaunch", "advisor", "runs", "help", "config", "gpus", "failure")  # screenshots/make.py's
CLOCK = 1795971100.0  # fixed wall clock: no ticking ages in the pictures


def file_name(scene: str, size: tuple[int, int]) -> str:
    """A screenshot's file in screenshots/: the first size plain, the others suffixed."""
    return f"{scene}.svg" if size == SIZES[0] else f"{scene}-{size[0]}x{size[1]}.svg"


def scene_app(capture: Path = CAPTURE) -> TuituneApp:
    replay = Replay(read_capture(capture), play=False)
    app = TuituneApp(replay, user_config=UserConfig(), clock=lambda: CLOCK)
    replay.publish_until(replay.duration)
    return app


def _runs(app: TuituneApp) -> None:
    """Three benchmark runs drawn around the capture's own profile throughput (seeded); the second
    is the seeds' failure: the same preset, but its server had lost the NCCL variables."""
    base = app.session.preset
    rate = app.session.store["tok_s"].summary().median
    rng = random.Random(7)
    lost = sorted(k for k in base.env if k.startswith("NCCL_"))
    five = P.with_changes(base, {"speculative.num_steps": 5})
    for preset, scale, drift in ((base, 1.0, []), (base, 0.76, lost), (five, 0.93, [])):
        values = [rate * scale * rng.gauss(1.0, 0.01) for _ in range(10)]
        s = summarize(values)
        summary = {
            "tok_s": {**s.as_dict(), "ci95": list(bootstrap_median_ci(values))},
            "failed": 0,
            "requests": 10,
            "accept_len": {"mean": 1.9 if preset is not five else 2.0},
        }
        app.book.add(preset.name, preset, values, summary, cycle_ms=20.1 / scale, started=CLOCK - 60, env_drift=drift)
    app._dirty_runs = True


def _gpus(app: TuituneApp) -> None:
    """Eight busy GPUs (seeded): GPU 3 thermally capped, GPU 5 lagging; the last run measured meanwhile."""
    rng = random.Random(11)
    app.session.publish([TelemetryState("on", "8 GPU(s), every 500 ms", 8)])
    for seq in range(40):
        ticks = []
        for i in range(8):
            hot = i == 3 and seq >= 20
            ticks.append(
                GpuSample(
                    index=i,
                    seq=seq,
                    util=round(55 + 8 * rng.random()) if i == 5 else round(95 + 5 * rng.random()),
                    mem_util=23.0,
                    mem_used=126518.0,
                    mem_total=143771.0,
                    power=round(430 + 40 * rng.random(), 2),
                    power_limit=700.0,
                    sm_clock=1290.0 if hot else 1980.0,
                    sm_clock_max=1980.0,
                    mem_clock=3201.0,
                    temp=88.0 if hot else float(52 + rng.randrange(5)),
                    reasons=0x20 if hot else 0x0,
                    pcie_gen=5,
                    pcie_width=16,
                    pcie_rx=float(900 + rng.randrange(300)),
                    pcie_tx=float(300 + rng.randrange(100)),
                    name="NVIDIA H200",
                )
            )
        app.session.publish(ticks)
    _runs(app)
    app.book.runs[-1].gpu_note = "thermal cap GPU 3 (50% of samples); straggler GPU 5 (100%)"


async def _relaunch_view(app: TuituneApp) -> RelaunchScreen:
    screen = RelaunchScreen(app.draft.name, P.launch_command(app.draft), app.cancel_relaunch)
    app.relaunch_screen = screen
    await app.push_screen(screen)
    return screen


async def prepare(app: TuituneApp, pilot, scene: str) -> None:
    await pilot.pause()
    app.set_focus(None)
    if scene == "main":
        _runs(app)  # the main screen as it looks after a few benchmarks
    elif scene == "relaunch":
        screen = await _relaunch_view(app)
        screen.set_phase(ServerState("starting", "capturing graphs", elapsed_s=2.4))
        screen.add_lines([ln for ln in app.logpane.lines if "Capture" in ln or "Load" in ln][:12])
    elif scene == "runs":
        _runs(app)
        app.book.mark_baseline(2)
    elif scene == "gpus":
        _gpus(app)
    elif scene == "config":
        app.add_class("-show-config")  # collapsed below 140 columns: shown as `e` shows it
        panel = app.config
        panel.query_one("#spec-num-steps").value = "5"
        panel.query_one("#val-nccl-proto").value = "LLL"
        await pilot.pause()
        app.set_focus(None)
    elif scene == "advisor":
        app.tabs.active = "tab-advisor"
        app.refresh_views()
        app.advisor.refresh_model(force=True)
    elif scene == "failure":
        message = (
            "server exited during start (out of memory): CUDA out of memory. Tried to allocate 3.50 GiB. "
            "GPU 0 has a total capacity of 94.97 GiB of which 1.12 GiB is free."
        )
        app.session.state = ServerState("failed", "failed", message)  # what the header shows behind it
        screen = await _relaunch_view(app)
        screen.done(
            False,
            message,
            [
                "[2026-11-29 16:02:01 TP0] Load weight begin. avail mem=93.62 GB",
                "[2026-11-29 16:02:02 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 2870',
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB.",
            ],
        )
    app.refresh_views()
    await pilot.pause()
