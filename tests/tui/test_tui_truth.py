"""The screen tells the truth about a live server (the simulator as a real process): death with
its cause, a relaunch by someone else, the diff against the running server, bench progress, and
every way of quitting."""

from __future__ import annotations

import os
import signal
import time

from tuitune import preset as P
from tuitune.machine.session import Session
from tuitune.tui.app import TuituneApp
from tuitune.tui.screens import QuitScreen, RelaunchScreen
from tuitune.tui.settings import UserConfig
from tuitune_support.pilot import until
from tuitune_support.presets import make_preset
from tuitune_support.procs import group_alive

SIZE = (120, 40)


def live(tmp_path, name="tui", stop_on_quit=False, autostart="launch", **kw):
    p = make_preset(tmp_path, name, **kw)
    session = Session(p, state_dir=str(tmp_path / "state"))
    return TuituneApp(session, autostart=autostart, user_config=UserConfig(), stop_on_quit=stop_on_quit), session


async def ready(app, pilot, s):
    await until(
        pilot, lambda: s.state.state == "ready" and not isinstance(app.screen, RelaunchScreen), 30, "server ready"
    )


def header(app) -> str:
    return str(app.header.render())


async def test_killed_server_is_shown_exited_and_bench_refuses(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        pid = s.state.pid
        os.killpg(pid, signal.SIGKILL)
        t0 = time.monotonic()
        await until(pilot, lambda: "exited: killed" in header(app), 10, "the header to say exited")
        seen_after = time.monotonic() - t0
        assert seen_after < 5, seen_after  # polled every 0.5 s; generous for a loaded machine
        assert any(f"server {pid} exited: killed" in m for m in app.messages)
        await pilot.press("b")
        await pilot.pause()
        assert not app.bench_running and not app.book.runs
        assert "the server is not ready (exited: killed" in app.messages[-1]


async def test_crash_cause_from_the_log_is_shown(tmp_path):
    app, s = live(tmp_path, args={"sim-fault": "crash-after=25"})
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        await until(pilot, lambda: s.state.state == "exited", 20, "the crash")
        await pilot.pause(0.2)
        assert "illegal memory access" in s.state.detail and "exited: " in header(app)


async def test_relaunch_by_another_client_is_noticed(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        old = s.state.pid
        other = Session(P.with_changes(s.preset, {"speculative.num_steps": 3}), state_dir=str(tmp_path / "state"))
        await other.transport.connect()
        await other.relaunch()
        new = other.record.pid
        await other.close()
        await until(
            pilot,
            lambda: any(
                f"relaunched by another tuitune or a `tuitune launch`: pid {old} → {new}" in m for m in app.messages
            ),
            10,
            "the notice",
        )
        assert s.state.pid == new
        assert s.state.state == "ready" and s.running_preset is None  # not our configuration
        await s.set_load(True)
        await until(
            pilot,
            lambda: s.store.last_profile is not None and s.store.last_profile.steps == 3,
            15,
            "the new server's log followed",
        )
        await s.close(stop_server=True)


async def test_diff_against_the_running_server_is_recomputed(tmp_path):
    app, s = live(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        diff = lambda: str(app.config.query_one("#diff").render())  # noqa: E731
        app.config.query_one("#spec-num-steps").value = "3"
        await pilot.pause()
        assert "speculative.num_steps: 2 → 3" in diff()
        app.action_revert()
        await pilot.pause()
        assert diff() == ""
        # open a preset for the same server: running → opened, in that order
        other = P.save(P.with_changes(s.preset, {"name": "four", "speculative.num_steps": 4}), tmp_path / "four.yaml")
        app.action_open()
        await pilot.pause()
        app.screen.dismiss(other)
        await pilot.pause()
        assert "speculative.num_steps: 2 → 4" in diff()
        # the running server is relaunched with it: nothing differs any more
        await pilot.press("r")
        await until(
            pilot,
            lambda: s.running_preset is not None and s.running_preset.name == "four" and s.state.state == "ready",
            30,
            "relaunch",
        )
        await pilot.pause(0.3)
        assert diff() == ""
        await s.close(stop_server=True)


async def test_open_explains_a_preset_for_another_port(tmp_path):
    app, s = live(tmp_path, autostart=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        elsewhere = P.save(
            P.with_changes(s.preset, {"name": "other", "server.port": s.preset.server.port + 1}),
            tmp_path / "other.yaml",
        )
        app.action_open()
        await pilot.pause()
        app.screen.dismiss(elsewhere)
        await pilot.pause()
        assert app.draft.name == "tui"
        assert f"Quit and run `tuitune {elsewhere}`" in app.messages[-1]


async def test_bench_progress_in_the_header(tmp_path):
    app, s = live(tmp_path, requests=4, max_tokens=100, args={"sim-speedup": 1})
    async with app.run_test(size=SIZE) as pilot:
        await ready(app, pilot, s)
        await pilot.press("b")
        await until(
            pilot,
            lambda: app.bench_progress is not None and app.bench_progress[0] >= 1,
            30,
            f"the first request done {app.messages}",
        )
        await pilot.pause(0.15)
        assert "bench " in header(app) and "/4" in header(app)
        await until(pilot, lambda: not app.bench_running, 60, "the bench")
        assert app.bench_progress is None and len(app.book.runs) == 1
        await s.close(stop_server=True)


async def test_quit_without_a_server_asks_nothing(tmp_path):
    app, s = live(tmp_path, autostart=None)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: s.state.state == "stopped", 10, "attached")
        await pilot.press("q")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, QuitScreen) and app.return_code == 0


async def test_every_quit_goes_through_the_dialog_and_the_demo_stops_its_server(tmp_path):
    app, s = live(tmp_path, stop_on_quit=True, args={"sim-load-seconds": 3, "sim-speedup": 1})
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, RelaunchScreen) and s.state.pid, 15, "the start view")
        await pilot.press("q")  # from the start view
        await pilot.pause()
        assert isinstance(app.screen, QuitScreen) and app.screen.starting
        await pilot.press("escape")
        await ready(app, pilot, s)
        pid = s.state.pid
        await pilot.press("ctrl+q")  # no bypass
        await pilot.pause()
        assert isinstance(app.screen, QuitScreen) and app.screen.default_stop
        assert "Stop the server [s] ⏎" in str(app.screen.query_one("#stop").label)
        await pilot.press("enter")  # the default: the simulator the demo started goes too
        await until(pilot, lambda: app.return_code is not None, 20, "exit")
    assert not group_alive(pid)
