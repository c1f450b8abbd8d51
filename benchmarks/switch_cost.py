"""The cost of being prepared to switch (docs/switch.md, issue 44): one step count measured in a launch
prepared to switch and held there (``speculative.switch``, `tuitune hold`), against the same step count
in a launch of its own (static), launch pairs alternated (A B, B A, ...), each launch benchmarked by
`tuitune bench` on the same prompts. The verdict is `ab`'s (each launch one sample).

What "prepared" changes, per engine:
- vLLM: ``num_speculative_tokens`` at the largest K of the switch (3) with a schedule of the preset's K
  (2) at every batch size, held at 2; static: K 2, no schedule.
- SGLang: ``--speculative-adaptive`` with candidate steps 1-3, held at steps 2 (its runtime states for
  1 and 3 built too); static: steps 2. Both with ``--disable-cuda-graph`` (the adaptive runtime needs it
  on a CPU; the static arm gets it too, so that only the preparation differs).

World: the real engines' CPU builds on the machine it runs on (tuitune_support.real_vllm and
real_sglang, their tiny random Llama and EAGLE-3 draft: real costs, acceptance 1.00). Run it on a quiet
machine; the launch-to-launch spread it prints bounds what it can resolve.

    python benchmarks/switch_cost.py [--engine vllm,sglang] [--rounds N] [--requests N] [--max-tokens N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tuitune.experiments.ab import verdict
from tuitune_support.captures import tuitune
from tuitune_support.ports import free_port

HOME = Path(tempfile.mkdtemp(prefix="tuitune-switch-cost-"))
STEPS, SWITCH = 2, [1, 2, 3]


def tt(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`tuitune ARGS` with this run's own HOME (its state never meets another run's)."""
    return tuitune(HOME, *args, timeout=timeout)


def presets(engine: str, port: int) -> tuple[Path, Path]:
    """(static, prepared) preset files of one engine on one port."""
    if engine == "vllm":
        from tuitune_support import real_vllm

        python, _ = real_vllm.build()
        static = real_vllm.preset("static", HOME / "vllm.log", port, python=python, method="EAGLE3", k=STEPS)
        prepared = real_vllm.preset("prepared", HOME / "vllm.log", port, python=python, method="EAGLE3", k=STEPS)
        prepared["speculative"]["switch"] = SWITCH
    else:
        from tuitune_support import real_sglang

        python, models = real_sglang.build()
        config = HOME / "adaptive.json"
        config.write_text(json.dumps({"1": {"candidate_steps": SWITCH}}))
        kw = {"python": python, "draft": models["eagle3"], "steps": STEPS, "args": {"disable-cuda-graph": True}}
        static = real_sglang.preset("static", HOME / "sglang.log", port, **kw)
        prepared = real_sglang.preset("prepared", HOME / "sglang.log", port, adaptive=config, switch=SWITCH, **kw)
    out = []
    for data in (static, prepared):
        path = HOME / f"{engine}-{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(path)
    return out[0], out[1]


def measure(preset: Path, held: bool, requests: int, max_tokens: int) -> dict:
    """Launch, hold (prepared), bench, stop: the bench's JSON."""
    r = tt("launch", str(preset))
    if r.returncode != 0:
        sys.exit(f"launch of {preset.name} failed:\n{r.stdout}\n{r.stderr}")
    try:
        if held:
            r = tt("hold", str(preset), str(STEPS), timeout=120)
            if r.returncode != 0:
                sys.exit(f"hold on {preset.name} failed:\n{r.stdout}\n{r.stderr}")
        out = HOME / "bench.json"
        r = tt(
            *("bench", str(preset), "--requests", str(requests), "--warmup", "2"),
            *("--max-tokens", str(max_tokens), "--json", str(out)),
        )
        if r.returncode != 0:
            sys.exit(f"bench of {preset.name} failed:\n{r.stdout}\n{r.stderr}")
        return json.loads(out.read_text())
    finally:
        tt("stop", str(preset), "--any", timeout=120)


def row(doc: dict, arm: str, r: int, name: str) -> dict:
    s = doc.get("summary") or doc
    tok = s.get("tok_s") or {}
    return {
        "arm": arm,
        "round": r,
        "preset": name,
        "median_tok_s": tok.get("median"),
        "failed": s.get("failed", 0),
        "errors": s.get("errors", []),
        "concurrency": 1,
        "workload": s.get("workload"),
        "server": None,
        "gpu_note": None,
    }


def run(engine: str, rounds: int, requests: int, max_tokens: int) -> None:
    static, prepared = presets(engine, free_port())
    rows: list[dict] = []
    for r in range(1, rounds + 1):
        arms = [("A", static, False), ("B", prepared, True)]
        for arm, p, held in arms if r % 2 else arms[::-1]:
            rows.append(row(measure(p, held, requests, max_tokens), arm, r, p.stem))
            print(f"  round {r} {arm} {p.stem}: {rows[-1]['median_tok_s']:.2f} tok/s", flush=True)
    a = [x["median_tok_s"] for x in rows if x["arm"] == "A"]
    b = [x["median_tok_s"] for x in rows if x["arm"] == "B"]
    v = verdict(rows, 0.01, rounds >= 4, bootstrap=False)
    pairs = [y / x for x, y in zip(a, b, strict=True)]
    print(
        f"== {engine}: steps {STEPS} prepared to switch {SWITCH} and held, against static steps {STEPS} "
        f"({rounds} launch pairs alternated, {requests} requests of {max_tokens} tokens each, tuitune bench)"
    )
    print(f"  static    median {statistics.median(a):.2f} tok/s (min {min(a):.2f}, max {max(a):.2f})")
    print(f"  prepared  median {statistics.median(b):.2f} tok/s (min {min(b):.2f}, max {max(b):.2f})")
    print(f"  prepared / static by pair: {', '.join(f'{x:.3f}' for x in pairs)}; median {statistics.median(pairs):.3f}")
    lo, hi = v.get("ratio_ci") or (float("nan"), float("nan"))
    print(f"  verdict: {v.get('verdict')} (B/A {v.get('shift', float('nan')):.3f}, interval {lo:.3f}-{hi:.3f})")
    if hi < 0.98:
        print("  the cost is above 2 %: an answer found in one launch is to be confirmed by a static launch")
    elif lo > 0.98:
        print("  the cost is below 2 % (the interval's low end is above 0.98)")
    else:
        print("  whether the cost is above 2 % is not resolved (the interval reaches below 0.98): more rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="vllm,sglang")
    ap.add_argument("--rounds", type=int, default=4, help="launch pairs per engine (default 4: a verdict needs 4)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ns = ap.parse_args()
    for engine in ns.engine.split(","):
        run(engine.strip(), ns.rounds, ns.requests, ns.max_tokens)


if __name__ == "__main__":
    main()
