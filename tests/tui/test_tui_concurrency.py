"""The TUI under load: the load keys drive the batch size, B measures a goodput curve."""

from __future__ import annotations

import pytest

from tuitune.machine.session import Session
from tuitune.tui.app import TuituneApp
from tuitune.tui.chart import render
from tuitune.tui.settings import UserConfig
from tuitune_support.pilot import SIZE_LIVE, until, wait_ready
from tuitune_support.presets import make_preset

pytestmark = pytest.mark.sim_clock  # goodput levels off the simulator's clock (CI, beside an engine: 1.47x for 1.5x)


async def test_load_drives_batch_size_and_a_multi_level_run_is_a_curve(tmp_path):
    p = make_preset(
        tmp_path,
        "conc",
        args={"sim-machine": "h200-llama8b", "sim-speedup": 1, "tp-size": 1},
        requests=4,
        max_tokens=60,
        spec_steps=3,
    )
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig(bench_levels=[1, 4]))
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await pilot.press("l")
        for _ in range(3):
            await pilot.press("plus")
        await until(pilot, lambda: s.load.concurrency == 4, 5, "four load streams")
        await until(
            pilot,
            lambda: s.store.last_profile is not None and s.store.last_profile.bs == 4,
            20,
            "profile windows of batch 4",
        )
        await until(
            pilot,
            lambda: "batch sizes 4:" in str(app.cycle.query_one("#bars").render()),
            3,
            "the batch-size distribution in the cycle panel",
        )
        await pilot.press("l")
        await until(pilot, lambda: not s.load.on, 5, "load off")
        await pilot.press("B")
        await until(pilot, lambda: len(app.book.runs) == 1 and not app.bench_running, 60, "a run over two levels")
        run = app.book.runs[0]
        assert [lv["concurrency"] for lv in run.levels] == [1, 4]
        # the model says 3.9x; the TUI, the client and the simulator share a loaded machine here
        assert run.levels[1]["goodput"] > 1.5 * run.levels[0]["goodput"], run.levels
        assert run.levels[1]["batch_size"] > 2 and run.levels[0]["batch_size"] < 1.5  # not the load's lines
        await pilot.pause(0.2)
        assert str(app.runs_table.get_row_at(0)[1]) == "1–4"
        assert app.chart.mode == "goodput"
        chart = render("goodput", s.store, app.book, 80, 20)
        assert "concurrent requests" in chart and "#1 conc" in chart
        await app.run_action("bench_at_load")  # four streams, as the load keys left it
        await until(pilot, lambda: len(app.book.runs) == 2 and not app.bench_running, 60, "a run at the load's level")
        assert app.book.runs[1].concurrency == 4 and app.book.delta(app.book.runs[1])["verdict"] == "not comparable"
        # a one-level run at another concurrency is no comparison for the baseline
        app.book.add("other", p, [1.0, 2.0], {"concurrency": 8, "tok_s": {"median": 1.5}})
        assert app.book.delta(app.book.runs[-1])["verdict"] == "not comparable"
        await s.close(stop_server=True)
