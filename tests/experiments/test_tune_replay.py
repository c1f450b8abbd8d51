"""tune's loop replayed over the real engine's launches, its choice judged by the real engine's grid
(issue 25: "tune --budget 3 ends within 2 % of the measured best, with the measured grid as truth";
issue 40: the same with real acceptance).

Each world of tests/data/real-worlds.json is two measurements of the real vLLM 0.32.0 CPU engine,
made apart and by different code:
- the launches: tune's own launch of every configuration of its space (speculation off, K = 1…8),
  each relaunched and benchmarked by tune's SessionSource as `tuitune tune --concurrency C` does it,
  its capture and its log row kept (``benchmarks/real_engine_launches.py``, under tests/data/);
- the truth: the grid of ``benchmarks/real_engine_grid.py``, each configuration measured by its own
  plain HTTP client in waves paired with a reference server's, on a quiet machine
  (benchmarks/data/; docs/evidence.md says how sure each is).
The worlds: the tiny random Llama with ngram (prompt lookup 1-3; acceptance from a random model
repeating itself) at one stream and at eight; SmolLM2-135M-Instruct with the EAGLE-3 head
tuitune_support.real_draft trains (real acceptance) on the code workload, at one stream.

The replay runs tune's whole loop (the cost model's fit, the next relaunch's choice, the stop, the
best measured) over the recorded launches (``tuitune.experiments.recorded``); a launch tune asks for
is the recorded one, read back as ``tune --resume`` reads its own. So what is tested is tune's
decisions on a real engine's costs and acceptance, not a world of tuitune's making; what the test
cannot see is the launch-to-launch noise a live run adds (one recorded launch per configuration).
``python benchmarks/advisor_worlds.py --real`` scores the same worlds (coverage, advise)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tuitune import preset as P
from tuitune.decide.advise import space
from tuitune.decide.launch import Config
from tuitune.experiments.recorded import RecordedLaunches
from tuitune.experiments.tuneloop import TuneError, levels_for, tune_loop
from tuitune_support import real_vllm
from tuitune_support.paths import ROOT

DATA = ROOT / "tests" / "data"
GRIDS = ROOT / "benchmarks" / "data"


@dataclass(frozen=True)
class World:
    """A real engine's world (tests/data/real-worlds.json, which benchmarks/advisor_worlds.py --real
    scores too): tune's recorded launches of its whole space and the grid that is their truth, at one
    concurrency, for one drafter."""

    id: str
    world: str
    concurrency: int
    method: str  # NGRAM or EAGLE3: the grid's labels and tune's space
    launches: Path
    grid: Path

    def label(self, c: Config) -> str:
        return f"{self.method.lower()} K={c.steps}" if c.speculative else "off"


WORLDS = [
    World(**{**w, "launches": ROOT / w["launches"], "grid": ROOT / w["grid"]})
    for w in json.loads((DATA / "real-worlds.json").read_text())
]


def base_preset(tmp: Path, w: World) -> P.Preset:
    lookup = (1, 3) if w.method == "NGRAM" else None
    return P.loads(yaml.safe_dump(real_vllm.preset("r", tmp / "r.log", 1, method=w.method, k=3, lookup=lookup)))


@pytest.mark.parametrize("w", WORLDS, ids=[w.id for w in WORLDS])
def test_the_recorded_launches_are_the_whole_space_tune_searches(tmp_path, w):
    src = RecordedLaunches(w.launches, w.concurrency, levels_for(w.concurrency))
    base = base_preset(tmp_path, w)
    searched = space(topks=base.engine.search_topks(base))
    assert set(searched) == src.configs, sorted(c.label for c in set(searched) ^ src.configs)
    truth = json.loads(w.grid.read_text())["grid"]["truth"]
    assert {w.label(c) for c in searched} <= set(truth), sorted({w.label(c) for c in searched} - set(truth))
    for c, row in src.rows.items():
        assert not row["failure"] and row["goodput"][str(w.concurrency)] > 0, row
        launch = src.launch(c)
        assert launch.windows or not c.speculative, c.label  # the probe's windows, read from the capture


def replay(tmp: Path, w: World, budget: int = 3, **kw):
    """tune's loop over world ``w``'s recorded launches from K 3: the recorded launches it asked for (in
    order), its result, and the grid's ratio of its choice to the grid's best (with that best's label)."""
    src = RecordedLaunches(w.launches, w.concurrency, levels_for(w.concurrency))
    base = base_preset(tmp, w)
    configs = space(topks=base.engine.search_topks(base))
    res = asyncio.run(tune_loop(src, Config.chain(3), budget, w.concurrency, configs=configs, **kw))
    truth = {lb: v[str(w.concurrency)] for lb, v in json.loads(w.grid.read_text())["grid"]["truth"].items()}
    best = max((w.label(c) for c in configs), key=truth.__getitem__)
    return src, res, truth[w.label(res.chosen)] / truth[best], best


@pytest.mark.parametrize("w", WORLDS, ids=[w.id for w in WORLDS])
def test_tune_replayed_on_the_real_engine_ends_within_2_percent_of_the_grids_best(tmp_path, w):
    src, res, ratio, best = replay(tmp_path, w)
    path = [w.label(c) for c in src.asked]
    assert path[0] == w.label(Config.chain(3)) and len(path) == len(set(path)) and res.relaunches <= 3, path
    assert ratio >= 0.98, (path, w.label(res.chosen), best, round(ratio, 3))


def test_a_configuration_that_was_not_recorded_is_named_not_made_up(tmp_path):
    import shutil

    folder = tmp_path / "rec"
    shutil.copytree(DATA / "real-engine-c1", folder)
    rows = (folder / "tune.jsonl").read_text().splitlines()
    (folder / "tune.jsonl").write_text("\n".join(r for r in rows if '"steps": 5,' not in r) + "\n")
    src = RecordedLaunches(folder, 1, levels_for(1))
    with pytest.raises(TuneError, match="steps 5 topk 1 tokens 6 was not recorded"):
        asyncio.run(src.measure(Config.chain(5), levels_for(1)))
    with pytest.raises(TuneError, match=r"load levels \[2, 8, 16\]"):
        asyncio.run(src.measure(Config.chain(3), levels_for(8)))
    (folder / "captures" / "launch-03-3-1-4.jsonl.gz").unlink()
    with pytest.raises(TuneError, match="capture of steps 3 topk 1 tokens 4 .* cannot be read"):
        src.launch(Config.chain(3))


# tiny-ngram-c8: the fifth measurement (the baseline's, besides the budget) reaches K 6, whose recorded launch
# read 0.6 % above K 4's (854.6 against 849.6 tok/s) where the grid puts it 2.3 % below: a tie inside the
# launch noise, just outside the 0.5 % that goes to the simpler configuration. Strict: it fails when it passes.
ONE_LAUNCH = [
    pytest.param(w, marks=pytest.mark.xfail(strict=True, reason="K 6 and K 4 tie in the recorded launches"))
    if w.id == "tiny-ngram-c8"
    else w
    for w in WORLDS
]


@pytest.mark.parametrize("w", ONE_LAUNCH, ids=[w.id for w in WORLDS])
def test_tune_in_one_launch_replayed_ends_within_2_percent_in_two_launches(tmp_path, w):
    """The order tune follows from a start prepared to switch K 1-8 (issue 44: "within 2 % of the grid's
    best with at most 2 launches"): speculation off first, in a launch of its own and besides the budget,
    then the start and every chain after it held in the prepared launch. Replayed over the same recorded
    launches, so what it shows is the order's decisions on a real engine's costs and acceptance; a held
    chain is read as its static launch here (the cost of being prepared, docs/switch.md, is not in these
    worlds)."""
    src, res, ratio, best = replay(tmp_path, w, baseline_first=True)
    path = [w.label(c) for c in src.asked]
    assert path[:2] == ["off", w.label(Config.chain(3))] and len(path) == len(set(path)) <= 5, path
    assert res.steps[0].reason.startswith("the baseline first") and res.steps[1].reason == "the starting configuration"
    # off's launch and the prepared start's: every other configuration asked for is a chain K 1-8 it holds
    others = [c for c in src.asked[2:] if not (c.speculative and c.topk == 1 and 1 <= c.steps <= 8)]
    assert others == [], path
    assert ratio >= 0.98, (path, w.label(res.chosen), best, round(ratio, 3))


def test_a_resumed_run_stopped_after_its_baseline_first_measures_the_start_next(tmp_path):
    """`tune --resume` of a run that stopped after speculation off's launch (the baseline first): the
    start is measured next, and the baseline still does not count against the budget."""
    from tuitune.decide.launch import OFF
    from tuitune.experiments.tuneloop import BASELINE_FIRST, Step

    w = WORLDS[0]
    ln = RecordedLaunches(w.launches, w.concurrency, levels_for(w.concurrency)).launch(OFF)
    prior = [(Step(0, OFF, BASELINE_FIRST, None, dict(ln.goodput)), ln)]
    _src, res, _ratio, _best = replay(tmp_path, w, budget=2, prior=prior)
    assert [st.config for st in res.steps[:2]] == [OFF, Config.chain(3)] and len(res.steps) == 4, res.steps
