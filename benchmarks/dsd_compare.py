"""vLLM's dynamic schedule (``num_speculative_tokens_per_batch_size``) emitted by ``tuitune advise
--emit vllm-dsd``, against the alternatives, on the real vLLM CPU engine at a load that alternates
between 1 and 16 concurrent streams.

World: the real vLLM 0.32.0 CPU build (tests/real_vllm.py), a tiny random-weight Llama (hidden
512, 8 layers), ngram speculation (prompt lookup 1-3: a random model soon repeats itself, so ngram's
acceptance is real; EAGLE-3 with a random draft accepts nothing, so it cannot show a schedule's
worth), ``--enforce-eager``, one engine on the machine this runs on (on the project's 2-core
machines other work shares the cores: read the spread it prints).

1. The schedule: two servers (ngram K=3 and speculation off, ``profile: true``) benchmarked by
   ``tuitune bench`` at 1, 4 and 16 streams (4, 8 and 32 requests); ``tuitune advise K3 OFF --emit vllm-dsd FILE`` fits
   the cost model from their logs and writes the schedule.
2. The arms, each a fresh launch per round, rounds interleaved (order reversed every other round):
   (a) the emitted schedule (``speculative.dynamic_schedule: FILE``, num_speculative_tokens = its
   largest K); (b) static K = 1..4 (ngram, the same lookup), the best of which is "the best static
   K"; (c) vLLM's own defaults: its n-gram page's configuration (``num_speculative_tokens`` 5,
   ``prompt_lookup_max`` 4, nothing else: no schedule); (d) no speculation.
3. Each launch: a warm-up, then ``--cycles`` cycles of [1 stream: ``--single`` requests one after
   another; 16 streams: 2 requests each]. Goodput of a phase = completion tokens (the server's
   ``usage``) / the phase's wall time, measured by a plain HTTP client here (no tuitune code).
   Per arm: the median over launches of each launch's median phase goodput at 1 and at 16 streams,
   and of the whole alternating load (all tokens / all time); min-max over launches beside it.
4. The no-regret floor: the recommendation (a) is never more than 2 % below (d) at 1 or 16 streams.

    python benchmarks/dsd_compare.py [--rounds 3] [--cycles 3] [--single 4] [--max-tokens 96]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import real_vllm  # noqa: E402
import yaml  # noqa: E402
from conftest import free_port  # noqa: E402

from tuitune.engines import vllm as V  # noqa: E402

HOME = Path(tempfile.mkdtemp(prefix="tuitune-dsd-"))
PROMPTS = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())
LOOKUP = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
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
    data = real_vllm.preset(name, HOME / f"{name}.log", free_port(), method=None, profile=profile)
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


def measure(preset: Path, args, seed: int) -> dict:
    """One launch of ``preset`` under the alternating load."""
    took = launch(preset)
    port = port_of(preset)
    model = str(real_vllm.TARGET)
    try:
        phase(port, model, 1, 2, 32, seed)  # warm-up: both shapes once
        phase(port, model, 16, 1, 32, seed)
        out: dict = {"launch_s": took, "1": [], "16": [], "tokens": 0, "time": 0.0, "accept": {}}
        for cyc in range(args.cycles):
            for streams, per in ((1, args.single), (16, 2)):
                m0 = metrics(port)
                g, n, s = phase(port, model, streams, per, args.max_tokens, seed + 100 * cyc + streams)
                m1 = metrics(port)
                out[str(streams)].append(g)
                out["tokens"] += n
                out["time"] += s
                d, dt, acc = (b - a for a, b in zip(m0, m1, strict=True))
                a = out["accept"].setdefault(str(streams), [0.0, 0.0, 0.0])
                a[0], a[1], a[2] = a[0] + d, a[1] + dt, a[2] + acc
        return out
    finally:
        stop(preset)


# ---- the schedule ----------------------------------------------------------------------------------


def emit_schedule(args) -> tuple[Path, str]:
    """Two servers benchmarked at 1, 4 and 16 streams, then `advise --emit vllm-dsd` from their logs."""
    k3 = write("fit-k3", {"num_speculative_tokens": 3, **LOOKUP}, profile=True)
    off = write("fit-off", None, profile=True)
    try:
        for p in (k3, off):
            launch(p)
            for c, n in ((1, 4), (4, 8), (16, 32)):  # at least 2 requests a stream
                r = tt(
                    "bench", str(p), "--concurrency", str(c), "--requests", str(n), "--warmup", "1",
                    "--max-tokens", str(args.max_tokens),
                )  # fmt: skip
                if r.returncode != 0:
                    sys.exit(f"bench of {p.name} at {c} failed:\n{r.stdout}\n{r.stderr}")
        f = HOME / "dsd.json"
        r = tt("advise", str(k3), str(off), "--concurrency", "1,16", "--emit", "vllm-dsd", str(f))
        if r.returncode != 0:
            sys.exit(f"advise failed:\n{r.stdout}\n{r.stderr}")
        return f, r.stdout
    finally:
        stop(k3)
        stop(off)


def spread(v: list[float]) -> str:
    return f"{statistics.median(v):7.1f} ({min(v):.1f}-{max(v):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="launches of each arm (interleaved)")
    ap.add_argument("--cycles", type=int, default=3, help="1-stream / 16-stream cycles a launch")
    ap.add_argument("--single", type=int, default=4, help="requests of a 1-stream phase")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--ks", default="1,2,3,4", help="the static Ks compared")
    ap.add_argument("--schedule", help="use this schedule file instead of fitting and emitting one")
    args = ap.parse_args()
    real_vllm.build()
    print(f"world: the real vLLM {real_vllm.RELEASE} CPU build, tiny random Llama, ngram (lookup 1-3), "
          f"--enforce-eager, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at start)")  # fmt: skip
    if args.schedule:
        f, said = Path(args.schedule), ""
    else:
        f, said = emit_schedule(args)
    table = V.read_dsd(str(f))
    top = max(k for _, _, k in table)
    print(f"\n== the emitted schedule ({f}): {json.dumps([list(r) for r in table])}")
    for line in said.splitlines():
        if line.startswith(("  batch sizes", "  use it", "  speculation pays")) or "rest on extrapolation" in line:
            print(line)
    arms: dict[str, Path] = {}
    if top > 0:
        arms["(a) emitted schedule"] = write(
            "dsd", {"num_speculative_tokens": top, **LOOKUP, "dynamic_schedule": str(f)}
        )
    for k in (int(x) for x in args.ks.split(",")):
        arms[f"(b) static K={k}"] = write(f"k{k}", {"num_speculative_tokens": k, **LOOKUP})
    arms["(c) vLLM's defaults"] = write("defaults", {"num_speculative_tokens": 5, "prompt_lookup_max": 4})
    arms["(d) no speculation"] = write("off", None)
    results: dict[str, list[dict]] = {a: [] for a in arms}
    order = list(arms)
    for r in range(args.rounds):
        seq = order if r % 2 == 0 else order[::-1]
        for arm in seq:
            res = measure(arms[arm], args, seed=random.Random(r).randrange(1000))
            results[arm].append(res)
            print(
                f"  round {r + 1} {arm:24s} 1 stream {statistics.median(res['1']):7.1f}  16 streams "
                f"{statistics.median(res['16']):7.1f}  all {res['tokens'] / res['time']:7.1f} tok/s "
                f"(launch {res['launch_s']:.0f} s)",
                flush=True,
            )
    print(f"\n== goodput, tok/s: median over {args.rounds} launches (min-max); each launch's median phase")
    print(f"  {'arm':26s} {'1 stream':>22s} {'16 streams':>22s} {'alternating':>22s}  K at 1 / 16, accept len 1 / 16")
    summary: dict[str, dict[str, list[float]]] = {}
    for arm, rows in results.items():
        s = {
            "1": [statistics.median(x["1"]) for x in rows],
            "16": [statistics.median(x["16"]) for x in rows],
            "all": [x["tokens"] / x["time"] for x in rows],
        }
        summary[arm] = s
        acc = []
        for c in ("1", "16"):
            d = sum(x["accept"][c][0] for x in rows)
            a = sum(x["accept"][c][2] for x in rows)
            acc.append(f"{1 + a / d:.2f}" if d else "-")
        if arm.startswith("(a)"):
            ks = f"{V.dsd_k(table, 1, top)} / {V.dsd_k(table, 16, top)}"
        elif arm.startswith("(b)"):
            ks = f"{arm.split('=')[1]} / {arm.split('=')[1]}"
        elif arm.startswith("(c)"):
            ks = "5 / 5"
        else:
            ks = "off"
        print(
            f"  {arm:26s} {spread(s['1']):>22s} {spread(s['16']):>22s} {spread(s['all']):>22s}  {ks}, {' / '.join(acc)}"
        )
    static = [a for a in summary if a.startswith("(b)")]
    best = max(static, key=lambda a: statistics.median(summary[a]["all"]))
    off = summary["(d) no speculation"]
    print(f"\n  best static K at the alternating load: {best.split(' ', 1)[1]}")
    if "(a) emitted schedule" in summary:
        rec, rec_name = summary["(a) emitted schedule"], "the emitted schedule"
    else:
        rec, rec_name = off, "no speculation (the schedule drafts nothing anywhere)"
    print(f"== no-regret floor: {rec_name} against no speculation (never more than {FLOOR:.0%} below)")
    ok = True
    for c, label in (("1", "1 stream"), ("16", "16 streams"), ("all", "alternating")):
        ratio = statistics.median(rec[c]) / statistics.median(off[c])
        held = ratio >= 1 - FLOOR
        ok &= held or c == "all"
        print(f"  {label:12s} {ratio:6.3f} x no speculation: {'holds' if held else 'BROKEN'}")
    for name in ("(b) " + best.split(" ", 1)[1], "(c) vLLM's defaults"):
        s = summary[name]
        print(
            f"  for comparison, {name}: "
            + ", ".join(f"{statistics.median(s[c]) / statistics.median(off[c]):.3f}" for c in ("1", "16", "all"))
            + " x no speculation at 1, 16 streams, alternating"
        )
    print(f"the floor {'holds' if ok else 'is broken'} at every measured concurrency")


if __name__ == "__main__":
    main()
