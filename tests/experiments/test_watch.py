"""The acceptance guard end to end on the simulator as a real process: `tuitune watch` (its alarms
and exit status), `--record` (alarms on stderr and in the capture), the TUI (a warning and the cycle
panel's line). The simulator's --sim-acceptance-shift is a draft that stops matching mid-run,
--sim-context-limit acceptance that collapses past a context length. The real SGLang's NGRAM run is in
tests/real/test_real_sglang.py."""

from __future__ import annotations

import json
import re

from tuitune import preset as P
from tuitune_support.pilot import until
from tuitune_support.presets import make_preset
from tuitune_support.procs import tuitune_cli


def _preset(tmp_path, name: str, steps: int = 3, max_tokens: int = 120, **args):
    p = make_preset(tmp_path, name, args={"sim-speedup": 30, **args}, spec_steps=steps, max_tokens=max_tokens)
    path = P.save(p, tmp_path / f"{name}.yaml")
    return p, str(path)


def _cli(tmp_path, *argv, timeout: float = 120):
    return tuitune_cli(*argv, env={"HOME": str(tmp_path)}, timeout=timeout)


def test_watch_raises_the_alarm_when_the_draft_stops_matching_and_exits_1(tmp_path):
    _, path = _preset(tmp_path, "shift", **{"sim-acceptance-shift": "4=0.3,0.1,0.05"})
    assert _cli(tmp_path, "launch", path).returncode == 0
    try:
        out = tmp_path / "watch.json"
        r = _cli(tmp_path, "watch", path, "--load", "4", "--duration", "90", "--until-alarm", "--json", str(out))
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert "watching shift on local: baseline: the launch's first cycles (learning)" in lines[0], r.stdout
        alarm = [x for x in lines if "acceptance guard: accept length" in x]
        assert alarm and "below the baseline's" in alarm[0] and "(the first 500 cycles" in alarm[0], r.stdout
        assert lines[-1].startswith("1 alarm raised in "), r.stdout
        res = json.loads(out.read_text())
        assert res["alarms_raised"] == 1 and res["active"] and res["baseline"]["accept_len"] > 1.5, res
    finally:
        _cli(tmp_path, "stop", path)


def test_watch_of_a_steady_server_raises_nothing_and_exits_0(tmp_path):
    _, path = _preset(tmp_path, "steady")
    assert _cli(tmp_path, "launch", path).returncode == 0
    try:
        r = _cli(tmp_path, "watch", path, "--load", "4", "--duration", "8")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[-1].startswith("0 alarms raised in 8 s; ok: accept length"), r.stdout
    finally:
        _cli(tmp_path, "stop", path)


def test_watch_names_acceptance_that_falls_with_context(tmp_path):
    _, path = _preset(tmp_path, "ctx", max_tokens=600, **{"sim-context-limit": 250})
    assert _cli(tmp_path, "launch", path).returncode == 0
    try:
        # one stream of long answers: each window is one request at one context length
        r = _cli(tmp_path, "watch", path, "--load", "1", "--duration", "15")
        assert r.returncode == 1, r.stdout + r.stderr
        # (the accept length falls below the first cycles' too, as the contexts grow)
        assert "acceptance guard: accept length falls with context: " in r.stdout, r.stdout
    finally:
        _cli(tmp_path, "stop", path)


def test_watch_refuses_what_it_cannot_watch_in_one_sentence(tmp_path):
    _, path = _preset(tmp_path, "idle")
    r = _cli(tmp_path, "watch", path, "--duration", "5")
    assert r.returncode == 3 and r.stderr.strip() == "tuitune: idle: no server is running on local: nothing to watch"
    bad = tmp_path / "not-a-capture.jsonl"
    bad.write_text("garbage\n")
    r = _cli(tmp_path, "watch", path, "--against", str(bad))
    assert r.returncode == 2 and r.stderr.startswith("tuitune: --against: ") and "Traceback" not in r.stderr, r.stderr
    r = _cli(tmp_path, "watch", path, "--drop", "10")
    assert r.returncode == 2 and "--drop is a share between 0 and 1" in r.stderr, r.stderr
    r = _cli(tmp_path, "watch", path, "--window", "0")
    assert r.returncode == 2 and r.stderr.strip() == "tuitune: --window must be positive (got 0)", r.stderr


def test_record_says_the_alarm_and_keeps_it_and_against_sets_aside_another_configuration(tmp_path):
    _, path = _preset(tmp_path, "rec", **{"sim-acceptance-shift": "3=0.3,0.1,0.05"})
    assert _cli(tmp_path, "launch", path).returncode == 0
    try:
        cap = tmp_path / "rec.jsonl"
        r = _cli(tmp_path, "--record", str(cap), path, "--load", "4", "--duration", "15", timeout=150)
        assert r.returncode == 0, r.stderr
        assert "tuitune: acceptance guard: accept length" in r.stderr and "the acceptance guard raised" in r.stderr
        marks = [json.loads(x) for x in cap.read_text().splitlines() if '"marker"' in x]
        assert any(m.get("text", "").startswith("acceptance guard: accept length") for m in marks), marks
        # a capture of 3 steps against a server of 2: not comparable; said, and the launch's own cycles used
        _, two = _preset(tmp_path, "rec", steps=2)
        assert _cli(tmp_path, "launch", two).returncode == 0
        r = _cli(tmp_path, "watch", two, "--against", str(cap), "--load", "2", "--duration", "6")
        assert "note: the baseline ran steps 3 topk 1 draft tokens 4, this server steps 2" in r.stdout, r.stdout
    finally:
        _cli(tmp_path, "stop", path)


async def test_the_tui_says_the_alarm_and_shows_it_in_the_cycle_panel(tmp_path):
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.settings import UserConfig
    from tuitune_support.pilot import SIZE_LIVE, wait_ready

    p, _ = _preset(tmp_path, "tuiguard", **{"sim-acceptance-shift": "3=0.3,0.1,0.05"})
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        await s.set_load(True, 4)
        await until(
            pilot, lambda: any(m.startswith("acceptance guard: accept length") for m in app.messages), 90, "alarm"
        )
        await until(pilot, lambda: "ACCEPTANCE" in str(app.cycle.query_one("#bars").render()), 10, "the panel's line")
        line = next(x for x in str(app.cycle.query_one("#bars").render()).splitlines() if x.startswith("ACCEPTANCE"))
        assert re.match(r"ACCEPTANCE accept length \d\.\d\d, \d+ % under \d\.\d\d", line), line  # a few words
        await s.close(stop_server=True)
