"""vLLM figures: the parser on a vLLM log, and a /metrics page turned into a window.

The log mix resembles a busy vLLM server with tuitune's probe on: the stats and SpecDecoding lines
every interval are rare, so most lines are access-log and other noise with vLLM's prefix; the
probe's EAGLE3_PROFILE lines carry vLLM's prefix too. The /metrics page is built with
prometheus_client like vLLM's: the spec-decode counters (5 positions), and 40 histograms of 30
buckets standing in for vLLM's latency histograms (a real page is mostly those).

    taskset -c 0 python benchmarks/bench_vllm.py [--lines N]
"""

from __future__ import annotations

import argparse
import random
import time

from tuitune.engines import vllm as V
from tuitune.measure import promscrape
from tuitune.measure.parse import parse_line

PRE = "({p} pid=4242) INFO 11-30 09:{m:02d}:{s:02d} [{f}] "
SAMPLES = [
    (
        2,
        "APIServer",
        "loggers.py:257",
        "Engine 000: Avg prompt throughput: {a}.0 tokens/s, Avg generation throughput: "
        "9{a}.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.{a}%, "
        "Prefix cache hit rate: 0.0%",
    ),
    (
        2,
        "APIServer",
        "metrics.py:142",
        "SpecDecoding metrics: Mean acceptance length: 1.{a}, Accepted throughput: "
        "4{a}.20 tokens/s, Drafted throughput: 8{a}.10 tokens/s, Accepted: 4{a} tokens, "
        "Drafted: 8{a} tokens, Per-position acceptance rate: 0.6{a}, 0.3{a}, "
        "Avg Draft acceptance rate: 4{a}.2%",
    ),
    (
        30,
        "EngineCore_DP0",
        "gpu_model_runner.py:3906",
        "EAGLE3_PROFILE v=1 cycles=40 bs=1 steps=2 topk=1 "
        "draft_tokens=3 draft_ms=0.4{a} verify_ms=19.{a} extend_ms=0.000 "
        "cycle_ms=20.{a} accept_len=1.{a} sync=event",
    ),
    (50, "APIServer", "launcher.py:1", 'INFO:     127.0.0.1:{a}00 - "POST /v1/completions HTTP/1.1" 200 OK'),
    (16, "EngineCore_DP0", "core.py:1", "Added request cmpl-{a}{a}."),
]


def log_rate(n: int) -> tuple[float, int]:
    rng = random.Random(1)
    lines = []
    for i in range(n):
        _, proc, where, msg = rng.choices(SAMPLES, [w for w, *_ in SAMPLES])[0]
        lines.append(
            PRE.format(p=proc, m=i // 12000 % 60, s=i // 200 % 60, f=where) + msg.format(a=rng.randint(10, 99))
        )
    t0 = time.perf_counter()
    events = sum(1 for line in lines if parse_line(line) is not None)
    return n / (time.perf_counter() - t0), events


def page(k: int, scale: int) -> str:
    import prometheus_client as pc

    reg = pc.CollectorRegistry()
    lv = ["/shared/kimi-k2.5-int4", "0"]
    for name in (V.NUM_DRAFTS, V.NUM_DRAFT_TOKENS, V.NUM_ACCEPTED, V.GENERATION_TOKENS):
        pc.Counter(name, "doc", ["model_name", "engine"], registry=reg).labels(*lv).inc(1000 * scale)
    c = pc.Counter(V.ACCEPTED_PER_POS, "doc", ["model_name", "engine", "position"], registry=reg)
    for i in range(k):
        c.labels(*lv, str(i)).inc(scale * (600 - 100 * i))
    buckets = [0.001 * 2 ** (i / 2) for i in range(30)]
    for h in range(40):
        hist = pc.Histogram(
            f"vllm:latency_{h}_seconds", "doc", ["model_name", "engine"], buckets=buckets, registry=reg
        ).labels(*lv)
        for j in range(scale):
            hist.observe(0.01 * (j % 50))
    return pc.generate_latest(reg).decode()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=300_000)
    n = ap.parse_args().lines
    rate, events = log_rate(n)
    print(f"vLLM log, {n:,} lines ({events:,} events): parse_line {rate:,.0f} lines/s")
    a, b = page(5, 1), page(5, 2)
    s = promscrape.Scraper()
    reps = 50
    t0 = time.perf_counter()
    for i in range(reps):
        s.feed(a if i % 2 == 0 else b, float(i))
    per = (time.perf_counter() - t0) / reps
    print(
        f"/metrics page of {len(a.splitlines()):,} lines ({len(a) // 1024} KiB): {per * 1000:.2f} ms a scrape "
        f"(parse + window), {per / 2 * 100:.3f} % of a core at one scrape every 2 s"
    )


if __name__ == "__main__":
    main()
