"""Seed measurements (FACTS.md §1) against the simulator at real speed (--sim-speedup 1).

Each configuration runs as a real `python -m tuitune.sim` process with the seeds' flags and
variables, benched single stream with max_tokens 500 by tuitune's own client; verify and cycle
times come from the simulator's EAGLE3_PROFILE lines. Prints the table docs/simulator.md shows.

    python benchmarks/sim_calibration.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from statistics import mean

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.parse import parse_line
from tuitune_support.simproc import running_sim

TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
SEED = [
    "--tp-size",
    "8",
    "--mem-fraction-static",
    "0.88",
    "--num-continuous-decode-steps",
    "4",
    "--disable-custom-all-reduce",
]
ROWS = [  # name, steps (None = baseline), tuned, seed tok/s, seed verify ms, seed cycle ms
    ("C1", None, False, 62.9, None, None),
    ("C2", None, True, 88.8, None, None),
    ("C3", 5, True, 86.7, 21.7, 22.68),
    ("C4", 2, True, 94.0, None, 19.85),
    ("C5", 5, False, None, 28.7, None),
    ("C6", 2, False, None, 25.6, None),
    ("C7", 2, False, 75.9, None, None),
    ("C8", 5, False, 71.3, None, None),
]


def run_row(steps, tuned, requests) -> tuple[float, float | None, float | None]:
    spec = (
        []
        if steps is None
        else [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            str(steps),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(steps + 1),
        ]
    )
    env = {**(TUNED if tuned else {}), "EAGLE3_PROFILE": "1"}
    with tempfile.NamedTemporaryFile("w+b", suffix=".log") as log:
        with running_sim(*SEED, *spec, env=env, log=log) as url:
            run = asyncio.run(run_bench(BenchConfig(url, requests=requests, warmup=1, max_tokens=500)))
        log.seek(0)
        prof = [
            e for e in map(parse_line, log.read().decode("utf-8", "replace").splitlines()) if e and e.kind == "profile"
        ]
    verify = mean(p.verify_ms for p in prof) if prof else None
    cycle = mean(p.cycle_ms for p in prof) if prof else None
    return run.median_tok_s(), verify, cycle


def fmt(seed, sim) -> str:
    if sim is None:
        return f"{'—':>7} {'—':>7} {'':>7}"
    if seed is None:
        return f"{'—':>7} {sim:>7.2f} {'':>7}"
    return f"{seed:>7.2f} {sim:>7.2f} {(sim - seed) / seed:>+7.1%}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5)
    ns = ap.parse_args()
    print(
        "row  steps  NCCL     | tok/s: seed     sim   error | verify ms: seed  sim   error | cycle ms: seed  sim   error"
    )
    worst = 0.0
    for name, steps, tuned, s_tok, s_ver, s_cyc in ROWS:
        tok, ver, cyc = run_row(steps, tuned, ns.requests)
        for seed, sim in ((s_tok, tok), (s_ver, ver), (s_cyc, cyc)):
            if seed is not None and sim is not None:
                worst = max(worst, abs(sim - seed) / seed)
        print(
            f"{name:<4} {steps or '-':>5}  {'tuned' if tuned else 'untuned':<8} | {fmt(s_tok, tok)} | "
            f"{fmt(s_ver, ver)} | {fmt(s_cyc, cyc)}",
            flush=True,
        )
    print(f"worst error {worst:.1%} (target ±10%)")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
