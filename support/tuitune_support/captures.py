"""Captures made on the simulator as tests/test_advise.py makes them (benchmarks/advise_extrapolation.py
takes the same): `python -m tuitune` from the checkout in a HOME of its own, and a single-stream
capture recorded by `tune --budget 0`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuitune import preset as P
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port


def tuitune(tmp: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "HOME": str(tmp)},
    )


def single_stream_capture(tmp: Path) -> Path:
    """One launch of the simulator's h100-llama8b (EAGLE-3, chain of 3) benchmarked at one stream
    only, recorded by `tune --budget 0` as a capture: the issue's single-stream case."""
    p = P.with_changes(
        P.resolve("sim-h100-llama8b-eagle3"),
        {
            "server.log": str(tmp / "sim.log"),
            "server.port": free_port(),
            "server.args.sim-speedup": 20,
            "server.args.sim-load-seconds": 0.2,
            "server.args.decode-log-interval": 10,
            "bench.requests": 4,
            "bench.warmup": 0,
            "bench.max_tokens": 120,
        },
    )
    preset = P.save(p, tmp / "h100.yaml")
    r = tuitune(
        tmp, "tune", str(preset), "--budget", "0", "--concurrency", "1", "--levels", "1", "--out", str(tmp / "o")
    )
    assert r.returncode == 0, r.stderr + r.stdout
    (capture,) = (tmp / "o" / "captures").glob("*.jsonl*")
    return capture
