"""`tuitune ab` on the simulator's twins of the seed presets reproduces the seeds' conclusions."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.experiments.ab import detectable_effect, power_note, run_ab, verdict
from tuitune.machine.transport import LocalTransport
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port


def twin(name: str, tmp: Path, port: int) -> P.Preset:
    """A shipped simulator twin, sped up 20x, its log and state under tmp; quasi-random acceptance
    draws, so that 4 short launches resolve a 5.7 % difference."""
    return P.with_changes(
        P.resolve(name),
        {
            "server.log": str(tmp / f"{name}.log"),
            "server.port": port,
            "profile": False,
            "server.args.sim-speedup": 20,
            "server.args.sim-load-seconds": 0.2,
            "server.args.sim-draws": "quasi",
            "bench.requests": 4,
            "bench.warmup": 0,
            "bench.max_tokens": 300,
        },
    )


@pytest.mark.sim_clock  # its ratio within 1.02-1.15, off the simulator's clock
def test_ab_cli_two_step_eagle3_beats_the_nccl_baseline(tmp_path):
    port = free_port()
    files = []
    for name in ("sim-c2-baseline-nccl", "sim-c4-eagle3-2step-nccl"):
        files.append(P.save(twin(name, tmp_path, port), tmp_path / f"{name}.yaml"))
    out = tmp_path / "ab.json"
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "ab", str(files[0]), str(files[1]), "--rounds", "4", "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**__import__("os").environ, "HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    assert "verdict: B (sim-c4-eagle3-2step-nccl) is faster" in r.stdout, r.stdout
    result = json.loads(out.read_text())
    assert len(result["launches"]) == 8
    assert [x["preset"] for x in result["launches"][:4]] == ["sim-c2-baseline-nccl", "sim-c4-eagle3-2step-nccl"] * 2
    assert 1.02 < result["verdict"]["ratio"] < 1.15  # seeds: +5.9 %; the model: +5.7 %; short launches: ±3 %
    # before the first relaunch it says what 4 rounds can detect, and from which spread
    power = [x for x in r.stdout.splitlines() if x.startswith("power: ")]
    assert r.stdout.index(power[0]) < r.stdout.index("round 1/4: launching A")
    assert "with 4 launches a side this A/B detects a change of " in power[0]
    assert "(launch-to-launch spread 2.0%, a prior: nothing measured yet)" in power[0]
    before = result["power"]["before"]
    assert before["spread_source"].startswith("a prior") and before["detectable"] == pytest.approx(
        detectable_effect(4, 0.02)
    )
    after = result["power"]["after"]  # and after, the same from the spread it measured
    assert after["spread_source"] == "measured in this A/B" and ", measured in this A/B)" in power[-1]
    assert after["spread"] > 0 and len(power) == 2


def test_detectable_effect_follows_the_verdict_rule():
    """The stated smallest detectable effect is what the verdict itself (``ab.verdict``: the exact
    Mann-Whitney decision and its interval) detects about 80 % of the time; fewer rounds than the
    exact test needs detect nothing; more rounds and less spread less; a sequential A/B of 4 up to 8
    rounds less than 4 fixed rounds."""
    import random

    assert detectable_effect(3, 0.02) is None and detectable_effect(1, 0.0) is None
    e4, e8 = detectable_effect(4, 0.02), detectable_effect(8, 0.02)
    assert e4 is not None and e8 is not None and 0.01 < e8 < e4 < 0.15
    assert detectable_effect(4, 0.01) < e4
    seq = detectable_effect(4, 0.02, max_rounds=8)
    assert seq is not None and e8 < seq < e4  # between its shortest and its longest fixed design
    rng = random.Random(7)

    def hit_rate(effect: float, trials: int = 150) -> float:
        hits = 0
        for _ in range(trials):
            rows = [
                {"arm": arm, "preset": arm, "median_tok_s": v, "failed": 0, "errors": [], "round": r}
                for r in range(1, 5)
                for arm, v in (
                    ("A", 1000 * math.exp(rng.gauss(0, 0.02))),
                    ("B", 1000 * (1 + effect) * math.exp(rng.gauss(0, 0.02))),
                )
            ]
            hits += verdict(rows)["verdict"] == "faster"
        return hits / trials

    assert hit_rate(e4) >= 0.7  # at the stated effect the real rule says faster (80 % by the model)
    assert hit_rate(e4 / 2) < 0.6  # at half of it, mostly not
    note = power_note(1, 0.02, "a prior")
    assert note["detectable"] is None and note["sentence"].startswith("with 1 launch(es) a side no effect can be")


@pytest.mark.sim_clock  # its ratio off the simulator's clock
async def test_ab_untuned_baseline_is_far_slower(tmp_path):
    port = free_port()
    tuned, untuned = twin("sim-c2-baseline-nccl", tmp_path, port), twin("sim-c1-baseline-untuned", tmp_path, port)
    result = await run_ab(LocalTransport(), tuned, untuned, 4, {})
    v = result.verdict
    assert v["verdict"] == "slower" and 0.65 < v["ratio"] < 0.78  # seeds: 62.9 / 88.8 = 0.71


async def test_ab_with_failed_requests_is_not_comparable(tmp_path):
    port = free_port()
    a = twin("sim-c2-baseline-nccl", tmp_path, port)
    # ready after ~0.3 s real, then the crash 1.5 s real (30 simulated s at 20x) into its life,
    # in the middle of 40 requests of ~0.16 s each
    b = P.with_changes(a, {"name": "b", "server.args.sim-fault": "crash-after=30", "bench.requests": 40})
    result = await run_ab(LocalTransport(), a, b, 1, {}, judge=False)
    assert result.launches[1]["failed"] > 0
    assert result.verdict["verdict"] == "not comparable"
    assert "failed requests" in result.verdict["reason"]


async def test_ab_with_one_arm_measured_while_capped_is_not_comparable(tmp_path):
    port = free_port()
    ctl = tmp_path / "ctl.json"
    cmd = f"{{python}} -m tuitune.sim.nvidia_smi --sim-port {{port}} --sim-control {ctl}"
    a = P.with_changes(
        twin("sim-c2-baseline-nccl", tmp_path, port),
        {"telemetry": {"command": cmd, "period_ms": 200}, "bench.max_tokens": 600},
    )
    b = P.with_changes(a, {"name": "b"})

    def progress(msg: str) -> None:  # the simulated box starts power-capping when B is launched
        if "launching B (b)" in msg:
            ctl.write_text(json.dumps({"capping": "power"}))

    result = await run_ab(LocalTransport(), a, b, 1, {}, progress=progress, judge=False)
    assert result.launches[0]["gpu_note"] is None
    assert result.launches[1]["gpu_note"].startswith("power cap GPU 0,1,2,3,4,5,6,7")
    v = result.verdict
    assert v["verdict"] == "not comparable" and "GPUs were held back during 1 of 2 launches (b, round 1" in v["reason"]
