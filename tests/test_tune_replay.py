"""tune's loop replayed over the real engine's launches, its choice judged by the real engine's grid
(issue 25: "tune --budget 3 ends within 2 % of the measured best, with the measured grid as truth").

Two measurements of the real vLLM 0.32.0 CPU engine (tiny random Llama, ngram with prompt lookup
1-3; at one stream and at eight), made apart and by different code:
- the launches: tune's own launch of every configuration of its space (speculation off, ngram
  K = 1…8), each relaunched and benchmarked by tune's SessionSource as `tuitune tune --concurrency 1`
  does it, its capture and its log row kept (``benchmarks/real_engine_launches.py``,
  tests/data/real-engine-c1/ and -c8/);
- the truth: the grid of ``benchmarks/real_engine_grid.py``, each configuration measured by its own
  plain HTTP client in waves paired with a reference server's (one stream: 40 waves on a quiet
  machine, benchmarks/data/real_engine_grid_c1_2026-12-02.json; eight: 40 waves, quiet,
  real_engine_grid_c8_2026-12-02.json; docs/advisor.md says how sure each is).

The replay runs tune's whole loop (the cost model's fit, the next relaunch's choice, the stop, the
best measured) over the recorded launches; a launch tune asks for is the recorded one, read back as
``tune --resume`` reads its own. So what is tested is tune's decisions on a real engine's costs and
acceptance, not a world of tuitune's making; what the test cannot see is the launch-to-launch noise
a live run adds (one recorded launch per configuration)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import real_vllm
import yaml

from tuitune import preset as P
from tuitune.decide.advise import space
from tuitune.decide.costmodel import Config
from tuitune.experiments.tune import _replay_prior, levels_for, tune_loop

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# (concurrency, the recorded launches, the grid that is their truth)
CASES = [
    (1, DATA / "real-engine-c1", ROOT / "benchmarks" / "data" / "real_engine_grid_c1_2026-12-02.json"),
    (8, DATA / "real-engine-c8", ROOT / "benchmarks" / "data" / "real_engine_grid_c8_2026-12-02.json"),
]


class Recorded:
    """tune's Source over recorded launches: each asked-for configuration's own launch, read back."""

    def __init__(self, folder: Path, concurrency: int):
        self.concurrency = concurrency
        rows = [json.loads(x) for x in (folder / "tune.jsonl").read_text().splitlines() if x.strip()]
        self.rows = {Config(**r["config"]): {**r, "capture": str(folder / r["capture"])} for r in rows}
        self.asked: list[Config] = []

    async def measure(self, config: Config, levels: list[int]) -> object:
        self.asked.append(config)
        assert levels == levels_for(self.concurrency), levels  # the levels the launches were benchmarked at
        row = self.rows.get(config)
        assert row is not None, f"tune asked for {config.label}, which was not recorded"
        ((_, launch),) = _replay_prior([row])
        assert launch.windows or not config.speculative, row  # its capture was read
        return launch


def label(c: Config) -> str:
    return f"ngram K={c.steps}" if c.speculative else "off"


def ngram_preset(tmp: Path) -> P.Preset:
    return P.loads(yaml.safe_dump(real_vllm.preset("r", tmp / "r.log", 1, method="NGRAM", k=3, lookup=(1, 3))))


@pytest.mark.parametrize("conc,folder,grid", CASES, ids=["c1", "c8"])
def test_the_recorded_launches_are_the_whole_space_tune_searches(tmp_path, conc, folder, grid):
    src = Recorded(folder, conc)
    base = ngram_preset(tmp_path)
    searched = space(topks=base.engine.search_topks(base))
    assert set(searched) == set(src.rows), sorted(c.label for c in set(searched) ^ set(src.rows))
    for c, row in src.rows.items():
        assert not row["failure"] and row["goodput"][str(conc)] > 0, row
        ((_, launch),) = _replay_prior([row])
        assert launch.windows or not c.speculative, c.label  # the probe's windows, read from the capture


@pytest.mark.parametrize("conc,folder,grid", CASES, ids=["c1", "c8"])
def test_tune_replayed_on_the_real_engine_ends_within_2_percent_of_the_grids_best(tmp_path, conc, folder, grid):
    src = Recorded(folder, conc)
    base = ngram_preset(tmp_path)
    res = asyncio.run(tune_loop(src, Config.chain(3), 3, conc, configs=space(topks=base.engine.search_topks(base))))
    truth = {lb: v[str(conc)] for lb, v in json.loads(grid.read_text())["grid"]["truth"].items()}
    best = max(truth, key=truth.__getitem__)
    path = [label(c) for c in src.asked]
    assert path[0] == "ngram K=3" and len(path) == len(set(path)) and res.relaunches <= 3, path
    ratio = truth[label(res.chosen)] / truth[best]
    assert ratio >= 0.98, (path, label(res.chosen), best, round(ratio, 3))
