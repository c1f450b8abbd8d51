"""How fast the simulator can serve 64 concurrent streams on this machine (simulator + client here).

The simulator emulates time: each cycle sleeps until its modelled end. Past some token rate the
host cannot keep up (every token is an SSE chunk to write, and to read in the client), cycles
start late and the figures come out too slow. This runs 64 streams against h200-llama8b without
speculation (one token per request per cycle: the most chunks per token) at rising
``--sim-speedup`` and reports, per speedup, the goodput in simulated time relative to the slowest
run, and the share of cycles that started late. The sustainable rate is the highest real token
rate at which both stay good (≥ 95 % and ≤ 5 %).

    python benchmarks/sim_batch_rate.py [--streams 64] [--max-tokens 200]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from tuitune.bench import BenchConfig, run_bench

SPEEDUPS = (0.5, 1, 2, 3, 4, 6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(speedup: float, streams: int, max_tokens: int):
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "tuitune.sim", "--port", str(port), "--sim-machine",
                                 "h200-llama8b", "--sim-load-seconds", "0.2", "--sim-speedup", str(speedup)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(200):
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                        break
                except OSError:
                    time.sleep(0.05)
            cfg = BenchConfig(f"http://127.0.0.1:{port}", requests=1, warmup=1, max_tokens=max_tokens)
            run = asyncio.run(run_bench(cfg.at_level(streams)))
        finally:
            proc.terminate()
            proc.wait(5)
    sim = run.server.get("sim") or {}
    late = sim.get("cycles_late", 0) / max(1, sim.get("cycles", 1))
    return run.goodput()["tok_s"], late, run.failed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=200)
    ns = ap.parse_args()
    print(f"{ns.streams} streams, h200-llama8b, no speculation, {ns.max_tokens} tokens a request")
    print(f"{'speedup':>8} {'real tok/s':>11} {'sim tok/s':>10} {'vs slowest':>10} {'late cycles':>11}")
    ref = None
    best = None
    for speedup in SPEEDUPS:
        real, late, failed = measure(speedup, ns.streams, ns.max_tokens)
        simulated = real / speedup
        ref = ref or simulated
        rel = simulated / ref
        good = rel >= 0.95 and late <= 0.05 and not failed
        if good:
            best = (speedup, real)
        print(f"{speedup:>8g} {real:>11.0f} {simulated:>10.0f} {rel:>10.1%} {late:>11.1%}"
              + ("" if good else "  <- falling behind"), flush=True)
    if best:
        print(f"\nsustainable: {best[1]:.0f} tok/s across {ns.streams} streams (--sim-speedup {best[0]:g} "
              f"on h200-llama8b without speculation)")
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
