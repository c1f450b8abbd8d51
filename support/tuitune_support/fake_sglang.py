"""A stand-in SGLang tree shaped like the real one, for the probe's tests and its GPU benchmark.

The worker classes have SGLang's module paths, class names and method names (v1 or v2 layout);
their phases either sleep (CPU tests) or run EAGLE-shaped torch work (the GPU benchmark).
"""

from __future__ import annotations

from pathlib import Path

V2 = """
import time
from . import _work

class Result:
    def __init__(self, accept_lens):
        self.accept_lens = accept_lens

class EagleDraftWorker:
    def __init__(self, tp_rank=0):
        self.tp_rank = tp_rank
        self.topk = 1
        self.speculative_num_steps = 2
        self.speculative_num_draft_tokens = 3
    def draft(self, batch, *, with_topology=False):
        _work.draft(self.speculative_num_steps)
    def _draft_extend_for_decode(self, batch, batch_result, *, kv_loc_plan=None):
        _work.extend()

class EAGLEWorkerV2:
    def __init__(self, tp_rank=0):
        self.tp_rank = tp_rank
    def verify(self, batch, pp_proxy_tensors=None, grammar_barrier=None):
        return Result(_work.verify(batch))
"""

V1 = """
from . import _work

class EagleVerifyOutput:
    def __init__(self, accept_length_per_req_cpu):
        self.accept_length_per_req_cpu = accept_length_per_req_cpu

class EAGLEWorker:
    def __init__(self, tp_rank=0):
        self.tp_rank = tp_rank
        self.topk = 1
        self.speculative_num_steps = 2
        self.speculative_num_draft_tokens = 3
    def draft(self, batch):
        _work.draft(self.speculative_num_steps)
    def verify(self, batch, spec_info):
        lens = _work.verify(batch)
        return None, EagleVerifyOutput([n - 1 for n in lens]), None, True
    def forward_draft_extend_after_decode(self, batch):
        _work.extend()
"""

SLEEP_WORK = """
import time
ACCEPT = [2, 1, 3, 2]  # tokens a cycle, bonus included: mean 2.0
_n = [0]
def draft(steps):
    time.sleep(0.001 * steps)
def verify(batch):
    time.sleep(0.005)
    _n[0] += 1
    return [ACCEPT[(_n[0] + i) % 4] for i in range(len(batch.reqs))]
def extend():
    time.sleep(0.001)
"""


def make_tree(root: Path, layout: str = "v2", work: str = SLEEP_WORK, drop: str | None = None) -> Path:
    """Write sglang/srt/speculative/<worker module> under root; ``drop`` removes a method (unknown layout)."""
    pkg = root / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True, exist_ok=True)
    for d in (root / "sglang", root / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (root / "sglang" / "_version.py").write_text("__version__ = '0.5.99.fake'\n")
    (pkg / "_work.py").write_text(work)
    src = V2 if layout == "v2" else V1
    if drop:
        src = src.replace(f"def {drop}(", f"def renamed_{drop}(")
    (pkg / ("eagle_worker_v2.py" if layout == "v2" else "eagle_worker.py")).write_text(src)
    return root


DRIVER = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="[%(asctime)s TP0] %(message)s", stream=sys.stdout)
layout, cycles, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
switch = int(sys.argv[4]) if len(sys.argv) > 4 else None  # the cycle where adaptive mode goes to 3 steps
class Batch:
    reqs = [object()]
if layout == "v2":
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2
    d, v = EagleDraftWorker(rank), EAGLEWorkerV2(rank)
    for i in range(cycles):
        if i == switch:  # as SGLang's adaptive runtime state does: both attributes on the worker
            d.speculative_num_steps, d.speculative_num_draft_tokens = 3, 4
        d.draft(Batch())
        r = v.verify(Batch())
        d._draft_extend_for_decode(Batch(), r)
else:
    from sglang.srt.speculative.eagle_worker import EAGLEWorker
    w = EAGLEWorker(rank)
    for _ in range(cycles):
        w.draft(Batch())
        w.verify(Batch(), None)
        w.forward_draft_extend_after_decode(Batch())
print("patched:", getattr(type(v if layout == "v2" else w).verify, "__eagle3_probe__", False))
"""
