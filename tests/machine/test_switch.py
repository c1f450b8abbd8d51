"""The switch (docs/switch.md): a signed command file that makes a running engine hold a step count
through its own switching code, and release it. Unit tests of the probe's reader (what it refuses,
and why), of its hooks on stand-ins of vLLM's scheduler and SGLang's adaptive controller, of the
source check; the simulator as a real process in both dialects, held and released by tuitune's
own ``machine.switch`` over the local transport; the inert case; and, where it is built, the real
vLLM CPU engine (ngram with a ``num_speculative_tokens_per_batch_size`` schedule)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.base import redact
from tuitune.machine import switch as S
from tuitune.machine.transport import LocalTransport
from tuitune.measure.parse import parse_line
from tuitune.probe import eagle3_probe as ep
from tuitune_support.clients import Load
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port, http_status
from tuitune_support.presets import vllm_sim_data
from tuitune_support.procs import tuitune_cli, wait_for

KEY = bytes(range(32))


def write_command(path: Path, command: dict, mode: int = 0o600) -> None:
    path.write_text(json.dumps(command))
    os.chmod(path, mode)


def fresh_reader(tmp_path: Path, key: bytes = KEY) -> ep.Switch:
    sw = ep.Switch(str(tmp_path / "switch.json"), key)
    return sw


def step(sw: ep.Switch, monkeypatch, engine, apply) -> dict | None:
    """One hook call with the look-up throttle passed; the ack it wrote (or None)."""
    monkeypatch.setattr(ep, "SWITCH", sw)
    sw.next_poll = 0.0
    ep._switch_tick(engine, apply)
    ack = Path(sw.path + ".ack")
    return json.loads(ack.read_text()) if ack.exists() else None


class FakeScheduler:
    """vLLM's scheduler as the switch sees it: its lookup by batch size and its maximum K."""

    def __init__(self, lookup):
        self.dynamic_sd_lookup = lookup
        self.num_spec_tokens = 3


# ---- signing, and what the reader refuses --------------------------------------------------------


def test_sign_and_the_canonical_bytes():
    cmd = S.sign(KEY, 7, 2)
    assert ep.switch_canonical(cmd) == b'{"hold":{"steps":2},"seq":7,"v":1}'
    assert cmd["mac"] == ep.switch_mac(KEY, {"v": 1, "seq": 7, "hold": {"steps": 2}}) and len(cmd["mac"]) == 64
    assert S.sign(KEY, 8, None)["hold"] is None


def test_the_reader_applies_a_signed_hold_and_refuses_the_rest(tmp_path, monkeypatch):
    sw = fresh_reader(tmp_path)
    path = Path(sw.path)
    sched = FakeScheduler([0, 3, 3, 1])
    own = sched.dynamic_sd_lookup
    write_command(path, S.sign(KEY, 1, 2))
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert ack == {"seq": 1, "applied": True, "steps": 2, "held": 2, "why": ack["why"]}
    assert sched.dynamic_sd_lookup == [2, 2, 2, 2] and sw.hold == 2

    cases = [
        (S.sign(bytes(32), 2, 1), 0o600, "does not match this launch's key"),  # wrong key
        (S.sign(KEY, 1, 1), 0o600, "a replay"),  # replayed seq
        (S.sign(KEY, 3, 1), 0o602, "writable by others"),  # world-writable
        (S.sign(KEY, 4, 1), 0o620, "writable by others"),  # group-writable
        (S.sign(KEY, 5, 9), 0o600, "outside 0..3"),  # K above num_speculative_tokens
        ({**S.sign(KEY, 6, 1), "seq": 7}, 0o600, "does not match"),  # tampered after signing
    ]
    for cmd, mode, why in cases:
        time.sleep(0.01)  # a new mtime
        write_command(path, cmd, mode)
        ack = step(sw, monkeypatch, sched, ep._vllm_apply)
        assert ack["applied"] is False and why in ack["why"], (cmd, ack)
        assert sched.dynamic_sd_lookup == [2, 2, 2, 2] and sw.hold == 2  # nothing changed
    path.write_text("{not json")
    os.chmod(path, 0o600)
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert ack == {"seq": None, "applied": False, "steps": None, "held": 2, "why": "the command file is not JSON"}
    # release: the engine's own schedule again
    write_command(path, S.sign(KEY, 10, None))
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert ack["applied"] and ack["held"] is None and sched.dynamic_sd_lookup is own and sw.hold is None


def test_an_unchanged_file_is_read_once_and_looked_at_every_50_ms_at_most(tmp_path, monkeypatch):
    sw = fresh_reader(tmp_path)
    calls = []
    write_command(Path(sw.path), S.sign(KEY, 1, 1))
    monkeypatch.setattr(ep, "SWITCH", sw)
    for _ in range(50):
        ep._switch_tick(object(), lambda e, k: calls.append(k))
    assert calls == [1]  # the first look applied it; the rest were throttled or saw the same file
    sw.next_poll = 0.0
    ep._switch_tick(object(), lambda e, k: calls.append(k))
    assert calls == [1]


