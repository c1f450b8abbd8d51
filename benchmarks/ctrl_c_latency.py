"""How long a headless command takes to end after Ctrl-C (SIGINT), against the simulator.

Issue 13 item 9: Ctrl-C during `--record --relaunch` or `--record --bench` must stop within 2 s
with a valid, closed capture; `launch` interrupted while the server starts must stop the
half-started server and exit 130. Each scenario runs the real command (`python -m tuitune`) on a
simulator preset, sends SIGINT at the moment named below, and times SIGINT -> process exit.

- record-relaunch: `--record OUT PRESET --relaunch`, 1 s into a 60 s model load
- record-bench:    `--record OUT PRESET --relaunch --bench 100000`, once the bench decodes
- launch:          `launch PRESET`, 1 s into a 60 s model load

    python benchmarks/ctrl_c_latency.py [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuitune import preset as P
from tuitune.measure.capture import read_capture
from tuitune_support.presets import make_preset
from tuitune_support.procs import group_alive, wait_for

ROOT = Path(__file__).resolve().parent.parent


SCENARIOS = {
    "record-relaunch": ({"sim-load-seconds": 60, "sim-speedup": 1}, ["--relaunch"]),
    "record-bench": ({}, ["--relaunch", "--bench", "100000"]),
    "launch": ({"sim-load-seconds": 60, "sim-speedup": 1}, []),
}


def one(tmp: Path, name: str, i: int) -> tuple[float, str | None]:
    """Seconds from SIGINT to exit, and what went wrong (None when all is well)."""
    args, extra = SCENARIOS[name]
    p = make_preset(tmp, f"{name}-{i}", args=args)
    path = P.save(p, tmp / f"{name}-{i}.yaml")
    out = tmp / f"{name}-{i}.jsonl"
    env = {**os.environ, "HOME": str(tmp)}
    cmd = ["launch", str(path)] if name == "launch" else ["--record", str(out), str(path), *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuitune", *cmd],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    state = tmp / ".cache" / "tuitune" / "servers" / f"{p.server.port}.json"
    try:
        wait_for(state.exists, 60, what="the server to start")
        if name == "record-bench":
            log = Path(p.server.log)
            wait_for(lambda: "Decode batch" in log.read_text(errors="replace"), 60, what="the bench to decode")
        else:
            time.sleep(1.0)
        pid = int(__import__("json").loads(state.read_text())["pid"])
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    problem = None
    if name == "launch":
        if proc.returncode != 130 or group_alive(pid):
            problem = f"exit {proc.returncode}, server {'alive' if group_alive(pid) else 'stopped'}: {err[-200:]}"
    else:
        cap = read_capture(out)
        if proc.returncode != 0 or cap.truncated or not cap.records:
            problem = f"exit {proc.returncode}, truncated={cap.truncated}, {len(cap.records)} records: {err[-200:]}"
    subprocess.run([sys.executable, "-m", "tuitune", "stop", str(path)], cwd=ROOT, env=env, capture_output=True)
    return took, problem


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    a = ap.parse_args()
    print(f"SIGINT -> exit, {a.runs} runs per scenario ({os.cpu_count()} CPUs)")
    for name in a.only or SCENARIOS:
        times, problems = [], []
        with tempfile.TemporaryDirectory() as d:
            for i in range(a.runs):
                took, problem = one(Path(d), name, i)
                times.append(took)
                if problem:
                    problems.append(problem)
        print(
            f"{name:16s} median {statistics.median(times):.2f} s  max {max(times):.2f} s  "
            f"min {min(times):.2f} s  problems {len(problems)}"
        )
        for pr in problems:
            print(f"    {pr}")


if __name__ == "__main__":
    main()
