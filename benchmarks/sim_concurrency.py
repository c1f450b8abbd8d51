"""Does the live simulator follow its own model at high concurrency? Spec vs no-spec at N streams.

For each of no speculation and EAGLE-3 chain 3 (num_steps 3, topk 1, 4 draft tokens) on a machine
file, a simulator process is started and N streams send requests back to back through a client
written here on plain aiohttp (none of tuitune's client). Over a steady window after a warm-up it
takes three goodputs (output tok/s of all streams together), each in simulated time:

- ``model``:   the model's steady state, N requests decoding as one batch (``expected_goodput``);
- ``did``:     the tokens the simulator produced in the window / the modelled time of the work it did
               (its decode cycles at the batch sizes it really had, plus the prefills of the requests
               that arrived: ``model_busy_s`` of /server_info). What the model says of that workload;
- ``client``:  the tokens the client received in the window / the window's wall time.

``did / model`` is the workload: new requests' prefills interrupt the batch (more often with
speculation, which finishes requests sooner) and a stream is out of the batch between its request's
end and the next one's prefill. ``client / did`` is the process: below 1 when the host cannot run the
cycles as fast as the model times them (``lag``: the simulator's wall-busy / model-busy - 1, from its
own counters). The spec/no-spec ratio is printed for each.

    python benchmarks/sim_concurrency.py [--machine h100-llama8b] [--streams 32] [--speedup 0.2]
        [--max-tokens 200] [--seconds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import aiohttp

from tuitune.sim import model as M
from tuitune_support.simproc import running_sim

CHAIN3 = ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"]
CHAIN3 += ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
PROMPT = "Summarise the history of the printing press in a few paragraphs please."  # ~15 tokens


async def sim_counters(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/server_info") as r:
        info = await r.json()
    return info["sim"]


async def measure(url: str, streams: int, max_tokens: int, warmup_s: float, window_s: float) -> dict:
    """Tokens received per stream over the window (wall), and the simulator's counters around it."""
    received = 0  # completion tokens received by all streams so far
    stop = False

    async def stream(session: aiohttp.ClientSession) -> None:
        nonlocal received
        body = json.dumps({"text": PROMPT, "sampling_params": {"max_new_tokens": max_tokens}, "stream": True})
        while not stop:
            seen = 0
            async with session.post(url + "/generate", data=body, headers={"Content-Type": "application/json"}) as r:
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        n = json.loads(line[6:])["meta_info"]["completion_tokens"]
                        received += n - seen
                        seen = n

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.ensure_future(stream(session)) for _ in range(streams)]
        await asyncio.sleep(warmup_s)
        before, t0, r0 = await sim_counters(session, url), time.perf_counter(), received
        await asyncio.sleep(window_s)
        after, t1, r1 = await sim_counters(session, url), time.perf_counter(), received
        stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    d = {k: after[k] - before[k] for k in ("model_busy_s", "prefill_busy_s", "wall_busy_s", "cycles", "cycles_late")}
    d["server_tokens"] = after["tokens"] - before["tokens"]
    d["client_tokens"] = r1 - r0
    d["window_s"] = t1 - t0
    return d


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", default="h100-llama8b")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--speedup", type=float, default=0.2, help="--sim-speedup (0.2: five times slower than modelled)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=12.0, help="the measured window (after a 3 s warm-up)")
    ns = ap.parse_args()
    print(
        f"{ns.machine}, {ns.streams} streams, {ns.max_tokens} tokens a request, --sim-speedup {ns.speedup:g}, "
        f"a {ns.seconds:g} s window; goodputs in simulated tok/s"
    )
    print(
        f"{'config':>8} {'model':>8} {'did':>8} {'client':>8} {'did/model':>9} {'client/did':>10} "
        f"{'prefill':>7} {'lag':>6} {'late cycles':>11}"
    )
    rows = {}
    for name, args, cfg in (
        ("no-spec", [], {"algorithm": None}),
        ("eagle3", CHAIN3, {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}),
    ):
        sim = ("--sim-machine", ns.machine, "--sim-speedup", str(ns.speedup), "--decode-log-interval", "40", *args)
        with running_sim(*sim) as url:
            d = asyncio.run(measure(url, ns.streams, ns.max_tokens, 3.0, ns.seconds))
        context = len(PROMPT.split()) * 1.3 + ns.max_tokens / 2
        model = M.expected_goodput(ns.machine, {**cfg, "context_tokens": context}, ns.streams)
        did = d["server_tokens"] / (d["model_busy_s"] * ns.speedup) if d["model_busy_s"] else 0.0
        client = d["client_tokens"] / (d["window_s"] * ns.speedup)
        lag = d["wall_busy_s"] / d["model_busy_s"] - 1 if d["model_busy_s"] else 0.0
        rows[name] = (model, did, client)
        print(
            f"{name:>8} {model:>8.0f} {did:>8.0f} {client:>8.0f} {did / model:>9.1%} {client / max(did, 1e-9):>10.1%} "
            f"{d['prefill_busy_s'] / max(d['model_busy_s'], 1e-9):>7.1%} {lag:>6.1%} "
            f"{d['cycles_late'] / max(1, d['cycles']):>11.1%}",
            flush=True,
        )
    ratios = [rows["eagle3"][i] / rows["no-spec"][i] for i in range(3)]
    print(f"\nspec / no-spec: model {ratios[0]:.2f}, did {ratios[1]:.2f}, client {ratios[2]:.2f}")
    print(
        f"client vs model: {ratios[2] / ratios[0]:.1%}; client vs what the simulator did: {ratios[2] / ratios[1]:.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