def test_a_fifo_or_a_link_at_the_command_path_is_refused_without_waiting(tmp_path, monkeypatch):
    """Whoever can put a FIFO where the command file goes must not stall the engine's scheduling
    loop (opening a FIFO for reading waits for a writer); a link is not followed. The simulator's
    reader refuses both the same way."""
    from tuitune.sim.switch import SimSwitch

    sw = fresh_reader(tmp_path)
    sched = FakeScheduler([0, 3, 3, 1])
    os.mkfifo(sw.path, 0o600)
    started = time.monotonic()
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert time.monotonic() - started < 5
    assert ack["applied"] is False and "not a regular file" in ack["why"] and sched.dynamic_sd_lookup == [0, 3, 3, 1]
    said: list[str] = []
    sim = SimSwitch(sw.path, KEY, said.append)
    assert sim.tick(lambda k: None) is False and "not a regular file" in said[-1]
    os.unlink(sw.path)
    target = tmp_path / "elsewhere.json"
    write_command(target, S.sign(KEY, 1, 1))
    os.symlink(target, sw.path)
    sw.next_poll = 0.0
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert ack["applied"] is False and "cannot be read" in ack["why"] and sw.hold is None


def test_an_engine_error_while_holding_leaves_the_policy_running(tmp_path, monkeypatch, caplog):
    """SGLang's own _activate failing inside the frozen feedback path is logged, never raised: the
    policy's feedback runs as if nothing were held."""
    c, sw, worker, policy = hooked_controller(tmp_path, monkeypatch)
    sw.hold = 4  # a hold the controller has no state for (as a release without activate_step_by_batch)
    with caplog.at_level(logging.WARNING):
        c.on_verify_complete([0, 1], 2)
    assert policy.fed == 1 and "hold 4 not applied" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_file_of_another_owner_is_refused(tmp_path, monkeypatch):
    sw = fresh_reader(tmp_path)
    write_command(Path(sw.path), S.sign(KEY, 1, 1))
    os.chown(sw.path, 65534, 65534)
    ack = step(sw, monkeypatch, FakeScheduler([3]), ep._vllm_apply)
    assert not ack["applied"] and "not to the engine's user" in ack["why"]


def test_vllm_without_a_schedule_refuses_saying_what_to_add(tmp_path, monkeypatch):
    sw = fresh_reader(tmp_path)
    write_command(Path(sw.path), S.sign(KEY, 1, 1))
    sched = FakeScheduler(None)
    ack = step(sw, monkeypatch, sched, ep._vllm_apply)
    assert not ack["applied"] and "num_speculative_tokens_per_batch_size" in ack["why"]
    assert sched.dynamic_sd_lookup is None


def test_the_engines_error_is_an_ack_never_an_exception(tmp_path, monkeypatch, caplog):
    sw = fresh_reader(tmp_path)
    write_command(Path(sw.path), S.sign(KEY, 1, 1))

    def boom(engine, steps):
        raise RuntimeError("no state")

    ack = step(sw, monkeypatch, object(), boom)
    assert not ack["applied"] and "RuntimeError: no state" in ack["why"]
    Path(sw.path + ".ack").unlink()
    Path(sw.path + ".ack").mkdir()  # not even the ack can be written: one logged line, no exception
    time.sleep(0.01)
    write_command(Path(sw.path), S.sign(KEY, 2, 1))
    with caplog.at_level(logging.INFO):
        step_only(sw, monkeypatch, object(), boom)
    said = [r.getMessage() for r in caplog.records if "EAGLE3_SWITCH" in r.getMessage()]
    assert len(said) == 1 and "seq=2 hold=1 applied=0" in said[0] and "the ack could not be written" in said[0]


def step_only(sw: ep.Switch, monkeypatch, engine, apply) -> None:
    monkeypatch.setattr(ep, "SWITCH", sw)
    sw.next_poll = 0.0
    ep._switch_tick(engine, apply)


WORKER_DRIVER = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="(Worker pid=%(process)d) INFO %(message)s")
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
class Out:
    num_scheduled_tokens = {"req-0": 3}
    def __init__(self, k):
        self.num_spec_tokens_to_schedule = k
r = GPUModelRunner()
def steps(k, n):
    for _ in range(n):
        r.execute_model(Out(k))
        r.sample_tokens(None)
steps(2, 8)
with open(os.environ["TUITUNE_SWITCH_FILE"] + ".ack", "w") as f:  # what the scheduler's process answered
    json.dump({"seq": 1, "applied": True, "steps": 1, "held": 1, "why": "hold applied"}, f)
time.sleep(0.06)
steps(1, 8)
time.sleep(0.06)
steps(2, 8)  # released by the scheduler; the ack that says so not written yet
"""


def test_vllm_worker_lines_follow_the_scheduled_k_and_the_hold(tmp_path):
    """vLLM's worker (a process apart from its scheduler): each line's steps is the K scheduled
    (num_spec_tokens_to_schedule, not the configured 2), held= comes from the ack, a window closes
    on a change, and a step at another K than the hold's is not labelled held."""
    from tuitune_support.fake_vllm import make_vllm_tree, run_probed

    make_vllm_tree(tmp_path / "fake")
    env = {"EAGLE3_PROFILE": "1", "TUITUNE_SWITCH_FILE": str(tmp_path / "s.json"), "TUITUNE_SWITCH_KEY": KEY.hex()}
    r = run_probed(tmp_path, env=env, driver=WORKER_DRIVER)
    assert r.returncode == 0, r.stderr
    wins = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert [(w.steps, w.draft_tokens, w.held) for w in wins] == [(2, 3, None)] * 2 + [(1, 2, 1)] * 2 + [
        (2, 3, None)
    ] * 2, r.stdout


