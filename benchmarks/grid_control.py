"""The one-stream control of benchmarks/real_engine_grid.py, alone: two speculation-off servers of the
real vLLM CPU engine (tuitune_support.real_vllm), one stream, 128-token waves from the grid's independent
client; each server's waves alone (the other idle, then SIGSTOPped), then off against off paired
R X R X … as the grid pairs them, plain and with the idle server SIGSTOPped. World: the real engine
on the machine it runs on (read the load: other work on the cores widens every spread).

    python benchmarks/grid_control.py --run   (bare, as `make bench` runs it: says what it needs)
"""

import contextlib
import os
import signal
import statistics
import sys
from pathlib import Path

if "--run" not in sys.argv[1:]:  # two engine launches and ten minutes: asked for, never by default
    print(f"{Path(__file__).name}: not run: pass --run (two real-engine launches, about ten minutes)")
    sys.exit(0)

import real_engine_grid as G

from tuitune_support import real_vllm
from tuitune_support.ports import free_port

WAVES, PAIRS, TOKENS = 16, 12, 128


def summary(name: str, xs: list[float]) -> None:
    cv = statistics.pstdev(xs) / statistics.mean(xs)
    print(f"{name}: n={len(xs)} median {statistics.median(xs):.3f} cv {cv:.3f} min {min(xs):.3f} max {max(xs):.3f}")


def main() -> None:
    model = str(real_vllm.TARGET)
    ports = [free_port(), free_port()]
    paths = [G.write(f"ctl{i}", port, None, 0, f"ctl{i}.yaml", TOKENS) for i, port in enumerate(ports)]
    pgid: dict[int, int] = {}  # port -> the server's process group, once launched
    try:
        for port, path in zip(ports, paths, strict=True):
            r = G.tt("launch", str(path))
            if r.returncode != 0:
                sys.exit(f"launch failed:\n{r.stdout}\n{r.stderr}")
            pgid[port] = G.server_pgid(path)
        other = {ports[0]: ports[1], ports[1]: ports[0]}

        def stopped_beside(port: int, *args) -> float:
            """A wave on ``port`` with the other server SIGSTOPped (no idle CPU of its own)."""
            os.killpg(pgid[other[port]], signal.SIGSTOP)
            try:
                return G.wave(port, *args)
            finally:
                os.killpg(pgid[other[port]], signal.SIGCONT)

        G.wave(ports[1], model, 1, 16, 0, True)
        summary("X alone, the other server idle", [G.wave(ports[1], model, 1, TOKENS, j) for j in range(WAVES)])
        summary("X alone, the other SIGSTOPped", [stopped_beside(ports[1], model, 1, TOKENS, j) for j in range(WAVES)])
        for mode, one in (("plain", None), ("sigstop", stopped_beside)):
            ratios, refs = G.paired(ports[0], ports[1], model, 1, PAIRS, TOKENS, one)
            summary(f"off/off paired, {mode}", ratios)
            summary(f"  the reference's waves, {mode}", refs)
    finally:
        for port, path in zip(ports, paths, strict=True):
            if port in pgid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid[port], signal.SIGCONT)
            G.tt("stop", str(path), "--any", timeout=180)


if __name__ == "__main__":
    main()
