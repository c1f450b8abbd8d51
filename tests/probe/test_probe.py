"""The profiling probe: import hook, patching and line format against stand-in SGLang classes
(no GPU: the host clock), sitecustomize chaining, `probe check` against the real SGLang source."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.measure.parse import parse_line
from tuitune.probe import FILES, check
from tuitune_support.fake_sglang import DRIVER, make_tree
from tuitune_support.paths import ROOT

PROBE_DIR = ROOT / "tuitune" / "probe"


def run_driver(
    tmp: Path,
    layout: str,
    cycles: int = 20,
    rank: int = 0,
    env: dict | None = None,
    extra_path: list[Path] | None = None,
    switch: int | None = None,
) -> subprocess.CompletedProcess:
    probe = tmp / "probe"
    probe.mkdir(exist_ok=True)
    for name in FILES:  # as the launch does: the probe files alone in a directory
        (probe / name).write_bytes((PROBE_DIR / name).read_bytes())
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    path = [str(probe), *(str(p) for p in extra_path or []), str(tmp / "fake")]
    full = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    full.update({"PYTHONPATH": os.pathsep.join(path), "EAGLE3_PROFILE_WINDOW": "5", **(env or {})})
    args = [layout, str(cycles), str(rank)] + ([str(switch)] if switch is not None else [])
    return subprocess.run(
        [sys.executable, str(driver), *args], capture_output=True, text=True, timeout=60, env=full, cwd=tmp
    )


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_probe_times_each_phase_and_prints_parsable_lines(tmp_path, layout):
    make_tree(tmp_path / "fake", layout)
    r = run_driver(tmp_path, layout, env={"EAGLE3_PROFILE": "1"})
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert len(events) == 4  # 20 cycles, window 5 (host timing logs each window when it closes)
    for ev in events:
        assert ev.kind == "profile" and ev.rank == "TP0" and ev.cycles == 5 and ev.bs == 1
        assert (ev.steps, ev.topk, ev.draft_tokens) == (2, 1, 3)
        assert ev.sync == "cpu"  # no CUDA here: the host clock, and the line says so
        assert 1.8 < ev.draft_ms < 6 and 4.5 < ev.verify_ms < 12 and 0.9 < ev.extend_ms < 5
        assert ev.accept_len == pytest.approx(2.0, abs=0.21)
        assert ev.cycle_ms == pytest.approx(ev.draft_ms + ev.verify_ms + ev.extend_ms, abs=0.01)
        # format v2: the stand-in accepts 2, 1, 3, 2 tokens in turn (bonus included)
        assert ev.v == 2 and ev.verify_tokens == 3 and sum(ev.accept_counts) == 5
        assert ev.accept_len == pytest.approx(sum((i + 1) * k for i, k in enumerate(ev.accept_counts)) / 5)
    total = [sum(ev.accept_counts[i] for ev in events if len(ev.accept_counts) > i) for i in range(3)]
    assert total == [5, 10, 5]
    assert "patched: True" in r.stdout


def test_probe_reads_the_steps_every_cycle_and_splits_the_window_when_they_change(tmp_path):
    """SGLang's --speculative-adaptive changes speculative_num_steps while the server runs."""
    make_tree(tmp_path / "fake", "v2")
    r = run_driver(tmp_path, "v2", cycles=20, env={"EAGLE3_PROFILE": "1"}, switch=7)
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert [(ev.cycles, ev.steps, ev.draft_tokens, ev.verify_tokens) for ev in events] == [
        (5, 2, 3, 3),
        (2, 2, 3, 3),
        (5, 3, 4, 4),
        (5, 3, 4, 4),
    ]  # cycles 0-4, 5-6 | 7-11, 12-16
    assert all(sum(ev.accept_counts) == ev.cycles for ev in events)