# ---- the hooks on stand-ins of the engines' classes ------------------------------------------------


def fake_module(name: str, **classes) -> types.ModuleType:
    m = types.ModuleType(name)
    for k, v in classes.items():
        setattr(m, k, v)
    return m


def test_vllm_scheduler_hook_holds_and_releases(tmp_path, monkeypatch):
    class Scheduler:
        def __init__(self):
            self.dynamic_sd_lookup = [0, 3, 3, 1, 1]
            self.num_spec_tokens = 3
            self.seen = []

        def schedule(self):
            self.seen.append(self.dynamic_sd_lookup[2])
            return self.dynamic_sd_lookup[2]

    sw = fresh_reader(tmp_path)
    monkeypatch.setattr(ep, "SWITCH", sw)
    ep.patch_switch(fake_module("vllm.v1.core.sched.scheduler", Scheduler=Scheduler))
    s = Scheduler()
    assert s.schedule() == 3  # no command: the engine's own schedule
    write_command(Path(sw.path), S.sign(KEY, 1, 1))
    sw.next_poll = 0.0
    assert s.schedule() == 1
    write_command(Path(sw.path), S.sign(KEY, 2, None))
    sw.next_poll = 0.0
    assert s.schedule() == 3 and s.dynamic_sd_lookup == [0, 3, 3, 1, 1]


class Policy:
    candidate_steps = [1, 3, 5]

    def __init__(self):
        self.fed = 0

    def get_steps_for_batch(self, bs):
        return 3

    def on_verify_complete(self, drafts, batch_size=0):
        self.fed += 1
        return 5 if self.fed == 1 else None


def sglang_controller():
    class AdaptiveController:
        def __init__(self, worker, policy):
            self.worker, self.params = worker, policy
            self._states = {s: object() for s in policy.candidate_steps}

        def activate_step_by_batch(self, batch_size):
            target = self.params.get_steps_for_batch(batch_size)
            if target != self.worker.speculative_num_steps:
                self._activate(target)

        def on_verify_complete(self, drafts, batch_size=0):
            new = self.params.on_verify_complete(drafts, batch_size)
            if new is not None:
                self._activate(new)

        def _activate(self, steps):
            if steps not in self._states:
                raise ValueError(f"Missing adaptive runtime state for steps={steps}")
            self.worker.speculative_num_steps = steps

    return AdaptiveController


def hooked_controller(tmp_path, monkeypatch):
    """A stand-in of SGLang's controller hooked by the probe: (controller, reader, worker, policy)."""
    AdaptiveController = sglang_controller()
    sw = fresh_reader(tmp_path)
    monkeypatch.setattr(ep, "SWITCH", sw)
    ep.patch_switch(fake_module("sglang.srt.speculative.adaptive_runtime_state", AdaptiveController=AdaptiveController))
    worker, policy = types.SimpleNamespace(speculative_num_steps=3), Policy()
    c = AdaptiveController(worker, policy)
    return c, sw, worker, policy


def test_sglang_controller_hook_holds_freezes_the_policy_and_releases(tmp_path, monkeypatch):
    c, sw, worker, policy = hooked_controller(tmp_path, monkeypatch)
    write_command(Path(sw.path), S.sign(KEY, 1, 1))
    c.activate_step_by_batch(4)
    assert worker.speculative_num_steps == 1 and sw.hold == 1
    c.on_verify_complete([0, 1], 2)
    assert policy.fed == 0 and worker.speculative_num_steps == 1  # the policy's feedback frozen
    time.sleep(0.01)
    write_command(Path(sw.path), S.sign(KEY, 2, 7))  # no runtime state for 7
    sw.next_poll = 0.0
    c.activate_step_by_batch(4)
    ack = json.loads(Path(sw.path + ".ack").read_text())
    assert not ack["applied"] and "no runtime state" in ack["why"] and "[1, 3, 5]" in ack["why"]
    assert worker.speculative_num_steps == 1
    write_command(Path(sw.path), S.sign(KEY, 3, None))
    sw.next_poll = 0.0
    c.activate_step_by_batch(4)
    assert worker.speculative_num_steps == 3 and sw.hold is None  # the policy's choice again
    c.on_verify_complete([2], 1)
    assert policy.fed == 1 and worker.speculative_num_steps == 5


def test_inert_without_the_variables(tmp_path, monkeypatch):
    """No TUITUNE_SWITCH_* in the environment: no reader, no hook, the engine's classes untouched."""
    monkeypatch.delenv("TUITUNE_SWITCH_FILE", raising=False)
    monkeypatch.delenv("TUITUNE_SWITCH_KEY", raising=False)
    monkeypatch.setattr(ep, "SWITCH", None)
    assert ep.Switch.from_env() is None and ep.install_switch() is False and ep.SWITCH is None
    AdaptiveController = sglang_controller()
    before = dict(AdaptiveController.__dict__)
    ep.patch_switch(fake_module("sglang.srt.speculative.adaptive_runtime_state", AdaptiveController=AdaptiveController))
    assert dict(AdaptiveController.__dict__) == before
    monkeypatch.setenv("TUITUNE_SWITCH_FILE", str(tmp_path / "s.json"))
    monkeypatch.setenv("TUITUNE_SWITCH_KEY", "abc")  # not a key: no switch either
    assert ep.Switch.from_env() is None


