"""Parser speed on a busy SGLang log: `tuitune parse` end to end, and the API, on one core.

The log is built from a seed: 1,000,000 lines stamped as SGLang stamps them (to the second, about
200 lines a second), 30 % the probe's EAGLE3_PROFILE lines in its full format v2 (as
``tuitune/probe/eagle3_probe.py`` prints them: histogram, verify tokens, verify spread,
sync=event), 30 % SGLang's Decode batch lines, 10 % Prefill batch lines, 20 % HTTP request lines
and 10 % other server lines; batch sizes, timings and acceptance vary line to line. The process
(and the `tuitune parse` it starts) is pinned to one core.

Printed: lines a second for ``tuitune parse FILE --json`` (process start, reading, parsing,
masking and JSON output included) and through the API, line by line (``parse_line``) and many
lines at once (``parse_lines``, which reads chunks through ``parse_many``), each as wall-clock
and as CPU time, the best of ``--runs`` runs (on a machine others share, the CPU-time figure is
the steadier one; the load average is printed with them). The API's consumer looks at every
event and keeps none (the same consumer for both ways); ``parse_lines`` is also timed with a
consumer that counts the events by kind, as ``summarize`` does. The API's two ways are checked
to give the same events; ``grep -cE`` over the file is the reference for reading it at all.
Goals: >= 300,000 lines/s for the CLI and >= 1,000,000 lines/s for the API. ``--ms``:
millisecond stamps (SGLANG_LOG_MS), where no two prefixes repeat and the parser's prefix memo
cannot help.

    python benchmarks/bench_parse.py [--lines N] [--seed S] [--cpu C] [--ms] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

from tuitune.measure.parse import parse_line, parse_lines
from tuitune_support.loglines import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _best(fn, runs: int):
    """(result, best wall-clock, best CPU time) over ``runs`` runs."""
    out, walls, cpus = None, [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return out, min(walls), min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cpu", type=int, default=None, help="the core to run on (default: the last one allowed)")
    ap.add_argument("--ms", action="store_true", help="millisecond stamps (every prefix different)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each measurement; the best is printed")
    ns = ap.parse_args()
    cpu = ns.cpu if ns.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # this process and the `tuitune parse` it starts
    n = ns.lines
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "busy.log")
        build(path, n, ns.seed, ns.ms)
        with open(path) as f:
            lines = f.read().splitlines()
        # timed as a consumer reads them: each event looked at, none kept (the same consumer for
        # both ways); then a consumer that also counts the events by kind, as summarize does
        _, w_one, c_one = _best(lambda: sum(1 for line in lines if parse_line(line) is not None), ns.runs)
        _, w_many, c_many = _best(lambda: sum(1 for ev in parse_lines(lines) if ev is not None), ns.runs)

        def count() -> dict[str, int]:
            counts: dict[str, int] = {}
            for ev in parse_lines(lines):
                counts[ev.kind] = counts.get(ev.kind, 0) + 1
            return counts

        counts, w_kinds, c_kinds = _best(count, ns.runs)
        for i in range(0, n, 10_000):  # (not timed) the two ways agree, event for event
            chunk = lines[i : i + 10_000]
            if list(map(repr, parse_lines(chunk))) != [repr(ev) for ev in map(parse_line, chunk) if ev is not None]:
                raise SystemExit(f"parse_lines and parse_line disagree on lines {i + 1}-{i + len(chunk)}")
        cmd = [sys.executable, "-m", "tuitune", "parse", path, "--json"]
        w_cli = c_cli = float("inf")
        for _ in range(ns.runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            w0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, cwd=ROOT).stdout
            w_cli = min(w_cli, time.perf_counter() - w0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            c_cli = min(c_cli, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
            if out.count(b"\n") != sum(counts.values()):
                raise SystemExit("tuitune parse printed a different number of events")
            del out
        w0 = time.perf_counter()
        # reading the file at all: stdout captured (GNU grep stops at the first match into /dev/null)
        subprocess.run(
            ["grep", "-cE", "EAGLE3_PROFILE|Decode batch|Prefill batch", path], check=True, capture_output=True
        )
        w_grep = time.perf_counter() - w0
    stamps = "millisecond stamps (every prefix different)" if ns.ms else "second stamps, 200 lines a second"
    print(
        f"{n:,} lines ({stamps}, seed {ns.seed}), core {cpu}; events: "
        + ", ".join(f"{k} {v:,}" for k, v in counts.items())
    )
    print(f"best of {ns.runs} runs; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    print(f"{'':34}{'wall-clock':>18}{'CPU time':>18}")
    for name, w, c in (
        ("tuitune parse FILE --json (CLI)", w_cli, c_cli),
        ("API: parse_lines (many at once)", w_many, c_many),
        ("  the same, counting kinds", w_kinds, c_kinds),
        ("API: parse_line (line by line)", w_one, c_one),
    ):
        print(f"{name:34}{n / w:>12,.0f} l/s {n / c:>12,.0f} l/s")
    print(f"{'grep -cE (reading the file at all)':34}{n / w_grep:>12,.0f} l/s")
    print("goals: CLI >= 300,000 lines/s, API >= 1,000,000 lines/s")


if __name__ == "__main__":
    main()
