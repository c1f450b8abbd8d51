"""The TUI: Pilot tests against the live simulator, SVG snapshots of deterministic scenes, replay."""

from __future__ import annotations

import pytest

from tuitune import preset as P
from tuitune.machine.session import Session
from tuitune.measure.capture import Replay, read_capture
from tuitune.tui.app import TuituneApp
from tuitune.tui.screens import RelaunchScreen
from tuitune.tui.settings import UserConfig, load_user_config
from tuitune_support.pilot import SIZE_LIVE, until, wait_ready
from tuitune_support.presets import make_preset
from tuitune_support.procs import group_alive
from tuitune_support.scenes import CAPTURE, SCENES, SIZE, prepare, scene_app


def live_app(tmp_path, **preset_kw) -> tuple[TuituneApp, Session]:
    p = make_preset(tmp_path, "tui", **preset_kw)
    session = Session(p, state_dir=str(tmp_path / "state"))
    return TuituneApp(session, autostart="launch", user_config=UserConfig()), session


async def test_edit_steps_relaunch_and_new_numbers(tmp_path):
    app, s = live_app(tmp_path)
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await s.set_load(True)
        await until(
            pilot,
            lambda: s.store.last_profile is not None and s.store.last_profile.steps == 2,
            15,
            "profile windows with 2 steps",
        )
        first_pid = s.state.pid
        app.config.query_one("#spec-num-steps").value = "4"
        await pilot.pause()
        assert app.draft.speculative.num_steps == 4 and app.modified
        assert "speculative.num_steps: 2 → 4" in str(app.config.query_one("#diff").render())
        before = app.relaunch_screen
        await pilot.press("r")
        # The view closes by itself once the server is ready, which on the simulator can be sooner
        # than a poll comes round: wait for a new view to have been opened, not for it to be open.
        await until(
            pilot,
            lambda: isinstance(app.relaunch_screen, RelaunchScreen) and app.relaunch_screen is not before,
            5,
            "the relaunch view",
        )
        await wait_ready(app, pilot, s)
        assert app.relaunch_screen.finished
        assert s.state.pid != first_pid and s.running_preset.speculative.num_steps == 4
        await until(
            pilot,
            lambda: s.store.last_profile is not None and s.store.last_profile.steps == 4,
            15,
            "profile windows with 4 steps",
        )
        assert s.load.on  # the load survives a relaunch
        await until(
            pilot, lambda: "steps 4" in str(app.cycle.query_one("#bars").render()), 2, "the panel's next refresh"
        )
        await s.close(stop_server=True)


async def test_invalid_nccl_value_rejected_inline(tmp_path):
    app, s = live_app(tmp_path)
    app.autostart = None
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await pilot.pause()
        app.config.query_one("#set-nccl-proto").value = True
        app.config.query_one("#val-nccl-proto").value = "LLL"
        await pilot.pause()
        err = str(app.config.query_one("#err-nccl-proto").render())
        assert "'LLL' is not one of LL, LL128, Simple" in err
        assert "NCCL_PROTO" in app.draft_errors and "NCCL_PROTO" not in app.draft.env
        await pilot.press("r")
        await pilot.pause()
        assert not isinstance(app.screen, RelaunchScreen) and s.state.state == "stopped"
        assert any("fix the configuration first" in m for m in app.messages)
        app.config.query_one("#val-nccl-proto").value = "LL128"
        await pilot.pause()
        assert not app.draft_errors and app.draft.env["NCCL_PROTO"] == "LL128"
        await s.close()