def test_sitecustomize_installs_the_switch_only_with_its_variables(tmp_path):
    code = "import eagle3_probe as e; print('switch', e.SWITCH is not None, 'recorder', e.RECORDER is not None)"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "TUITUNE_SWITCH"))}
    base["PYTHONPATH"] = str(ROOT / "tuitune" / "probe")
    env_on = {**base, "TUITUNE_SWITCH_FILE": str(tmp_path / "s.json"), "TUITUNE_SWITCH_KEY": KEY.hex()}
    for env, want in ((base, "switch False recorder False"), (env_on, "switch True recorder False")):
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert want in r.stdout, r.stdout + r.stderr


def test_check_reports_the_switch_patch_points(tmp_path):
    root = tmp_path / "sglang"
    (root / "srt" / "speculative").mkdir(parents=True)
    good = (
        "class AdaptiveController:\n"
        "    def __init__(self, worker, policy):\n        self.worker = worker\n        self.params = policy\n"
        "        self._states = {}\n"
        "    def on_verify_complete(self, d, batch_size=0): pass\n"
        "    def activate_step_by_batch(self, bs): pass\n"
        "    def _activate(self, steps): pass\n"
    )
    f = root / "srt" / "speculative" / "adaptive_runtime_state.py"
    f.write_text(good)
    rep = ep.check(str(root), "sglang")["switch"]
    assert rep["ok"] and all(rep["points"].values())
    f.write_text(good.replace("def activate_step_by_batch", "def other"))  # optional: older releases
    assert ep.check(str(root), "sglang")["switch"]["ok"]
    f.write_text(good.replace("def _activate", "def _switch"))
    assert not ep.check(str(root), "sglang")["switch"]["ok"]
    f.unlink()
    assert not ep.check(str(root), "sglang")["switch"]["ok"]


@pytest.fixture(scope="module")
def sglang_0_5_18(tmp_path_factory) -> Path:
    """SGLang 0.5.18's speculative sources (the release that runs on a CPU:
    ../shared/sglang-cpu/README.md), from its wheel; skips only when the registry is unreachable."""
    import zipfile

    from tuitune_support.registry import pip_download

    tmp = tmp_path_factory.mktemp("sglang-0.5.18")
    wheel = pip_download(tmp, "sglang==0.5.18")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp / "site", [n for n in z.namelist() if n.startswith(("sglang/srt/speculative/", "sglang-"))])
    return tmp / "site" / "sglang"


@pytest.mark.timeout(900)
def test_check_finds_the_switch_patch_points_in_sglang_0_5_18(sglang_0_5_18):
    """The switch's patch points exist in the release (read with ast, nothing imported)."""
    rep = ep.check(str(sglang_0_5_18), "sglang")
    assert rep["version"] == "0.5.18" and rep["switch"]["ok"], rep["switch"]


SGLANG_DRIVER = """
import json, logging, os, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
from machine_switch_sign import sign
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
class Worker:  # what EAGLEWorkerV2 gives the controller: its steps, a state per step, applying one
    speculative_num_steps = 3
    def build_adaptive_runtime_state(self, speculative_num_steps, speculative_num_draft_tokens, cuda_graph_bs=None):
        return ("state", speculative_num_steps)
    def apply_runtime_state(self, state):
        self.speculative_num_steps = state[1]
w = Worker()
c = AdaptiveController(w, config_path=os.environ["CONFIG"])
c.init_states()
path = os.environ["TUITUNE_SWITCH_FILE"]
def cycle(accepted):  # as EAGLEWorkerV2 calls it: before the draft, after the verify
    c.activate_step_by_batch(1)
    steps = w.speculative_num_steps
    c.on_verify_complete([accepted], 1)
    return steps
def command(seq, steps):
    with open(path + ".tmp", "w") as f:
        json.dump(sign(bytes.fromhex(os.environ["TUITUNE_SWITCH_KEY"]), seq, steps), f)
    os.chmod(path + ".tmp", 0o600)
    os.replace(path + ".tmp", path)
    time.sleep(0.06)
own = [cycle(0) for _ in range(30)]  # nothing accepted: the policy steps down
command(1, 5)
held = [cycle(0) for _ in range(30)]  # held at 5 whatever the acceptance
command(2, 2)  # no runtime state for 2
refused = [cycle(0) for _ in range(5)]
command(3, None)
released = [cycle(4) for _ in range(40)]  # everything accepted: the policy steps up again
print(json.dumps({"own": own, "held": held, "refused": refused, "released": released,
                  "patched": getattr(AdaptiveController.on_verify_complete, "__eagle3_switch__", False)}))
"""

SIGN_SRC = """
import hashlib, hmac, json
def sign(key, seq, steps):
    c = {"v": 1, "seq": seq, "hold": None if steps is None else {"steps": steps}}
    body = json.dumps(c, sort_keys=True, separators=(",", ":")).encode()
    c["mac"] = hmac.new(key, body, hashlib.sha256).hexdigest()
    return c
"""


