"""`make bench`: every benchmark through one runner, grouped by purpose, each run kept as one record.

    python benchmarks/run.py                      every script that runs bare, in table order
    python benchmarks/run.py --group performance  one group (performance, accuracy, calibration, real-engine)
    python benchmarks/run.py bench_parse cli_startup    named scripts
    python benchmarks/run.py bench_parse -- --runs 5    one script, with its own arguments after --
    python benchmarks/run.py --list               the table: group, world, what a script needs

Each script prints its own figures; the runner adds the context a figure needs to be read: the
world it was measured in (the simulator, a real sshd on loopback, the real vLLM or SGLang CPU
engine, a CUDA GPU, or the source tree), the command, the commit, the host's load, the exit status
and the wall time. One JSON object per script run is appended to ``--out`` (default
``.cache/bench/records.jsonl``): ``name``, ``group``, ``world``, ``command``, ``commit``, ``when``,
``load``, ``exit``, ``seconds`` and ``figures`` (the lines it printed). A script that needs an
argument nobody can guess (a running server's preset, a folder of recorded launches) is not run
bare: the runner says what it needs and records it as ``not run``. A GPU script on a machine
without one says so itself and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

SIM = "the simulator (python -m tuitune.sim, simulated time) on this machine"
SSHD = "a real OpenSSH sshd on loopback and the simulator, on this machine"
HOST = "this machine (no server)"
VLLM = "the real vLLM CPU engine (tuitune_support.real_vllm) on this machine"
SGLANG = "the real SGLang CPU engine (tuitune_support.real_sglang) on this machine (needs AVX-512)"
GPU = "a CUDA GPU (the lent GPU machine); says so and skips elsewhere"


@dataclass(frozen=True)
class Bench:
    name: str
    group: str
    world: str
    needs: str = ""  # what must be passed to run it at all (empty: it runs bare)


TABLE = [
    # performance: tuitune's own speed and overheads
    Bench("cli_startup", "performance", HOST),
    Bench("bench_parse", "performance", HOST + "; a synthetic SGLang log"),
    Bench("bench_lines", "performance", HOST + "; a synthetic SGLang log"),
    Bench("bench_vllm", "performance", HOST + "; a synthetic vLLM log and /metrics page"),
    Bench("hostile_lines", "performance", HOST + "; adversarial lines, and a local session"),
    Bench("bench_capture", "performance", HOST + "; captures of the simulator"),
    Bench("control_latency", "performance", SSHD),
    Bench("ctrl_c_latency", "performance", SIM),
    Bench("exit_detection", "performance", SSHD),
    Bench("link_drops", "performance", SSHD),
    Bench("multinode_failover", "performance", SIM + " (two nodes)"),
    Bench("telemetry_overhead", "performance", SSHD + " (its simulated nvidia-smi)"),
    Bench("telemetry_size", "performance", SIM),
    Bench("tui_responsiveness", "performance", SIM),
    Bench("install_size", "performance", HOST + "; the package index"),
    Bench("house_figures", "performance", "the source tree"),
    # accuracy: how often a verdict or a prediction is right
    Bench("ab_power", "accuracy", "the A/B's statistics (no measurement)"),
    Bench("ab_accuracy", "accuracy", "a noise model of launch-to-launch spread (--world sim: the simulator)"),
    Bench("advisor_accuracy", "accuracy", SIM + " (random machines)"),
    Bench("advisor_worlds", "accuracy", "worlds written in the script, not tuitune's formulas"),
    Bench("advise_extrapolation", "accuracy", SIM),
    Bench("bench_client", "accuracy", SIM),
    Bench("bench_pairs", "accuracy", "the server of the preset given", needs="PRESET (a server that is up)"),
    Bench("bench_vs_server", "accuracy", "the server of the preset given", needs="PRESET (a server that is up)"),
    # calibration: the simulator against published and measured figures, and the GPU's own
    Bench("sim_calibration", "calibration", SIM + " against FACTS.md's seeds"),
    Bench("sim_batch_calibration", "calibration", SIM + " against published batch figures"),
    Bench("sim_batch_rate", "calibration", SIM),
    Bench("sim_concurrency", "calibration", SIM),
    Bench("forward_curve", "calibration", GPU),
    Bench("hbm_bandwidth", "calibration", GPU),
    Bench("nccl_decode_step", "calibration", GPU),
    Bench("probe_overhead", "calibration", GPU),
    # real-engine: tuitune against a real engine
    Bench("real_vllm", "real-engine", VLLM),
    Bench("vllm_startup", "real-engine", VLLM),
    Bench("vllm_cpu_preload", "real-engine", VLLM),
    Bench("real_engine_grid", "real-engine", VLLM),
    Bench("grid_control", "real-engine", VLLM + "; two launches, about ten minutes", needs="--run"),
    Bench("real_engine_launches", "real-engine", VLLM, needs="OUT (an empty or new folder)"),
    Bench("acceptance_fit", "real-engine", VLLM + "; launches recorded by real_engine_launches", needs="FOLDER"),
    Bench("real_draft_acceptance", "real-engine", VLLM + " serving SmolLM2 with the trained EAGLE-3 head"),
    Bench("dsd_compare", "real-engine", VLLM),
    Bench("switch_cost", "real-engine", VLLM + "; " + SGLANG + "; about 15 minutes"),
    Bench("tune_live", "real-engine", VLLM + " serving SmolLM2 with the trained EAGLE-3 head"),
    Bench(
        "live_aa",
        "real-engine",
        VLLM + " (--engine sglang: " + SGLANG + "; --engine sim: the simulator); one launch, 20 live sweeps",
    ),
    Bench("schedule_refits", "real-engine", VLLM),
    Bench("real_sglang", "real-engine", SGLANG),
]
GROUPS = ("performance", "accuracy", "calibration", "real-engine")
BY_NAME = {b.name: b for b in TABLE}


def scripts() -> list[str]:
    """Every benchmark script in the folder (this runner aside)."""
    return sorted(p.stem for p in HERE.glob("*.py") if p.name != Path(__file__).name)


@functools.cache
def commit() -> str | None:
    """The checkout's commit, asked of git once a run."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or None