async def test_bench_rows_verdict_and_baseline_staleness(tmp_path):
    app, s = live_app(tmp_path, requests=6, max_tokens=80)
    now = [1000.0]
    app.clock = lambda: now[0]
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await pilot.press("b")
        await until(pilot, lambda: len(app.book.runs) == 1 and not app.bench_running, 30, "first run")
        await pilot.press("b")
        await until(pilot, lambda: len(app.book.runs) == 2 and not app.bench_running, 30, "second run")
        await pilot.pause(0.2)
        table = app.runs_table
        assert table.row_count == 2
        assert all(r.cycle_ms and 1.0 < r.cycle_ms < 4.0 for r in app.book.runs)  # ~2 ms cycles at 10x
        delta = str(table.get_row_at(1)[4])
        assert "%" in delta and delta[-1] in "▲▼≈"
        assert app.book.baseline_id == 1 and app.stale_reason() is None
        # mark the second run as the baseline
        table.move_cursor(row=1)
        await pilot.press("m")
        assert app.book.baseline_id == 2
        # age: older than the configured limit
        now[0] += app.book.max_age_s + 60
        await pilot.pause(0.2)
        assert "min ago" in app.stale_reason()
        assert "STALE" in str(table.border_subtitle)
        now[0] -= app.book.max_age_s + 60
        # environment: relaunch with an NCCL variable changed
        app.config.query_one("#set-nccl-buffsize").value = True
        app.config.query_one("#val-nccl-buffsize").value = "8388608"
        await pilot.pause()
        await pilot.press("r")
        await wait_ready(app, pilot, s)
        assert app.stale_reason() is None  # a candidate that differs is the comparison, not staleness
        await s.close(stop_server=True)


async def test_save_and_reopen_preset(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    app, s = live_app(tmp_path)
    app.autostart = None
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await pilot.pause()
        app.config.query_one("#spec-num-steps").value = "5"
        await pilot.pause()
        await pilot.press("s")
        await pilot.pause()
        inp = app.screen.query_one("#save-path")
        inp.value = "my-five-steps"
        await pilot.press("enter")
        await pilot.pause()
        saved = tmp_path / "cfg" / "tuitune" / "presets" / "my-five-steps.yaml"
        assert saved.exists() and P.load(saved).speculative.num_steps == 5
        assert P.load(saved).name == "my-five-steps" and not app.modified
        # change it again, then reopen the saved file: the diff preview and the values come back
        app.config.query_one("#spec-num-steps").value = "3"
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        options = app.screen.query_one("#presets")
        idx = next(i for i, e in enumerate(app.screen.entries) if e[1] == saved)
        options.highlighted = idx
        await pilot.pause()
        assert "num_steps: 3 → 5" in str(app.screen.query_one("#preview").render())
        await pilot.press("enter")
        await pilot.pause()
        assert app.draft.speculative.num_steps == 5
        assert app.config.query_one("#spec-num-steps").value == "5"
        await s.close()


async def test_server_crash_during_start_shows_cause(tmp_path):
    app, s = live_app(tmp_path, args={"mem-fraction-static": 0.97})
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await until(
            pilot, lambda: isinstance(app.screen, RelaunchScreen) and app.screen.failed, 30, "the relaunch to fail"
        )
        text = str(app.screen.query_one("#error").render())
        assert "out of memory" in text and "CUDA out of memory" in text
        assert "OutOfMemoryError" in str(app.screen.query_one("#lines").render())
        assert s.state.state == "failed"
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, RelaunchScreen)
        assert app.draft.server.args["mem-fraction-static"] == 0.97  # the config stays loaded
        await s.close()


async def test_quit_leaves_the_server_running_by_default(tmp_path):
    app, s = live_app(tmp_path)
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        pid = s.state.pid
        await pilot.press("q")
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: not app.is_running, 10, "the app to exit")
    assert group_alive(pid)
    from tuitune.machine.control import ServerControl
    from tuitune.machine.transport import LocalTransport

    await ServerControl(LocalTransport(), s.preset, s.control.state_dir).stop()


async def test_end_follows_a_stopped_tail_again_and_quitting_right_after_ends(tmp_path):
    """End ("follow again") restarts a live tail that stopped, and quitting while that tail is still
    starting ends at once, with the server stopped and no tailer left (it could hang: issue 13)."""
    import subprocess

    app, s = live_app(tmp_path)
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        pid = s.state.pid
        await s.stop_follow()
        assert not s.tail_running
        await pilot.press("end")
        await until(pilot, lambda: s.tail_running, 5, "the tail to follow again")
        seen = len(app.logpane.lines)
        await s.set_load(True)
        await until(pilot, lambda: len(app.logpane.lines) > seen, 10, "new log lines")
        await s.set_load(False)
        await s.stop_follow()
        await pilot.press("end", "q", "s")  # follow again, quit at once, stop the server
        await until(pilot, lambda: not app.is_running, 20, "the app to exit")
    assert not group_alive(pid)
    assert subprocess.run(["pgrep", "-f", s.preset.server.log], capture_output=True).returncode == 1


