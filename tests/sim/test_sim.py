"""The simulator as a real subprocess: start-up, health, HTTP, SGLang rules, NCCL, faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.parse import parse_line
from tuitune.measure.request import client_session, run_request
from tuitune.sim import model
from tuitune_support.ports import http_status
from tuitune_support.procs import group_alive, wait_for
from tuitune_support.simproc import SEED_ARGS, SPEC2, TUNED_NCCL

FAST = ["--sim-load-seconds", "0.4", "--sim-speedup", "10"]


def run_sim(*args, env=None, timeout=15) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tuitune.sim", *args], capture_output=True, text=True, timeout=timeout, env=full
    )


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def test_startup_log_and_health_transitions(sim_factory):
    sim = sim_factory("--sim-load-seconds", "1.5", *SPEC2, env={"EAGLE3_PROFILE": "1"})
    seen = set()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        seen.add(http_status(sim.url + "/health", timeout=0.5))
        if 200 in seen:
            break
        time.sleep(0.01)
    # connection refused while loading, then 200; 503 during warm-up may be brief but must precede
    assert None in seen and 200 in seen
    text = sim.text()
    order = [
        "server_args=ServerArgs(",
        "Load weight begin",
        "Capture cuda graph begin",
        "Capture draft cuda graph begin",
        "Uvicorn running on http://127.0.0.1",
        "The server is fired up and ready to roll!",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in text
    kinds = [e.kind for e in map(parse_line, text.splitlines()) if e]
    assert "http_up" in kinds and "ready" in kinds


def test_health_503_during_warmup(sim_factory):
    # HTTP comes up after loading; /health answers 503 through the warm-up (0.2 s here), then 200
    sim = sim_factory("--sim-load-seconds", "4", "--sim-speedup", "1")
    wait_for(lambda: "Uvicorn running" in sim.text(), 20, interval=0.005, what="HTTP up")
    codes = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and 200 not in codes:
        codes.append(http_status(sim.url + "/health", timeout=1))
        time.sleep(0.005)
    assert 503 in codes and codes[-1] == 200, codes


def test_streaming_generate_profile_and_decode_lines(sim_factory):
    sim = sim_factory(
        *FAST, *SPEC2, *SEED_ARGS, "--decode-log-interval", "10", env={"EAGLE3_PROFILE": "1", **TUNED_NCCL}
    )
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=2, warmup=0, max_tokens=200)))
    assert run.failed == 0
    r = run.results[0]
    assert r.completion_tokens == 200 and r.spec_verify_ct and 1.0 < r.accept_len < 3.0
    wait_for(lambda: "EAGLE3_PROFILE" in sim.text(), 5, what="a profile line")
    events = [e for e in map(parse_line, sim.text().splitlines()) if e]
    prof = [e for e in events if e.kind == "profile"]
    dec = [e for e in events if e.kind == "decode"]
    assert prof and dec and all(e.kind != "malformed" for e in events)
    exp = model.cycle_cost(
        model.sim_config(
            model.load_machine(None),
            continuous_decode_steps=4,
            custom_all_reduce=False,
            algorithm="EAGLE3",
            steps=2,
            draft_tokens=3,
            tp_size=8,
            env_factor=model.nccl_factor(TUNED_NCCL),
        )
    )
    # the profile line reports real (sped-up) milliseconds
    assert prof[0].verify_ms == pytest.approx(exp.verify_ms / 10, rel=0.1)
    assert prof[0].steps == 2 and prof[0].draft_tokens == 3 and dec[0].accept_len is not None


def test_baseline_has_no_accept_fields_nor_profile(sim_factory):
    sim = sim_factory(*FAST, "--decode-log-interval", "5", env={"EAGLE3_PROFILE": "1"})
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=1, warmup=0, max_tokens=60)))
    assert run.failed == 0 and run.results[0].spec_verify_ct is None
    wait_for(lambda: "Decode batch" in sim.text(), 5, what="decode line")
    assert "EAGLE3_PROFILE" not in sim.text() and "accept len" not in sim.text()


def test_openai_non_streaming_and_info_endpoints(sim_factory):
    sim = sim_factory(*FAST, "--enable-metrics", *SPEC2, env={"SGLANG_RECORD_STEP_TIME": "1"})
    sim.wait_ready()
    body = json.dumps({"model": "x", "prompt": "hello", "max_tokens": 20}).encode()
    req = urllib.request.Request(sim.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        out = json.loads(r.read())
    assert out["usage"]["completion_tokens"] == 20 and out["choices"][0]["text"]
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 10}}).encode()
    with urllib.request.urlopen(urllib.request.Request(sim.url + "/generate", data=body), timeout=10) as r:
        gen = json.loads(r.read())
    assert gen["meta_info"]["completion_tokens"] == 10 and "spec_verify_ct" in gen["meta_info"]
    info = get_json(sim.url + "/server_info")
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert info["internal_states"][0]["step_time_dict"]
    assert get_json(sim.url + "/get_server_info")["speculative_num_steps"] == 2
    assert get_json(sim.url + "/v1/models")["data"][0]["id"]
    assert get_json(sim.url + "/get_model_info")["is_generation"] is True
    with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert "sglang:gen_throughput" in metrics and "sglang:spec_accept_length" in metrics
    assert http_status(sim.url + "/health_generate") == 200


def test_unknown_flag_exits_2_like_argparse():
    r = run_sim("--no-such-flag", "1")
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "/d",
                "--speculative-num-steps",
                "2",
                "--speculative-eagle-topk",
                "2",
                "--speculative-num-draft-tokens",
                "9",
            ],
            "must be <= speculative_num_steps * speculative_eagle_topk + 1 (5)",
        ),
        (
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "/d",
                "--speculative-eagle-topk",
                "2",
            ],
            "must be unset when speculative_num_steps is unset",
        ),
    ],
)
def test_speculative_rules_refuse(args, message):
    r = run_sim(*args, "--sim-load-seconds", "0")
    assert r.returncode == 1 and message in r.stdout


def test_speculative_auto_choice(sim_factory):
    sim = sim_factory(*FAST, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d")
    sim.wait_ready()
    info = get_json(sim.url + "/server_info")
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"], info["speculative_num_draft_tokens"]) == (
        3,
        1,
        4,
    )


def test_nccl_debug_lines_and_tuning(sim_factory):
    sim = sim_factory(*FAST, *SPEC2, env={**TUNED_NCCL, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"})
    sim.wait_ready()
    events = [e for e in map(parse_line, sim.text().splitlines()) if e]
    env = {e.name: e.value for e in events if e.kind == "nccl_env"}
    assert env == TUNED_NCCL
    algo = [e for e in events if e.kind == "nccl_algo"]
    assert algo and algo[0].algo == "RING" and algo[0].proto == "LL" and algo[0].channels == 16


def test_invalid_nccl_proto_fails_startup():
    r = run_sim("--sim-load-seconds", "0.2", env={"NCCL_PROTO": "LLL"})
    assert r.returncode == 1
    kinds = {e.category for e in map(parse_line, r.stdout.splitlines()) if e and e.kind == "error"}
    assert "nccl" in kinds and "traceback" in kinds


def test_mem_fraction_too_high_ooms():
    r = run_sim("--mem-fraction-static", "0.97", "--sim-load-seconds", "0.2")
    assert r.returncode == 1
    errs = [e for e in map(parse_line, r.stdout.splitlines()) if e and e.kind == "error"]
    assert any(e.category == "oom" for e in errs)


def test_crash_after_fault():
    r = run_sim("--sim-fault", "crash-after=0.3", "--sim-load-seconds", "5")
    assert r.returncode == 1 and "illegal memory access" in r.stdout


def test_sigterm_clean_exit_within_2s(sim_factory):
    sim = sim_factory(*FAST, "--tp-size", "4")
    sim.wait_ready()
    children = subprocess.run(["pgrep", "-g", str(sim.proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) >= 2  # scheduler helpers share the process group, like SGLang's
    t = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.proc.wait(2) == 0 and time.monotonic() - t < 2
    wait_for(lambda: not group_alive(sim.proc.pid), 3, what="helpers to exit")


def test_hang_on_sigterm_needs_sigkill(sim_factory):
    sim = sim_factory(*FAST, "--sim-fault", "hang-on-sigterm")
    sim.wait_ready()
    sim.proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        sim.proc.wait(1.0)
    sim.proc.kill()
    assert sim.proc.wait(2) != 0


def test_health_hang_fault(sim_factory):
    sim = sim_factory(*FAST, "--sim-fault", "health-hang")
    wait_for(lambda: "fired up" in sim.text(), 10, what="ready line")
    assert http_status(sim.url + "/health", timeout=0.5) is None  # times out


def test_garbage_fault_writes_invalid_utf8_and_long_lines(sim_factory):
    sim = sim_factory(*FAST, "--sim-fault", "garbage", "--sim-seed", "3", *SPEC2)
    sim.wait_ready()
    asyncio.run(run_bench(BenchConfig(sim.url, requests=3, warmup=0, max_tokens=400)))
    raw = sim.log.read_bytes()
    assert b"\xff\xfe" in raw
    for line in raw.decode("utf-8", "replace").splitlines():
        parse_line(line)  # never raises


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_sim("--port", str(port), "--sim-load-seconds", "0")
    assert r.returncode == 1 and "address already in use" in r.stdout.lower()
    assert any(e and e.kind == "error" and e.category == "port_in_use" for e in map(parse_line, r.stdout.splitlines()))


def test_bench_rate_matches_cost_model_within_2_percent(sim_factory):
    # Deterministic acceptance (every draft accepted) isolates timing accuracy from sampling noise.
    sim = sim_factory(
        "--sim-load-seconds",
        "0.2",
        "--sim-speedup",
        "5",
        "--sim-acceptance",
        "1",
        "--sim-jitter",
        "0",
        "--sim-launch-sigma",
        "0.03",
        *SPEC2,
        *SEED_ARGS,
        env=TUNED_NCCL,
    )
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=4, warmup=1, max_tokens=301)))
    expected = run.server["sim"]["expected_tok_s"]
    assert run.median_tok_s() == pytest.approx(expected, rel=0.02)
    # every request's clock started when it was on the wire (the trace signal fired), and the
    # simulator saw it after that: its handler's wall stamp is later than the client's start
    assert all(r.send_ms is not None and 0 < r.send_ms < 1000 for r in run.ok)
    assert all(r.client_lag_ms is not None and r.client_lag_ms > 0 for r in run.ok)
    assert "t0" not in run.ok[0].to_dict()


def test_bench_clock_starts_when_the_request_is_on_the_wire(sim_factory):
    """With a session that lacks the trace signal the clock starts before the request is built;
    with ``client_session`` it starts later, when the last byte was handed to the socket."""
    import aiohttp

    sim = sim_factory("--sim-load-seconds", "0.2", "--sim-speedup", "5")
    sim.wait_ready()
    cfg = BenchConfig(sim.url, max_tokens=8)

    async def one(traced: bool):
        async with client_session() if traced else aiohttp.ClientSession() as session:
            t_call = time.perf_counter()
            r = await run_request(session, cfg, "hello")
            return t_call, r

    t_call, plain = asyncio.run(one(False))
    assert plain.ok and plain.send_ms is None and t_call <= plain.t0 < t_call + 0.01
    t_call, traced = asyncio.run(one(True))
    assert traced.ok and traced.send_ms > 0 and traced.t0 >= t_call + traced.send_ms / 1000 - 1e-4


CALIBRATION = [  # (name, steps or None, tuned, seed tok/s)
    ("C1", None, False, 62.9),
    ("C2", None, True, 88.8),
    ("C3", 5, True, 86.7),
    ("C4", 2, True, 94.0),
    ("C7", 2, False, 75.9),
    ("C8", 5, False, 71.3),
]


@pytest.mark.parametrize("name, steps, tuned, seed", CALIBRATION)
def test_calibration_short_runs(sim_factory, name, steps, tuned, seed):
    spec = (
        []
        if steps is None
        else [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(steps + 1),
        ]
    )
    speedup = 10
    sim = sim_factory(
        "--sim-load-seconds", "0.2", "--sim-speedup", str(speedup), *SEED_ARGS, *spec, env=TUNED_NCCL if tuned else {}
    )
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=6, warmup=1, max_tokens=500)))
    measured = run.median_tok_s() / speedup
    assert measured == pytest.approx(seed, rel=0.10), f"{name}: sim {measured:.1f} vs seed {seed}"


# ---- the simulator stands apart: an independent server, not tuitune checking itself ------------


def test_the_simulator_imports_nothing_of_tuitune_outside_itself():
    """Every import in tuitune/sim/*.py, at any depth (functions too), names tuitune.sim or
    nothing of tuitune: it writes and reads the engines' wire formats with its own code."""
    import ast
    from pathlib import Path

    import tuitune.sim

    folder = Path(tuitune.sim.__file__).parent
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 8
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside tuitune.sim only if it stays in the folder
                    names = ["tuitune.sim" if node.level == 1 else "tuitune"]
                else:
                    names = [node.module or ""]
                    names += [f"{node.module}.{a.name}" for a in node.names if node.module == "tuitune"]
            else:
                continue
            for name in names:
                top = name.split(".")
                if top[0] == "tuitune" and (len(top) < 2 or top[1] != "sim"):
                    bad.append(f"{path.name}:{node.lineno}: {name}")
    assert not bad, bad


ADAPTIVE_CASES = [
    {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}, "ema_alpha": 0.3},
    {"4": {"candidate_steps": [2]}, "x": {"candidate_steps": "ignored"}},
    [1, 2],
    {"x": {"candidate_steps": [1]}},
    {"1": {"candidate_steps": []}},
    {"1": {"candidate_steps": [-1]}},
    {"1": {"candidate_steps": [1.0]}},
    {"1": {"candidate_steps": [True]}},
    {"1": {"candidate_steps": "1,2"}},
    {"8": {}},
    {"8": 3},
    {},
]


@pytest.mark.parametrize("cfg", ADAPTIVE_CASES, ids=range(len(ADAPTIVE_CASES)))
def test_the_simulators_own_reading_of_the_adaptive_file_agrees_with_tuitunes_checker(cfg):
    """Two readings of SGLang's schedule file, written apart (the simulator's, as the server
    loads it; tuitune's, before it emits one): the same files taken, the same refused, with the
    same buckets."""
    from tuitune.engines import sglang_schedule
    from tuitune.sim import adaptive

    try:
        want = sglang_schedule.check_adaptive(cfg)
    except ValueError as e:
        with pytest.raises(ValueError) as got:
            adaptive.load_config(cfg)
        assert str(got.value) == str(e)
    else:
        assert adaptive.load_config(cfg) == want


@pytest.mark.sim_clock  # two clients' rates on the simulator
def test_bench_stamps_the_stream_on_its_own_clock_not_the_callers_loop(sim_factory):
    """A caller whose event loop stalls (a session's liveness check forking while its child waits
    for a core, a /metrics page parsed on a loaded machine: 0.3-2.9 s seen on the real vLLM engine)
    must not stamp the stream late. With the calling loop blocked 0.9 s in a syscall, then 0.3 s in
    pure Python, in every 1.2 s, each request still has its decode rate, within 15 % of a quiet run
    (the old client, on the caller's loop, read whole streams in one read: no rate at all)."""
    sim = sim_factory("--sim-load-seconds", "0.4", "--sim-speedup", "2", *SPEC2)
    sim.wait_ready()

    def cfg() -> BenchConfig:
        return BenchConfig(sim.url, requests=4, warmup=1, max_tokens=200)

    async def stalled():
        async def staller():
            while True:
                await asyncio.sleep(0.02)
                time.sleep(0.9)  # the GIL released, as a fork waiting for its child's exec
                end = time.perf_counter() + 0.3
                while time.perf_counter() < end:  # the GIL held (switched every 5 ms)
                    sum(range(1000))

        t = asyncio.ensure_future(staller())
        try:
            return await run_bench(cfg())
        finally:
            t.cancel()

    quiet = asyncio.run(run_bench(cfg())).tok_s()
    run = asyncio.run(stalled())
    rates = [r.decode_tok_s for r in run.results]
    assert run.failed == 0 and all(x is not None for x in rates), rates
    ratio = statistics.median(rates) / statistics.median(quiet)
    assert abs(ratio - 1) < 0.15, (rates, quiet)
