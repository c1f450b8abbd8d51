"""Per-line costs on one core: the parser by kind of line, and secret masking.

The lines are those of ``bench_parse.py``'s mixed SGLang log (second stamps, 200 lines a second):
for each kind (profile, decode, prefill, HTTP access, other) 200,000 lines of that kind alone go
through ``tuitune.measure.parse.parse_line``; then the whole mix through
``tuitune.base.redact.Redactor()`` (what every printed or written log line pays). Best of
``--repeat`` runs, microseconds a line.

    taskset -c 0 python benchmarks/bench_lines.py [--lines 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from bench_parse import SAMPLES, build

from tuitune.base.redact import Redactor
from tuitune.measure.parse import parse_line

KINDS = ("decode", "profile", "prefill", "access", "other")  # the order of bench_parse.SAMPLES


def best_us(lines: list[str], fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for line in lines:
            fn(line)
        best = min(best, time.perf_counter() - t0)
    return best / len(lines) * 1e6


def lines_of(d: str, name: str, samples, n: int) -> list[str]:
    import bench_parse

    path = os.path.join(d, name + ".log")
    saved = bench_parse.SAMPLES
    bench_parse.SAMPLES = samples
    try:
        build(path, n)
    finally:
        bench_parse.SAMPLES = saved
    with open(path) as f:
        return f.read().splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ns = ap.parse_args()
    print(f"{ns.lines:,} lines a run, best of {ns.repeat}")
    with tempfile.TemporaryDirectory() as d:
        for kind, sample in zip(KINDS, SAMPLES, strict=True):
            lines = lines_of(d, kind, [sample], ns.lines)
            us = best_us(lines, parse_line, ns.repeat)
            print(f"parse_line, {kind:<8} {us:6.2f} µs a line ({1e6 / us:>10,.0f} lines/s)", flush=True)
        mix = lines_of(d, "mix", SAMPLES, ns.lines)
        us = best_us(mix, parse_line, ns.repeat)
        print(f"parse_line, the mix  {us:6.2f} µs a line ({1e6 / us:>10,.0f} lines/s)")
        red = Redactor()
        us = best_us(mix, red, ns.repeat)
        print(f"Redactor(), the mix  {us:6.2f} µs a line ({1e6 / us:>10,.0f} lines/s)")


if __name__ == "__main__":
    main()
