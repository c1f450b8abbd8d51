"""How the advisor does in worlds whose physics it does not share: `tune --budget 3` and the
model's 95 % intervals against truths written here, independently of tuitune's formulas.

Each world is drawn at random from features the cost model (tuitune/decide/costmodel.py) does not
assume, one or several at a time:

* the target's forward time against token count: a REAL H200 curve (Llama-3.1-8B shapes, one GPU,
  CUDA graphs: ``benchmarks/data/h200_llama8b_forward.json``, 160 points over 1-1024 tokens made
  by ``benchmarks/forward_curve.py``; without it the twelve points of FACTS §6), scaled and
  stretched for other models and GPUs (rising slowly, then tile steps, not even monotone); or a GEMM wave-quantisation curve (steps at every tile of 64-256
  tokens: ``max(memory time, waves × wave time)``); or a smooth rational knee;
* the draft model's forward on its own curve (the H200 draft-step points of FACTS §6, or waves);
* trees dearer than chains: a tree's verify and draft steps cost 0-30 % more than a chain's at the
  same token count (tree attention masks), plus a per-step top-k selection time;
* acceptance per position that decays, plateaus, rises, or falls off a cliff after a depth the
  drafter was trained for; sibling ranks geometric, with a share of misses that no candidate
  holds (Sequoia's published ranks: the top 6 hold ~82 % of what rank 1 misses; the model assumes
  a power law); prompts vary
  from window to window (the histograms are over-dispersed);
* attention over the KV cache (per request), the all-reduce of TP ranks (PCIe: large), and in
  some worlds a large fixed per-cycle overhead (host synchronisation over PCIe) or host time per
  request; the draft extend runs over the verified tokens or over one token a request;
* a benchmark's goodput includes prefill stalls (each new request's prompt stops the batch), and
  the baseline's decode lines count those stalls too (SGLang's gen throughput is tokens over wall
  time); launches differ by 0.5-3 % (clocks, placement), a benchmark by 0.5-1.5 %.

Truth: the expected benchmark goodput of every configuration of the advise space (speculation
off; steps 1-8; topk 1, 2, 4, 8; SGLang's draft-token budgets) at the concurrency, from this
file's physics alone (no tuitune.decide or tuitune.sim formula). Launches are synthesised
in-process (profile windows written as EAGLE3_PROFILE v2 lines and decode lines as SGLang prints
them, parsed back by tuitune's parser), so that ~250 launches take seconds, not hours.

Each case (world, concurrency) draws its launch noise from its own random stream, so the worlds
a seed draws do not depend on the launches earlier cases made: two versions of the advisor meet
the same worlds (figures of 2026-12-03: benchmarks/data/advisor_worlds_2026-12-03.txt).

For each world and each concurrency in {1, 8, 32}: tuitune's tune loop (``tune_loop``, the code
behind `tuitune tune`) from SGLang's usual chain of 3 with a budget of 3 relaunches. Figures:
(a) the share of cases whose chosen configuration is within 2 % of the best (goal >= 90 %), the
worst case; (b) relaunches used; (c) interval coverage: the share of configurations whose true
goodput lies inside the 95 % interval of the model fitted to the launches tune made (goal >= 90 %),
and of the model fitted to the first launch alone (advise from one capture).

    python benchmarks/advisor_worlds.py [--worlds 20] [--seed 1 | --seeds 1,2,3,4] [--budget 3] [--verbose]

``--real`` scores the same figures in the real engines' worlds instead (issue 40): each world of
``tests/data/real-worlds.json`` is tune's own launch of every configuration of its space on a real
engine, recorded (``benchmarks/real_engine_launches.py``), and a grid of the same configurations
measured apart by another client, paired against a reference server (``benchmarks/real_engine_grid.py``),
which is its truth. tune's loop is replayed over the recorded launches (``tuitune.experiments.recorded``:
a launch it asks for is the recorded one, read back as ``tune --resume`` reads its own), and advise's
choice is read from the start launch alone. The launches and the grid ran at different times with
different clients, so for coverage the grid's truth is put on the launches' level by one factor,
the recorded off launch over the grid's off; the share within 2 % needs no such factor.

    python benchmarks/advisor_worlds.py --real [--budget 3] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from tuitune_support.worlds import real_case, real_report, real_target_points, real_worlds, report, run

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, default=20, help="random worlds (3 concurrencies each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seeds", help="several seeds, reported together (e.g. 1,2,3,4); overrides --seed")
    ap.add_argument("--budget", type=int, default=3, help="relaunches tune may make")
    ap.add_argument("--verbose", action="store_true", help="one line per case")
    ap.add_argument("--real", action="store_true", help="the real engines' recorded worlds instead of random ones")
    ns = ap.parse_args()
    t0 = time.time()
    if ns.real:
        rows = [asyncio.run(real_case(w, ns.budget)) for w in real_worlds()]
        print(real_report(rows, ns.budget))
        return 0
    seeds = [int(x) for x in ns.seeds.split(",")] if ns.seeds else [ns.seed]
    rows = [r for seed in seeds for r in run(ns.worlds, seed, ns.budget, ns.verbose)]
    print(report(rows, ns.worlds * len(seeds), ns.budget, time.time() - t0, real_target_points()[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