GRACE_S = 20.0  # after the Ctrl-C, before SIGKILL


def kill_group(pid: int) -> None:
    """Ctrl-C the script's process group (its finally blocks stop the servers it started, which run in
    sessions of their own), then SIGKILL what is left of the group after GRACE_S."""
    for sig, wait in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # it ended
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def run_one(b: Bench, extra: list[str], timeout: float | None) -> dict:
    argv = [sys.executable, str(HERE / f"{b.name}.py"), *extra]
    shown = " ".join(["python", f"benchmarks/{b.name}.py", *extra])
    rec = {
        "name": b.name,
        "group": b.group,
        "world": b.world,
        "command": shown,
        "commit": commit(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load": round(os.getloadavg()[0], 2),
    }
    if b.needs and not extra:
        return rec | {"exit": None, "seconds": 0.0, "figures": [f"not run: needs {b.needs}"]}
    start = time.monotonic()
    lines: list[str] = []
    try:
        with subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        ) as p:
            assert p.stdout is not None
            stop = (
                threading.Timer(timeout, os.killpg, (p.pid, 9)) if timeout else None
            )  # silent or not, with its children
            if stop:
                stop.start()
            for line in p.stdout:  # shown as it comes: some scripts run for minutes
                print(f"  {line}", end="", flush=True)
                lines.append(line.rstrip("\n"))
            code = p.wait()
            if stop:
                stop.cancel()
                if time.monotonic() - start >= timeout:
                    lines.append(f"runner: stopped after {timeout:.0f} s")
    except OSError as e:
        lines.append(f"runner: could not start it: {e}")
        code = -1
    return rec | {"exit": code, "seconds": round(time.monotonic() - start, 1), "figures": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="scripts to run (default: every one of the groups chosen)")
    ap.add_argument("--group", action="append", choices=GROUPS, help="only this group (repeatable)")
    ap.add_argument("--list", action="store_true", help="print the table and exit")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "bench" / "records.jsonl")
    ap.add_argument("--timeout", type=float, default=None, help="stop a script after this many seconds")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: the script's own arguments
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    missing = sorted(set(scripts()) - set(BY_NAME))
    if missing:  # a new script is given a group and a world before it can be run
        print(f"run.py: not in the table: {', '.join(missing)}; add each with its group and world", file=sys.stderr)
        return 2
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        print(f"run.py: no benchmark named {', '.join(unknown)} (--list shows them)", file=sys.stderr)
        return 2
    chosen = [BY_NAME[n] for n in args.names] if args.names else TABLE
    if extra and len(chosen) != 1:
        print(f"run.py: arguments ({' '.join(extra)}) go to one script: name exactly one", file=sys.stderr)
        return 2
    if args.group:
        chosen = [b for b in chosen if b.group in args.group]
    if args.list:
        for b in chosen:
            need = f"  [needs {b.needs}]" if b.needs else ""
            print(f"{b.group:12} {b.name:22} {b.world}{need}")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    failed = []
    for b in chosen:
        print(f"== {b.name} ({b.group}; {b.world})", flush=True)
        rec = run_one(b, extra, args.timeout)
        if rec["exit"] is None:
            print(f"  {rec['figures'][0]}")
        elif rec["exit"] != 0:
            failed.append(b.name)
        with args.out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
    ran = sum(1 for b in chosen if not (b.needs and not extra))
    print(f"run.py: {ran} run, {len(chosen) - ran} not run, {len(failed)} failed; records appended to {args.out}")
    if failed:
        print(f"run.py: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