@pytest.mark.timeout(900)
def test_sglang_0_5_18s_own_controller_and_policy_held_and_released(sglang_0_5_18, tmp_path):
    """SGLang 0.5.18's own AdaptiveController and AdaptiveSpeculativeParams (the release's code, its
    EMA policy; only the worker and ``sglang.srt.utils``' logging helper stood in for), hooked by the
    probe through its import hook: a hold keeps 5 while nothing is accepted, a step without a
    runtime state is refused, release gives the choice back to the policy."""
    import runpy
    import shutil

    root = tmp_path / "tree"
    (root / "sglang" / "srt").mkdir(parents=True)
    shutil.copytree(sglang_0_5_18 / "srt" / "speculative", root / "sglang" / "srt" / "speculative")
    (root / "sglang" / "srt" / "utils.py").write_text("def log_info_on_rank0(logger, msg):\n    logger.info(msg)\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "machine_switch_sign.py").write_text(SIGN_SRC)
    assert runpy.run_path(str(src / "machine_switch_sign.py"))["sign"](KEY, 3, 5) == S.sign(KEY, 3, 5)
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 5], "warmup_batches": 2, "update_interval": 2}}))
    (tmp_path / "driver.py").write_text(SGLANG_DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EAGLE3_", "TUITUNE_SWITCH"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "tuitune" / "probe"), str(root), str(src)]),
        TUITUNE_SWITCH_FILE=str(tmp_path / "s.json"),
        TUITUNE_SWITCH_KEY=KEY.hex(),
        CONFIG=str(config),
    )
    r = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py")], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["patched"] and out["own"][0] == 3 and out["own"][-1] == 1, out["own"]  # its policy stepped down
    assert set(out["held"][1:]) == {5}, out["held"]
    assert set(out["refused"]) == {5}
    assert out["released"][-1] == 5 and 3 in out["released"], out["released"]  # the policy's choice again
    said = [x for x in r.stdout.splitlines() if "EAGLE3_SWITCH" in x]
    assert said[0].endswith("EAGLE3_SWITCH seq=1 hold=5 applied=1"), said
    assert "seq=2 hold=2 applied=0 why=steps 2 has no runtime state in this launch (prepared: [1, 3, 5])" in said[1]
    assert said[2].endswith("seq=3 hold=release applied=1"), said


def test_the_key_is_a_secret_wherever_env_is_shown():
    assert redact.secret_env("TUITUNE_SWITCH_KEY")
    shown = redact.env({"TUITUNE_SWITCH_KEY": "ab" * 32, "TUITUNE_SWITCH_FILE": "/h/s.json"})
    assert "ab" * 32 not in json.dumps(shown) and shown["TUITUNE_SWITCH_FILE"] == "/h/s.json"


# ---- tuitune's side over the local transport, against the simulator ------------------------------------


def start_sim(tmp: Path, argv: list[str], env: dict, port: int) -> tuple[subprocess.Popen, Path]:
    log = tmp / f"sim-{port}.log"
    full = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "EAGLE3_", "TUITUNE_SWITCH"))}
    full.update({"EAGLE3_PROFILE": "1", **env})
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuitune.sim", *argv], stdout=f, stderr=subprocess.STDOUT, env=full, cwd=ROOT
        )
    wait_for(lambda: http_status(f"http://127.0.0.1:{port}/health") == 200 or proc.poll() is not None, 30)
    assert proc.poll() is None, log.read_text()[-2000:]
    return proc, log


def profiles(log: Path, start: int = 0) -> list:
    lines = log.read_text(errors="replace").splitlines()[start:]
    return [e for e in map(parse_line, lines) if e is not None and e.kind == "profile"]


def lines_of(log: Path) -> int:
    return len(log.read_text(errors="replace").splitlines())


async def held_then_released(sw: S.Switch, log: Path, k: int, own: set[int]) -> None:
    """Hold ``k``: the lines that follow run at ``k`` and say ``held=k``; release: the engine's own
    steps again, no ``held``."""
    ack = await sw.hold(k, timeout=20)
    assert ack.applied and ack.held == k and ack.steps == k
    mark = lines_of(log)
    await asyncio.sleep(1.5)
    wins = profiles(log, mark)
    assert wins and all(w.steps == k and w.held == k for w in wins), [(w.steps, w.held) for w in wins]
    state = await sw.state()
    assert state is not None and state.held == k
    ack = await sw.release(timeout=20)
    assert ack.applied and ack.held is None and ack.steps is None
    mark = lines_of(log)
    await asyncio.sleep(1.5)
    wins = profiles(log, mark)
    assert wins and all(w.held is None and w.steps in own for w in wins), [(w.steps, w.held) for w in wins]
    assert f"EAGLE3_SWITCH seq={ack.seq} hold=release applied=1" in log.read_text()


async def prepared_switch(tmp_path, monkeypatch) -> tuple[int, S.Switch, dict[str, str]]:
    """A free port, its switch prepared under tmp_path as HOME, and the env a launch on it gets."""
    monkeypatch.setenv("HOME", str(tmp_path))
    port = free_port()
    sw = S.Switch(LocalTransport(), port)
    return port, sw, await sw.prepare()


