"""`tuitune bench` and an independent client, each held against the server's own clock.

    python benchmarks/bench_vs_server.py PRESET [--rounds 2] [--requests 6] [--max-tokens 128]

PRESET names a vLLM server that is up (such as the real vLLM CPU engine of tuitune_support.real_vllm,
launched with `tuitune launch PRESET`). Each round runs a batch of `tuitune bench PRESET` (no
warm-up) and a batch of tuitune_support.stream_client (plain http.client, a process of its own) on the same
prompts, in turn A B B A. Around each batch it reads vLLM's `/metrics` (prometheus_client's parser,
not tuitune's scraper): the decode time of the batch's requests (request_decode_time_seconds, first
token to last) and their generated tokens less one a request. A client's decode rate over its batch
(its tokens after the first over its own spans) divided by vLLM's for the same requests is free of
the machine's drift, which swings the engine's speed up to 1.5x between batches on a 2-core box.
Prints each batch's ratio and each client's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", type=Path, nargs="?", help="a preset whose server is up")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ns = ap.parse_args()
    if ns.preset is None:  # `make bench` runs every script bare: this one needs a server that is up
        print(f"{Path(__file__).name}: not run: it needs PRESET, a preset whose server is up (see its --help)")
        return
    from tuitune import preset as P
    from tuitune_support.stream_client import server_decode_clock as server_clock

    p = P.load(ns.preset)
    port, model = p.server.port, p.engine.served_model(p)
    prompts = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
    prompts = [prompts[i % len(prompts)] for i in range(ns.requests)]
    out = Path(tempfile.mkdtemp(prefix="bench-vs-server-")) / "r.json"
    ratios: dict[str, list[float]] = {"tuitune bench PRESET": [], "independent": []}
    for rnd in range(ns.rounds):
        for who in list(ratios) if rnd % 2 == 0 else list(ratios)[::-1]:
            before = server_clock(port)
            if who == "independent":
                cmd = [sys.executable, "-m", "tuitune_support.stream_client", "--no-warmup", str(port), model]
                r = subprocess.run([*cmd, str(ns.max_tokens), *prompts], capture_output=True, text=True, check=True)
                got = json.loads(r.stdout)
                tokens, spans = sum(n - 1 for _, n, _ in got), sum(s for _, _, s in got)
            else:
                cmd = [sys.executable, "-m", "tuitune", "bench", str(ns.preset), "--requests", str(ns.requests)]
                cmd += ["--warmup", "0", "--max-tokens", str(ns.max_tokens), "--json", str(out)]
                subprocess.run(cmd, cwd=ROOT, env=os.environ, capture_output=True, check=True)
                got = json.loads(out.read_text())["results"]
                tokens = sum(x["completion_tokens"] - 1 for x in got)
                spans = sum(x["e2e_s"] - x["ttft_s"] for x in got)
            after = server_clock(port)
            server = (after[0] - before[0]) / (after[1] - before[1])
            ratios[who].append(tokens / spans / server)
            print(f"round {rnd + 1} {who}: {tokens / spans:.1f} tok/s, vLLM {server:.1f}: {ratios[who][-1]:.3f}")
    for who, xs in ratios.items():
        print(f"{who} / vLLM's clock: median {statistics.median(xs):.3f} over {len(xs)} batches")


if __name__ == "__main__":
    main()
