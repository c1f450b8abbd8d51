"""How often an in-launch comparison calls two blocks of the same setting different (docs/switch.md,
issue 44: "in-launch A/A comparisons report a difference in at most 5 % of cases"): one launch prepared
to switch, then N runs of `tuitune sweep --live` over the preset's own step count alone, so that each
run has only its reference A and its A/A twin A' (the same step count, blocks interleaved in a drawn
order, a seed of their own), and each run's A/A verdict is read from its live.json. Printed: the
verdicts' counts, the share that said faster or slower, and that share's exact 95 % interval
(Clopper-Pearson).

World, by --engine: `vllm` the real vLLM CPU build (tuitune_support.real_vllm: the tiny random Llama,
EAGLE-3 K 2 with its random draft, prepared for K 1-3) on the machine it runs on; `sglang` the real
SGLang CPU build (tuitune_support.real_sglang: the same kind of tiny random Llama and draft, EAGLE-3
steps 2, adaptive with candidates 1-3, no CUDA graphs); `sim` tuitune's own simulator playing vLLM (a
world this project wrote: evidence about the design's arithmetic, not about an engine).

    python benchmarks/live_aa.py [--engine vllm|sglang|sim] [--runs 20] [--rounds 6] [--requests 3] [--max-tokens 64]
        [--first-seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

from tuitune_support.captures import tuitune
from tuitune_support.ports import free_port

HOME = Path(tempfile.mkdtemp(prefix="tuitune-live-aa-"))
STEPS, SWITCH = 2, [1, 2, 3]
KEYS = {"vllm": "speculative.num_speculative_tokens", "sim": "speculative.num_speculative_tokens"}
KEYS["sglang"] = "speculative.num_steps"
WORLDS = {
    "vllm": "the real vLLM CPU build, tiny random Llama, EAGLE-3 K 2 prepared for 1-3",
    "sglang": "the real SGLang CPU build, tiny random Llama, EAGLE-3 steps 2, adaptive with candidates 1-3",
    "sim": "tuitune's simulator playing vLLM (a world this project wrote)",
}


def preset(engine: str) -> Path:
    """The prepared preset's file (its step key: KEYS[engine])."""
    port = free_port()
    if engine == "sglang":
        from tuitune_support import real_sglang

        python, models = real_sglang.build()
        config = HOME / "adaptive.json"
        config.write_text(json.dumps({"1": {"candidate_steps": SWITCH}}))
        kw = {"python": python, "draft": models["eagle3"], "steps": STEPS, "args": {"disable-cuda-graph": True}}
        data = real_sglang.preset("aa", HOME / "aa.log", port, adaptive=config, switch=SWITCH, **kw)
    elif engine == "vllm":
        from tuitune_support import real_vllm

        python, _ = real_vllm.build()
        data = real_vllm.preset("aa", HOME / "aa.log", port, python=python, method="EAGLE3", k=STEPS)
        data["speculative"]["switch"] = SWITCH
    else:
        from tuitune_support.presets import vllm_sim_data

        data = vllm_sim_data(HOME, "aa", port, env={"VLLM_LOG_STATS_INTERVAL": "1"}, switch=SWITCH)
    path = HOME / "aa.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact interval of a binomial share k / n (bisection on the binomial tails, each rising in p)."""

    def tail(j: int, p: float) -> float:  # P(X >= j)
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(j, n + 1))

    def solve(j: int, target: float) -> float:  # the p where P(X >= j) = target
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if tail(j, mid) < target else (lo, mid)
        return (lo + hi) / 2

    a = (1 - level) / 2
    return (0.0 if k == 0 else solve(k, a)), (1.0 if k == n else solve(k + 1, 1 - a))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("vllm", "sglang", "sim"), default="vllm")
    ap.add_argument("--runs", type=int, default=20, help="live sweeps, each one A/A verdict (default 20)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds of each sweep (default 6, the live sweep's)")
    ap.add_argument("--first-seed", type=int, default=0, help="run i draws its order with seed FIRST+i (default 0)")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ns = ap.parse_args()
    path = preset(ns.engine)
    r = tuitune(HOME, "launch", str(path), timeout=900)
    if r.returncode != 0:
        sys.exit(f"the launch failed:\n{r.stdout}\n{r.stderr}")
    verdicts: Counter[str] = Counter()
    by_goodput = 0  # runs judged by goodput: a block whose outputs all came whole had no decode rate
    try:
        for i in range(ns.runs):
            out = HOME / f"run-{i}"
            args = ["sweep", str(path), "--live", "--grid", f"{KEYS[ns.engine]}={STEPS}", "--rounds", str(ns.rounds)]
            args += ["--seed", str(ns.first_seed + i), "--requests", str(ns.requests), "--warmup", "1"]
            args += ["--max-tokens", str(ns.max_tokens), "--out", str(out)]
            r = tuitune(HOME, *args, timeout=1800)
            if not (out / "live.json").exists():
                sys.exit(f"run {i} wrote no live.json:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            doc = json.loads((out / "live.json").read_text())
            aa = doc["aa"]
            verdicts[aa["verdict"]] += 1
            lo, hi = aa.get("ratio_ci") or [math.nan, math.nan]
            why = (doc["verdicts"].get("A'") or {}).get("metric_why")  # blocks without a decode rate
            by_goodput += bool(why)
            print(
                f"  run {i + 1:>2}: A/A {aa['verdict']} (A'/A interval {lo:.3f}-{hi:.3f})"
                + (f"; by goodput: {why}" if why else ""),
                flush=True,
            )
    finally:
        tuitune(HOME, "stop", str(path), timeout=300)
    n = sum(verdicts.values())
    wrong = verdicts["faster"] + verdicts["slower"]
    lo, hi = clopper_pearson(wrong, n)
    print(
        f"world: {WORLDS[ns.engine]}; {ns.rounds} rounds a run, {ns.requests} requests of {ns.max_tokens} tokens a block"
    )
    print(f"verdicts: {dict(verdicts)}; judged by goodput (blocks without a decode rate): {by_goodput} of {n}")
    print(f"A/A called different: {wrong} of {n} ({wrong / n:.1%}, 95% interval {lo:.1%}-{hi:.1%})")


if __name__ == "__main__":
    main()
