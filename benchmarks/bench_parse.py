"""Parser speed: a 1,000,000-line mixed SGLang log through the API and through `tuitune parse`.

The mix resembles a busy log with the probe on: decode and profile lines, prefill lines, HTTP
access lines and other noise. `grep -cE` over the same file gives a reference for "reading the
file at all". Target: at least 500,000 lines/s for the API on one core.

    python benchmarks/bench_parse.py [--lines N]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

from tuitune.parse import parse_line

SAMPLES = [
    (30, "[2026-11-29 16:02:{s:02d} TP0] Decode batch, #running-req: 1, #token: {n}, token usage: 0.00, accept len: 1.{a}, "
         "accept rate: 0.4{a}, cuda graph: True, gen throughput (token/s): 9{a}.12, #queue-req: 0"),
    (30, "[2026-11-29 16:02:{s:02d} TP0] EAGLE3_PROFILE v=1 cycles=40 bs=1 steps=2 topk=1 draft_tokens=3 draft_ms=0.4{a} "
         "verify_ms=19.{a} extend_ms=0.20 other_ms=0.05 cycle_ms=20.{a} accept_len=1.{a} eff_tok_s=9{a}.5 sync=event"),
    (10, "[2026-11-29 16:02:{s:02d} TP0] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: 0, token usage: 0.00, "
         "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1{a}00.00"),
    (20, "[2026-11-29 16:02:{s:02d}] INFO:     127.0.0.1:{n} - \"POST /generate HTTP/1.1\" 200 OK"),
    (10, "[2026-11-29 16:02:{s:02d} TP0] Cache flushed successfully! memory usage {n} tokens"),
]


def build(path: str, n: int) -> None:
    rng = random.Random(1)
    weights = [w for w, _ in SAMPLES]
    with open(path, "w") as f:
        for i in range(n):
            tmpl = rng.choices(SAMPLES, weights)[0][1]
            f.write(tmpl.format(s=i % 60, n=rng.randint(100, 60000), a=rng.randint(10, 99)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    n = ap.parse_args().lines
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mixed.log")
        build(path, n)
        with open(path) as f:
            lines = f.read().splitlines()
        t0 = time.perf_counter()
        events = sum(1 for line in lines if parse_line(line) is not None)
        api = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tuitune", "parse", path, "--json"], check=True,
                       stdout=subprocess.DEVNULL)
        cli = time.perf_counter() - t0
        t0 = time.perf_counter()
        # stdout captured: GNU grep stops at the first match when its output is /dev/null
        subprocess.run(["grep", "-cE", "EAGLE3_PROFILE|Decode batch|Prefill batch", path], check=True,
                       capture_output=True)
        grep = time.perf_counter() - t0
    print(f"{n:,} lines, {events:,} events")
    print(f"parse_line API       {n / api:>12,.0f} lines/s  ({api:.2f} s)")
    print(f"tuitune parse --json {n / cli:>12,.0f} lines/s  ({cli:.2f} s, process start and JSON output included)")
    print(f"grep -cE             {n / grep:>12,.0f} lines/s  ({grep:.2f} s)")
    print(f"ratios: API at 1/{api / grep:.0f} of grep's speed, tuitune parse at 1/{cli / grep:.0f}")


if __name__ == "__main__":
    main()
