"""How often `tuitune ab`'s verdict is right: false positives when nothing differs, power at 2 %
and 5.8 % gains, for fixed rounds against the sequential A/B (`--until-decided`), in a named world.

Worlds (``--world``):

- ``noise`` (the default): a noise model written here. Each launch's number is
  1000 × (1 + gain, arm B only) × exp(spread · Z), Z standard normal (``--tails t3``: Student's t
  with 3 degrees of freedom, scaled to sd 1: rare launches far off). It is of this benchmark's own
  making, so it is evidence about the statistics (does the design keep the error rate it promises,
  what power does it buy), not about real engines: their launches may drift or correlate.
- ``sim``: the simulator as a process: real launches and real HTTP through ``run_ab`` on this
  machine, ``--sim-launch-sigma`` = ``--spread``, B's costs scaled by 1 / (1 + gain)
  (``--sim-scale``); its launch-to-launch spread also has the benchmark's own sampling noise and
  this machine's scheduling, and is printed as measured. Slow: ``--comparisons`` per gain.

Rules compared: "old rule" (ab before issue 25: p < 0.05 and the medians' bootstrap CI beyond the
1 % minimum effect, 4 rounds), fixed 4 and 8 rounds (the exact Mann-Whitney decision), and the
sequential A/B from 4 up to 8 and 12 rounds (group-sequential Mann-Whitney, Pocock-type
spending). In the sim world each sequential run of 4..8 rounds also gives the fixed-4 and old-rule
verdicts from its first 4 rounds (the same launches).

    python benchmarks/ab_accuracy.py [--world noise|sim] [--trials 2000] [--spread 0.02] [--tails normal|t3]
                                     [--orders 200000]
    python benchmarks/ab_accuracy.py --world sim [--comparisons 8] [--max-tokens 300] [--requests 6]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from pathlib import Path

from tuitune.experiments.ab import MIN_EFFECT, ab_design, stop_reason, verdict
from tuitune.measure import stats

ROOT = Path(__file__).resolve().parent.parent


GAINS = (0.0, 0.02, 0.058)
RULES = (("old rule, 4 rounds", 4, 4), ("fixed 4 rounds", 4, 4), ("fixed 8 rounds", 8, 8))
SEQUENTIAL = (("sequential 4..8", 4, 8), ("sequential 4..12", 4, 12))


def rows_of(values: list[tuple[float, float]]) -> list[dict]:
    return [
        {"arm": arm, "preset": arm, "median_tok_s": v, "failed": 0, "errors": [], "round": r}
        for r, (a, b) in enumerate(values, 1)
        for arm, v in (("A", a), ("B", b))
    ]


def old_rule(rows: list[dict]) -> str:
    """ab's verdict before issue 25 (``stats.compare``: p < 0.05 and the bootstrap CI beyond 1 %)."""
    va = [x["median_tok_s"] for x in rows if x["arm"] == "A"]
    vb = [x["median_tok_s"] for x in rows if x["arm"] == "B"]
    return stats.compare(va, vb, 0.01)["verdict"]


def run_design(draw, first: int, last: int, min_effect: float) -> tuple[str, int]:
    """One A/B with looks after ``first`` … ``last`` rounds, stopping as ``run_ab`` does."""
    d = ab_design(first, last)
    values: list[tuple[float, float]] = []
    for r in range(1, last + 1):
        values.append(draw())
        if r >= first:
            v = verdict(rows_of(values), min_effect, True, d, bootstrap=False)
            if r == last or not stop_reason(v, r, last).startswith("undecided"):
                return v["verdict"], r
    raise AssertionError("unreachable")


def noise_world(trials: int, spread: float, tails: str, min_effect: float) -> dict:
    def z(rng: random.Random) -> float:
        if tails == "normal":
            return rng.gauss(0, 1)
        chi = sum(rng.gauss(0, 1) ** 2 for _ in range(3))
        return rng.gauss(0, 1) / math.sqrt(chi / 3) / math.sqrt(3)  # t3 has variance 3

    out: dict = {}
    for gain in GAINS:
        for label, first, last in RULES + SEQUENTIAL:
            rng = random.Random(f"{gain}-{label}")  # one stream a cell: cells are reproducible one by one

            def draw(rng=rng, gain=gain) -> tuple[float, float]:
                return 1000 * math.exp(spread * z(rng)), 1000 * (1 + gain) * math.exp(spread * z(rng))

            got = []
            for _ in range(trials):
                if label.startswith("old rule"):
                    got.append((old_rule(rows_of([draw() for _ in range(4)])), 4))
                else:
                    got.append(run_design(draw, first, last, min_effect))
            out[(label, gain)] = got
    return out


