"""The simulator's batch model as pure functions: machine files, costs, acceptance, ground truth."""

from __future__ import annotations

import random
import re

import pytest
import yaml

from tuitune.experiments.crossover import launches, level_verdict, schedule
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.benchrun import BenchRun, stream_goodput
from tuitune.measure.request import RequestResult
from tuitune.sim import model as M
from tuitune.sim.server import Window
from tuitune_support.paths import ROOT

CHAIN3 = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}
OFF = {"algorithm": None}
PAPER = {2: 1.81, 4: 1.82, 8: 1.62, 16: 1.48, 24: 1.39, 32: 1.32, 48: 1.38, 56: 1.34, 64: 1.38}
H200_TARGET = {
    1: 4.24,
    4: 4.38,
    16: 4.45,
    32: 4.51,
    64: 4.62,
    96: 4.97,
    128: 6.12,
    256: 7.03,
    384: 11.11,
    512: 12.31,
    768: 19.95,
    1024: 23.23,
}
H200_DRAFT = {1: 0.19, 96: 0.19, 128: 0.26, 512: 0.56, 1024: 1.06}


def shipped(name: str) -> dict:
    return yaml.safe_load((M.MACHINES_DIR / f"{name}.yaml").read_text())


# ---- machine files -------------------------------------------------------------------------------


def test_shipped_machines_load_and_the_default_is_the_seeds_box():
    assert {p.stem for p in M.MACHINES_DIR.glob("*.yaml")} >= {"seed-pcie8", "h100-llama8b", "h200-llama8b"}
    assert M.load_machine(None) == M.load_machine(M.MACHINES_DIR / "seed-pcie8.yaml")
    m = M.load_machine("h100-llama8b")
    assert m.tp_size == 1 and m.topology == "nvlink" and m.sibling_decay == 0.7 and m.verify_extra_ms == 0.0


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda d: d.pop("sched_ms"), "sched_ms is missing"),
        (lambda d: d["target"].pop("knee_sharpness"), "target.knee_sharpness is missing"),
        (lambda d: d["target"].update(mem_ms="fast"), "target.mem_ms must be a number > 0"),
        (lambda d: d["target"].update(knee_sharpness=400), "target.knee_sharpness must be a number in (0, 20]"),
        (lambda d: d["draft"].update(ms_per_token=-1), "draft.ms_per_token must be a number >= 0"),
        (lambda d: d.update(topology="infiniband"), "topology must be pcie or nvlink"),
        (lambda d: d.update(acceptance=[0.8, 1.4]), "acceptance must be a non-empty list"),
        (lambda d: d.update(tp_size=0), "tp_size must be an integer >= 1"),
        (lambda d: d.update(flops=1), "unknown key flops"),
        (lambda d: d["draft"].update(knee_sharpness=2), "unknown key draft.knee_sharpness"),
        (lambda d: d.update(target=[1, 2]), "target must be a mapping"),
    ],
)
def test_machine_file_errors_are_one_sentence_naming_the_key(tmp_path, edit, key):
    data = shipped("h100-llama8b")
    edit(data)
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(M.MachineError) as e:
        M.load_machine(path)
    msg = str(e.value)
    assert msg.startswith(str(path)) and key in msg and "\n" not in msg


def test_machine_file_not_yaml_or_missing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(M.MachineError, match="not valid YAML at line"):
        M.load_machine(bad)
    with pytest.raises(M.MachineError, match="no such machine file .*h100-llama8b"):
        M.load_machine("h900-llama8b")


# ---- costs and acceptance ------------------------------------------------------------------------


def test_knee_curve_flat_then_linear():
    c = M.Curve(4.0, 0.02, 4.0)
    assert c(1) == pytest.approx(4.0, rel=1e-3) and c(2000) == pytest.approx(40.0, rel=1e-3)
    assert c(100) < c(200) < c(400)


def test_h200_curves_follow_the_measurement_within_12_percent():
    m = M.load_machine("h200-llama8b")
    for n, ms in H200_TARGET.items():
        assert m.target(n) == pytest.approx(ms, rel=0.12), n
    for n, ms in H200_DRAFT.items():
        assert m.draft(n) == pytest.approx(ms, rel=0.12), n


def test_h100_reproduces_the_paper_speedups_within_10_percent():
    for bs, paper in PAPER.items():
        speedup = M.expected_goodput("h100-llama8b", CHAIN3, bs) / M.expected_goodput("h100-llama8b", OFF, bs)
        assert speedup == pytest.approx(paper, rel=0.10), bs


