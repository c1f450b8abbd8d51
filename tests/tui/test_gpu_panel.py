"""The GPU panel (Pilot): rows per GPU, flags in words, the toggle key, the summary line on small terminals."""

from __future__ import annotations

from pathlib import Path

from tuitune.base.events import GpuSample, TelemetryState
from tuitune.measure.capture import Capture, Replay
from tuitune.tui.app import TuituneApp
from tuitune.tui.settings import UserConfig


def tick(seq: int, n: int = 8, capped: int | None = None, straggler: int | None = None, util: float = 97.0):
    out = []
    for i in range(n):
        out.append(
            GpuSample(
                index=i,
                seq=seq,
                util=55.0 if i == straggler else util,
                mem_util=22.0,
                mem_used=126518.0,
                mem_total=143771.0,
                power=690.0 if i == capped else 420.0,
                power_limit=700.0,
                sm_clock=1470.0 if i == capped else 1980.0,
                sm_clock_max=1980.0,
                mem_clock=3201.0,
                temp=55.0,
                reasons=0x4 if i == capped else 0x0,
                pcie_gen=5,
                pcie_width=16,
                name="NVIDIA H200",
            )
        )
    return out


def replay_app(tmp_path: Path) -> tuple[TuituneApp, Replay]:
    stream = Replay(Capture({"kind": "meta", "schema": 1}, tmp_path / "none.jsonl"), play=False)
    return TuituneApp(stream, user_config=UserConfig()), stream


async def test_eight_gpus_fit_with_flags_at_120x40(tmp_path):
    app, stream = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = app.gpu_panel
        assert not panel.display  # nothing until telemetry arrives: old captures look as before
        stream.publish([TelemetryState("on", "8 GPU(s), every 500 ms", 8)])
        for seq in range(8):
            stream.publish(tick(seq, capped=3, straggler=5))
        await pilot.pause(0.3)
        assert panel.display and panel.rows == 8
        assert panel.region.bottom <= 40 and panel.region.height == 8 + 2  # 8 rows and the border, on screen
        lines = str(panel.render()).splitlines()
        assert len(lines) == 8
        assert "power cap" in lines[3] and "straggler" in lines[5]
        assert not any(f in lines[0] for f in ("power cap", "straggler"))
        assert "1470/1980" in lines[3] and "690W" in lines[3] and "124/140G" in lines[3]
        assert panel.flags[3] == ["power cap"] and panel.flags[5] == ["straggler"]
        assert "8 × NVIDIA H200" in panel.border_title
        await pilot.press("t")  # full -> one summary line
        await pilot.pause()
        assert panel.mode == "summary"
        stream.publish(tick(8, capped=3, straggler=5))
        await pilot.pause(0.3)
        assert panel.rows == 0 and "power cap GPU 3" in str(panel.render())
        await pilot.press("t")  # -> hidden
        await pilot.pause()
        assert not panel.display
        await pilot.press("t")  # -> rows again
        stream.publish(tick(9))
        await pilot.pause(0.3)
        assert panel.display and panel.rows == 8


async def test_small_terminal_gets_the_summary_line(tmp_path):
    app, stream = replay_app(tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        stream.publish([TelemetryState("on", None, 8)] + tick(0))
        stream.publish(tick(1, capped=0))
        await pilot.pause(0.3)
        assert app.gpu_panel.display and app.gpu_panel.rows == 0
        assert "8 GPU(s)" in str(app.gpu_panel.render()) and "power cap GPU 0" in str(app.gpu_panel.render())


async def test_telemetry_unavailable_is_one_notice_and_no_panel(tmp_path):
    app, stream = replay_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        stream.publish([TelemetryState("unavailable", "nvidia-smi not found on local: GPU telemetry is off")])
        await pilot.pause(0.3)
        assert not app.gpu_panel.display
        assert app.messages.count("nvidia-smi not found on local: GPU telemetry is off") == 1


async def test_a_recorded_capture_replays_into_the_panel(tmp_path):
    from tuitune.measure.capture import CaptureWriter, read_capture

    w = CaptureWriter(tmp_path / "t.jsonl", {"preset": {}})
    w.write([TelemetryState("on", None, 8)], m=0.0)
    for seq in range(5):
        w.write(tick(seq, capped=2), m=seq * 0.5)
    w.close()
    stream = Replay(read_capture(tmp_path / "t.jsonl"), play=False)
    app = TuituneApp(stream, user_config=UserConfig())
    async with app.run_test(size=(120, 40)) as pilot:
        stream.publish_until(stream.duration)
        await pilot.pause(0.3)
        assert app.gpu_panel.rows == 8 and app.gpu_panel.flags[2] == ["power cap"]
        assert stream.store.gpus.seq == 4 and len(stream.store.gpus.gpus[0].series["util"]) == 5
