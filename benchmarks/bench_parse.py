"""Parser speed: a 1,000,000-line mixed SGLang log through the API and through `tuitune parse`.

The mix resembles a busy log with the probe on: decode and profile lines, prefill lines, HTTP
access lines and other noise, stamped like SGLang stamps them (to the second, 200 lines a second).
A second run uses millisecond stamps (SGLANG_LOG_MS, 1,000 lines a second), where no two
prefixes repeat:
the parser's prefix memo cannot help there. `grep -cE` over the same file gives a reference for
"reading the file at all". Target: at least 500,000 lines/s for the API on one core.

    taskset -c 0 python benchmarks/bench_parse.py [--lines N] [--v2]
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import subprocess
import sys
import tempfile
import time

from tuitune.measure.parse import parse_line

SAMPLES = [
    (
        30,
        "[{s} TP0] Decode batch, #running-req: 1, #token: {n}, token usage: 0.00, accept len: 1.{a}, "
        "accept rate: 0.4{a}, cuda graph: True, gen throughput (token/s): 9{a}.12, #queue-req: 0",
    ),
    (
        30,
        "[{s} TP0] EAGLE3_PROFILE v=1 cycles=40 bs=1 steps=2 topk=1 draft_tokens=3 draft_ms=0.4{a} "
        "verify_ms=19.{a} extend_ms=0.20 other_ms=0.05 cycle_ms=20.{a} accept_len=1.{a} eff_tok_s=9{a}.5 sync=event",
    ),
    (
        10,
        "[{s} TP0] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: 0, token usage: 0.00, "
        "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 1{a}00.00",
    ),
    (20, '[{s}] INFO:     127.0.0.1:{n} - "POST /generate HTTP/1.1" 200 OK'),
    (10, "[{s} TP0] Cache flushed successfully! memory usage {n} tokens"),
]
# --v2: profile lines of format v2 as the simulator writes them (histograms of accept lengths and
# batch sizes, verify tokens)
PROFILE_V2 = (
    "[{s} TP0] EAGLE3_PROFILE v=2 cycles=40 bs=8 steps=3 topk=1 draft_tokens=4 verify_tokens=32 "
    "draft_ms=0.5{a} verify_ms=5.{a} extend_ms=0.20 other_ms=0.05 cycle_ms=6.{a} accept_len=2.{a} "
    "accept_hist=1:1{a},2:8{a},3:6{a},4:5{a} bs_hist=7:3,8:37 eff_tok_s=29{a}.5 sync=sim"
)


def build(path: str, n: int, ms: bool = False, v2: bool = False) -> None:
    per_s = 1000 if ms else 200  # with ms stamps, each line its own millisecond
    rng = random.Random(1)
    samples = [(w, PROFILE_V2 if v2 and "EAGLE3_PROFILE" in t else t) for w, t in SAMPLES]
    weights = [w for w, _ in samples]
    t0 = datetime.datetime(2026, 11, 29, 16, 2, 0)
    with open(path, "w") as f:
        for i in range(n):
            tmpl = rng.choices(samples, weights)[0][1]
            t = t0 + datetime.timedelta(seconds=i / per_s)
            stamp = t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond // 1000:03d}" if ms else "")
            f.write(tmpl.format(s=stamp, n=rng.randint(100, 60000), a=rng.randint(10, 99)) + "\n")


def api_rate(path: str) -> tuple[float, int]:
    with open(path) as f:
        lines = f.read().splitlines()
    t0 = time.perf_counter()
    events = sum(1 for line in lines if parse_line(line) is not None)
    return len(lines) / (time.perf_counter() - t0), events


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--v2", action="store_true", help="profile lines of format v2 (with histograms)")
    ns = ap.parse_args()
    n = ns.lines
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "mixed.log")
        build(path, n, v2=ns.v2)
        api, events = api_rate(path)
        ms_path = os.path.join(d, "mixed-ms.log")
        build(ms_path, n, ms=True, v2=ns.v2)
        api_ms, _ = api_rate(ms_path)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tuitune", "parse", path, "--json"], check=True, stdout=subprocess.DEVNULL
        )
        cli = time.perf_counter() - t0
        t0 = time.perf_counter()
        # stdout captured: GNU grep stops at the first match when its output is /dev/null
        subprocess.run(
            ["grep", "-cE", "EAGLE3_PROFILE|Decode batch|Prefill batch", path], check=True, capture_output=True
        )
        grep = time.perf_counter() - t0
    print(f"{n:,} lines, {events:,} events")
    print(f"parse_line API       {api:>12,.0f} lines/s  ({n / api:.2f} s)")
    print(f"  with ms stamps     {api_ms:>12,.0f} lines/s  ({n / api_ms:.2f} s, every prefix different)")
    print(f"tuitune parse --json {n / cli:>12,.0f} lines/s  ({cli:.2f} s, process start and JSON output included)")
    print(f"grep -cE             {n / grep:>12,.0f} lines/s  ({grep:.2f} s)")
    print(f"ratios: API at 1/{n / api / grep:.0f} of grep's speed, tuitune parse at 1/{cli / grep:.0f}")


if __name__ == "__main__":
    main()
