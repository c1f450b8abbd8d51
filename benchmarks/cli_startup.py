"""`tuitune --help` wall time: the console script of this environment, run ``--runs`` times
(one warm-up first, so the file cache is warm), median and max. Also the same for
``tuitune preset list`` (a command that loads the preset layer).

    python benchmarks/cli_startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ns = ap.parse_args()
    exe = os.path.join(os.path.dirname(sys.executable), "tuitune")
    if not os.path.exists(exe):
        raise SystemExit(f"no tuitune console script next to {sys.executable}: pip install . first")
    for args in (["--help"], ["preset", "list"]):
        cmd = [exe, *args]
        wall(cmd)  # warm-up
        times = [wall(cmd) for _ in range(ns.runs)]
        print(
            f"tuitune {' '.join(args):<12} median {statistics.median(times) * 1000:6.0f} ms, "
            f"max {max(times) * 1000:6.0f} ms over {ns.runs} runs"
        )


if __name__ == "__main__":
    main()