async def test_sim_sglang_adaptive_held_then_released(tmp_path, monkeypatch):
    port, sw, env = await prepared_switch(tmp_path, monkeypatch)
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 5]}}))
    assert env["TUITUNE_SWITCH_FILE"] == f"{tmp_path}/.cache/tuitune/switch/{port}.json"
    key_file = tmp_path / ".cache" / "tuitune" / "switch" / f"{port}.key"
    assert key_file.read_text() == env["TUITUNE_SWITCH_KEY"] and key_file.stat().st_mode & 0o777 == 0o600
    argv = [
        *("--model-path", "/m/llama", "--port", str(port), "--sim-speedup", "10", "--sim-load-seconds", "0.1"),
        *("--decode-log-interval", "5", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path"),
        *("/d", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-adaptive"),
        *("--speculative-adaptive-config", str(config)),
    ]
    proc, log = start_sim(tmp_path, argv, env, port)
    try:
        with Load(port, "/m/llama", max_tokens=48):
            await held_then_released(sw, log, 5, {1, 3, 5})
            with pytest.raises(S.SwitchRefused, match=r"no runtime state in this launch \(prepared: \[1, 3, 5\]\)"):
                await sw.hold(2, timeout=20)
    finally:
        proc.kill()
        proc.wait(10)


async def test_sim_vllm_schedule_held_then_released(tmp_path, monkeypatch):
    port, sw, env = await prepared_switch(tmp_path, monkeypatch)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 256, 2]]}
    argv = ["--sim-engine", "vllm", "serve", "/m/tiny", "--port", str(port), "--sim-speedup", "10"]
    argv += ["--sim-load-seconds", "0.1", "--speculative-config", json.dumps(spec)]
    proc, log = start_sim(tmp_path, argv, {**env, "VLLM_LOG_STATS_INTERVAL": "2"}, port)
    try:
        with Load(port, "/m/tiny", max_tokens=48):
            await held_then_released(sw, log, 1, {2})
            await held_then_released(sw, log, 3, {2})
            with pytest.raises(S.SwitchRefused, match=r"K=4 is outside 0\.\.3"):
                await sw.hold(4, timeout=20)
    finally:
        proc.kill()
        proc.wait(10)


async def test_sim_vllm_without_a_schedule_refuses_and_without_preparing_times_out(tmp_path, monkeypatch):
    port, sw, env = await prepared_switch(tmp_path, monkeypatch)
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    argv = ["--sim-engine", "vllm", "serve", "/m/tiny", "--port", str(port), "--sim-speedup", "10"]
    argv += ["--sim-load-seconds", "0.1", "--speculative-config", json.dumps(spec)]
    proc, log = start_sim(tmp_path, argv, env, port)
    try:
        with Load(port, "/m/tiny", max_tokens=48):
            with pytest.raises(S.SwitchRefused, match="num_speculative_tokens_per_batch_size"):
                await sw.hold(1, timeout=20)
    finally:
        proc.kill()
        proc.wait(10)
    # the same server launched without the variables: inert, nothing answers
    port2 = free_port()
    argv[argv.index("--port") + 1] = str(port2)
    proc, log = start_sim(tmp_path, argv, {}, port2)
    sw2 = S.Switch(LocalTransport(), port2)
    try:
        with pytest.raises(S.SwitchError, match="not launched prepared for switching"):
            await sw2.hold(1, timeout=1)  # no key on the target for this port
        await sw2.prepare()  # a key, but the running server never got it
        with Load(port2, "/m/tiny", max_tokens=48):
            with pytest.raises(S.SwitchTimeout, match="not launched prepared for switching, or the probe is not"):
                await sw2.hold(1, timeout=2)
        assert "EAGLE3_SWITCH" not in log.read_text() and all(w.held is None for w in profiles(log))
    finally:
        proc.kill()
        proc.wait(10)


# ---- prepared by the preset (speculative.switch), held by `tuitune hold` -----------------------------------


def vllm_switch_data(tmp_path: Path, port: int, target="local", **spec) -> dict:
    """A simulator playing vLLM, EAGLE-3 at K 2 (prepared by ``spec``, e.g. ``switch=[1, 2, 3, 4]``)."""
    return vllm_sim_data(tmp_path, "swv", port, target, **spec)


def test_the_preset_prepares_vllm_with_the_largest_k_and_a_schedule(tmp_path):
    p = P.from_dict(vllm_switch_data(tmp_path, 30001, switch=[3, 1, 4, 1]))
    assert p.switch_steps == [1, 3, 4]
    cfg = json.loads(p.flags()[p.flags().index("--speculative-config") + 1])
    # vLLM sizes its drafts for K 4, and runs the preset's K 2 through a schedule until a hold
    assert cfg["num_speculative_tokens"] == 4 and cfg["num_speculative_tokens_per_batch_size"] == [[1, 1024, 2]]
    assert p.engine.speculative_view(p)["speculative.switch"] == [1, 3, 4]
    plain = P.from_dict(vllm_switch_data(tmp_path, 30001))
    assert "num_speculative_tokens_per_batch_size" not in plain.flags()[-1] and plain.hash() != p.hash()
    own = P.from_dict(vllm_switch_data(tmp_path, 30001, switch=[1, 2], dynamic_schedule=[[1, 4, 2], [5, 64, 1]]))
    cfg = json.loads(own.flags()[own.flags().index("--speculative-config") + 1])
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 4, 2], [5, 64, 1]]  # its own schedule kept
    from tuitune.decide.launch import Config

    assert p.engine.config_changes(Config(3, 1, 4), p)["switch"] is None  # a configuration tune writes is static
    for bad, why in (
        ({"switch": []}, "list the step counts to hold"),
        ({"switch": [65]}, "from 0 to 64"),
        ({"algorithm": "SUFFIX", "draft_model_path": None, "switch": [1]}, "suffix decoding chooses"),
    ):
        with pytest.raises(ValueError, match=why):
            P.from_dict(vllm_switch_data(tmp_path, 30001, **bad))