def test_verify_cost_follows_the_live_batch():
    cfg = M.config_from_dict(M.load_machine("h200-llama8b"), CHAIN3)
    costs = [M.cycle_cost(cfg, bs).verify_ms for bs in (1, 8, 32, 64, 128)]
    assert costs == sorted(costs) and costs[-1] > 2 * costs[0]
    # the KV term grows with context
    assert M.cycle_cost(cfg, 32, context=2000).verify_ms > M.cycle_cost(cfg, 32, context=100).verify_ms


def test_chain_tree_and_expected_accept_length():
    m = M.load_machine("h100-llama8b")
    chain = M.config_from_dict(m, CHAIN3)
    assert chain.tree == ((1,), (1, 1), (1, 1, 1))
    a = m.acceptance
    assert M.expected_accept_len(chain) == pytest.approx(1 + a[0] + a[0] * a[1] + a[0] * a[1] * a[2])
    tree = M.config_from_dict(m, {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 4, "num_draft_tokens": 8})
    assert len(tree.tree) == 7 and all(p[:-1] in tree.tree or len(p) == 1 for p in tree.tree)
    assert M.expected_accept_len(chain) < M.expected_accept_len(tree) < 4


@pytest.mark.parametrize(
    "config", [CHAIN3, {"algorithm": "EAGLE3", "num_steps": 4, "eagle_topk": 4, "num_draft_tokens": 16}]
)
def test_per_position_draws_average_to_the_expected_accept_length(config):
    cfg = M.config_from_dict(M.load_machine("h200-llama8b"), config)
    rng = random.Random(7)
    n = 40000
    mean = sum(M.draw_accepted(cfg, lambda d: rng.random()) for _ in range(n)) / n
    assert mean == pytest.approx(M.expected_accept_len(cfg), rel=0.015)
    quasi = M.QuasiDraws(3)
    assert sum(M.draw_accepted(cfg, quasi) for _ in range(4000)) / 4000 == pytest.approx(
        M.expected_accept_len(cfg), rel=0.03
    )


def test_expected_goodput_contract():
    # goodput = bs × E / cycle; a bigger batch gives more in total and less per request
    g1, g64 = (M.expected_goodput(None, {"algorithm": "EAGLE3", "num_steps": 2}, c) for c in (1, 64))
    assert g64 > g1 and g64 / 64 < g1
    # NCCL variables reach the all-reduce of the 8-GPU box; TP 1 has none to tune
    tuned = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert M.expected_goodput(None, {"env": tuned}, 1) > M.expected_goodput(None, {}, 1)
    assert M.expected_goodput(None, {"env": tuned, "tp_size": 1}, 1) == M.expected_goodput(None, {"tp_size": 1}, 1)
    # a loaded Machine and its file give the same figure
    m = M.load_machine("h200-llama8b")
    assert M.expected_goodput(m, CHAIN3, 16) == M.expected_goodput("h200-llama8b", CHAIN3, 16)


def test_speculation_stops_paying_under_load_for_a_big_tree():
    tree = {"algorithm": "EAGLE3", "num_steps": 4, "eagle_topk": 4, "num_draft_tokens": 16}
    ratio = [
        M.expected_goodput("h200-llama8b", tree, c) / M.expected_goodput("h200-llama8b", OFF, c) for c in (1, 4, 16, 64)
    ]
    assert ratio[0] > 2 and ratio[-1] < 0.8 and ratio == sorted(ratio, reverse=True)


def test_profile_window_line_is_format_v2():
    cfg = M.config_from_dict(M.load_machine(None), CHAIN3)
    w = Window(0.0)
    w.add(4, [1, 2, 2, 3], 0.6, 20.0, 0.2, 0.05)
    w.add(2, [4, 1], 0.6, 21.0, 0.2, 0.05)
    line = w.profile_line(cfg)
    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
    assert fields["v"] == "2" and fields["cycles"] == "2" and fields["bs"] == "3" and fields["steps"] == "3"
    assert fields["verify_tokens"] == "12"  # bs × draft tokens
    assert fields["accept_hist"] == "1:2,2:2,3:1,4:1" and fields["bs_hist"] == "2:1,4:1"
    assert float(fields["accept_len"]) == pytest.approx(13 / 6, abs=1e-3)


# ---- goodput and the crossover verdict -----------------------------------------------------------


