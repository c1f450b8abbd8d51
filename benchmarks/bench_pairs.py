"""`tuitune bench` against an independent client, one request at a time in turn.

    python benchmarks/bench_pairs.py PRESET [--pairs 12] [--max-tokens 128] [--url]

PRESET names a server that is up (an OpenAI-API server, such as the real vLLM CPU engine of
tuitune_support.real_vllm, launched with `tuitune launch PRESET`). Each pair is one `tuitune bench`
command measuring one request (after one warm-up, as bench's own) and tuitune_support.stream_client
(plain http.client, a process of its own) measuring the same prompt after the same warm-up, the
order flipping every pair, so that the machine's drift between the two is a few seconds at most.
Prints the median of the paired decode-rate ratios (tuitune / independent) and every ratio. With
--url, tuitune benchmarks the server's URL (no session: no log tail, /metrics scrape or liveness
watch beside the requests) instead of the preset.
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
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--url", action="store_true", help="bench the server's URL, not the preset")
    ns = ap.parse_args()
    if ns.preset is None:  # `make bench` runs every script bare: this one needs a server that is up
        print(f"{Path(__file__).name}: not run: it needs PRESET, a preset whose server is up (see its --help)")
        return
    from tuitune import preset as P

    p = P.load(ns.preset)
    port = p.server.port
    model = p.engine.served_model(p)
    prompts = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
    out = Path(tempfile.mkdtemp(prefix="bench-pairs-")) / "r.json"
    target = ["--url", f"http://127.0.0.1:{port}", "--api", "openai"] if ns.url else [str(ns.preset)]
    ratios = []
    for i in range(ns.pairs):
        got: dict[str, float | None] = {}
        for who in ("tuitune", "independent") if i % 2 == 0 else ("independent", "tuitune"):
            if who == "tuitune":
                cmd = [sys.executable, "-m", "tuitune", "bench", *target, "--requests", "1", "--warmup", "1"]
                cmd += ["--max-tokens", str(ns.max_tokens), "--json", str(out)]
                subprocess.run(cmd, cwd=ROOT, env=os.environ, capture_output=True, check=True)
                got[who] = json.loads(out.read_text())["results"][0]["decode_tok_s"]
            else:
                cmd = [sys.executable, "-m", "tuitune_support.stream_client", str(port), model]
                r = subprocess.run([*cmd, str(ns.max_tokens), prompts[0], prompts[1]], capture_output=True, text=True)
                got[who] = json.loads(r.stdout)[0][0] if r.returncode == 0 else None
        if got["tuitune"] and got["independent"]:
            ratios.append(got["tuitune"] / got["independent"])
    mode = "bench --url" if ns.url else "bench PRESET"
    print(f"{mode} / independent: median {statistics.median(ratios):.3f} over {len(ratios)} pairs")
    print("  pairs: " + " ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