async def sim_world(n: int, spread: float, max_tokens: int, requests: int, min_effect: float) -> tuple[dict, list]:
    from tuitune import preset as P
    from tuitune.experiments.ab import measured_spread, run_ab
    from tuitune.machine.transport import LocalTransport
    from tuitune_support.presets import make_preset

    out: dict = {}
    spreads = []
    with tempfile.TemporaryDirectory() as d:
        a = make_preset(
            Path(d),
            "a",
            args={"sim-speedup": 50, "sim-load-seconds": 0.05, "tp-size": 1, "sim-launch-sigma": spread},
            profile=False,
            requests=requests,
            max_tokens=max_tokens,
        )
        t = LocalTransport()
        for gain in GAINS:
            b = P.with_changes(
                a, {"name": f"b-gain-{gain * 1000:.0f}permille", "server.args.sim-scale": round(1 / (1 + gain), 6)}
            )
            for i in range(n):
                r = await run_ab(t, a, b, 4, {}, min_effect, max_rounds=8, stop_at_end=(i == n - 1))
                rows = r["launches"]
                first4 = rows[:8]
                f4 = verdict(first4, min_effect, True, ab_design(4), bootstrap=False)["verdict"]
                out.setdefault(("sequential 4..8", gain), []).append((r["verdict"]["verdict"], r["rounds"]))
                out.setdefault(("fixed 4 rounds", gain), []).append((f4, 4))
                out.setdefault(("old rule, 4 rounds", gain), []).append((old_rule(first4), 4))
                if (sp := measured_spread(rows, "median_tok_s")) is not None:
                    spreads.append(sp)
                print(
                    f"  gain {gain:.1%} #{i + 1}: sequential {r['verdict']['verdict']} after {r['rounds']} rounds, "
                    f"fixed 4: {f4}, old rule: {old_rule(first4)}",
                    flush=True,
                )
    return out, spreads


def report(cells: dict) -> None:
    labels = list(dict.fromkeys(label for label, _ in cells))
    print(f"\n{'rule':<22} {'false positives (0 %)':>22} {'power at 2 %':>14} {'power at 5.8 %':>15}   mean rounds")
    for label in labels:
        parts, rounds = [], []
        for gain in GAINS:
            got = cells.get((label, gain)) or []
            if not got:
                parts.append("-")
                continue
            k = (
                sum(v != "no significant difference" for v, _ in got)
                if gain == 0
                else sum(v == "faster" for v, _ in got)
            )
            rate = k / len(got)
            se = math.sqrt(max(rate * (1 - rate), 1 / len(got)) / len(got))
            parts.append(f"{rate:.1%} ± {se:.1%}")
            rounds.append(f"{sum(r for _, r in got) / len(got):.1f}")
        print(f"{label:<22} {parts[0]:>22} {parts[1]:>14} {parts[2]:>15}   {' / '.join(rounds)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", choices=["noise", "sim"], default="noise")
    ap.add_argument("--trials", type=int, default=2000, help="A/Bs per cell in the noise world (default 2000)")
    ap.add_argument("--comparisons", type=int, default=8, help="A/Bs per gain in the sim world (default 8)")
    ap.add_argument("--spread", type=float, default=0.02, help="launch-to-launch spread, sd of log (default 0.02)")
    ap.add_argument("--tails", choices=["normal", "t3"], default="normal", help="the noise world's launch noise")
    ap.add_argument("--min-effect", type=float, default=MIN_EFFECT, help="ab's --min-effect (default 0.01)")
    ap.add_argument("--max-tokens", type=int, default=300, help="sim world: per request")
    ap.add_argument("--requests", type=int, default=6, help="sim world: per launch")
    ap.add_argument("--orders", type=int, default=200000, help="random orders checking the boundaries (200000)")
    ns = ap.parse_args()
    t0 = time.perf_counter()
    if ns.world == "noise":
        print(
            f"world: a noise model written in this benchmark (launch numbers 1000 x exp({ns.spread:.1%} Z), Z "
            f"{'standard normal' if ns.tails == 'normal' else 'Student t3 scaled to sd 1'}): not evidence about "
            "real engines"
        )
        cells = noise_world(ns.trials, ns.spread, ns.tails, ns.min_effect)
        print(
            f"{ns.trials} A/Bs a cell, minimum practical effect {ns.min_effect:.1%}, {time.perf_counter() - t0:.0f} s"
        )
    else:
        print(
            f"world: the simulator as a process on this machine (--sim-launch-sigma {ns.spread}, 50x clock, "
            f"{ns.requests} requests of {ns.max_tokens} tokens a launch): not evidence about real engines"
        )
        cells, spreads = asyncio.run(sim_world(ns.comparisons, ns.spread, ns.max_tokens, ns.requests, ns.min_effect))
        print(
            f"{ns.comparisons} A/Bs a gain, launch-to-launch spread measured {stats.median(spreads):.1%} "
            f"(median over A/Bs), {time.perf_counter() - t0:.0f} s"
        )
    report(cells)
    print(f"\nthe boundaries themselves ({ns.orders} fresh random orders, another seed than their calibration's):")
    for rounds in (4, 8):
        d = ab_design(rounds)
        print(f"  fixed {rounds}: critical U {d.critical[0]}, false-positive rate {d.null_rate:.2%} (exact)")
    for last in (8, 12):
        d = ab_design(4, last)
        print(
            f"  4..{last}: critical U a look {list(d.critical)}, false-positive rate {null_rate(d, ns.orders):.2%} "
            f"(in the calibration sample {d.null_rate:.2%})"
        )


def null_rate(d, orders: int, seed: int = 99) -> float:
    """The chance that some look of design ``d`` crosses when nothing differs: under that
    hypothesis the launches' order is uniformly random whatever their distribution, so random
    orders are the exact null (only Monte-Carlo error, 0.05 % at 200 000)."""
    import bisect

    rng = random.Random(seed)
    hits = 0
    for _ in range(orders):
        xs: list[float] = []
        ys: list[float] = []
        u = 0
        for r in range(1, d.last + 1):
            x, y = rng.random(), rng.random()
            u += len(ys) - bisect.bisect_left(ys, x)
            bisect.insort(xs, x)
            u += bisect.bisect_left(xs, y)
            bisect.insort(ys, y)
            c = d.critical[r - d.first] if r >= d.first else None
            if c is not None and (u <= c or u >= r * r - c):
                hits += 1
                break
    return hits / orders


if __name__ == "__main__":
    main()