async def test_keymap_log_filter_and_load_keys(tmp_path, monkeypatch):
    cfg = tmp_path / "cfg" / "tuitune"
    cfg.mkdir(parents=True)
    (cfg / "config.yaml").write_text("keymap:\n  tuitune.load: x\nbaseline_max_age_min: 5\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    uc = load_user_config()
    assert uc.keymap == {"tuitune.load": "x"} and uc.baseline_max_age_min == 5 and not uc.errors
    p = make_preset(tmp_path, "keys")
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=uc)
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await pilot.press("x")
        await until(pilot, lambda: s.load.on, 5, "load on")
        await pilot.press("plus")
        await until(pilot, lambda: s.load.concurrency == 2, 5, "two streams")
        await until(pilot, lambda: any("EAGLE3_PROFILE" in ln for ln in app.logpane.lines), 10, "profile lines")
        app.logpane.set_filter("Decode batch")
        log = app.logpane.query_one("#log")
        assert log.line_count > 0 and all("Decode batch" in ln for ln in log.lines)
        assert app.book.max_age_s == 300
        await s.close(stop_server=True)
    bad = tmp_path / "bad.yaml"
    bad.write_text("keymap: [1, 2]\nsurprise: 1\n")
    errs = load_user_config(bad).errors
    assert any("keymap must map" in e for e in errs) and any("surprise" in e for e in errs)


async def test_replay_drives_the_tui_to_the_same_numbers_as_live():
    cap = read_capture(CAPTURE)
    replay = Replay(cap, speed=50.0)
    app = TuituneApp(replay, user_config=UserConfig())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: replay.position == len(cap.records), 20, "the replay to finish")
        await pilot.pause(0.2)
        last = [r.event for r in cap.records if r.event.kind == "profile"][-1]
        assert replay.store.last_profile == last
        bars = str(app.cycle.query_one("#bars").render())
        assert f"{last.verify_ms:.2f} ms" in bars and f"accept len {last.accept_len:.2f}" in bars
        assert app.logpane.lines and replay.state.state == "replay"
        await pilot.press("r")  # no relaunch in a replay
        assert not isinstance(app.screen, RelaunchScreen)


async def test_a_replay_without_a_preset_says_there_is_nothing_to_save_open_or_revert():
    """A capture recorded without a preset (a server found by its port) replays with none: save,
    open and revert say so in one sentence (they used to end the app on an assertion)."""
    cap = read_capture(CAPTURE)
    cap.meta = {k: v for k, v in cap.meta.items() if k != "preset"}
    replay = Replay(cap, speed=50.0)
    assert replay.preset is None
    app = TuituneApp(replay, user_config=UserConfig())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        await pilot.press("o")
        await app.run_action("revert")
        await pilot.pause(0.1)
        assert app.is_running and app.screen is app.screen_stack[0]  # no dialog opened, nothing ended
        said = [m for m in app.messages if m.startswith("nothing to ")]
        assert said == [
            f"nothing to {what}: the capture this replay plays holds no preset"
            for what in ("save", "open a preset against", "revert to")
        ], app.messages


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("scene", SCENES)
def test_snapshots(scene, size, snap_compare):
    app = scene_app()
    assert snap_compare(app, terminal_size=size, run_before=lambda pilot: prepare(app, pilot, scene))


async def test_relaunch_view_takes_updates_before_it_is_composed():
    # the 10 Hz refresh may reach the view between push_screen and its compose: it must not crash
    from tuitune.base.events import ServerState

    app = scene_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = RelaunchScreen("x", "cmd", app.cancel_relaunch)
        app.push_screen(screen)  # not awaited: not composed yet
        screen.set_phase(ServerState("starting", "loading weights", elapsed_s=1.5))
        screen.add_lines(["Load weight begin"])
        await pilot.pause()
        assert "loading weights  (1.5 s)" in str(screen.query_one("#phase").render())
        assert "Load weight begin" in str(screen.query_one("#lines").render())


