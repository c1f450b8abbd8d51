"""Captures made on the simulator as tests/decide/test_advise.py makes them (benchmarks/advise_extrapolation.py
takes the same): `python -m tuitune` from the checkout in a HOME of its own, a single-stream
capture recorded by `tune --budget 0`, and the simulator's vLLM dialect's launches that `advise --emit
vllm-dsd` is fitted from (tests/engines/test_dsd.py, tests/real/test_dsd_real.py)."""

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


def sim_ngram(tmp: Path, name: str, k: int) -> Path:
    """The simulator's vLLM dialect serving ngram with K drafts (20x clock)."""
    data = {
        "name": name,
        "target": "local",
        "server": {
            "engine": "vllm",
            "python": sys.executable,
            "module": "tuitune.sim",
            "log": str(tmp / f"{name}.log"),
            "port": free_port(),
            "args": {"model": "/shared/m", "tensor-parallel-size": 2, "sim-load-seconds": 0.2, "sim-speedup": 20},
        },
        "env": {"VLLM_LOG_STATS_INTERVAL": "1"},
        "profile": True,
        "bench": {"requests": 4, "warmup": 0, "max_tokens": 120},
        "speculative": {
            "algorithm": "NGRAM",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        },
    }
    return P.save(P.from_dict(data), tmp / f"{name}.yaml")


def sim_captures(tmp: Path) -> list[str]:
    """Two launches of the simulator's vLLM (ngram K=3, then speculation off) benchmarked at 1, 4
    and 16 streams by `tune --budget 1`: the captures `advise` is fitted from."""
    out = tmp / "tune"
    r = tuitune(
        tmp, "tune", str(sim_ngram(tmp, "sv", 3)), "--budget", "1", "--concurrency", "4", "--levels", "1,4,16",
        "--out", str(out), "--ab-rounds", "1", "--no-verdict",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    caps = sorted(str(x) for x in (out / "captures").glob("launch-*"))
    assert len(caps) == 2, caps
    return caps
