"""Does the advisor's acceptance model fit a real drafter's acceptance? (issue 40, item 4: "where the
advisor's acceptance model does not fit the measured per-position acceptance, fix the model and say
how much it moved").

Input: a folder of tune's own recorded launches of every chain length (``benchmarks/real_engine_launches.py``,
e.g. tests/data/real-smollm2-eagle3-code-c1: SmolLM2-135M with the EAGLE-3 head tuitune_support.real_draft
trains, K = 1-8, on the real vLLM CPU build). The probe's accept-length histograms of each launch
are real per-position acceptance.

For each start K the operator might launch with, the model is fitted from that launch alone (what
`advise` sees from one capture) and its predicted tokens per request-cycle (tau) at every other K
is set beside the tau each K's own launch measured, with the model's 95 % interval; then the
conditional acceptance per position as the deepest launch measured it against what the model
extrapolated past the start's depth.

    python benchmarks/acceptance_fit.py tests/data/real-smollm2-eagle3-code-c1 [--starts 1,2,3]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tuitune.decide.acceptance import _position_counts, fit_acceptance
from tuitune.decide.launch import Config
from tuitune.experiments.recorded import RecordedLaunches

ROOT = Path(__file__).resolve().parent.parent


def measured_tau(windows: list) -> float:
    """Tokens per request-cycle over a launch's windows, weighted by their request-cycles."""
    num = den = 0.0
    for w in windows:
        n = sum(w.accept_counts or [])
        if n and math.isfinite(w.accept_len):
            num += w.accept_len * n
            den += n
    return num / den if den else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--starts", default="1,2,3,4", help="the start launches to fit from, one at a time")
    a = ap.parse_args()
    src = RecordedLaunches(a.folder, 1)
    chains = sorted((c for c in src.configs if c.speculative and c.topk == 1), key=lambda c: c.steps)
    if not chains:
        sys.exit(f"{a.folder}: no chain launch recorded")
    launches = {c: src.launch(c) for c in chains}
    tau = {c: measured_tau(launches[c].windows) for c in chains}
    print(f"{a.folder}: {len(chains)} chain launches; tau = tokens per request-cycle, the probe's histograms")
    print("  measured tau: " + "  ".join(f"K={c.steps} {tau[c]:.3f}" for c in chains))
    deepest = chains[-1]
    succ, trials = _position_counts(launches[deepest].windows)
    rates = [succ[i] / trials[i] for i in range(deepest.steps) if trials[i]]
    print(
        f"  per position, K={deepest.steps}'s launch (conditional, successes/trials): "
        + "  ".join(f"{i + 1}:{r:.3f} ({succ[i]:.0f}/{trials[i]:.0f})" for i, r in enumerate(rates))
    )
    for s in (int(x) for x in a.starts.split(",")):
        start = Config.chain(s)
        if start not in launches:
            continue
        acc = fit_acceptance([launches[start]])
        inside, worst = 0, (0.0, start)
        cells = []
        for c in chains:
            e = acc.estimate(c)
            lo, hi = e.lo, e.hi
            inside += lo <= tau[c] <= hi
            err = e.mean / tau[c] - 1
            worst = max(worst, (abs(err), c))
            cells.append(f"K={c.steps} {e.mean:.3f} [{lo:.3f}-{hi:.3f}] {err:+.1%}")
        print(f"  fitted from K={s} alone ({acc.source}, {acc.measured} positions measured):")
        print("    predicted tau against the measured: " + "  ".join(cells))
        print(
            f"    the measured tau inside the 95 % interval at {inside}/{len(chains)} Ks; worst error "
            f"{worst[0]:.1%} at K={worst[1].steps}"
        )
        print(
            "    conditional acceptance per position, the model: "
            + "  ".join(f"{i + 1}:{acc.mean[i]:.3f}±{acc.sd[i]:.3f}" for i in range(deepest.steps))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
