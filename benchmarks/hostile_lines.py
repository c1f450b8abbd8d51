"""Hostile log lines: parser errors over a hostile corpus, the cost of parsing and masking one
adversarial line, and how long a session tailing a log full of them holds its event loop.

First a corpus of hostile lines (default 1,000,000, seeded): every line format the parsers read
(EAGLE3_PROFILE, Decode/Prefill batch, vLLM's SpecDecoding metrics and stats line, NCCL), with one
to three of its numbers replaced by a hostile one (1e309, -inf, nan, 5000 digits, 1e309%…) or a
field cut short; the lines that end as "parser error: …" (an exception inside a parser) are
counted, the goal being 0, and ``parse_lines`` (the batch readers) must give the events
``parse_line`` gives. Then each line built to defeat a pattern of the parser, the tail or the
redaction (long runs of a marker, of separators, of a prefix), 1 MiB each: the worst time per line
is printed; each of them at 16 and 64 KiB, to show the cost grows linearly (about 4 times for 4
times the text; more than 8 is printed as super-linear); then a local session tails 5 MB of such
lines while a 10 ms ticker measures the longest gap of the event loop.

    python benchmarks/hostile_lines.py [--corpus 1000000] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import tempfile
import time
from pathlib import Path

from tuitune.base import redact
from tuitune.machine.session import Session
from tuitune.machine.tail import LogTail
from tuitune.measure.parse import parse_line, parse_lines, parse_many
from tuitune_support.presets import make_preset

ROOT = Path(__file__).resolve().parent.parent


def lines(n: int) -> dict[str, str]:
    return {
        "vllm": "SpecDecoding metrics: " + "a" * n,
        "per-position": "SpecDecoding metrics: Per-position acceptance rate: " + "0.5, " * (n // 5),
        "tail notices": "tail: " * (n // 6),
        "profile": "EAGLE3_PROFILE " + "x=1 " * (n // 4),
        "decode": "Decode batch, " + "a: " * (n // 3),
        "nccl": "NCCL INFO " * (n // 10),
        "prefixes": "[2026-01-01 00:00:00" * (n // 20),
        "flags": "--api-key " * (n // 10),
        "assignments": "HF_TOKEN=" * (n // 9),
        "json": '"api_key": "' * (n // 12),
        "profile-eq": "EAGLE3_PROFILE " + "=" * n,
        "profile-pairs": "[2026-11-29 16:02:00 TP0] EAGLE3_PROFILE " + "cycles=7 " * (n // 9),
        "decode-fields": "[2026-11-29 16:02:00 TP0] Decode batch, " + "#token: 1, " * (n // 11),
        "decode-colons": "Decode batch, " + ":" * n,
        "prefill-commas": "Prefill batch, " + ", " * (n // 2),
        "prefill-true": "Prefill batch, cuda graph: " + "True" * (n // 4),
        "errorish": "rror " * (n // 5),
    }


TEMPLATES = [
    "[2026-11-29 16:37:09 TP0] EAGLE3_PROFILE v=2 cycles=40 bs=8 steps=3 topk=1 draft_tokens=4 verify_tokens=32 "
    "draft_ms=0.600 verify_ms=5.100 extend_ms=0.200 other_ms=0.400 cycle_ms=6.300 accept_len=2.375 "
    "accept_hist=1:100,2:80,4:140 bs_hist=7:3,8:37 eff_tok_s=3015.87 sync=sim",
    "[2026-11-29 16:02:11.513 DP0 TP0] EAGLE3_PROFILE cycles=1 draft_ms=0.9 verify_ms=21.7 extend_ms=0.2 accept_len=2",
    "[2026-03-16 11:32:10 TP0] Decode batch [1234], #running-req: 8, #token: 5120, token usage: 0.03, "
    "accept len: 2.10, accept rate: 0.62, cuda graph: True, gen throughput (token/s): 812.40, #queue-req: 0",
    "[2026-03-16 11:32:09 TP0] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, input throughput (token/s): 524.34",
    "(EngineCore_DP0 pid=7) INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: 2.31, "
    "Accepted throughput: 41.20 tokens/s, Drafted throughput: 89.10 tokens/s, Accepted: 412 tokens, "
    "Drafted: 891 tokens, Per-position acceptance rate: 0.712, 0.455, 0.301, Avg Draft acceptance rate: 46.2%",
    "INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Draft acceptance rate: 46.2%, Accepted: 412 tokens, "
    "Drafted: 891 tokens",
    "(APIServer pid=1) INFO 05-01 12:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 12.5 tokens/s, "
    "Avg generation throughput: 150.2 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%, "
    "Prefix cache hit rate: 0.0%",
    "host:1:1 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..15}",
    "host:1:1 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.",
]
HOSTILE = ["1e309", "-1e309", "1e400", "inf", "-inf", "nan", "NaN", "-0", "1e-400", "9" * 5000, "9" * 400]
HOSTILE += ["1e309%", "inf%", "", "²", "0x10", "1_0", "+1e309", ".", "1e", "-"]
_NUM = re.compile(r"\d+(?:\.\d+)?")


def corpus(n: int, seed: int):
    """``n`` hostile lines: a format's numbers replaced by hostile ones, or the line cut short."""
    rng = random.Random(seed)
    spans = [[m.span() for m in _NUM.finditer(t)] for t in TEMPLATES]
    for _ in range(n):
        i = rng.randrange(len(TEMPLATES))
        line = TEMPLATES[i]
        for a, b in sorted(rng.sample(spans[i], min(len(spans[i]), rng.randint(1, 3))), reverse=True):
            line = line[:a] + rng.choice(HOSTILE) + line[b:]
        if rng.random() < 0.1:
            line = line[: rng.randrange(len(line) + 1)]
        yield line


