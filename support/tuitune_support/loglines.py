"""A busy server's log lines, made up (every kind tuitune reads, the probe's full lines, second or
millisecond stamps): benchmarks/bench_parse.py and bench_lines.py time the parser on them,
tests/measure/test_parse.py and tests/measure/test_parse_reference.py check it on them."""

from __future__ import annotations

import datetime
import random

WEIGHTS = {"profile": 30, "decode": 30, "prefill": 10, "http": 20, "other": 10}
OTHER = (
    "[{s} TP0] Cache flushed successfully! memory usage {n} tokens",
    "[{s} TP0] Receive: obj=GenerateReqInput(rid='{h}', text=None, input_ids=None)",
    '[{s}] INFO:     127.0.0.1:{p} - "GET /health HTTP/1.1" 200 OK',
)


def profile_line(rng: random.Random, s: str) -> str:
    """One window of 40 cycles as the probe logs it (format v2, every key it writes)."""
    bs = rng.choice((1, 2, 4, 8, 16, 24, 32, 48, 64))
    steps = 3
    tokens = steps + 1
    hist = [rng.randint(0, 40 * bs) for _ in range(tokens)]
    total = sum(hist) or 1
    accept = sum((i + 1) * k for i, k in enumerate(hist)) / total
    draft = rng.uniform(0.3, 1.2)
    verify = 6 + bs * rng.uniform(0.05, 0.12)
    extend = rng.uniform(0.1, 0.4)
    cycle = draft + verify + extend
    spread = sorted(verify * rng.uniform(0.9, 1.1) for _ in range(3))
    return (
        f"[{s} TP0] EAGLE3_PROFILE v=2 cycles=40 bs={bs} steps={steps} topk=1 draft_tokens={tokens} "
        f"verify_tokens={bs * tokens} draft_ms={draft:.3f} verify_ms={verify:.3f} extend_ms={extend:.3f} "
        f"cycle_ms={cycle:.3f} accept_len={accept:.3f} "
        f"accept_hist={','.join(f'{i + 1}:{k}' for i, k in enumerate(hist) if k)} "
        f"eff_tok_s={accept * bs / cycle * 1000:.2f} p50_verify_ms={spread[1]:.3f} "
        f"p90_verify_ms={spread[2]:.3f} max_verify_ms={spread[2] * 1.02:.3f} sync=event"
    )


def decode_line(rng: random.Random, s: str) -> str:
    running = rng.randint(1, 64)
    return (
        f"[{s} TP0] Decode batch, #running-req: {running}, #token: {running * rng.randint(200, 4000)}, "
        f"token usage: {rng.uniform(0, 0.9):.2f}, accept len: {rng.uniform(1.5, 3.9):.2f}, "
        f"accept rate: {rng.uniform(0.2, 0.95):.2f}, cuda graph: True, "
        f"gen throughput (token/s): {rng.uniform(80, 6000):.2f}, #queue-req: {rng.randint(0, 8)}"
    )


def prefill_line(rng: random.Random, s: str) -> str:
    return (
        f"[{s} TP0] Prefill batch, #new-seq: {rng.randint(1, 4)}, #new-token: {rng.randint(16, 8192)}, "
        f"#cached-token: {rng.randint(0, 4096)}, token usage: {rng.uniform(0, 0.9):.2f}, "
        f"#running-req: {rng.randint(0, 64)}, #queue-req: {rng.randint(0, 8)}, #pending-token: 0, "
        f"cuda graph: False, input throughput (token/s): {rng.uniform(1000, 90000):.2f}"
    )


def http_line(rng: random.Random, s: str) -> str:
    return f'[{s}] INFO:     127.0.0.1:{rng.randint(30000, 65000)} - "POST /generate HTTP/1.1" 200 OK'


def other_line(rng: random.Random, s: str) -> str:
    return rng.choice(OTHER).format(
        s=s, n=rng.randint(100, 60000), h=f"{rng.getrandbits(64):016x}", p=rng.randint(30000, 65000)
    )


MAKERS = {
    "profile": profile_line,
    "decode": decode_line,
    "prefill": prefill_line,
    "http": http_line,
    "other": other_line,
}


def build(path: str, n: int, seed: int = 1, ms: bool = False, per_s: int = 200, mix: dict | None = None) -> None:
    """The log: ``n`` lines, kinds drawn with the weights of ``mix`` (default WEIGHTS)."""
    rng = random.Random(seed)
    mix = mix or WEIGHTS
    kinds = list(mix)
    weights = [mix[k] for k in kinds]
    t0 = datetime.datetime(2026, 11, 29, 16, 2, 0)
    with open(path, "w") as f:
        for i in range(n):
            t = t0 + datetime.timedelta(seconds=i / (1000 if ms else per_s))
            stamp = t.strftime("%Y-%m-%d %H:%M:%S") + (f".{t.microsecond // 1000:03d}" if ms else "")
            f.write(MAKERS[rng.choices(kinds, weights)[0]](rng, stamp) + "\n")
