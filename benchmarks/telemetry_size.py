"""What GPU telemetry adds to a capture: bytes an hour, plain and gzip.

`tuitune --record OUT PRESET --relaunch --load --duration S` against the simulator (real speed,
TP 8, one stream of load) with the simulator's nvidia-smi as the preset's telemetry command
(8 GPUs, sampled every 500 ms, busy while the server has requests), captures kept at the default
rate (``telemetry.record_every_s`` 1 s: whole ticks of 8 samples). The capture's `gpu` records are
counted and measured, plain, and what they add to the capture gzip-compressed at the capture
writer's level (6: the compressed capture with them less without), and scaled to an hour at the
rate the capture kept ticks (its own clock); the whole capture's size is printed beside them.

    python benchmarks/telemetry_size.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tuitune import preset as P
from tuitune_support.presets import make_preset

ROOT = Path(__file__).resolve().parent.parent


def tuitune(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tuitune", *args], check=True, cwd=ROOT, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        p = make_preset(
            tmp,
            "telemetry",
            args={"sim-speedup": 1, "decode-log-interval": 40, "sim-load-seconds": 1, "tp-size": 8},
            max_tokens=500,
        )
        p = P.with_changes(
            p, {"telemetry.command": "{python} -m tuitune.sim.nvidia_smi --sim-port {port} --sim-gpus 8"}
        )
        path = P.save(p, tmp / "telemetry.yaml")
        out = tmp / "capture.jsonl"
        try:
            tuitune("--record", str(out), str(path), "--relaunch", "--load", "--duration", str(ns.seconds))
        finally:
            tuitune("stop", str(path))
        lines = out.read_bytes().splitlines(keepends=True)
        records = [json.loads(x) for x in lines]
        gpu = [x for x, r in zip(lines, records, strict=True) if r.get("kind") == "gpu"]
        stamps = sorted({(r["seq"], r["m"]) for r in records if r.get("kind") == "gpu"})
        if len(stamps) < 3:
            raise SystemExit("the capture holds fewer than 3 telemetry ticks: telemetry did not run")
        ticks = len({seq for seq, _ in stamps})
        span = stamps[-1][1] - stamps[0][1]
        per_s = (ticks - 1) / span  # ticks kept a second, from the capture's own clock
        plain = sum(map(len, gpu))
        # gzip: what the gpu records add to the compressed capture (the capture with them, less without)
        rest = [x for x, r in zip(lines, records, strict=True) if r.get("kind") != "gpu"]
        packed = len(gzip.compress(b"".join(lines), compresslevel=6)) - len(
            gzip.compress(b"".join(rest), compresslevel=6)
        )
        hour = 3600 * per_s / ticks  # (bytes of a tick) x (ticks an hour)
        total = sum(map(len, lines))
    print(
        f"{ns.seconds:.0f} s recorded: {len(gpu)} gpu records in {ticks} ticks over {span:.0f} s "
        f"({per_s:.2f} ticks a second, {len(gpu) / ticks:.0f} GPUs a tick, {plain / len(gpu):.0f} bytes a record)"
    )
    print(
        f"telemetry in a capture: {plain * hour / 3600 / 1e3:.1f} KB/s = {plain * hour / 1e6:.1f} MB/h plain, "
        f"{packed * hour / 1e6:.2f} MB/h gzip"
    )
    print(f"the whole capture, {ns.seconds:.0f} s: {total / 1e3:.0f} KB plain ({len(lines)} records)")


if __name__ == "__main__":
    main()
