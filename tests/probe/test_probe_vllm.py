"""The probe inside vLLM: a stand-in tree with vLLM 0.33's module paths, class and method names
(tuitune_support.fake_vllm; the real ones are checked against the release in test_vllm_release.py);
phases sleep, so the times each EAGLE3_PROFILE line reports are known."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuitune.measure.parse import parse_line
from tuitune.probe import check
from tuitune_support.fake_vllm import DRIVER, make_vllm_tree, run_probed
from tuitune_support.paths import ROOT


def test_probe_times_vllm_steps(tmp_path):
    make_vllm_tree(tmp_path / "fake")
    r = run_probed(tmp_path, env={"EAGLE3_PROFILE": "1"})
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert len(events) == 5, r.stdout
    for ev in events:
        assert ev.kind == "profile" and ev.rank == "DP0" and ev.cycles == 4 and ev.bs == 1
        assert (ev.steps, ev.topk, ev.draft_tokens) == (2, 1, 3) and ev.extend_ms == 0.0
        assert 1.8 < ev.draft_ms < 6  # propose: 2 ms
        assert 5.0 < ev.verify_ms < 12  # the step (5.5 ms) without the draft inside it
        assert ev.accept_len == pytest.approx(2.0)
    assert "patched: True" in r.stdout
    off = run_probed(tmp_path)
    assert "EAGLE3_PROFILE" not in off.stdout and "patched: False" in off.stdout


def test_vllm_layout_without_a_method_runs_unprofiled_and_check_says_why(tmp_path):
    make_vllm_tree(tmp_path / "fake", drop="sample_tokens")
    r = run_probed(tmp_path, env={"EAGLE3_PROFILE": "1"})
    warnings = [x for x in r.stdout.splitlines() + r.stderr.splitlines() if "not found" in x]
    assert len(warnings) == 1 and "vLLM" in warnings[0] and "GPUModelRunner.sample_tokens" in warnings[0]
    assert "EAGLE3_PROFILE v=" not in r.stdout
    report = check(str(tmp_path / "fake" / "vllm"), engine="vllm")
    assert report["version"] == "0.99.0.fake" and not report["ok"] and report["missing"] == ["step", "step_end"]
    out = subprocess.run(
        [sys.executable, "-m", "tuitune", "probe", "check", "--vllm-path", str(tmp_path / "fake" / "vllm")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 1 and "MISSING GPUModelRunner.sample_tokens (step_end)" in out.stdout
    assert "vLLM 0.99.0.fake" in out.stdout


# vLLM's scheduler counts a draft per request that had draft tokens scheduled and got an output
# (vllm/v1/core/sched/scheduler.py, observe_draft); a look-up drafter with no match drafts nothing
RUNNER_PARTIAL_DRAFTS = """
import time
from vllm.v1.spec_decode.eagle import EagleProposer
STEPS = [  # (scheduled draft tokens per request, tokens each request got)
    ({"req-0": [1, 2, 3], "req-1": []}, [[7, 7, 7], [7]]),
    ({"req-0": [1, 2, 3], "req-1": [4, 5]}, [[7], [7, 7, 7]]),
    ({}, [[7], [7]]),  # neither found a match: plain decode
    ({"req-0": [1]}, [[7, 7], []]),  # req-1 got no token: a chunk of its prefill
]
class SpecConfig:
    num_speculative_tokens = 3
class Output:
    def __init__(self, ids):
        self.req_ids = ["req-0", "req-1"]
        self.sampled_token_ids = ids
class SchedulerOutput:
    def __init__(self, spec):
        self.num_scheduled_tokens = {"req-0": 4, "req-1": 4}
        self.scheduled_spec_decode_tokens = spec
class GPUModelRunner:
    def __init__(self):
        self.speculative_config = SpecConfig()
        self.drafter = EagleProposer(3)
        self.n = 0
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        time.sleep(0.002)
    def sample_tokens(self, grammar_output):
        self.drafter.propose()
        out = Output(STEPS[self.n % 4][1])
        self.n += 1
        return out
"""
DRIVER_PARTIAL_DRAFTS = DRIVER.replace(
    "r.execute_model(SchedulerOutput())",
    "from vllm.v1.worker.gpu_model_runner import STEPS\n    r.execute_model(SchedulerOutput(STEPS[_ % 4][0]))",
)


def test_probe_counts_drafts_as_vllms_scheduler_does(tmp_path):
    """accept_len: tokens per request-step that got a token (12 over 7); drafts and draft_accept_len:
    only the request-steps that verified a draft (4, accepting 2 + 0 + 2 + 1), vLLM's Mean
    acceptance length 1 + 5 / 4."""
    make_vllm_tree(tmp_path / "fake")
    (tmp_path / "fake" / "vllm" / "v1" / "worker" / "gpu_model_runner.py").write_text(RUNNER_PARTIAL_DRAFTS)
    r = run_probed(tmp_path, cycles=8, env={"EAGLE3_PROFILE": "1"}, driver=DRIVER_PARTIAL_DRAFTS)
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert len(events) == 2, r.stdout
    for ev in events:
        assert ev.accept_len == pytest.approx(12 / 7, abs=1e-3)
        assert ev.accept_counts == (4, 1, 2)  # lengths 1, 2, 3
        assert ev.drafts == 4 and ev.draft_accept_len == pytest.approx(2.25)
