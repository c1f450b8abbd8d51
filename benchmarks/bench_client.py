"""The benchmark client's accuracy and overhead, against a real simulator process.

1. Accuracy: with deterministic acceptance (every draft accepted) and no timing noise, the decode
   tok/s `tuitune bench` measures against the rate the simulator's cost model gives (its /server_info
   `sim.expected_tok_s`). Target: within 2 %.
2. Overhead per request: the client's end-to-end latency minus the server's own `e2e_latency`
   (what the client adds: HTTP, SSE parsing, loopback), and the client's CPU time per request.

    python benchmarks/bench_client.py [--speedup 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request

from tuitune.bench import BenchConfig, run_bench
from tuitune.metrics import quantile


def start_sim(port: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"})
    proc = subprocess.Popen([sys.executable, "-m", "tuitune.sim", "--port", str(port), "--sim-load-seconds", "0.3",
                             "--tp-size", "8", "--disable-custom-all-reduce", "--num-continuous-decode-steps", "4",
                             "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d",
                             "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(200):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("simulator did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--requests", type=int, default=8)
    ns = ap.parse_args()
    port = free_port()
    proc = start_sim(port, "--sim-acceptance", "1", "--sim-jitter", "0", "--sim-speedup", str(ns.speedup))
    try:
        for api in ("native", "openai"):
            run = asyncio.run(run_bench(BenchConfig(f"http://127.0.0.1:{port}", requests=ns.requests, warmup=1,
                                                    max_tokens=500, api=api)))
            expected = run.server["sim"]["expected_tok_s"]
            med = run.median_tok_s()
            print(f"[{api}] decode {med:.2f} tok/s measured, {expected:.2f} expected by the cost model: "
                  f"{(med - expected) / expected:+.2%} (target within ±2%), {run.failed} failed")
            ok = run.ok
            cpu = sorted(r.client_cpu_s * 1000 for r in ok)
            chunks = sum(r.chunks for r in ok) / len(ok)
            print(f"[{api}] client CPU per request: p50 {quantile(cpu, 0.5):.1f} ms "
                  f"({quantile(cpu, 0.5) * 1000 / chunks:.0f} µs per chunk, {chunks:.0f} chunks a request)")
            if api == "native":
                added = sorted((r.e2e_s - r.server_e2e_s) * 1000 for r in ok if r.server_e2e_s)
                print(f"[{api}] client e2e minus server e2e (client + server HTTP handling): "
                      f"p50 {quantile(added, 0.5):.2f} ms, max {added[-1]:.2f} ms")
                lag = sorted(r.client_lag_ms for r in ok if r.client_lag_ms is not None)
                print(f"[{api}] latency the client adds (start -> server handler, last chunk written -> "
                      f"timestamped): p50 {quantile(lag, 0.5):.3f} ms, max {lag[-1]:.3f} ms (target < 1 ms)")
    finally:
        proc.terminate()
        proc.wait(5)


if __name__ == "__main__":
    main()
