"""The benchmark client's accuracy and overhead, against a real simulator process.

1. Accuracy: with deterministic acceptance (every draft accepted) and no timing noise, the decode
   tok/s `tuitune bench` measures against the rate the simulator's cost model gives (its /server_info
   `sim.expected_tok_s`). Target: within 2 %.
2. The client's own overhead per request, where it could touch the figures:
   - send: the client's work from starting a request to its last byte being handed to the socket.
     tuitune starts a request's clock only then, so this stays out of TTFT and latency;
   - receive: bytes handed to aiohttp's protocol (a diagnostic hook this script installs on
     `ResponseHandler.data_received`) -> the client's timestamp of the first and the last chunk,
     i.e. what the client's own code adds to TTFT and end-to-end latency. Target: below 1 ms;
   - for context, what lies outside both programs' code, from the simulator's wall-clock stamps:
     request on the wire -> the simulator's handler, plus last chunk written -> stamped. That
     includes loopback and the wake-up of each sleeping process (on an idle VM, a millisecond or
     more each).
   And the client's CPU time per request.

    python benchmarks/bench_client.py [--speedup 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request

import aiohttp.client_proto

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.metrics import quantile
from tuitune.measure.request import client_session, run_request
from tuitune_support.ports import free_port

ARRIVALS: list[tuple[float, bytes]] = []  # (perf_counter, bytes) of each data_received of the client
_orig_data_received = aiohttp.client_proto.ResponseHandler.data_received


def _stamped_data_received(self, data: bytes) -> None:
    ARRIVALS.append((time.perf_counter(), bytes(data)))
    _orig_data_received(self, data)


def receive_lags(cfg: BenchConfig, n: int, prompt: str) -> tuple[list[float], list[float], list[float]]:
    """Per request: send ms, and for the first and the last chunk, bytes arrived -> stamped (ms)."""
    aiohttp.client_proto.ResponseHandler.data_received = _stamped_data_received
    sends, firsts, lasts = [], [], []

    def lag(stamp: float, marker: bytes, first: bool) -> float:
        """stamp - arrival of the bytes carrying ``marker`` (the first or the last such arrival)."""
        times = [t for t, data in ARRIVALS if marker in data and t <= stamp]
        return (stamp - times[0 if first else -1]) * 1000

    async def go() -> None:
        async with client_session() as session:
            for _ in range(n):
                ARRIVALS.clear()
                r = await run_request(session, cfg, prompt)
                if not r.ok or r.send_ms is None:
                    raise SystemExit(f"request failed: {r.error}")
                sends.append(r.send_ms)
                firsts.append(lag(r.t0 + r.ttft_s, b'"completion_tokens"', True))  # the first token chunk
                lasts.append(lag(r.t0 + r.e2e_s, b'"finish_reason": {', False))  # the final chunk

    try:
        asyncio.run(go())
    finally:
        aiohttp.client_proto.ResponseHandler.data_received = _orig_data_received
    return sends, firsts, lasts


def p(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"p50 {quantile(xs, 0.5):.3f} ms, max {xs[-1]:.3f} ms"


def start_sim(port: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update({"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tuitune.sim",
            "--port",
            str(port),
            "--sim-load-seconds",
            "0.3",
            "--tp-size",
            "8",
            "--disable-custom-all-reduce",
            "--num-continuous-decode-steps",
            "4",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "1",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    for _ in range(200):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
                return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("simulator did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--requests", type=int, default=8)
    ns = ap.parse_args()
    port = free_port()
    proc = start_sim(port, "--sim-acceptance", "1", "--sim-jitter", "0", "--sim-speedup", str(ns.speedup))
    try:
        for api in ("native", "openai"):
            run = asyncio.run(
                run_bench(
                    BenchConfig(f"http://127.0.0.1:{port}", requests=ns.requests, warmup=1, max_tokens=500, api=api)
                )
            )
            expected = run.server["sim"]["expected_tok_s"]
            med = run.median_tok_s()
            print(
                f"[{api}] decode {med:.2f} tok/s measured, {expected:.2f} expected by the cost model: "
                f"{(med - expected) / expected:+.2%} (target within ±2%), {run.failed} failed"
            )
            ok = run.ok
            cpu = sorted(r.client_cpu_s * 1000 for r in ok)
            chunks = sum(r.chunks for r in ok) / len(ok)
            print(
                f"[{api}] client CPU per request: p50 {quantile(cpu, 0.5):.1f} ms "
                f"({quantile(cpu, 0.5) * 1000 / chunks:.0f} µs per chunk, {chunks:.0f} chunks a request)"
            )
            if api == "native":
                lag = [r.client_lag_ms for r in ok if r.client_lag_ms is not None]
                print(
                    f"[{api}] outside both programs' code (request on the wire -> handler, last chunk "
                    f"written -> stamped; loopback and wake-ups): {p(lag)}"
                )
        cfg = BenchConfig(f"http://127.0.0.1:{port}", max_tokens=200, api="native")
        sends, firsts, lasts = receive_lags(cfg, ns.requests * 2, "Write a short poem about the sea.")
        print(
            f"[native] send, the client's work before the request is on the wire (kept out of the figures): {p(sends)}"
        )
        print(f"[native] receive, bytes handed to aiohttp -> first chunk stamped: {p(firsts)}")
        print(f"[native] receive, bytes handed to aiohttp -> last chunk stamped: {p(lasts)}")
        total = [a + b for a, b in zip(firsts, lasts, strict=False)]
        print(
            f"[native] the client's own overhead in a request's figures (first + last chunk): {p(total)} "
            f"(target < 1 ms)"
        )
    finally:
        proc.terminate()
        proc.wait(5)


if __name__ == "__main__":
    main()
