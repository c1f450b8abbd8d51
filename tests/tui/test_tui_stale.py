"""What the TUI shows is what is (issue 41, item 10): Tab does not land in the log filter, a dead
server's GPU figures are marked stale, a preset loaded with `o` is "loaded, not running" until
launched, vLLM's runs get an accept figure, and the relaunch view shows the new server's lines only."""

from __future__ import annotations

import os
import signal

from test_gpu_panel import tick

from tuitune import preset as P
from tuitune.base.events import LogLine, TelemetryState
from tuitune.machine.session import Session
from tuitune.tui.app import TuituneApp
from tuitune.tui.logpane import FilterInput
from tuitune.tui.screens import RelaunchScreen
from tuitune.tui.settings import UserConfig
from tuitune_support.pilot import until
from tuitune_support.presets import make_preset
from tuitune_support.scenes import scene_app

SIZE = (120, 40)


def live(tmp_path, preset=None, autostart="launch"):
    p = preset or make_preset(tmp_path, "tui")
    session = Session(p, state_dir=str(tmp_path / "state"))
    return TuituneApp(session, autostart=autostart, user_config=UserConfig()), session


async def ready(app, pilot, s):
    await until(
        pilot, lambda: s.state.state == "ready" and not isinstance(app.screen, RelaunchScreen), 30, "server ready"
    )


async def test_tab_does_not_land_in_the_log_filter():
    app = scene_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for _ in range(4):
            await pilot.press("tab")
            await pilot.pause()
            assert not isinstance(app.focused, FilterInput)
        await pilot.press("tab", "tab", "j", "k", "j")
        await pilot.pause()
        assert app.logpane.filter == ""  # navigation keys were not typed as a filter
        await pilot.press("slash")  # `/` still goes there
        await pilot.pause()
        assert isinstance(app.focused, FilterInput)
        await pilot.press("z", "q", "x")
        await pilot.pause()
        assert "no line contains 'zqx'" in app.logpane.status  # a filter that hides all says so
        await pilot.press("escape", "tab")
        await pilot.pause()
        assert not isinstance(app.focused, FilterInput)


async def test_gpu_figures_of_a_dead_server_are_marked_stale(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        s.publish([TelemetryState("on", None, 2), *tick(0, n=2)])
        await until(pilot, lambda: app.gpu_panel.display and app.gpu_panel.rows == 2, 5, "the GPU rows")
        assert app.gpu_panel.stale is None and "stale" not in str(app.gpu_panel.render())
        os.killpg(s.state.pid, signal.SIGKILL)
        await until(pilot, lambda: app.gpu_panel.stale is not None, 10, "the GPU panel marked stale")
        assert "stale: server exited" in str(app.gpu_panel.render())
        assert "stale" in (app.gpu_panel.border_subtitle or "")


async def test_opened_preset_is_loaded_not_running_until_launched(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        other = P.save(P.with_changes(s.preset, {"name": "other", "speculative.num_steps": 3}), tmp_path / "other.yaml")
        app.action_open()
        await pilot.pause()
        app.screen.dismiss(other)
        await pilot.pause()
        app.refresh_views()
        head = str(app.header.render())
        assert "other (loaded, not running; server runs tui)" in head, head
        await pilot.press("r")
        await until(pilot, lambda: s.running_preset is not None and s.running_preset.name == "other", 30, "relaunch")
        await ready(app, pilot, s)
        app.refresh_views()
        assert "not running" not in str(app.header.render())
        await s.close(stop_server=True)


async def test_relaunch_view_shows_only_the_new_servers_lines(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        app.action_relaunch()
        screen = app.relaunch_screen
        s.publish([LogLine("OLD SERVER: shutting down")])  # the old server's last words, before the new launch
        app.refresh_views()  # drawn while the view is open (the simulator's start can beat the next tick)
        assert not any("OLD SERVER" in ln for ln in screen.lines), screen.lines
        await until(pilot, lambda: screen.finished or s.state.phase == "launching", 20, "the launch")
        await ready(app, pilot, s)
        app.refresh_views()
        assert not any("OLD SERVER" in ln for ln in screen.lines), screen.lines
        assert screen.lines and any("OLD SERVER" in ln for ln in app.logpane.lines)  # the log pane keeps them
        await s.close(stop_server=True)


async def test_vllm_runs_get_the_accept_figure_the_cycle_panel_shows(tmp_path):
    from tuitune_support.presets import sim_vllm

    app, s = live(tmp_path, sim_vllm(tmp_path, "tui-v"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        await s.set_load(True)
        await until(pilot, lambda: s.store["decode_accept_len"].values(), 30, "vLLM's acceptance in the log")
        await pilot.press("b")
        await until(pilot, lambda: app.book.runs, 60, "the run")
        run = app.book.runs[-1]
        assert run.accept_len is not None and run.accept_len > 1, run.summary.get("accept_len")
        row = app.runs_table.get_row_at(0)
        assert str(row[5]) == f"{run.accept_len:.2f}"
        await s.close(stop_server=True)
