"""How often `tuitune tune --budget 3` ends within 2 % of the optimum, on random simulator machines.

For each of N machines drawn at random (every key of the machine file varied over a realistic
range: PCIe and NVLink, TP 1-8, knees from 8 to 400 tokens, a verify overhead or none, strong to
weak drafters) and each concurrency in {1, 8, 32}:

* run tuitune's tune loop (``tuitune.tune.tune_loop``, the code behind `tuitune tune`) from
  SGLang's usual chain of 3 with a budget of 3 relaunches;
* ground truth: ``tuitune.sim.model.expected_goodput`` over the whole advise space (speculation
  off; steps 1-8; topk 1, 2, 4, 8; the draft-token budgets SGLang accepts);
* report (a) the share of cases whose chosen configuration is within 2 % of the optimum,
  (b) relaunches used, (c) Spearman ρ between the model's predicted and the true goodput over the
  whole space after one launch and after three.

Measurement source. Running a real simulator process for each of the ~180 launches (each with
several load levels and a warm-up) would take hours on a 2-core machine, so by default each launch
is *synthesised in-process from the simulator's own model*: the same ``cycle_cost`` (with the
machine's launch-to-launch spread and the simulator's per-cycle jitter), per-request accept
lengths drawn through the same ``draw_accepted`` and draft tree, windows of 40 cycles formatted as
EAGLE3_PROFILE v2 lines and parsed back by tuitune's parser, and a benchmark goodput equal to the
model's steady-state goodput times the launch factor and a 1 % measurement noise. What it leaves
out: prefill and ramp time of a real benchmark (the tune loop calibrates those away with the
measured goodput), the asyncio scheduler's timing noise. The tests drive the same loop against
the real simulator process (tests/decide/test_advise.py).

    python benchmarks/advisor_accuracy.py [--machines 20] [--seed 1] [--budget 3] [--verbose]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

from tuitune.decide.advise import space
from tuitune_support.simtruth import CONCURRENCY, case, random_machine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--verbose", action="store_true")
    ns = ap.parse_args()
    rng = random.Random(ns.seed)
    configs = space()
    rows = []
    t0 = time.time()
    for i in range(ns.machines):
        m = random_machine(rng, i)
        for conc in CONCURRENCY:
            r = asyncio.run(case(m, conc, ns.budget, rng, configs))
            rows.append(r)
            if ns.verbose:
                print(
                    f"{m.name:<10} tp{m.tp_size} {m.topology:<6} c={conc:<3} chosen {r['chosen']:<30} "
                    f"optimum {r['optimum']:<30} {r['ratio']:.3f} (start {r['start_ratio']:.3f}) "
                    f"relaunches {r['relaunches']} rho1 {r['rho1']:.3f} rho3 {r['rho3']:.3f}",
                    flush=True,
                )
    n = len(rows)
    within = sum(1 for r in rows if r["ratio"] >= 0.98)
    print(
        f"\n{ns.machines} random machines x concurrency {', '.join(map(str, CONCURRENCY))} = {n} cases, "
        f"budget {ns.budget} relaunches, {len(configs)} configurations in the space ({time.time() - t0:.0f} s)"
    )
    print(
        f"(a) within 2 % of the optimum: {within}/{n} = {within / n:.1%}"
        f"   (the start, chain of 3: {sum(1 for r in rows if r['start_ratio'] >= 0.98) / n:.1%})"
    )
    worst = min(rows, key=lambda r: r["ratio"])
    print(
        f"    mean ratio to optimum {sum(r['ratio'] for r in rows) / n:.4f}, worst {worst['ratio']:.3f} "
        f"({worst['machine']} c={worst['concurrency']})"
    )
    rel = [r["relaunches"] for r in rows]
    print(
        f"(b) relaunches: mean {sum(rel) / n:.2f}, max {max(rel)}; "
        + ", ".join(f"{k}: {rel.count(k)}" for k in range(ns.budget + 1))
    )
    for key, what in (("rho1", "after one launch"), ("rho3", "after three launches")):
        vals = sorted(r[key] for r in rows)
        print(
            f"(c) Spearman rho {what}: median {vals[n // 2]:.3f}, mean {sum(vals) / n:.3f}, "
            f"10th percentile {vals[n // 10]:.3f}"
        )
    for conc in CONCURRENCY:
        sub = [r for r in rows if r["concurrency"] == conc]
        print(
            f"    concurrency {conc:>2}: within 2 % {sum(1 for r in sub if r['ratio'] >= 0.98)}/{len(sub)}, "
            f"rho after 3 median {sorted(r['rho3'] for r in sub)[len(sub) // 2]:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
