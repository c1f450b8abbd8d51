"""How fast the simulator can serve 64 concurrent streams on this machine (simulator + client here).

The simulator emulates time: each cycle sleeps until its modelled end. Past some token rate the
host cannot keep up (every token is an SSE chunk to write, and to read in the client), cycles
start late and the figures come out too slow. This runs 64 streams against h200-llama8b without
speculation (one token per request per cycle: the most chunks per token) at rising
``--sim-speedup`` and reports, per speedup, the goodput in simulated time relative to the slowest
run, and the share of cycles that started late. The sustainable rate is the highest real token
rate at which both stay good (≥ 95 % and ≤ 5 %).

    python benchmarks/sim_batch_rate.py [--streams 64] [--max-tokens 200] [--stream-interval N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune_support.simproc import running_sim

SPEEDUPS = (0.125, 0.25, 0.5, 1, 2, 4)


def measure(speedup: float, streams: int, max_tokens: int, interval: int):
    with running_sim(
        "--sim-machine", "h200-llama8b", "--sim-speedup", str(speedup), "--stream-interval", str(interval)
    ) as url:
        run = asyncio.run(run_bench(BenchConfig(url, requests=1, warmup=1, max_tokens=max_tokens).at_level(streams)))
    return run.goodput()["tok_s"], run.sim_late_share or 0.0, run.failed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--stream-interval", type=int, default=1, help="SGLang's --stream-interval (chunks every N cycles)")
    ns = ap.parse_args()
    print(
        f"{ns.streams} streams, h200-llama8b, no speculation, {ns.max_tokens} tokens a request, "
        f"a chunk every {ns.stream_interval} cycle(s)"
    )
    print(f"{'speedup':>8} {'real tok/s':>11} {'req/s':>7} {'sim tok/s':>10} {'vs slowest':>10} {'late cycles':>11}")
    ref = None
    best = None
    for speedup in SPEEDUPS:
        real, late, failed = measure(speedup, ns.streams, ns.max_tokens, ns.stream_interval)
        simulated = real / speedup
        ref = ref or simulated
        rel = simulated / ref
        good = rel >= 0.95 and late <= 0.05 and not failed
        if good:
            best = (speedup, real)
        print(
            f"{speedup:>8g} {real:>11.0f} {real / ns.max_tokens:>7.1f} {simulated:>10.0f} {rel:>10.1%} {late:>11.1%}"
            + ("" if good else "  <- falling behind"),
            flush=True,
        )
    if best:
        print(
            f"\nsustainable: {best[1]:.0f} tok/s = {best[1] / ns.max_tokens:.1f} requests/s of {ns.max_tokens} "
            f"tokens across {ns.streams} streams (--sim-speedup {best[0]:g} on h200-llama8b without speculation)"
        )
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
