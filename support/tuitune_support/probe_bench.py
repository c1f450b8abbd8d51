"""The probe's GPU benchmark workload (benchmarks/probe_overhead.py; tests/probe/test_probe.py's GPU test): EAGLE-shaped
torch work for the stand-in SGLang tree (fake_sglang.make_tree's work), the harness that drives
its worker, and one run of it under the probe."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuitune.measure.parse import parse_line

GPU_WORK = """
import os
import torch
from torch.profiler import record_function
H, LAYERS, VOCAB = 7168, 48, 32000
dev = "cuda"
torch.manual_seed(0)
def w(rows, cols):
    return torch.randn(rows, cols, dtype=torch.bfloat16, device=dev) * 0.01
DRAFT = [w(H, H), w(H, 2 * H), w(2 * H, H), w(H, VOCAB)]  # attention-, up-, down-projection, LM head
W_big = [w(H, 2 * H) for _ in range(LAYERS)]
x1 = torch.randn(1, H, dtype=torch.bfloat16, device=dev)
x3 = torch.randn(3, H, dtype=torch.bfloat16, device=dev)
TINY_EXTEND = os.environ.get("TINY_EXTEND") == "1"
def draft_pass(x):
    for W in DRAFT:
        x = torch.matmul(x, W)
    return x
def draft(steps):
    with record_function("phase_draft"):
        for _ in range(steps):
            draft_pass(x1)
def verify(batch):
    with record_function("phase_verify"):
        for W in W_big:
            torch.matmul(x3, W)
        return torch.full((len(batch.reqs),), 2, dtype=torch.int32, device=dev)
def extend():
    with record_function("phase_extend"):
        if TINY_EXTEND:
            torch.matmul(x3, DRAFT[0])
        else:
            draft_pass(x3)
"""

HARNESS = """
import json, logging, sys, time, torch
logging.basicConfig(level=logging.INFO, format="[%(asctime)s TP0] %(message)s", stream=sys.stdout)
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
profile = sys.argv[1] == "profiler"
class Batch:
    reqs = [object()]
d, v, b = EagleDraftWorker(0), EAGLEWorkerV2(0), Batch()
def cycles(n):
    for _ in range(n):
        d.draft(b)
        r = v.verify(b)
        d._draft_extend_for_decode(b, r)
cycles(100)
torch.cuda.synchronize()
if profile:
    from torch.profiler import ProfilerActivity, profile as prof_ctx
    with prof_ctx(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        cycles(200)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.startswith("phase_"):
            dev_total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            out[e.key] = dev_total / max(1, e.count) / 1000.0  # ms per call
    print("PROFILER " + json.dumps(out))
else:
    t0 = time.perf_counter()
    cycles(400)
    torch.cuda.synchronize()
    print("CYCLE_MS %.6f" % ((time.perf_counter() - t0) / 400 * 1000))
"""


def run(tmp: Path, mode: str, extra_env: dict | None = None) -> tuple[str, list]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp / "probe"), str(tmp / "fake")])
    env.update(extra_env or {})
    r = subprocess.run(
        [sys.executable, str(tmp / "harness.py"), mode], capture_output=True, text=True, env=env, timeout=300
    )
    if r.returncode != 0:
        raise SystemExit(r.stderr[-2000:])
    lines = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    return r.stdout, [e for e in lines if e is not None and e.kind == "profile"]
