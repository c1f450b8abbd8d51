"""The one-stream control of benchmarks/real_engine_grid.py, alone: two speculation-off servers of the
real vLLM CPU engine (tests/real_vllm.py), one stream, 128-token waves from the grid's independent
client; each server's waves alone (the other idle, then SIGSTOPped), then off against off paired
R X R X … as the grid pairs them, plain and with the idle server SIGSTOPped. World: the real engine
on the machine it runs on (read the load: other work on the cores widens every spread).

    python benchmarks/grid_control.py --run   (bare, as `make bench` runs it: says what it needs)
"""

import os
import signal
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
if "--run" not in sys.argv[1:]:  # two engine launches and ten minutes: asked for, never by default
    print(f"{Path(__file__).name}: not run: pass --run (two real-engine launches, about ten minutes)")
    sys.exit(0)

import real_engine_grid as G
import real_vllm
from conftest import free_port

model = str(real_vllm.TARGET)
ports = [free_port(), free_port()]
paths = [G.write(f"n{i}", p, None, 0, f"n{i}.yaml", 128) for i, p in enumerate(ports)]
for p in paths:
    r = G.tt("launch", str(p))
    print(p.name, r.returncode, r.stdout.strip().splitlines()[-1:], flush=True)
pg = [G.server_pgid(p) for p in paths]


def stop(i):
    os.killpg(pg[i], signal.SIGSTOP)


def cont(i):
    os.killpg(pg[i], signal.SIGCONT)


def cv(xs):
    return statistics.pstdev(xs) / statistics.mean(xs)


def summary(name, xs):
    xs2 = sorted(xs)
    print(
        f"{name}: n={len(xs)} median {statistics.median(xs):.3f} cv {cv(xs):.3f} min {xs2[0]:.3f} max {xs2[-1]:.3f}",
        flush=True,
    )


try:
    for i in (0, 1):
        G.wave(ports[i], model, 1, 16)
    a = [G.wave(ports[1], model, 1, 128, j) for j in range(16)]
    summary("X alone, ref idle running", a)
    stop(0)
    b = [G.wave(ports[1], model, 1, 128, j) for j in range(16)]
    cont(0)
    summary("X alone, ref SIGSTOPped", b)
    for mode in ("plain", "sigstop"):
        ratios = []

        def w(i, first, mode=mode):
            if mode == "sigstop":
                stop(1 - i)
            try:
                return G.wave(ports[i], model, 1, 128, first)
            finally:
                if mode == "sigstop":
                    cont(1 - i)

        refs = [w(0, 0)]
        for j in range(12):
            x = w(1, j + 1)
            refs.append(w(0, j + 1))
            ratios.append(2 * x / (refs[-2] + refs[-1]))
        summary(f"off/off paired {mode}", ratios)
        summary(f"  ref waves {mode}", refs)
finally:
    for i in (0, 1):
        try:
            cont(i)
        except Exception:
            pass
    for p in paths:
        G.tt("stop", str(p), "--any", timeout=180)