async def test_advisor_panel_updates_from_windows_and_applies_the_top_suggestion():
    """The advisor tab refits as v2 windows arrive (h100-llama8b, chain of 3 at bs 32, where 2 steps
    win) and `a` puts the top suggestion into the config panel, as an edit `r` would relaunch."""
    import random

    from tuitune.decide.launch import Config
    from tuitune.sim import model as S
    from tuitune_support import simtruth as AA

    src = AA.ModelSource(S.load_machine("h100-llama8b"), random.Random(5))
    launch = await src.measure(Config.chain(3), [8, 32, 64])
    app = scene_app()
    replay = app.session
    from tuitune.base.events import Marker

    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.tabs.active = "tab-advisor"
        # the demo capture's v1 windows (no histogram) already give a model, from accept lengths
        app.advisor.refresh_model(force=True)
        assert app.advisor.running == Config.chain(2) and app.advisor.rows
        assert "accept length" in str(app.advisor.render()) or app.advisor.note
        replay.publish([Marker("relaunch: demo")])  # a new launch: the old windows no longer count
        app.refresh_views()
        app.advisor.refresh_model(force=True)
        assert not app.advisor.rows
        app.config.query_one("#spec-num-steps").value = "3"  # as the windows below were launched
        await pilot.pause()
        before = app.draft
        assert before.speculative.num_steps == 3
        await pilot.press("a")
        assert "no advice yet" in app.messages[-1] and app.draft is before
        replay.publish(launch.windows[:4])  # the first windows: bs 8
        await until(pilot, lambda: app.advisor.rows, 5, "the advisor's first fit")
        assert app.advisor.running == Config.chain(3) and app.advisor.concurrency == 8
        replay.publish(launch.windows[4:])
        app.refresh_views()
        app.advisor.refresh_model(force=True)
        assert app.advisor.concurrency == 32
        labels = [p.config for p in app.advisor.rows]
        assert set(labels) >= {Config.chain(2), Config.chain(3), Config.chain(4), Config()}
        best = app.advisor.top()
        assert best == Config.chain(2)  # the simulator's truth at bs 32: 2 steps beat 3 (and trees)
        text = str(app.advisor.render())
        assert "steps 2 topk 1 tokens 3" in text and "a: apply" in text and "running" in text
        await pilot.press("a")
        await until(
            pilot,
            lambda: app.draft is not before and app.draft.speculative.num_steps == 2,
            5,
            "the config panel's edit",
        )
        assert app.draft.speculative.num_draft_tokens == 3 and not app.draft_errors
        assert app.config.query_one("#spec-num-steps").value == "2"
        assert "config panel set to steps 2" in app.messages[-1]


async def test_the_config_panel_offers_the_loaded_engines_flags_and_algorithms():
    """The panel reads what to offer from the engine (Engine.editable_flags, .algorithms): a vLLM
    preset shows vLLM's flags (its gpu-memory-utilization, not SGLang's mem-fraction-static) and
    only the algorithms tuitune drives on vLLM; an edit becomes that flag's change; back on an
    SGLang preset, SGLang's rows are shown again."""
    from textual.app import App
    from textual.widgets import Checkbox, Input, Select

    from tuitune import engines
    from tuitune.tui.config import ConfigPanel

    class One(App):
        def compose(self):
            yield ConfigPanel()

    vllm = P.resolve("vllm-c4-eagle3-2tok-nccl")
    sglang = P.resolve("c4-eagle3-2step-nccl")
    app = One()
    async with app.run_test(size=(120, 60)) as pilot:
        panel = app.query_one(ConfigPanel)

        def shown(prefix: str) -> set[str]:
            return {
                w.id.removeprefix(prefix) for w in panel.query("*") if (w.id or "").startswith(prefix) and w.display
            }

        assert shown("row-") | (shown("flag-") & {"disable-custom-all-reduce"}) == {
            f.name for f in engines.get("sglang").editable_flags
        }
        panel.load(vllm)
        await pilot.pause()
        assert shown("row-") == {"gpu-memory-utilization", "max-num-seqs"}
        assert panel.query_one("#flag-gpu-memory-utilization", Input).value == "0.88"
        assert panel.query_one("#flag-disable-custom-all-reduce", Checkbox).value is True
        algo = panel.query_one("#spec-algorithm", Select)
        assert algo.value == "EAGLE3" and [v for _, v in algo._options] == [
            "none",
            "EAGLE",
            "EAGLE3",
            "NGRAM",
            "SUFFIX",
        ]
        panel.query_one("#flag-gpu-memory-utilization", Input).value = "0.8"
        panel.query_one("#flag-max-num-seqs", Input).value = "64"
        await pilot.pause()
        changes, errors = panel.collect()
        assert changes == {"server.args.gpu-memory-utilization": 0.8, "server.args.max-num-seqs": 64}, changes
        assert not errors and P.with_changes(vllm, changes).server.args["max-num-seqs"] == 64
        panel.load(sglang)
        await pilot.pause()
        assert shown("row-") == {"num-continuous-decode-steps", "mem-fraction-static"}
        assert len(algo._options) == 1 + len(engines.get("sglang").algorithms)
        assert panel.collect() == ({}, {})