def test_probe_off_does_nothing_and_other_ranks_stay_quiet(tmp_path):
    make_tree(tmp_path / "fake", "v2")
    off = run_driver(tmp_path, "v2")
    assert off.returncode == 0 and "EAGLE3_PROFILE" not in off.stdout and "patched: False" in off.stdout
    rank1 = run_driver(tmp_path, "v2", rank=1, env={"EAGLE3_PROFILE": "1"})
    assert "EAGLE3_PROFILE" not in rank1.stdout and "patched: True" in rank1.stdout
    chosen = run_driver(tmp_path, "v2", rank=1, env={"EAGLE3_PROFILE": "1", "EAGLE3_PROFILE_RANK": "1"})
    assert chosen.stdout.count("EAGLE3_PROFILE v=2") == 4


def test_unknown_layout_warns_once_and_runs_unprofiled(tmp_path):
    make_tree(tmp_path / "fake", "v2", drop="verify")
    r = run_driver(tmp_path, "v2", env={"EAGLE3_PROFILE": "1"})
    warnings = [x for x in r.stdout.splitlines() if "not found" in x]
    assert len(warnings) == 1 and "EAGLEWorkerV2.verify" in warnings[0] and "unprofiled" in warnings[0]
    assert "EAGLE3_PROFILE v=" not in r.stdout


@pytest.mark.parametrize("where", ["start", "stop", "_accept", "_log"])
def test_a_probe_error_disables_the_probe_and_never_the_server(tmp_path, where):
    """A failure injected into the recorder (as a bug or an unexpected SGLang object would cause):
    the server's phases all run and return, one warning is logged, SGLang's methods are restored."""
    make_tree(tmp_path / "fake", "v2")
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(  # chained after the probe's own, once it is installed
        "import eagle3_probe\n"
        f"def boom(*a, **k):\n    raise RuntimeError('injected into {where}')\n"
        f"eagle3_probe.Recorder.{where} = boom\n"
    )
    r = run_driver(tmp_path, "v2", cycles=20, env={"EAGLE3_PROFILE": "1"}, extra_path=[inject])
    assert r.returncode == 0, r.stderr  # the driver ran all 20 cycles
    warnings = [x for x in (r.stdout + r.stderr).splitlines() if "probe disabled" in x]
    assert len(warnings) == 1 and f"injected into {where}" in warnings[0] and "unprofiled" in warnings[0]
    assert "EAGLE3_PROFILE v=" not in r.stdout and "patched: False" in r.stdout


def test_the_servers_own_errors_pass_through_the_probe(monkeypatch):
    from tuitune.probe import eagle3_probe as ep

    class Worker:
        calls = 0

        def verify(self, x):
            Worker.calls += 1
            if x < 0:
                raise ValueError("the server's own error")
            return x * 2

    monkeypatch.setattr(ep, "RECORDER", ep.Recorder(5, "host"))
    monkeypatch.setattr(ep, "_PATCHED", [])
    ep._wrap(Worker, "verify", "verify")
    assert Worker().verify(3) == 6
    with pytest.raises(ValueError, match="own error"):
        Worker().verify(-1)
    assert Worker.calls == 2 and ep.RECORDER is not None  # called once each; the probe stays on


def test_sitecustomize_chains_to_an_existing_one(tmp_path):
    make_tree(tmp_path / "fake", "v2")
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nprint('OTHER SITECUSTOMIZE RAN')\n")
    for env in ({}, {"EAGLE3_PROFILE": "1"}):
        r = run_driver(tmp_path, "v2", env=env, extra_path=[other])
        assert "OTHER SITECUSTOMIZE RAN" in r.stdout


