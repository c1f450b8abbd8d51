"""Does vLLM's CPU build speculate faster with Intel OpenMP preloaded? Its worker warns at start-up,
when speculation is on and ``libiomp`` is not in ``LD_PRELOAD``: "Speculative decoding on CPU without
Intel OpenMP in LD_PRELOAD will cause significant performance loss" (vLLM 0.32,
``vllm/v1/worker/cpu_worker.py``). The venv tuitune_support.real_vllm builds ships ``lib/libiomp5.so``.

World: the real vLLM 0.32.0 CPU build serving SmolLM2-135M-Instruct (tuitune_support.real_vllm) with the
suite's environment (``OMP_NUM_THREADS=1``), the EAGLE-3 head tuitune_support.real_draft trains (checkpoint
``final``), the code workload through the chat API, 96 tokens a request. Each configuration (off,
EAGLE-3 K=1, K=3) is launched by `tuitune launch` without and then with ``LD_PRELOAD`` set to that
library, and measured by benchmarks/real_engine_grid.py's own client: one warm-up request, four
one-stream waves (the median printed with each), two eight-stream waves.

    python benchmarks/vllm_cpu_preload.py [--draft final] [--ks 1,3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import real_engine_grid as G
import yaml

ROOT = Path(__file__).resolve().parent.parent


IOMP = G.real_vllm.HOME / "lib" / "libiomp5.so"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", choices=("early", "mid", "final"), default="final")
    ap.add_argument("--ks", default="1,3", help="EAGLE-3's K to measure beside off")
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    if not IOMP.is_file():
        sys.exit(f"{IOMP} is missing: build the engine first (python -m tuitune_support.real_vllm)")
    G.set_world("smollm2", "chat", a.draft, "1,3", ROOT / "tests" / "data" / "workloads" / "code.txt", eagle=True)
    print(f"world: {G.world_name()}")
    model = str(G.model_path())
    for preload in (None, IOMP):
        for method, k in [(None, 0)] + [("EAGLE3", k) for k in G.ks(a.ks)]:
            port = G.free_port()
            path = G.write("preload", port, method, k, "preload.yaml", a.max_tokens)
            data = yaml.safe_load(path.read_text())
            if preload:
                data["env"]["LD_PRELOAD"] = str(preload)
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            r = G.tt("launch", str(path))
            if r.returncode:
                sys.exit(f"launch failed:\n{r.stdout[-800:]}\n{r.stderr[-800:]}")
            try:
                G.wave(port, model, 1, a.max_tokens, warm_up=True)
                one = [G.wave(port, model, 1, a.max_tokens, first=i) for i in range(4)]
                eight = [G.wave(port, model, 8, a.max_tokens, first=i) for i in range(2)]
            finally:
                G.tt("stop", str(path), "--any", timeout=180)
            label = f"EAGLE-3 K={k}" if method else "off"
            print(
                f"  LD_PRELOAD {'libiomp5' if preload else 'unset':<8} {label:<12} "
                f"c=1 {statistics.median(one):5.1f} tok/s ({' '.join(f'{x:.1f}' for x in one)})   "
                f"c=8 {statistics.median(eight):5.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
