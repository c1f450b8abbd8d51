"""How often `tuitune ab`'s verdict is right, on the simulator (real launches, real HTTP).

40 A/A comparisons (identical configurations: the verdict should be "no significant difference"
in at least 95 %) and 40 comparisons of configurations 5 % apart (`--sim-scale 0.95`: it should
find the difference in at least 90 %). Each comparison is `run_ab` with 4 rounds (8 launches);
launches differ by the simulator's per-launch speed factor (1 %) and their own acceptance draws.
The simulator runs 50x faster than real time to keep this to minutes.

    python benchmarks/ab_accuracy.py [--comparisons 40] [--rounds 4] [--max-tokens 500] [--requests 10]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from conftest import make_preset  # noqa: E402

from tuitune import preset as P  # noqa: E402
from tuitune.experiments.ab import run_ab  # noqa: E402
from tuitune.target.transport import LocalTransport  # noqa: E402


async def main(n: int, rounds: int, max_tokens: int, requests: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        a = make_preset(
            tmp,
            "a",
            args={"sim-speedup": 50, "sim-load-seconds": 0.05, "tp-size": 1},
            profile=False,
            requests=requests,
            max_tokens=max_tokens,
        )
        a2 = P.with_changes(a, {"name": "a-again"})
        b = P.with_changes(a, {"name": "b-5pct", "server.args.sim-scale": 0.95})
        t = LocalTransport()
        results = {}
        t0 = time.perf_counter()
        for label, other, want in (("A/A", a2, "no significant difference"), ("A/B 5%", b, "faster")):
            verdicts = []
            for i in range(n):
                r = await run_ab(t, a, other, rounds, {}, stop_at_end=(i == n - 1))
                verdicts.append(r["verdict"]["verdict"])
                print(
                    f"  {label} #{i + 1}: {r['verdict']['verdict']} (ratio {r['verdict'].get('ratio', float('nan')):.4f}, "
                    f"p {r['verdict'].get('p_value', float('nan')):.3f})",
                    flush=True,
                )
            results[label] = (sum(v == want for v in verdicts), len(verdicts), want)
    print(
        f"\n{n} comparisons each, {rounds} rounds (launches per arm), {requests} requests of {max_tokens} tokens "
        f"per launch, {time.perf_counter() - t0:.0f} s"
    )
    for label, (ok, total, want) in results.items():
        print(f"{label}: verdict '{want}' in {ok}/{total} = {ok / total:.0%}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--comparisons", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=500, help="per request (the preset default)")
    ap.add_argument("--requests", type=int, default=10, help="per launch (the preset default)")
    ns = ap.parse_args()
    asyncio.run(main(ns.comparisons, ns.rounds, ns.max_tokens, ns.requests))