def test_sglang_switches_through_an_adaptive_config_that_holds_the_steps(tmp_path):
    from tuitune_support.presets import make_preset

    base = make_preset(tmp_path, "sg").model_dump(exclude_none=True)
    spec = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3}

    def with_spec(**kw):
        return P.from_dict({**base, "speculative": {**spec, **kw}})

    with pytest.raises(
        ValueError, match=r"set speculative.adaptive_config .*\{\"1\": \{\"candidate_steps\": \[1, 3\]\}\}"
    ):
        with_spec(switch=[1, 3])
    with pytest.raises(ValueError, match="EAGLE and EAGLE3 chains only"):
        P.from_dict({**base, "speculative": {"algorithm": "NGRAM", "num_draft_tokens": 4, "switch": [1]}})
    cpu = {**base, "server": {**base["server"], "args": {**base["server"]["args"], "device": "cpu"}}}
    with pytest.raises(ValueError, match="steps 0 crashes SGLang's adaptive runtime on a CPU"):
        P.from_dict({**cpu, "speculative": {**spec, "adaptive_config": "/a.json", "switch": [0, 3]}})
    p = with_spec(adaptive_config="/a.json", switch=[1, 3, 5])
    assert p.engine.check_schedule(p, json.dumps({"1": {"candidate_steps": [1, 3, 5]}})) is None
    why = p.engine.check_schedule(p, json.dumps({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [3]}}))
    assert why and "holds steps [5], which are not among its candidate steps [1, 3]" in why
    assert "--speculative-adaptive" in p.flags()
    two = {"nodes": [{"host": "127.0.0.1"}, {"host": "127.0.0.1", "server": {"port": 30999, "log": "/tmp/n1.log"}}]}
    with pytest.raises(ValueError, match="every node of a multi-node server runs its own scheduler"):
        P.from_dict({**base, "target": two, "speculative": {**spec, "adaptive_config": "/a.json", "switch": [1, 3]}})


