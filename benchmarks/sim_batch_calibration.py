"""The simulator's batch model against published and measured figures (FACTS.md §1, §6).

1. EAGLE-3 paper (arXiv 2503.01840), SGLang, H100, Llama-3.1-8B, chain length 3 vs no
   speculation, bs 2 … 64, on machine h100-llama8b: the model's speedup (the simulator's ground
   truth, `tuitune.sim.model.expected_goodput`) and, unless --model-only, the speedup measured
   through real simulator processes by tuitune's own bench client at concurrency = bs. Target ±10 %.
2. The H200 forward times (target n = 1 … 1024, draft step) against machine h200-llama8b's curves.
   Target ±12 %.
3. The seeds' C1–C8 tok/s on the default machine (seed-pcie8), from the model. Target ±10 %.
   (benchmarks/sim_calibration.py measures C1–C8 through the simulator process.)

    python benchmarks/sim_batch_calibration.py [--model-only] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.sim import model as M
from tuitune_support.simproc import running_sim

PAPER = {2: 1.81, 4: 1.82, 8: 1.62, 16: 1.48, 24: 1.39, 32: 1.32, 48: 1.38, 56: 1.34, 64: 1.38}
H200_TARGET = {
    1: 4.24,
    4: 4.38,
    16: 4.45,
    32: 4.51,
    64: 4.62,
    96: 4.97,
    128: 6.12,
    256: 7.03,
    384: 11.11,
    512: 12.31,
    768: 19.95,
    1024: 23.23,
}
H200_DRAFT = {1: 0.19, 96: 0.19, 128: 0.26, 512: 0.56, 1024: 1.06}
TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
SEEDS = [
    ("C1", None, False, 62.9),
    ("C2", None, True, 88.8),
    ("C3", 5, True, 86.7),
    ("C4", 2, True, 94.0),
    ("C7", 2, False, 75.9),
    ("C8", 5, False, 71.3),
]
CHAIN3 = {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def measured_goodput(spec: bool, bs: int, max_tokens: int) -> float:
    """Goodput of a real simulator process (h100-llama8b) at concurrency bs, by tuitune's client."""
    args = (
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
        ]
        if spec
        else []
    )
    with running_sim("--sim-machine", "h100-llama8b", "--sim-seed", str(bs), "--sim-draws", "quasi", *args) as url:
        run = asyncio.run(run_bench(BenchConfig(url, requests=1, warmup=1, max_tokens=max_tokens).at_level(bs)))
    return run.goodput()["tok_s"]


def err(sim: float, ref: float) -> float:
    return (sim - ref) / ref


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-only", action="store_true", help="skip the measurement through the simulator")
    ap.add_argument("--max-tokens", type=int, default=500)
    ns = ap.parse_args()
    worst = {"paper": 0.0, "h200": 0.0, "seeds": 0.0}

    print("1. EAGLE-3 paper, SGLang, H100, Llama-3.1-8B, chain length 3 vs no speculation (h100-llama8b)")
    print(
        f"{'bs':>4} {'paper':>7} {'model':>7} {'error':>7}"
        + ("" if ns.model_only else f" {'measured':>9} {'error':>7}")
    )
    ctx = 25 + ns.max_tokens / 2
    for bs, paper in PAPER.items():
        model = M.expected_goodput("h100-llama8b", {**CHAIN3, "context_tokens": ctx}, bs) / M.expected_goodput(
            "h100-llama8b", {"context_tokens": ctx}, bs
        )
        worst["paper"] = max(worst["paper"], abs(err(model, paper)))
        line = f"{bs:>4} {paper:>7.2f} {model:>7.2f} {err(model, paper):>+7.1%}"
        if not ns.model_only:
            meas = measured_goodput(True, bs, ns.max_tokens) / measured_goodput(False, bs, ns.max_tokens)
            worst["paper"] = max(worst["paper"], abs(err(meas, paper)))
            line += f" {meas:>9.2f} {err(meas, paper):>+7.1%}"
        print(line, flush=True)

    m = M.load_machine("h200-llama8b")
    print("\n2. H200 forward times, measured vs machine h200-llama8b (ms)")
    print(f"{'n':>5} {'target':>7} {'sim':>7} {'error':>7}   {'draft':>6} {'sim':>6} {'error':>7}")
    for n, ms in H200_TARGET.items():
        worst["h200"] = max(worst["h200"], abs(err(m.target(n), ms)))
        line = f"{n:>5} {ms:>7.2f} {m.target(n):>7.2f} {err(m.target(n), ms):>+7.1%}"
        if n in H200_DRAFT:
            d = H200_DRAFT[n]
            worst["h200"] = max(worst["h200"], abs(err(m.draft(n), d)))
            line += f"   {d:>6.2f} {m.draft(n):>6.2f} {err(m.draft(n), d):>+7.1%}"
        print(line)

    print("\n3. The seeds' box (seed-pcie8, the default), single stream, tok/s")
    seed = {"num_continuous_decode_steps": 4, "disable_custom_all_reduce": True, "tp_size": 8}
    for name, steps, tuned, tok in SEEDS:
        cfg = {**seed, "env": TUNED if tuned else {}, "algorithm": "EAGLE3" if steps else None, "num_steps": steps}
        g = M.expected_goodput(None, cfg, 1)
        worst["seeds"] = max(worst["seeds"], abs(err(g, tok)))
        print(f"{name:<3} {tok:>6.1f} {g:>6.1f} {err(g, tok):>+7.1%}")

    print(
        f"\nworst: paper {worst['paper']:.1%} (target 10%), H200 {worst['h200']:.1%} (target 12%), "
        f"seeds {worst['seeds']:.1%} (target 10%)"
    )
    ok = worst["paper"] <= 0.10 and worst["h200"] <= 0.12 and worst["seeds"] <= 0.10
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
