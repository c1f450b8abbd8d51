"""`advise --emit sglang-adaptive` against a world whose per-batch-size winner is known by
construction: the seeds' PCIe box with a strong drafter and a dearer forward per token, on the
simulator (a process, over HTTP). A verify forward pays a fixed extra cost that a decode step does
not, and its extra tokens cost compute: speculation wins by a quarter at one stream and loses from
four streams on, by margins the simulator's own model gives (``tuitune.sim.model.expected_goodput``,
the simulator's ground truth, not the advisor's model). The captures come from the real simulator
through `tuitune tune`, the schedule from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.decide.launch import OFF, Config
from tuitune.sim import model as S
from tuitune_support.captures import tuitune
from tuitune_support.ports import free_port

NAME = "sim-c4-eagle3-2step-nccl"  # seed-pcie8 at TP 8, the seeds' tuned NCCL set, 4 continuous decode steps
# the bucket of 16 is judged at 22 streams (up to the next key, 32): benchmarked to 24, its chains' verify
# forwards (66 tokens for a chain of 2 there, 88 for 3) lie inside what was measured. Benchmarked to 16 only
# (48 tokens at most), CI's run of e962415 once predicted chains of 2-3 ahead of off there (truth: 0.84
# and 0.75 of off), its choice resting on the verify curve extended past the tokens measured.
LEVELS = (1, 2, 4, 8, 16, 24)
# the schedule is emitted from launches benchmarked on the simulator's clock (CI, beside an engine: a step
# at 0.747 of the best where 0.88 was asked)
pytestmark = pytest.mark.sim_clock


def world(tmp: Path) -> Path:
    """The machine file: seed-pcie8 with the "strong" drafter and 2.5 ms a token past the knee."""
    m = yaml.safe_load(S.machine_path("seed-pcie8").read_text())
    m.update(name="pcie8-strong", acceptance=list(S.ACCEPTANCE_PROFILES["strong"]))
    m["target"]["ms_per_token"] = 2.5
    path = tmp / "pcie8-strong.yaml"
    path.write_text(yaml.safe_dump(m))
    return path


def truth(machine: Path, steps: int, bs: int) -> float:
    """The simulator's steady-state goodput for NAME on ``machine`` with ``steps`` chain steps (0 = off)."""
    cfg: dict = {"algorithm": None}
    if steps:
        c = Config.chain(steps)
        cfg = {"algorithm": "EAGLE3", "num_steps": c.steps, "eagle_topk": 1, "num_draft_tokens": c.draft_tokens}
    cfg.update(env=P.resolve(NAME).env, disable_custom_all_reduce=True, num_continuous_decode_steps=4)
    return S.expected_goodput(S.load_machine(machine), cfg, bs)


