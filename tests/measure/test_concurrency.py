"""Concurrency end to end: the simulator as a real process batching real HTTP streams, `tuitune
bench --concurrency` and `tuitune crossover` as real commands."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.parse import parse_line
from tuitune.sim import model as M
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port

pytestmark = pytest.mark.sim_clock  # goodput curves and crossovers off the simulator's clock
CHAIN3 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "/d",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
]


def tuitune(*args, tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "HOME": str(tmp)},
    )


def sim_preset(tmp: Path, shipped: str, speedup: float, **bench) -> Path:
    """A shipped simulator preset, made quick to launch, its log and state under tmp."""
    p = P.with_changes(
        P.resolve(shipped),
        {
            "server.log": str(tmp / f"{shipped}.log"),
            "server.port": free_port(),
            "profile": True,
            "server.args.sim-speedup": speedup,
            "server.args.sim-load-seconds": 0.2,
            "server.args.decode-log-interval": 10,
            "server.args.sim-seed": 11,
            **{f"bench.{k}": v for k, v in {"requests": 4, "warmup": 1, "max_tokens": 120, **bench}.items()},
        },
    )
    return P.save(p, tmp / f"{shipped}.yaml")


def test_bad_machine_file_is_a_one_sentence_usage_error(tmp_path):
    path = tmp_path / "m.yaml"
    data = yaml.safe_load((M.MACHINES_DIR / "h100-llama8b.yaml").read_text())
    del data["target"]["comm_ms"]
    path.write_text(yaml.safe_dump(data))
    r = subprocess.run(
        [sys.executable, "-m", "tuitune.sim", "--sim-machine", str(path)], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].endswith("target.comm_ms is missing (it must be a number >= 0)")


def test_sim_decodes_concurrent_requests_as_one_batch(sim_factory):
    sim = sim_factory(
        "--sim-machine",
        "h200-llama8b",
        "--sim-load-seconds",
        "0.2",
        "--sim-speedup",
        "2",
        "--decode-log-interval",
        "10",
        "--sim-seed",
        "5",
        *CHAIN3,
        env={"EAGLE3_PROFILE": "1"},
    )
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=16, warmup=1, max_tokens=200, concurrency=8)))
    assert run.failed == 0
    events = [e for e in map(parse_line, sim.text().splitlines()) if e]
    prof = [e for e in events if e.kind == "profile"]
    assert max(p.bs for p in prof) == 8 and any(p.verify_tokens == 32 for p in prof)
    assert max(e.running_req for e in events if e.kind == "decode") == 8
    # each request's accepted tokens are its own draws: accept lengths differ between requests
    assert len({round(r.accept_len, 3) for r in run.ok}) > 3
    # the measured goodput is the model's at this batch (context: ~25 prompt + 100 generated)
    expected = 2 * M.expected_goodput("h200-llama8b", {"algorithm": "EAGLE3", "num_steps": 3, "context_tokens": 125}, 8)
    assert run.goodput()["tok_s"] == pytest.approx(expected, rel=0.15)


def test_bench_cli_over_levels_reports_a_goodput_curve(tmp_path):
    preset = sim_preset(tmp_path, "sim-h100-llama8b-eagle3", speedup=2)
    assert tuitune("launch", str(preset), tmp=tmp_path).returncode == 0
    try:
        # four streams before: their decode lines are in the log the bench attaches to (its backlog)
        url = f"http://127.0.0.1:{P.load(preset).server.port}"
        assert not asyncio.run(run_bench(BenchConfig(url, requests=8, warmup=0, max_tokens=200, concurrency=4))).failed
        out = tmp_path / "b.json"
        r = tuitune("bench", str(preset), "--concurrency", "1,4", "--json", str(out), tmp=tmp_path)
    finally:
        tuitune("stop", str(preset), tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "goodput tok/s" in r.stdout and "ITL p50/p99" in r.stdout
    data = json.loads(out.read_text())
    one, four = data["curve"]
    assert (one["concurrency"], four["concurrency"]) == (1, 4)
    assert len(data["levels"][1]["results"]) == 8  # max(4 requests, 2 per stream)
    assert four["goodput"] > 2.5 * one["goodput"] and four["decode_tok_s"] > 0
    assert four["batch_size"] == pytest.approx(4, abs=1.5) and one["batch_size"] == pytest.approx(1, abs=0.2)
    assert four["itl_ms_p99"] >= four["itl_ms_p50"] > 0 and four["ttft_ms_p99"] >= four["ttft_ms_p50"]
    assert four["goodput_ci95"][0] < four["goodput"] < four["goodput_ci95"][1]


def test_crossover_found_on_the_seeds_box(tmp_path):
    preset = sim_preset(tmp_path, "sim-c4-eagle3-2step-nccl", speedup=4)
    out = tmp_path / "x.json"
    r = tuitune(
        "crossover",
        str(preset),
        "--concurrency",
        "1,4",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "x.svg"),
        tmp=tmp_path,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "crossover: speculation stops paying at concurrency 4" in r.stdout, r.stdout
    result = json.loads(out.read_text())
    four = result["levels"][1]
    assert four["verdict"] == "slower" and 0.6 < four["speedup"] < 0.85  # the model: 0.72
    assert "goodput (tok/s) against concurrency" in r.stdout and "\x1b" not in r.stdout  # the terminal plot
    assert (tmp_path / "x.svg").read_text().lstrip().startswith("<?xml")


def test_crossover_not_in_range_for_the_papers_chain(tmp_path):
    preset = sim_preset(tmp_path, "sim-h100-llama8b-eagle3", speedup=1, max_tokens=80)  # real time: keeps up
    r = tuitune("crossover", str(preset), "--concurrency", "1,8", "--no-plot", tmp=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "crossover: not within the tested range" in r.stdout, r.stdout
    # speculation pays at both levels; under the other worker's load one of them was once left
    # undecided (not significant), which is an honest row, never a "slower" one
    rows = [ln.rstrip() for ln in r.stdout.splitlines()]
    assert sum(ln.endswith("  faster") for ln in rows) >= 1 and not any(ln.endswith("  slower") for ln in rows)


def test_crossover_refuses_a_preset_without_speculation(tmp_path):
    r = tuitune("crossover", "sim-c2-baseline-nccl", tmp=tmp_path, timeout=30)
    assert r.returncode == 2 and "has no speculation to turn off" in r.stderr


def test_concurrency_64_bench_on_a_small_machine(sim_factory):
    """64 streams through the real client and simulator: the CI machine has 2 cores."""
    sim = sim_factory(
        "--sim-machine", "h100-llama8b", "--sim-load-seconds", "0.2", *CHAIN3, "--decode-log-interval", "10"
    )
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=64, warmup=1, max_tokens=80).at_level(64)))
    assert run.failed == 0 and len(run.results) == 128
    decode = [e.running_req for e in map(parse_line, sim.text().splitlines()) if e and e.kind == "decode"]
    assert max(decode) >= 56  # all 64 at once, give or take the stragglers of a loaded machine
    expected = M.expected_goodput("h100-llama8b", {"algorithm": "EAGLE3", "num_steps": 3, "context_tokens": 65}, 64)
    # below the steady state: new requests' prefills interrupt the batch, as on a real server
    # (benchmarks/sim_concurrency.py --streams 64 --max-tokens 80 --speedup 1: 80-85 % of it)
    assert 0.7 * expected < run.goodput()["tok_s"] < 1.02 * expected


def sim_info(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/server_info", timeout=10) as r:
        return json.loads(r.read())["sim"]


def test_the_simulator_follows_its_model_at_32_streams(sim_factory):
    """Spec vs no-spec at 32 streams (issue 26: an independent client once measured 1.16 against the
    model's 1.41). With requests long enough that prefills are a small share, tuitune's client
    measures the model's steady-state ratio within 10 %; and the simulator's own account (the
    modelled time of the work it did against the wall time it took) says it kept up."""
    got = {}
    for name, args in (("off", []), ("on", CHAIN3)):
        sim = sim_factory("--sim-machine", "h100-llama8b", "--sim-load-seconds", "0.2", "--sim-speedup", "0.5", *args)
        sim.wait_ready()
        before = sim_info(sim.url)
        run = asyncio.run(run_bench(BenchConfig(sim.url, requests=32, warmup=1, max_tokens=200).at_level(32)))
        after = sim_info(sim.url)
        assert run.failed == 0
        d = {k: after[k] - before[k] for k in ("model_busy_s", "wall_busy_s", "prefill_busy_s", "tokens")}
        assert d["tokens"] >= 32 * 2 * 200 * 0.99  # warm-up and measured requests, all of them
        # the process kept up: its busy wall time is its modelled time, give or take a few cycles
        assert d["model_busy_s"] <= d["wall_busy_s"] < 1.05 * d["model_busy_s"], d
        assert 0 < d["prefill_busy_s"] < 0.15 * d["model_busy_s"], d
        # bench reads the same account over its measured requests: kept up, so nothing to flag
        assert run.sim_lag_share is not None and run.sim_lag_share < 0.05 and run.sim_behind() is None, run
        # the client got what the simulator's model says of the work it did (tokens / modelled time)
        did = d["tokens"] / d["model_busy_s"] / 0.5
        assert 0.9 * did < run.goodput()["tok_s"] / 0.5 < 1.1 * did, (run.goodput(), did)
        got[name] = run.goodput()["tok_s"] / 0.5
    cfg = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "context_tokens": 120}
    model = M.expected_goodput("h100-llama8b", cfg, 32) / M.expected_goodput(
        "h100-llama8b", {"context_tokens": 120}, 32
    )
    assert model == pytest.approx(1.34, abs=0.03)
    assert 0.9 * model < got["on"] / got["off"] < 1.1 * model, (got, model)


def test_sweep_over_concurrency_and_ab_at_a_concurrency(tmp_path):
    preset = sim_preset(tmp_path, "sim-h100-llama8b-eagle3", speedup=2, requests=2, max_tokens=60)
    out = tmp_path / "out"
    r = tuitune(
        "sweep",
        str(preset),
        "--grid",
        "bench.concurrency=1,4",
        "--baseline-every",
        "0",
        "--no-plot",
        "--out",
        str(out),
        tmp=tmp_path,
    )
    assert r.returncode == 0 and (out / "results.jsonl").exists(), r.stderr + r.stdout
    rows = {json.loads(x)["label"]: json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()}
    assert rows["concurrency=4"]["concurrency"] == 4 and rows["concurrency=4"]["requests"] == 8
    assert rows["concurrency=4"]["goodput"] > 2.5 * rows["concurrency=1"]["goodput"]
    four = next(x for x in r.stdout.splitlines() if x.startswith("concurrency=4"))
    assert "n/c (other concurrency)" in four  # the baseline ran one stream
    assert "best: concurrency=4" not in r.stdout  # never a winner against a one-stream baseline
    off = P.save(P.with_changes(P.load(preset), {"speculative": None, "name": "off"}), tmp_path / "off.yaml")
    r = tuitune(
        "ab",
        str(off),
        str(preset),
        "--rounds",
        "1",
        "--no-verdict",
        "--concurrency",
        "4",
        "--json",
        str(tmp_path / "ab.json"),
        tmp=tmp_path,
    )
    result = json.loads((tmp_path / "ab.json").read_text())
    assert r.returncode == 0 and result["verdict"]["metric"] == "goodput"
    assert "medians of goodputs at concurrency 4" in r.stdout
    assert all(x["concurrency"] == 4 for x in result["launches"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "sim-c4-eagle3-2step-nccl", "--concurrency", "1,x"], "invalid concurrency list"),
        (["bench", "sim-c4-eagle3-2step-nccl", "--concurrency", "4,4"], "invalid concurrency list"),
        (["bench", "sim-c4-eagle3-2step-nccl", "--concurrency", "0"], "invalid concurrency list"),
        (
            ["ab", "sim-c2-baseline-nccl", "sim-c4-eagle3-2step-nccl", "--concurrency", "1,4"],
            "--concurrency takes one level here (got 2)",
        ),
        (["crossover", "sim-c4-eagle3-2step-nccl", "--plot", "out.pdf"], "the file must end in .png or .svg"),
    ],
)
def test_concurrency_flags_are_checked_before_anything_starts(tmp_path, args, message):
    r = tuitune(*args, tmp=tmp_path, timeout=30)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_stream_interval_sends_a_chunk_every_n_cycles(sim_factory):
    sim = sim_factory("--sim-load-seconds", "0.2", "--sim-speedup", "10", "--stream-interval", "4")
    sim.wait_ready()
    run = asyncio.run(run_bench(BenchConfig(sim.url, requests=1, warmup=0, max_tokens=101)))
    r = run.results[0]
    assert r.ok and r.completion_tokens == 101 and r.chunks == 26  # the first token, then 100 in fours
    assert (
        subprocess.run(
            [sys.executable, "-m", "tuitune.sim", "--stream-interval", "0"], capture_output=True, text=True, timeout=30
        ).returncode
        == 2
    )
