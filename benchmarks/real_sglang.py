"""Figures of the real SGLang CPU engine under tuitune (tuitune_support.real_sglang: sglang 0.5.18, the CPU kernels
built from ../shared/sglang-cpu/'s source, a tiny random Llama, hidden 384, 10 layers): the sizes on disk,
start-up per mode (tuitune's own `ready in`), and the probe's overhead (the same launch settings with
``profile: true`` and ``false``, alternated launch by launch, each launch's median decode rate of an
independent /generate client).

World: the machine it runs on (2 cores here; run it on a quiet machine and read the spread it prints).
Builds the engine first if needed (timed then).

    python benchmarks/real_sglang.py [--rounds N] [--only sizes,startup,overhead]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tuitune_support import real_sglang
from tuitune_support.clients import PROMPTS, generate
from tuitune_support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent


HOME = Path(tempfile.mkdtemp(prefix="tuitune-real-sglang-"))


def tt(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "HOME": str(HOME)},
    )


def write(name: str, port: int, **kw) -> Path:
    path = HOME / f"{name}.yaml"
    path.write_text(yaml.safe_dump(real_sglang.preset(name, HOME / f"{name}.log", port, **kw), sort_keys=False))
    return path


def launch(preset: Path) -> float:
    r = tt("launch", str(preset))
    if r.returncode != 0:
        sys.exit(f"launch of {preset.name} failed:\n{r.stdout}\n{r.stderr}")
    return float(re.search(r"ready in ([\d.]+)s", r.stdout).group(1))


def stop(preset: Path) -> None:
    tt("stop", str(preset), "--any", timeout=120)


def spread(v: list[float], unit: str) -> str:
    return f"median {statistics.median(v):.1f} {unit} (min {min(v):.1f}, max {max(v):.1f}, n={len(v)})"


def du(path: Path) -> str:
    return subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True).stdout.split()[0]


def sizes() -> None:
    print("== sizes on disk")
    wheel = real_sglang.kernel_wheel()
    print(f"  venv {real_sglang.HOME}: {du(real_sglang.HOME)}")
    print(f"  kernel wheel {wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB (build venv {du(real_sglang.BASE)})")
    print(f"  tiny models {real_sglang.MODELS}: {du(real_sglang.MODELS)}")


MODES = {
    "plain": {"method": None},
    "NGRAM (8 draft tokens)": {"method": "NGRAM", "draft_tokens": 8},
    "EAGLE3 chain (steps 2)": {"method": "EAGLE3", "steps": 2},
    "EAGLE3 tree (steps 3, topk 4, 8 tokens)": {"method": "EAGLE3", "steps": 3, "topk": 4, "draft_tokens": 8},
}


def startup(rounds: int) -> None:
    print(f"== start-up (tuitune launch's `ready in`: process start to SGLang's warm-up request done; {rounds} each)")
    for label, kw in MODES.items():
        p = write("startup", free_port(), **kw)
        times = []
        for _ in range(rounds):
            times.append(launch(p))
            stop(p)
        print(f"  {label:42s} {spread(times, 's')}")


def decode_rate(port: int, n: int, max_tokens: int) -> float:
    generate(port, PROMPTS[0], 16)
    return statistics.median(generate(port, PROMPTS[(1 + i) % len(PROMPTS)], max_tokens)["rate"] for i in range(n))


def overhead(rounds: int, n: int, max_tokens: int) -> None:
    port = free_port()
    on, off = write("probe-on", port, profile=True), write("probe-off", port, profile=False)
    got: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for arm in ("on", "off") if r % 2 == 0 else ("off", "on"):
            p = on if arm == "on" else off
            launch(p)
            try:
                got[arm].append(decode_rate(port, n, max_tokens))
            finally:
                stop(p)
    ratios = [a / b for a, b in zip(got["on"], got["off"], strict=True)]
    print(
        f"== the probe's overhead (EAGLE3 chain, steps 2; {rounds} launch pairs alternated, {n} requests of "
        f"{max_tokens} tokens each, an independent /generate client)"
    )
    print(f"  probe on   {spread(got['on'], 'tok/s')}")
    print(f"  probe off  {spread(got['off'], 'tok/s')}")
    print(f"  on / off by pair: {', '.join(f'{x:.3f}' for x in ratios)}; median {statistics.median(ratios):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--only", default="sizes,startup,overhead")
    ns = ap.parse_args()
    t0 = time.monotonic()
    try:
        real_sglang.build()
    except (real_sglang.NoSource, real_sglang.UnfitCpu, real_sglang.Unreachable) as e:
        sys.exit(f"the real SGLang engine cannot be built here: {e}")
    print(f"engine ready in {time.monotonic() - t0:.0f} s (0 when built before; a first build prints its own times)")
    only = set(ns.only.split(","))
    if "sizes" in only:
        sizes()
    if "startup" in only:
        startup(ns.rounds)
    if "overhead" in only:
        overhead(max(2, ns.rounds), ns.requests, ns.max_tokens)
    print(json.dumps({"home": str(HOME)}))


if __name__ == "__main__":
    main()
