"""The probe's cost on a GPU: a synthetic EAGLE-shaped workload under no probe, sync=event and
sync=host, and its phase times against torch.profiler's kernel times.

The workload lives in a stand-in SGLang tree (module, class and method names of SGLang's v2
worker), so the probe patches it exactly as it patches SGLang. Its phases have the shapes and the
sizes the seeds measured (FACTS.md: draft about 0.2 ms a step, extend about 0.2 ms, verify far
larger): a draft-model pass is one decoder-layer-like block plus an LM head (7168 -> 7168 ->
14336 -> 7168 -> 32000, bf16, four memory-bound matmuls, about 1 GB of weights); draft = `steps`
passes over one token, extend = one pass over the 3 verified tokens, verify = 48 large matmuls
(3 × 7168 by 7168 × 14336, about 10 GB of weights read, memory bound like a real verify). Accept
lengths come back as a GPU tensor, as SGLang's do. Cycle time = wall time of 400 cycles / 400
(one synchronize at the end). `--tiny-extend` makes extend a single 7168 × 7168 matmul (about
25 µs) instead, the first version of this workload: there the fixed few microseconds between a
CUDA event and the kernel it brackets, which the profiler's kernel time leaves out, are a large
share of the phase. It also counts the device operations the accept-length bookkeeping dispatches
in one verify (the per-cycle cost the histogram adds). `--probe DIR` takes the probe's files from
DIR instead of tuitune/probe (an older version, to measure before and after); `--rounds N`
interleaved rounds (default 3; the median is shown). Needs CUDA; run it on the GPU machine.

    python benchmarks/probe_overhead.py [--tiny-extend] [--probe DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from tuitune.probe import FILES
from tuitune_support.fake_sglang import make_tree
from tuitune_support.probe_bench import GPU_WORK, HARNESS, run

ROOT = Path(__file__).resolve().parent.parent


def hot_path_ops(probe_dir: Path, torch) -> list[str]:
    """The device operations (views excluded: they launch nothing) one verify's accept-length
    bookkeeping dispatches, after a first call set things up: the histogram's cost a cycle."""
    from torch.utils._python_dispatch import TorchDispatchMode

    spec = importlib.util.spec_from_file_location("eagle3_probe_counted", probe_dir / "eagle3_probe.py")
    ep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ep)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.ops.append(str(func).removeprefix("aten.").removesuffix(".default"))
            return func(*args, **(kwargs or {}))

    class Worker:
        tp_rank = 0

    class Result:
        accept_lens = torch.full((1,), 2, dtype=torch.int32, device="cuda")

    rec = ep.Recorder(40, "event")
    rec._setup(Worker())
    rec._accept(Result())
    with Count() as counted:
        rec._accept(Result())
    return counted.ops


def main() -> None:
    ap = argparse.ArgumentParser(description="the probe's cost on a GPU")
    ap.add_argument("--tiny-extend", action="store_true", help="extend = one small matmul")
    ap.add_argument(
        "--probe", type=Path, default=ROOT / "tuitune" / "probe", help="the probe's files (default: this tree's)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median is shown)")
    ns = ap.parse_args()
    tiny = ns.tiny_extend
    if tiny:
        os.environ["TINY_EXTEND"] = "1"
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("probe_overhead: needs a CUDA GPU (see docs/probe.md for the H200 figures); skipped")
        return
    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, probe from {ns.probe}"
        + (", extend = one small matmul (--tiny-extend)" if tiny else "")
    )
    ops = hot_path_ops(ns.probe, torch)
    print(f"accept-length bookkeeping a verify: {len(ops)} device op(s): {', '.join(ops)}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        make_tree(tmp / "fake", "v2", work=GPU_WORK)
        (tmp / "probe").mkdir()
        for name in FILES:
            (tmp / "probe" / name).write_bytes((ns.probe / name).read_bytes())
        (tmp / "harness.py").write_text(HARNESS)
        results = {}
        for _round in range(ns.rounds):  # interleaved rounds
            for mode, env in (
                ("none", {}),
                ("event", {"EAGLE3_PROFILE": "1"}),
                ("host", {"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_SYNC": "host"}),
            ):
                out, lines = run(tmp, "timed", env)
                ms = float(next(x for x in out.splitlines() if x.startswith("CYCLE_MS")).split()[1])
                results.setdefault(mode, []).append((ms, lines))

        def median(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]

        base = median([m for m, _ in results["none"]])
        head = f"cycle ms (median of {ns.rounds} runs)"
        print(f"{'mode':<6} {head:>28} {'overhead':>9}   probe's phase means (last run)")
        for mode in ("none", "event", "host"):
            ms = median([m for m, _ in results[mode]])
            lines = results[mode][-1][1][1:]  # the first window of a process is cold (CUDA/cuBLAS start-up)
            phases = ""
            if lines:
                n = len(lines)
                phases = (
                    f"draft {sum(e.draft_ms for e in lines) / n:.3f} verify {sum(e.verify_ms for e in lines) / n:.3f} "
                    f"extend {sum(e.extend_ms for e in lines) / n:.3f} ms ({n} windows, sync={lines[0].sync})"
                )
            print(f"{mode:<6} {ms:>28.4f} {(ms - base) / base:>+9.2%}   {phases}")
        out, lines = run(tmp, "profiler", {"EAGLE3_PROFILE": "1"})
        prof = json.loads(next(x for x in out.splitlines() if x.startswith("PROFILER"))[len("PROFILER ") :])
        # 100 warm-up cycles, then 200 under the profiler: windows of 40 from the 4th on lie inside it
        inside = lines[3:]
        print(
            f"\nphase    probe (sync=event) ms   torch.profiler device ms   difference   ({len(inside)} windows "
            "inside the profiled span)"
        )
        for phase in ("draft", "verify", "extend"):
            mine = sum(getattr(e, f"{phase}_ms") for e in inside) / len(inside)
            theirs = prof.get(f"phase_{phase}")
            print(f"{phase:<8} {mine:>21.4f} {theirs:>26.4f} {(mine - theirs) / theirs:>+12.1%}")
        print("draft ms per window (event):", [round(e.draft_ms, 3) for e in results["event"][-1][1]])
        print("draft ms per window (profiler run):", [round(e.draft_ms, 3) for e in lines])
        print(json.dumps({"cycle_ms": {m: [x for x, _ in v] for m, v in results.items()}, "profiler": prof}))


if __name__ == "__main__":
    main()