async def test_a_step_change_is_held_live_in_a_prepared_launch_and_other_changes_relaunch(tmp_path):
    """A launch prepared to switch (speculative.switch): editing K and pressing r holds it in the
    running server in seconds, no relaunch (same pid, profile windows held at the new K, the run marked
    live in the runs table); K back to the launch's own releases it; a change of anything else says why
    it relaunches, and relaunches."""
    from tuitune_support.ports import free_port
    from tuitune_support.presets import vllm_sim_data

    p = P.from_dict(
        vllm_sim_data(tmp_path, "tuiv", free_port(), env={"VLLM_LOG_STATS_INTERVAL": "1"}, switch=[1, 2, 4])
    )
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await s.set_load(True)
        await until(pilot, lambda: s.store.last_profile is not None, 15, "profile windows")
        pid = s.state.pid
        app.config.query_one("#spec-num-steps").value = "4"  # vLLM's K in the first row
        await pilot.pause()
        assert app.draft.speculative.num_speculative_tokens == 4
        await pilot.press("r")
        await until(pilot, lambda: s.held == 4, 30, "K 4 held")
        await until(pilot, lambda: any("K 4 held live" in m for m in app.messages), 5, "said")
        await until(pilot, lambda: "held K 4" in str(app.header.render()), 5, "the header's mark")
        assert s.state.pid == pid and not isinstance(app.screen, RelaunchScreen)
        assert s.running_preset.speculative.num_speculative_tokens == 4 and s.launched_preset is not None
        assert s.launched_preset.speculative.num_speculative_tokens == 2
        await until(
            pilot,
            lambda: (
                s.store.last_profile is not None and s.store.last_profile.held == 4 and s.store.last_profile.steps == 4
            ),
            15,
            "windows held at 4",
        )
        await pilot.press("b")
        await until(pilot, lambda: len(app.book.runs) == 1 and not app.bench_running, 60, "a benchmark run")
        assert app.book.runs[0].label.endswith("live K 4"), app.book.runs[0].label
        assert app.book.config_summary(app.book.runs[0]) == "baseline · live K 4"  # the runs table's config column
        app.config.query_one("#spec-num-steps").value = "2"
        await pilot.pause()
        await pilot.press("r")
        await until(pilot, lambda: s.held is None, 30, "released")
        assert s.state.pid == pid and s.running_preset.speculative.num_speculative_tokens == 2
        app.config.query_one("#spec-num-steps").value = "3"  # not prepared: a relaunch, said so
        await pilot.pause()
        await pilot.press("r")
        said = "relaunching: K 3 is not one the running launch is prepared to hold ([1, 2, 4])"
        assert said in app.messages, app.messages
        await wait_ready(app, pilot, s)
        await until(pilot, lambda: s.state.pid != pid and s.state.state == "ready", 30, "the relaunch")
        assert s.running_preset.speculative.num_speculative_tokens == 3