async def held_as_attached(preset: Path) -> tuple[int | None, int | None]:
    """(the hold a new session learns on attaching, the K of what it says the server was launched with)."""
    from tuitune.machine.session import Session

    s = Session(P.load(preset))
    await s.connect(backlog=0)
    try:
        launched = s.launched_preset
        return s.held, launched.speculative.num_speculative_tokens if launched and launched.speculative else None
    finally:
        await s.close()


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_launch_prepared_then_hold_status_release_and_a_relaunch_without_it(where, tmp_path, request, monkeypatch):
    """`tuitune launch` of a preset with speculative.switch prepares the key; `tuitune hold` holds,
    `status` says so with no drift, a K outside the list and a launch without the switch are refused at
    once with a sentence; over SSH as locally."""
    import yaml

    target = request.getfixturevalue("sshd").target() if where == "ssh" else "local"
    port = free_port()
    data = vllm_switch_data(tmp_path, port, target, switch=[1, 2, 3, 4])
    preset = tmp_path / "swv.yaml"
    preset.write_text(yaml.safe_dump(data))
    log = tmp_path / "swv.log"
    env = {"HOME": str(tmp_path)} if where == "local" else None
    key = (Path(os.environ["HOME"]) if env is None else tmp_path) / ".cache" / "tuitune" / "switch" / f"{port}.key"
    r = tuitune_cli("launch", str(preset), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        assert key.stat().st_mode & 0o777 == 0o600
        r = tuitune_cli("hold", str(preset), env=env)
        assert r.returncode == 0 and "prepared for K [1, 2, 3, 4]; the engine's own schedule chooses" in r.stdout
        r = tuitune_cli("hold", str(preset), "3", env=env)
        assert r.returncode == 0 and "swv: holds K 3 (command 1" in r.stdout, r.stdout + r.stderr
        with Load(port, "/m/tiny", max_tokens=48):
            wait_for(lambda: any(w.held == 3 and w.steps == 3 for w in profiles(log)), 20, what="a window held at 3")
        r = tuitune_cli("status", str(preset), "--json", env=env)
        st = json.loads(r.stdout)
        assert r.returncode == 0 and st["switch"] == {"held": 3, "seq": 1} and st["record"]["switch"] == [1, 2, 3, 4]
        assert not st["drift"] and data["speculative"]["switch"] and key.read_text() not in r.stdout
        if env:  # the session below runs in this process: the same HOME as the commands' (its state dir)
            monkeypatch.setenv("HOME", env["HOME"])
        assert asyncio.run(held_as_attached(preset)) == (3, 2)  # a session that attaches learns the hold
        r = tuitune_cli("hold", str(preset), "7", env=env)
        assert r.returncode == 2 and "K 7 is not one this launch was prepared to hold ([1, 2, 3, 4])" in r.stderr
        r = tuitune_cli("hold", str(preset), "--release", env=env)
        assert r.returncode == 0 and "released; the engine's own schedule chooses" in r.stdout, r.stdout + r.stderr
        # the same preset without the switch: relaunched unprepared, its old key gone, a hold refused at once
        del data["speculative"]["switch"]
        preset.write_text(yaml.safe_dump(data))
        r = tuitune_cli("launch", str(preset), env=env)
        assert r.returncode == 0 and not key.exists(), r.stdout + r.stderr
        t0 = time.monotonic()
        r = tuitune_cli("hold", str(preset), "1", env=env)
        assert r.returncode == 2 and "was not launched prepared for switching: set speculative.switch" in r.stderr
        assert time.monotonic() - t0 < 15 and "Traceback" not in r.stderr
    finally:
        tuitune_cli("stop", str(preset), env=env)


async def test_a_command_that_times_out_is_withdrawn_and_never_taken_later(tmp_path, monkeypatch):
    """An idle engine steps no more (nothing nudges it): the hold times out, and tuitune withdraws the
    command, so that the engine does not take it at its next step while tuitune said it failed."""
    import yaml

    from tuitune.machine.control import ServerControl

    monkeypatch.setenv("HOME", str(tmp_path))
    port = free_port()
    preset = tmp_path / "swv.yaml"
    preset.write_text(yaml.safe_dump(vllm_switch_data(tmp_path, port, switch=[1, 2, 3])))
    r = tuitune_cli("launch", str(preset), env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        control = ServerControl(LocalTransport(), P.load(preset))
        with pytest.raises(S.SwitchTimeout, match=r"within 1 s \(the command is withdrawn\)"):
            await S.hold_running(control, 3, None, timeout=1)
        assert not (tmp_path / ".cache" / "tuitune" / "switch" / f"{port}.json").exists()
        log = tmp_path / "swv.log"
        mark = lines_of(log)
        with Load(port, "/m/tiny", max_tokens=48):
            wait_for(lambda: len(profiles(log, mark)) >= 2, 20, what="windows under load")
        assert all(w.held is None for w in profiles(log, mark)) and "EAGLE3_SWITCH" not in log.read_text()
    finally:
        tuitune_cli("stop", str(preset), env={"HOME": str(tmp_path)})


# ---- the real vLLM CPU engine -----------------------------------------------------------------------------


@pytest.mark.xdist_group("real-vllm")  # one worker: launches never overlap on 2 cores
@pytest.mark.timeout(900)
def test_real_vllm_ngram_launched_prepared_held_at_1_then_max_then_released(tmp_path):
    """The whole path on the real engine: a preset with ``speculative.switch``, `tuitune launch` (the
    key and the schedule prepared), `tuitune hold` and `--release` while load runs, the probe's lines
    following each."""
    import yaml

    from tuitune_support import real_vllm

    python, _models = real_vllm.build()
    port = free_port()
    data = real_vllm.preset("sw", tmp_path / "server.log", port, python=python, method="NGRAM", k=2, lookup=(1, 3))
    data["speculative"]["switch"] = [1, 2, 3]
    data["env"]["EAGLE3_PROFILE_WINDOW"] = "8"
    preset = tmp_path / "sw.yaml"
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    home.mkdir()
    real_vllm.share_flag_listing(home)
    env = {"HOME": str(home)}
    log = tmp_path / "server.log"
    r = tuitune_cli("launch", str(preset), env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        spec = json.loads(
            next(a for a in Path(f"/proc/{_pid(home, port)}/cmdline").read_bytes().split(b"\0") if b"per_batch" in a)
        )
        assert spec["num_speculative_tokens"] == 3 and spec["num_speculative_tokens_per_batch_size"] == [[1, 1024, 2]]
        with Load(port, str(data["server"]["args"]["model"]), max_tokens=32):
            wait_for(lambda: len(profiles(log)) >= 3, 180, what="the probe's first lines")  # numba compiles first
            own = {w.steps for w in profiles(log)}
            assert own == {2}, own  # the preset's K, through the schedule the switch needs
            for k in (1, 3):
                cli_held_then_released(preset, env, log, k)
        r = tuitune_cli("status", str(preset), env=env)
        assert r.returncode == 0 and "no drift" in r.stdout and "nothing held" in r.stdout, r.stdout + r.stderr
    finally:
        tuitune_cli("stop", str(preset), env=env, timeout=120)


def _pid(home: Path, port: int) -> int:
    return json.loads((home / ".cache" / "tuitune" / "servers" / f"{port}.json").read_text())["pid"]


def cli_held_then_released(preset: Path, env: dict, log: Path, k: int) -> None:
    """`tuitune hold PRESET k`, the windows after it all held at k, then `--release` and the
    schedule's K again."""
    r = tuitune_cli("hold", str(preset), str(k), env=env, timeout=120)
    assert r.returncode == 0 and f"holds K {k}" in r.stdout, r.stdout + r.stderr
    time.sleep(1)  # the windows that straddled the switch
    mark = lines_of(log)
    time.sleep(8)
    wins = profiles(log, mark)
    assert wins and all(w.steps == k and w.held == k for w in wins), [(w.steps, w.held) for w in wins]
    assert re.search(rf"EAGLE3_SWITCH seq=\d+ hold={k} applied=1", log.read_text())
    r = tuitune_cli("hold", str(preset), "--release", env=env, timeout=120)
    assert r.returncode == 0 and "released" in r.stdout, r.stdout + r.stderr
    time.sleep(1)
    mark = lines_of(log)
    time.sleep(8)
    wins = profiles(log, mark)
    assert wins and all(w.held is None and w.steps == 2 for w in wins), [(w.steps, w.held) for w in wins]
