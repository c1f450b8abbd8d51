"""What an A/B can detect: the power figures `tuitune ab` states, for the designs docs/advisor.md names.

For each design (fixed 4 and 8 rounds, sequential 4..8 and 4..12 rounds) at a launch-to-launch
spread (``--spread``, sd of log goodput; 2 % is ab's prior): the smallest gain detected 80 % of
the time (``experiments.ab.detectable_effect``, the line ab prints before its first round) and the
mean rounds a side at that gain; then, at ``--at-spread`` (3.8 %: what the sim world of
benchmarks/ab_accuracy.py measured), the false positives (no gain: the design's null rate, the
same at any spread) and the power at a 5.8 % gain with its mean rounds, from the design's own
simulation (``stats.design_power``: log-normal
launches, 2 000 simulated A/Bs with common random numbers, so the figures are deterministic). Pure
computation, no engine: the world is the statistics' own model.

    python benchmarks/ab_power.py [--spread 0.02] [--at-spread 0.038] [--gain 0.058]
"""

from __future__ import annotations

import argparse
import math

from tuitune.experiments.ab import ab_design, detectable_effect
from tuitune.measure import stats

DESIGNS = (
    ("fixed 4 rounds", 4, None),
    ("fixed 8 rounds", 8, None),
    ("sequential 4..8", 4, 8),
    ("sequential 4..12", 4, 12),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spread", type=float, default=0.02)
    ap.add_argument("--at-spread", type=float, default=0.038)
    ap.add_argument("--gain", type=float, default=0.058)
    ns = ap.parse_args()
    print(f"detected 80% of the time at a {ns.spread:.1%} launch-to-launch spread:")
    for label, rounds, last in DESIGNS:
        eff = detectable_effect(rounds, ns.spread, max_rounds=last)
        d = ab_design(rounds, last)
        if eff is None:
            print(f"  {label:<18} nothing")
            continue
        mean = stats.design_power(d, math.log1p(eff) / ns.spread)[1]
        print(f"  {label:<18} {eff:.1%} (mean rounds a side {mean:.1f})")
    shift = math.log1p(ns.gain) / ns.at_spread
    print(f"at a {ns.at_spread:.1%} spread (stats.design_power, log-normal launches):")
    for label, rounds, last in DESIGNS:
        d = ab_design(rounds, last)
        power, rounds_at = stats.design_power(d, shift)
        # (false positives do not depend on the spread: with nothing different, the launches'
        # order is uniformly random; the design's own null rate, exact for one look)
        print(
            f"  {label:<18} false positives {d.null_rate:.1%}, power at {ns.gain:.1%} {power:.0%} "
            f"(mean rounds {rounds_at:.1f})"
        )


if __name__ == "__main__":
    main()