def test_check_reads_the_source_without_importing(tmp_path):
    make_tree(tmp_path / "fake", "v1")
    make_tree(tmp_path / "fake", "v2", drop="draft")
    report = check(str(tmp_path / "fake" / "sglang"))
    assert report["version"] == "0.5.99.fake" and report["ok"] is True  # v1 complete; v2 lacks draft
    assert report["modules"]["sglang.srt.speculative.eagle_worker_v2"]["EagleDraftWorker.draft"]["found"] is False
    assert "sglang.srt.speculative.eagle_worker" in report["usable"]
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "probe", "check", "--sglang-path", str(tmp_path / "fake" / "sglang")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (
        r.returncode == 0
        and "MISSING EagleDraftWorker.draft" in r.stdout
        and "patchable phases: draft, extend, verify" in r.stdout
    )


def test_check_against_the_real_sglang_release(sglang_release):
    report = check(str(sglang_release))
    assert report["version"] == "0.5.23" and report["ok"]
    assert report["usable"] == ["sglang.srt.speculative.eagle_worker_v2", "sglang.srt.speculative.ngram_worker"]
    ngram = report["modules"]["sglang.srt.speculative.ngram_worker"]
    assert ngram["NGRAMWorker.forward_batch_generation"] == {"phase": "cycle", "found": True}
    assert ngram["NGRAMWorker._prepare_for_speculative_decoding"] == {"phase": "draft", "found": True}


