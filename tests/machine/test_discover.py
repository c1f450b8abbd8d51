"""Issue 41 item 1, without a preset: `tuitune --port P` / `--pid PID` (the TUI and `--record`) and
`tuitune preset discover` read a hand-started server's preset off its process (argv, environment,
working directory, where its output goes), watch it read-only, and say how to write it down and adopt
it. The engines turn their own flags back into a preset (``Engine.preset_data``, the inverse of
``launch_args``): every shipped preset's command line reads back as the same launch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.machine.discover import DiscoverError, parse_host
from tuitune.machine.record import compute_drift
from tuitune.machine.session import Session
from tuitune.measure.capture import read_capture
from tuitune.preset.discovered import from_process
from tuitune.tui.app import TuituneApp
from tuitune.tui.settings import UserConfig
from tuitune_support.paths import ROOT
from tuitune_support.pilot import collect_says, until
from tuitune_support.ports import free_port
from tuitune_support.procs import HandServer, tuitune_cli
from tuitune_support.simproc import sim_argv

PRESETS = sorted((ROOT / "tuitune" / "presets").glob("*.yaml"))


# ---- the engines' inverse: pure -----------------------------------------------------------------


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_shipped_presets_command_line_reads_back_as_the_same_launch(path):
    p = P.load(path)
    if p.is_multinode:
        pytest.skip("a multi-node server is described by a preset only")
    argv = [p.python(), "-m", p.server.module, *p.flags()]
    env = {**p.launch_env(), "HOME": "/root", "PATH": "/usr/bin"}
    q, notes = from_process(argv, env, name=p.name, target="local", log=p.server.log)
    assert notes == []
    assert q.flags() == p.flags() and q.server.engine == p.server.engine and q.server.module == p.server.module
    assert compute_drift(q, argv, env) == []
    assert q.env == p.env and q.profile == p.profile  # HOME and PATH are no server's settings
    assert q.hash() == p.hash()


def test_vllms_console_script_and_its_speculative_config():
    cfg = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "suffix_tree_depth": 9}
    argv = ["/v/bin/python3", "/v/bin/vllm", "serve", "m/x", "--port", "8011", "--max-num-seqs", "8"]
    p, notes = from_process(
        [*argv, "--speculative-config", json.dumps(cfg), "--enforce-eager"],
        {"VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/root/.cache/tuitune/probe:/opt/lib", "EAGLE3_PROFILE": "1"},
        name="v",
        target="local",
        log="/tmp/v.log",
        cwd="/srv",
    )
    assert p.server.engine == "vllm" and p.server.module == "vllm.entrypoints.cli.main" and p.server.port == 8011
    assert p.server.args == {"model": "m/x", "max-num-seqs": 8, "enforce-eager": True}
    assert p.server.workdir == "/srv" and p.server.python == "/v/bin/python3"
    s = p.speculative
    assert (s.algorithm, s.num_speculative_tokens, s.prompt_lookup_max) == ("NGRAM", 3, 4)
    assert p.env == {"VLLM_CPU_KVCACHE_SPACE": "4", "PYTHONPATH": "/opt/lib"} and p.profile  # the probe's dir left out
    assert notes == ["--speculative-config's 'suffix_tree_depth' is not one a preset holds: left out"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["python3", "-m", "http.server", "8000"], "`python3 -m http.server 8000`, which is no server tuitune knows"),
        (["/v/bin/python", "/v/bin/vllm", "bench", "serve"], "it runs `vllm bench`, not `vllm serve`"),
        (
            ["python3", "-m", "vllm.entrypoints.cli.main", "serve", "m", "--speculative-config", '{"method": "mtp"}'],
            "the method 'mtp' is not one tuitune knows",
        ),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--nnodes", "2"], "--nnodes: a server of"),
        (["python3", "-m", "sglang.launch_server", "--model-path", "m", "--speculative-num-steps", "0"], "no valid"),
    ],
)
def test_a_process_no_preset_can_describe_is_one_sentence(argv, words):
    with pytest.raises(P.PresetError) as e:
        from_process(argv, {}, name="x", target="local", log="/tmp/x.log", source="pid 7 on local")
    assert words in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)


def test_host_forms():
    assert parse_host(None) == "local" and parse_host("local") == "local"
    assert parse_host("me@gpu-box:2222") == {"host": "gpu-box", "user": "me", "port": 2222}
    assert parse_host("gpu-box") == {"host": "gpu-box"}
    for bad in ("me@", "a b", "box:99999", "x@y@z"):
        with pytest.raises(DiscoverError, match="is not \\[USER@\\]HOST"):
            parse_host(bad)


# ---- a simulator started by hand: real processes ------------------------------------------------


def start_hand(tmp: Path, log: bool = True) -> HandServer:
    """The simulator as a person starts it: `cd DIR; NCCL_ALGO=Ring EAGLE3_PROFILE=1 nohup python -m
    tuitune.sim … > server.log 2>&1 &` (``log`` False: its output into a pipe, as under a supervisor)."""
    port = free_port()
    argv = sim_argv(port, steps=3)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(NCCL_ALGO="Ring", EAGLE3_PROFILE="1")
    return HandServer(argv, port, env, tmp / "server.log" if log else None, cwd=tmp)


@pytest.fixture
def hand(tmp_path):
    h = start_hand(tmp_path)
    yield h
    h.stop()


def test_discover_prints_a_preset_with_no_drift_then_save_and_adopt_make_it_tuitunes(hand, tmp_path):
    home = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    name = f"sim-{hand.port}"
    for by in (["--port", str(hand.port)], ["--pid", str(hand.proc.pid)]):
        r = tuitune_cli("preset", "discover", *by, env=home)
        assert r.returncode == 0, r.stderr
        data = yaml.safe_load(r.stdout)
        assert data["name"] == name and data["server"]["log"] == str(hand.log), data
        assert data["server"]["workdir"] == str(tmp_path) and data["server"]["port"] == hand.port
        assert data["speculative"]["num_steps"] == 3 and data["env"] == {"NCCL_ALGO": "Ring"} and data["profile"]
    written = tmp_path / "discovered.yaml"
    written.write_text(r.stdout)
    r = tuitune_cli("status", str(written), env=home)
    assert r.returncode == 5 and "not started by tuitune" in r.stdout, r.stdout
    assert "no drift: environment and flags match the preset" in r.stdout, r.stdout
    r = tuitune_cli("preset", "discover", "--port", str(hand.port), "--save", env=home)
    assert r.returncode == 0 and f"`tuitune adopt {name}`" in r.stdout, r.stderr
    assert (tmp_path / "cfg" / "tuitune" / "presets" / f"{name}.yaml").exists()
    r = tuitune_cli("preset", "discover", "--port", str(hand.port), "--save", env=home)
    assert r.returncode == 2 and "exists already" in r.stderr, r.stderr  # never over a preset of yours
    r = tuitune_cli("adopt", name, env=home)
    assert r.returncode == 0 and f"adopted server {hand.proc.pid}" in r.stdout, r.stdout
    assert "difference(s)" not in r.stdout, r.stdout
    r = tuitune_cli("stop", name, env=home)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stderr
    assert hand.proc.wait(10) is not None


def test_record_by_port_watches_without_relaunching_and_says_how_to_adopt(hand, tmp_path):
    home = {"HOME": str(tmp_path)}
    out = tmp_path / "hand.jsonl"
    r = tuitune_cli("--record", str(out), "--port", str(hand.port), "--load", "--duration", "4", env=home, timeout=90)
    assert r.returncode == 0, r.stderr
    events = [x.event for x in read_capture(out).records]
    assert any(isinstance(e, ProfileWindow) and e.steps == 3 for e in events)
    assert any(isinstance(e, DecodeStats) for e in events)
    r = tuitune_cli("--record", str(tmp_path / "x.jsonl"), "--port", str(hand.port), "--relaunch", env=home)
    assert r.returncode == 2, r.stderr
    said = r.stderr.strip()
    assert "in use by a server tuitune did not start" in said and "\n" not in said, said
    assert f"`tuitune preset discover --port {hand.port} --save`, then `tuitune adopt sim-{hand.port}`" in said
    assert hand.proc.poll() is None  # not relaunched, not stopped


def test_what_cannot_be_found_is_one_sentence(tmp_path):
    home = {"HOME": str(tmp_path)}
    idle = free_port()
    cases = [
        (["--record", "o.jsonl", "--port", str(idle)], 1, f"nothing listens on port {idle} of local"),
        (["preset", "discover", "--pid", str(2**22 - 1)], 1, f"no process {2**22 - 1} on local"),
        (["preset", "discover", "--port", "0"], 2, "--port 0 is not a port"),
        (["preset", "discover", "--port", "1", "--log", "server.log"], 1, "nothing listens"),
        (["c4-eagle3-2step-nccl", "--port", "30000"], 2, "give a PRESET or the server's --port / --pid, not both"),
        (["--record", "o.jsonl", "--log", "/x.log"], 2, "give the server's --port or --pid"),
    ]
    for args, code, words in cases:
        r = tuitune_cli(*args, env=home)
        said = r.stderr.strip()
        assert r.returncode == code and words in said and "\n" not in said, (args, r.returncode, said)


def test_a_server_whose_output_is_no_file_needs_log(tmp_path):
    h = start_hand(tmp_path, log=False)
    try:
        home = {"HOME": str(tmp_path)}
        r = tuitune_cli("preset", "discover", "--port", str(h.port), env=home)
        assert r.returncode == 1 and "give its log with --log PATH" in r.stderr, r.stderr
        r = tuitune_cli("preset", "discover", "--port", str(h.port), "--log", "relative.log", env=home)
        assert r.returncode == 1 and "is not an absolute path" in r.stderr, r.stderr
        r = tuitune_cli("preset", "discover", "--port", str(h.port), "--log", "/var/log/sim.log", env=home)
        assert r.returncode == 0 and "log: /var/log/sim.log" in r.stdout, r.stderr
    finally:
        h.stop()


async def test_tui_on_a_discovered_preset_shows_live_numbers_and_refuses_relaunch(hand, tmp_path):
    from tuitune.machine.discover import discover

    found = await discover(port=hand.port)
    assert found.pid == hand.proc.pid and found.notes == []
    session = Session(found.preset, state_dir=str(tmp_path / "state"))
    app = TuituneApp(session, user_config=UserConfig())
    said = collect_says(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.state.state == "ready", 20, "attached")
        assert session.read_only and session.state.pid == hand.proc.pid
        await session.set_load(True)
        await until(pilot, lambda: session.store.last_profile is not None, 20, "profile windows from its log")
        assert session.store.last_profile.steps == 3
        await pilot.press("r")
        await pilot.pause()
        assert any(f"`tuitune preset discover --port {hand.port} --save`" in m for m in said), said
        await session.close(stop_server=False)
    assert hand.proc.poll() is None
