"""Hostile log lines: the cost of parsing and masking one adversarial line, and how long a session
tailing a log full of them holds its event loop.

Each line is built to defeat a pattern of the parser, the tail or the redaction (long runs of a
marker, of separators, of a prefix), 1 MiB each: the worst time per line is printed, then a local
session tails 5 MB of such lines while a 10 ms ticker measures the longest gap of the event loop.

    python benchmarks/hostile_lines.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import make_preset  # noqa: E402

from tuitune.base import redact  # noqa: E402
from tuitune.measure.parse import parse_line  # noqa: E402
from tuitune.target.session import Session  # noqa: E402
from tuitune.target.tail import LogTail  # noqa: E402


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
    }


def per_line() -> None:
    mask = redact.Redactor()
    worst = (0.0, "")
    for name, line in lines(1024 * 1024).items():
        t0 = time.perf_counter()
        parse_line(line)
        mask(line)
        data = line.encode() + b"\n"
        LogTail(None, "/x").feed(b"D %d\n" % len(data) + data)  # as the remote tailer frames it
        worst = max(worst, (time.perf_counter() - t0, name))
    print(f"worst 1 MiB line (parse + mask + tail feed): {worst[0] * 1000:.1f} ms ({worst[1]})")


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
    per_line()
    asyncio.run(session_gap())
