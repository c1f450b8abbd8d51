"""A stand-in vLLM tree shaped like vLLM 0.33's, for the probe's tests (tests/probe/test_probe_vllm.py)
and the switch's (tests/machine/test_switch.py): its module paths, class and method names (the real ones
are checked against the release in test_vllm_release.py); phases sleep, so the times each
EAGLE3_PROFILE line reports are known. ``run_probed`` runs a driver over it with the probe on its path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tuitune.probe import FILES
from tuitune_support.paths import ROOT

PROBE_DIR = ROOT / "tuitune" / "probe"

PROPOSER = """
import time
class SpecDecodeBaseProposer:
    def __init__(self, k):
        self.num_speculative_tokens = k
    def propose(self, *args, **kwargs):
        time.sleep(0.001 * self.num_speculative_tokens)
        return [[0] * self.num_speculative_tokens]
"""
EAGLE = """
from .llm_base_proposer import SpecDecodeBaseProposer
class EagleProposer(SpecDecodeBaseProposer):
    pass
"""
RUNNER = """
import time
from vllm.v1.spec_decode.eagle import EagleProposer
ACCEPTED = [1, 0, 2, 1]  # drafts accepted a step: mean 1, so 2 tokens a step with the bonus
class SpecConfig:
    num_speculative_tokens = 2
class Output:
    def __init__(self, ids):
        self.sampled_token_ids = ids
class SchedulerOutput:
    num_scheduled_tokens = {"req-0": 3}
class GPUModelRunner:
    def __init__(self):
        self.speculative_config = SpecConfig()
        self.drafter = EagleProposer(2)
        self.n = 0
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        time.sleep(0.005)  # the target forward over the drafted tokens
        return None
    def sample_tokens(self, grammar_output):
        time.sleep(0.0005)
        self.drafter.propose()
        self.n += 1
        return Output([[7] * (ACCEPTED[self.n % 4] + 1)])
"""
DRIVER = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, datefmt="%m-%d %H:%M:%S",
                    format="(EngineCore_DP0 pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s")
from vllm.v1.worker.gpu_model_runner import GPUModelRunner, SchedulerOutput
r = GPUModelRunner()
r.drafter.propose()  # a warm-up draft outside any step: not a cycle's
for _ in range(int(sys.argv[1])):
    r.execute_model(SchedulerOutput())
    r.sample_tokens(None)
print("patched:", getattr(GPUModelRunner.execute_model, "__eagle3_probe__", False))
"""


def make_vllm_tree(root: Path, drop: str | None = None) -> Path:
    """The stand-in tree under ``root`` (``root / "vllm"``); ``drop`` renames that method away."""
    files = {
        "vllm/v1/spec_decode/llm_base_proposer.py": PROPOSER,
        "vllm/v1/spec_decode/eagle.py": EAGLE,
        "vllm/v1/worker/gpu_model_runner.py": RUNNER,
    }
    for d in ("vllm", "vllm/v1", "vllm/v1/spec_decode", "vllm/v1/worker"):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text("__version__ = version = '0.99.0.fake'\n")
    for rel, text in files.items():
        (root / rel).write_text(text.replace(f"def {drop}(", f"def renamed_{drop}(") if drop else text)
    return root


def run_probed(
    tmp: Path, cycles: int = 20, env: dict | None = None, driver: str = DRIVER
) -> subprocess.CompletedProcess:
    """The driver (``DRIVER``) over the stand-in tree under ``tmp / "fake"`` with a copy of the probe on
    its path, ``env`` over this environment less its EAGLE3_ variables: the finished process."""
    probe = tmp / "probe"
    probe.mkdir(exist_ok=True)
    for name in FILES:
        (probe / name).write_bytes((PROBE_DIR / name).read_bytes())
    (tmp / "driver.py").write_text(driver)
    full = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    full.update(
        {"PYTHONPATH": os.pathsep.join([str(probe), str(tmp / "fake")]), "EAGLE3_PROFILE_WINDOW": "4", **(env or {})}
    )
    return subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(cycles)],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        cwd=tmp,
    )