def parser_errors(n: int, seed: int) -> None:
    t0 = time.perf_counter()
    errors: dict[str, int] = {}
    lines_ = list(corpus(n, seed))
    one = [parse_line(line) for line in lines_]
    for ev in one:
        if ev is not None and ev.kind == "malformed" and ev.marker == "?":
            errors[ev.reason] = errors.get(ev.reason, 0) + 1
    many = list(parse_lines(lines_))  # the batch readers, on the same lines (repr: NaN is NaN there)
    same = list(map(repr, many)) == [repr(ev) for ev in one if ev is not None]
    differ = "the same events" if same else "DIFFERENT events"
    took = time.perf_counter() - t0
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())) if errors else "none"
    print(
        f"hostile corpus: {n} lines (seed {seed}), {sum(errors.values())} parser errors ({kinds}); "
        f"parse_lines gives {differ}; {took:.1f} s"
    )


def per_line() -> None:
    mask = redact.Redactor()
    worst = (0.0, "")
    for name, line in lines(1024 * 1024).items():
        t0 = time.perf_counter()
        parse_line(line)
        parse_many([line, line])
        mask(line)
        data = line.encode() + b"\n"
        LogTail(None, "/x").feed(b"D %d\n" % len(data) + data)  # as the remote tailer frames it
        worst = max(worst, (time.perf_counter() - t0, name))
    print(f"worst 1 MiB line (parse_line + parse_many + mask + tail feed): {worst[0] * 1000:.1f} ms ({worst[1]})")


def _cpu(fn, runs: int = 7) -> float:
    best = float("inf")
    for _ in range(runs):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def linearity() -> None:
    """Each adversarial line at 16 KiB and at 64 KiB (the most of a line the parser reads): the
    cost of parsing it (one line, and batches of it) and masking it grows 4 times when linear."""
    small, big = lines(16 * 1024), lines(64 * 1024)
    mask = redact.Redactor()
    ratios = []
    for name in small:

        def work(line: str) -> None:
            parse_line(line)
            parse_many([line] * 8)
            mask(line)

        a = _cpu(lambda name=name: work(small[name]))
        b = _cpu(lambda name=name: work(big[name]))
        ratios.append((b / a if a > 0 else 0.0, name, b))
    ratios.sort(reverse=True)
    top = ", ".join(f"{name} {r:.1f}x" for r, name, _ in ratios[:3])
    print(
        f"64 KiB against 16 KiB (4x the text; CPU time, best of 7): worst {top}; slowest at 64 KiB "
        f"{max(b for *_, b in ratios) * 1000:.1f} ms"
    )
    if ratios[0][0] > 8:
        print("SUPER-LINEAR: some line costs more than twice what a linear reading would")


async def session_gap() -> None:
    tmp = Path(tempfile.mkdtemp())
    p = make_preset(tmp, "hostile")
    body = list(lines(80_000).values()) * 6
    Path(p.server.log).write_text(
        "\n".join(body) + "\n[2026-01-01 00:00:00] The server is fired up and ready to roll!\n"
    )
    session = Session(p, state_dir=str(tmp / "state"))
    got: list = []
    session.subscribe(got.extend)
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.ensure_future(ticker())
    t0 = time.monotonic()
    await session.follow()
    while not any(e.kind == "ready" for e in got):
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - t0
    tick.cancel()
    await session.close()
    gaps.sort()
    print(
        f"session tailing {sum(map(len, body)) / 1e6:.1f} MB of hostile lines: {elapsed:.2f} s; "
        f"event-loop gap p50 {gaps[len(gaps) // 2] * 1000:.0f} ms, max {gaps[-1] * 1000:.0f} ms"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", type=int, default=1_000_000, help="hostile lines to parse (default 1,000,000)")
    ap.add_argument("--seed", type=int, default=1)
    ns = ap.parse_args()
    parser_errors(ns.corpus, ns.seed)
    per_line()
    linearity()
    asyncio.run(session_gap())