def test_launch_command_puts_the_probe_first_on_pythonpath(tmp_path):
    p = P.resolve("c4-eagle3-2step-nccl")
    cmd = P.launch_command(p)
    assert 'EAGLE3_PROFILE=1 PYTHONPATH="$HOME/.cache/tuitune/probe${PYTHONPATH:+:$PYTHONPATH}"' in cmd
    assert "PYTHONPATH" not in P.launch_command(P.resolve("demo"))  # the simulator prints its own lines
    out = subprocess.run(
        ["bash", "-c", 'HOME=/h; PYTHONPATH=/a; echo "$HOME/.cache/tuitune/probe${PYTHONPATH:+:$PYTHONPATH}"'],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert out == "/h/.cache/tuitune/probe:/a"


@pytest.mark.gpu
def test_event_timing_on_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (CI never has one)")
    from tuitune_support import probe_bench as po

    make_tree(tmp_path / "fake", "v2", work=po.GPU_WORK)
    (tmp_path / "probe").mkdir()
    for name in FILES:
        (tmp_path / "probe" / name).write_bytes((PROBE_DIR / name).read_bytes())
    (tmp_path / "harness.py").write_text(po.HARNESS)
    out, lines = po.run(tmp_path, "timed", {"EAGLE3_PROFILE": "1"})
    # the first window includes CUDA's warm-up (a fresh H200 drafted 3.44 ms against a 2.68 ms
    # verify there): only the windows after it show the steady-state phase order
    assert len(lines) >= 8 and all(e.sync == "event" for e in lines)
    assert all(e.verify_ms > e.draft_ms > 0 for e in lines[1:])
    assert all(e.accept_len == pytest.approx(2.0) for e in lines)  # read from the GPU tensor, a window late
    # format v2: the histogram counted on the GPU (every request accepted 2 tokens), verify tokens
    assert all(
        e.v == 2 and e.accept_counts == (0, e.cycles * e.bs) and e.verify_tokens == e.bs * e.draft_tokens for e in lines
    )


# ---- accept lengths as a tensor (SGLang's v2 verify returns them on the GPU) ----------------------


class _Batch:
    def __init__(self, n):
        self.reqs = [object()] * n


class _Result:
    def __init__(self, lens):
        self.accept_lens = lens


class _Worker:
    __module__ = "sglang.srt.speculative.eagle_worker_v2"
    tp_rank = 0
    speculative_num_steps = 2
    speculative_num_draft_tokens = 3


def _drive(rec, lens_seq, steps_at=None):
    """Cycles through the recorder as the patched phases call it; ``steps_at``: {cycle: (steps, tokens)}."""
    w = _Worker()
    for i, lens in enumerate(lens_seq):
        if steps_at and i in steps_at:
            w.speculative_num_steps, w.speculative_num_draft_tokens = steps_at[i]
        for phase, result in (("draft", None), ("verify", _Result(lens)), ("extend", None)):
            token = rec.start(phase, w)
            rec.stop(phase, token, w, (_Batch(len(lens)),), result)


def _profile_lines(caplog):
    events = [parse_line(r.getMessage()) for r in caplog.records if "EAGLE3_PROFILE" in r.getMessage()]
    assert all(e is not None and e.kind == "profile" for e in events)
    return events


def test_tensor_accept_lengths_are_counted_per_window_across_ring_overflow_and_a_steps_change(caplog):
    """The tensor path keeps the lengths in a ring on their device and counts them once a window:
    every window's histogram and mean must be exactly its own cycles', also when the ring fills up
    mid-window (cycles of 3000 requests against a 4096-slot ring) and when a steps change closes
    a window early (that cycle's lengths, already in the ring, belong to the next window)."""
    torch = pytest.importorskip("torch")
    from tuitune.probe import eagle3_probe as ep

    caplog.set_level(logging.INFO)
    gen = torch.Generator().manual_seed(7)
    sizes = [1, 5, 3000, 2, 3000, 3000, 7, 1, 3000, 4, 2, 3000, 1]
    seq = [torch.randint(1, 5, (n,), generator=gen, dtype=torch.int32) for n in sizes]
    seq[4][0] = 40  # longer than HIST_LEN: counted in the last bin, summed as it is
    rec = ep.Recorder(5, "host")
    _drive(rec, seq, steps_at={7: (3, 4)})
    events = _profile_lines(caplog)
    # cycles 0-4 | 5-6 (steps change at 7) | 7-11; cycle 12 stays in the open window
    assert [(e.cycles, e.steps) for e in events] == [(5, 2), (2, 2), (5, 3)]
    for e, cycles in zip(events, (seq[0:5], seq[5:7], seq[7:12]), strict=True):
        flat = torch.cat(cycles)
        want = [int((flat.clamp(1, ep.HIST_LEN) == k).sum()) for k in range(1, ep.HIST_LEN + 1)]
        while want and want[-1] == 0:
            want.pop()
        assert list(e.accept_counts) == want
        assert e.accept_len == pytest.approx(float(flat.double().mean()), abs=5e-4)
    assert rec.lens.off == 3001 and rec.lens.start == 3000  # the ring did start over


def test_the_ring_read_a_window_late_gives_each_window_its_own_counts():
    """sync=event reads a window's counts when the next window closes: by then the ring already
    counts the newer window, so each handle must keep its own (pinned rows in turn)."""
    torch = pytest.importorskip("torch")
    from tuitune.probe import eagle3_probe as ep

    ring = ep._LensRing(torch, torch.ones(3, dtype=torch.int32), window=4)
    handles = []
    for k in range(6):  # window k: four cycles of three requests accepting k + 1
        for _ in range(4):
            ring.add(torch.full((3,), k + 1, dtype=torch.int32))
        handles.append(ring.close())
        if k:
            counts, total = ring.read(handles[k - 1])  # one window late, as event mode reads
            assert counts[k - 1] == 12 and sum(counts) == 12 and total == 12 * k


@pytest.mark.gpu
def test_the_histogram_costs_one_device_op_a_cycle_on_a_gpu():
    """The accept-length histogram's hot path on a GPU: one copy a verify, nothing that waits
    (profile v2 first counted it there each cycle: 5 kernels and 2 device-to-host copies)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (CI never has one)")
    from torch.utils._python_dispatch import TorchDispatchMode

    from tuitune.probe import eagle3_probe as ep

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:  # views launch nothing
                self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    rec = ep.Recorder(40, "event")
    lens = torch.full((8,), 2, dtype=torch.int32, device="cuda")
    rec._setup(_Worker())
    rec._accept(_Result(lens))  # the first call allocates the ring
    with Count() as counted:
        rec._accept(_Result(lens))
    assert counted.ops == ["aten.copy_.default"]
