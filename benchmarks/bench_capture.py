"""Captures: how fast events are written, how big a typical hour is, how fast `report` reads.

1. Writer throughput in isolation (1,000,000 parsed events, plain and gzip).
2. `tuitune --record` against the simulator at full speed (10x clock, a profile and a decode line
   every cycle, 2 concurrent streams): events written per second.
3. Capture size of a typical single-stream session: the simulator at real speed with SGLang's
   default --decode-log-interval 40, one stream of load, 30 s, extrapolated to an hour; with and
   without --raw, plain and gzip.
4. `tuitune report` on the 1,000,000-event capture.

    python benchmarks/bench_capture.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuitune import preset as P
from tuitune.measure.capture import CaptureWriter
from tuitune.measure.parse import parse_line
from tuitune_support.presets import make_preset

ROOT = Path(__file__).resolve().parent.parent


LINES = [
    "[2026-11-29 16:02:11 TP0] EAGLE3_PROFILE v=1 cycles=40 bs=1 steps=2 topk=1 draft_tokens=3 draft_ms=0.401 "
    "verify_ms=19.45 extend_ms=0.20 other_ms=0.05 cycle_ms=20.10 accept_len=1.92 eff_tok_s=95.5 sync=event",
    "[2026-11-29 16:02:11 TP0] Decode batch, #running-req: 1, #token: 186, token usage: 0.00, accept len: 1.92, "
    "accept rate: 0.46, cuda graph: True, gen throughput (token/s): 95.50, #queue-req: 0",
]


def tuitune(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tuitune", *args], check=True, cwd=ROOT, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        events = [parse_line(x) for x in LINES]
        for name in ("big.jsonl", "big.jsonl.gz"):
            w = CaptureWriter(tmp / name, {"preset": None})
            t0 = time.perf_counter()
            for _ in range(1000):
                w.write(events * 500)
            w.close()
            dt = time.perf_counter() - t0
            print(
                f"writer, 1,000,000 events to {name}: {1e6 / dt:,.0f} events/s, "
                f"{(tmp / name).stat().st_size / 1e6:.1f} MB"
            )
        dt = tuitune("report", str(tmp / "big.jsonl"), "--json")
        print(f"tuitune report on 1,000,000 events: {dt:.1f} s (plain)")
        dt = tuitune("report", str(tmp / "big.jsonl.gz"), "--json")
        print(f"tuitune report on 1,000,000 events: {dt:.1f} s (gzip)")

        fast = make_preset(
            tmp, "fast", args={"sim-speedup": 10, "decode-log-interval": 1, "sim-load-seconds": 0.3}, max_tokens=2000
        )
        path = P.save(fast, tmp / "fast.yaml")
        tuitune("--record", str(tmp / "fast.jsonl"), str(path), "--relaunch", "--load", "2", "--duration", "10")
        n = sum(1 for _ in open(tmp / "fast.jsonl")) - 1
        print(f"--record, simulator at full speed: {n / 10:,.0f} events/s written ({n:,} in 10 s)")
        tuitune("stop", str(path))

        typical = make_preset(
            tmp,
            "typical",
            args={"sim-speedup": 1, "decode-log-interval": 40, "sim-load-seconds": 1, "tp-size": 8},
            max_tokens=500,
        )
        path = P.save(typical, tmp / "typical.yaml")
        for raw, ext in ((False, "jsonl"), (True, "jsonl"), (False, "jsonl.gz"), (True, "jsonl.gz")):
            out = tmp / f"typical-{int(raw)}.{ext}"
            args = ["--record", str(out), str(path), "--load", "--duration", "30"] + (["--raw"] if raw else [])
            if raw is False and ext == "jsonl":
                args.insert(3, "--relaunch")
            tuitune(*args)
            size = out.stat().st_size
            print(
                f"typical single stream, {'with' if raw else 'without'} --raw, {ext}: "
                f"{size / 30 * 3600 / 1e6:.1f} MB per hour ({size / 1024:.0f} KiB in 30 s)"
            )
        tuitune("stop", str(path))


if __name__ == "__main__":
    main()