def run_of(concurrency: int, tokens: int, latency_s: float, n: int = 12, failed: int = 0) -> BenchRun:
    """A finished bench run: n requests of `tokens` tokens, latencies spread ±5 % around latency_s."""
    run = BenchRun(BenchConfig("http://x", concurrency=concurrency))
    for i in range(n):
        run.results.append(
            RequestResult(
                ok=True, completion_tokens=tokens, ttft_s=0.01, e2e_s=latency_s * (0.95 + 0.1 * i / max(1, n - 1))
            )
        )
    run.results += [RequestResult(ok=False, error="HTTP 500") for _ in range(failed)]
    return run


def test_goodput_and_its_ci():
    run = run_of(8, 100, 1.0)
    gp = run.goodput()
    assert gp["tok_s"] == pytest.approx(800, rel=0.01) and gp["ci95"][0] < gp["tok_s"] < gp["ci95"][1]
    assert stream_goodput([(100, 2.0), (300, 2.0)], 4) == 400
    assert run.summary()["concurrency"] == 8
    # at least two requests per stream above concurrency 1
    assert BenchConfig("u", requests=10).at_level(64).requests == 128
    assert BenchConfig("u", requests=1).at_level(1).requests == 1


def test_crossover_order_and_verdicts():
    assert schedule([1, 4, 16], 1) == [(1, "on"), (1, "off"), (4, "off"), (4, "on"), (16, "on"), (16, "off")]
    # levels + 1 launches, each benchmarking its levels in one go (the shared level-bench routine)
    assert launches(schedule([1, 4, 16], 1)) == [("on", [1]), ("off", [1, 4]), ("on", [4, 16]), ("off", [16])]
    assert len(launches(schedule([1, 4], 2))) == 5  # a round's last arm serves the next round's first level
    faster = level_verdict([run_of(4, 100, 1.0)], [run_of(4, 100, 1.5)], 4, 0.02)
    assert faster.verdict == "faster" and faster.speedup == pytest.approx(1.5, rel=0.01)
    slower = level_verdict([run_of(64, 100, 2.0)], [run_of(64, 100, 1.0)], 64, 0.02)
    assert slower.verdict == "slower" and slower.ci95[1] < 0.98
    same = level_verdict([run_of(16, 100, 1.0)], [run_of(16, 100, 1.005)], 16, 0.02)
    assert same.verdict == "no significant difference"
    broken = level_verdict([run_of(4, 100, 1.0, failed=1)], [run_of(4, 100, 1.0)], 4, 0.02)
    assert broken.verdict == "not comparable" and "1 request(s) failed" in broken.reason
    behind = run_of(4, 100, 1.0)
    behind.sim_late_share = 0.4
    late = level_verdict([behind], [run_of(4, 100, 1.5)], 4, 0.02)
    assert late.verdict == "not comparable" and "fell behind its clock (40% of its cycles started late)" in late.reason
    assert any("fell behind" in w for w in behind.cross_check())
    # where the simulator reports its busy time, that decides: late cycles it caught up on do not count
    behind.sim_lag_share = 0.03
    assert behind.sim_behind() is None and not any("fell behind" in w for w in behind.cross_check())
    assert level_verdict([behind], [run_of(4, 100, 1.5)], 4, 0.02).verdict != "not comparable"
    behind.sim_lag_share = 0.12
    slow = level_verdict([behind], [run_of(4, 100, 1.5)], 4, 0.02)
    assert slow.verdict == "not comparable" and "its figures 12% below its model's" in slow.reason, slow
    capped = run_of(4, 100, 1.0)
    capped.gpu_note = "GPU 3 power cap"
    held = level_verdict([capped], [run_of(4, 100, 1.5)], 4, 0.02)
    assert held.verdict == "not comparable" and "GPU 3 power cap" in held.reason
    short = run_of(64, 100, 1.0)
    short.batch_sizes = [20, 22]
    noted = level_verdict([short], [run_of(64, 100, 1.0)], 64, 0.02)
    assert "ran about 21 requests at once" in noted.note


def test_the_core_never_imports_the_simulator():
    core = ROOT / "tuitune"
    pattern = re.compile(r"^\s*(from\s+(tuitune)?\.?sim\b|import\s+tuitune\.sim\b)", re.M)
    for f in list(core.glob("*.py")) + list(core.glob("tui/*.py")):
        assert not pattern.search(f.read_text()), f