def test_the_worlds_winners_by_construction(tmp_path):
    """What the schedule below is held to, from the simulator's model alone."""
    m = world(tmp_path)
    g = {bs: {s: truth(m, s, bs) for s in range(9)} for bs in range(1, 17)}
    spec = {bs: max(v for s, v in g[bs].items() if s) for bs in g}
    assert g[1][0] < 0.8 * spec[1]  # one stream: speculation wins by a quarter
    assert 0.9 * spec[2] < g[2][0] < spec[2] and g[3][0] > spec[3]  # the cross-over: two to three streams
    assert all(g[bs][0] > 1.06 * spec[bs] for bs in range(4, 17))  # four and more: off, by 7-13 %
    assert all(g[bs][0] > 1.1 * spec[bs] for bs in range(5, 17))


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> tuple[Path, dict[int, list[int]], str]:
    """Two launches of the world (a chain of 2, then off: tune's first relaunch goes to the baseline,
    never measured and with a chance of being the best), benchmarked at LEVELS, and the schedule `advise --emit` writes from their
    captures: (the machine file, the schedule by key, advise's output)."""
    tmp = tmp_path_factory.mktemp("schedule")
    m = world(tmp)
    p = P.with_changes(
        P.resolve(NAME),
        {
            "server.args.sim-machine": str(m),
            "server.log": str(tmp / "sim.log"),
            "server.port": free_port(),
            "server.args.sim-speedup": 10,
            "server.args.sim-load-seconds": 0.2,
            "server.args.decode-log-interval": 10,
            "bench.requests": 12,  # 4 x 120 tokens: the prediction at five streams spread 0.90-0.97 of off
            "bench.warmup": 0,
            "bench.max_tokens": 480,  # (truth 0.90) on a quiet machine, 0.98+ in CI; 12 x 480: 0.86-0.94
        },
    )
    preset = P.save(p, tmp / "c4.yaml")
    out = tmp / "tune"
    levels = ",".join(map(str, LEVELS))
    r = tuitune(
        tmp, "tune", str(preset), "--budget", "1", "--concurrency", "8", "--levels", levels,
        "--out", str(out), "--ab-rounds", "1", "--no-verdict", timeout=500,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    launched = [x for x in map(json.loads, (out / "tune.jsonl").read_text().splitlines()) if x["kind"] == "launch"]
    assert [x["config"] for x in launched] == [Config.chain(2).to_dict(), OFF.to_dict()], launched  # both sides
    sched = tmp / "adaptive.json"
    adv = tuitune(tmp, "advise", *[x["capture"] for x in launched], "--emit", "sglang-adaptive", str(sched))
    assert adv.returncode == 0, adv.stderr + adv.stdout
    got = {int(k): v["candidate_steps"] for k, v in json.loads(sched.read_text()).items()}
    assert sorted(got) == [1, 2, 4, 8, 16, 32, 64]
    return m, got, adv.stdout


@pytest.mark.timeout(600)  # two launches benchmarked at five levels, on a shared CPU
def test_emitted_schedule_follows_the_simulated_worlds_winners(emitted):
    m, got, text = emitted
    # SGLang serves a batch of size bs with the largest key <= bs: no key's steps may be far behind
    # the winner at any measured batch size it serves (key 4, at the cross-over: the test below)
    for key, steps in got.items():
        if key == 4:
            continue
        upper = min((k for k in got if k > key), default=max(LEVELS) + 1)
        for bs in range(key, min(upper, max(LEVELS) + 1)):
            g = {s: truth(m, s, bs) for s in range(9)}
            best = max(g.values())
            assert all(g[s] >= 0.88 * best for s in steps), (
                (key, bs, steps, {s: round(g[s] / best, 3) for s in steps}),
                text,
            )
    assert 0 not in got[1] and got[1], got  # one stream: speculate (off is a quarter behind)
    assert got[8] == [0] and got[16] == [0], got  # eight streams and more: off (speculation 12 % behind)
    marks = {int(x.split(">=")[1].split()[0]): "EXTRAPOLATED" in x for x in text.splitlines() if "batch size >=" in x}
    assert not any(marks[k] for k in (1, 2, 4, 8, 16)) and marks[32] and marks[64], marks  # measured 1-24


@pytest.mark.timeout(600)
def test_emitted_schedule_turns_speculation_off_past_the_cross_over(emitted):
    """Batch sizes 4-7 (judged at 5, between the benchmarks at 4 and 8): off, which the truth has
    7-13 % ahead of every chain. The knee model (before issue 25's cost model) put [1, 2] there from
    these two launches: its knee form overpredicted the chain of 2 at five streams by ~10 % (2,400
    tok/s against off's 2,300 on three fixture runs' captures), where the monotone curve through the
    token counts measured predicts it 6-10 % below off (2,170-2,240 against 2,370-2,420); seen
    failing with the code of b6ffacd. With 4 requests of 120 tokens a level the prediction spread
    0.90-0.97 of off over seven quiet runs (the acceptance drawn over too few cycles) and CI's stop
    run of f1d1ea1 put it within 2 %; 12 of 480 gave 0.86-0.94 over eight runs, three of them beside
    two busy cores."""
    m, got, text = emitted
    assert got[4] == [0], (got, text)  # batch sizes 4-7: off by 7-13 %


def test_a_measured_goodput_outranks_the_prediction_at_its_batch_size():
    """Where a benchmark measured chains at a bucket's batch size, the schedule goes by what it
    measured there: the seeds' box measured off 4 % ahead of a chain of 2 at two streams, advise
    printed both measurements beside its predictions, and emitted [2] for that bucket."""
    import asyncio
    import random

    from tuitune.decide import advise as A
    from tuitune.decide.costmodel import fit
    from tuitune_support import simtruth as AA

    src = AA.ModelSource(S.load_machine("h100-llama8b"), random.Random(5))
    launches = [asyncio.run(src.measure(c, [1, 2, 16])) for c in (Config.chain(2), OFF)]
    model = fit(launches)
    cfg, why = A.adaptive_schedule(model)
    at = {w["key"]: w for w in why}
    assert at[2]["batch_size"] == 2 and 0 not in cfg["2"]["candidate_steps"]  # speculation: far ahead on h100
    assert at[2]["measured"] == {s: round(ln.goodput[2], 1) for s, ln in ((2, launches[0]), (0, launches[1]))}
    launches[1].goodput[2] = 1.5 * max(at[2]["predicted"].values())  # a benchmark: off far ahead at two streams
    cfg2, why2 = A.adaptive_schedule(model)
    assert cfg2["2"] == {"candidate_steps": [0]}
    assert {k: v for k, v in cfg2.items() if k != "2"} == {k: v for k, v in cfg.items() if k != "2"}  # only there
    assert {w["key"]: w["predicted"] for w in why2} == {w["key"]: w["predicted"] for w in why}  # the model as it was
