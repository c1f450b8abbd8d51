"""Headless capture, report, and sweep, end to end with the simulator as a real process."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.base.events import ProfileWindow
from tuitune.measure.capture import CaptureWriter, read_capture
from tuitune.measure.parse import parse_line
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.presets import make_preset
from tuitune_support.procs import tuitune_cli, wait_for, wait_or_dump


def cli(*args, timeout=180, env=None):
    return tuitune_cli(*args, env=env, timeout=timeout)


def test_record_then_report_round_trip(tmp_path):
    p = make_preset(tmp_path, "rec", env={"NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret", "MY_API_KEY": "k"})
    path = P.save(p, tmp_path / "rec.yaml")
    out = tmp_path / "cap.jsonl.gz"
    r = cli("--record", str(out), str(path), "--relaunch", "--load", "--cycles", "200", "--raw")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    cap = read_capture(out)
    assert cap.meta["schema"] == 1 and cap.meta["preset_hash"] == p.hash() and not cap.truncated
    assert cap.meta["preset"]["env"] == {"NCCL_PROTO": "LL", "HF_TOKEN": "••••", "MY_API_KEY": "••••"}
    assert "hf_secret" not in out.read_bytes().decode("latin-1")  # gzip of text: check decompressed too
    kinds = {rec.event.kind for rec in cap.records}
    assert {"profile", "decode", "log", "ready", "server_state"} <= kinds
    cycles = sum(rec.event.cycles for rec in cap.records if isinstance(rec.event, ProfileWindow))
    assert cycles >= 200
    # the recording ends with what it wrote, even when stderr is not a terminal
    windows = sum(isinstance(rec.event, ProfileWindow) for rec in cap.records)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"wrote {len(cap.records)} events ({windows} profile windows, {cycles} cycles) to {out}"), (
        last
    )
    ms = [rec.m for rec in cap.records]
    assert ms == sorted(ms)
    r = cli("report", str(out), "--json")
    rep = json.loads(r.stdout)[0]
    assert rep["relaunches"] == 1 and rep["stats"]["verify_ms"]["n"] >= 20 and rep["stats"]["accept_len"]["mean"] > 1
    r = cli("report", str(out), str(out))
    assert (
        r.returncode == 0 and "verify_ms" in r.stdout and "+0.0%" in r.stdout and "tok/s per profile window" in r.stdout
    )
    cli("stop", str(path))


def test_killed_recording_still_reads_and_ctrl_c_finishes_cleanly(tmp_path):
    p = make_preset(tmp_path, "kill")
    path = P.save(p, tmp_path / "kill.yaml")
    for sig, name in ((signal.SIGKILL, "killed.jsonl"), (signal.SIGINT, "interrupted.jsonl")):
        out = tmp_path / name
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuitune",
                "--record",
                str(out),
                str(path),
                "--relaunch",
                "--load",
                "--duration",
                "60",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda out=out: out.exists() and out.stat().st_size > 20_000, 30, what="capture to grow")
        proc.send_signal(sig)
        rc = proc.wait(20)
        cap = read_capture(out)
        assert len(cap.records) > 50
        if sig == signal.SIGINT:
            assert rc == 0 and not cap.truncated
    # a capture cut mid-record: the partial last line is dropped, everything before it reads
    whole = (tmp_path / "killed.jsonl").read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(whole[: len(whole) - 7])
    cap = read_capture(cut)
    assert cap.truncated and len(cap.records) >= 1
    cli("stop", str(path))


def test_capture_errors_are_one_sentence(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    r = cli("report", str(bad))
    assert r.returncode == 2 and "not a tuitune capture" in r.stderr and "Traceback" not in r.stderr
    newer = tmp_path / "newer.jsonl"
    newer.write_text('{"kind": "meta", "schema": 99}\n')
    assert "newer than this tuitune reads" in cli("report", str(newer)).stderr
    w = CaptureWriter(tmp_path / "old.jsonl", {"preset": None})
    w.write([ProfileWindow(1.0, 2.0, 3.0, 1.5, 6.0)])
    w.close()
    with open(tmp_path / "old.jsonl", "a") as f:
        f.write('{"kind": "some_future_kind", "x": 1, "t": 0, "m": 0}\n')
    cap = read_capture(tmp_path / "old.jsonl")
    assert len(cap.records) == 1 and cap.skipped == 1
    assert cli("--record", str(tmp_path / "x.jsonl")).returncode == 2
    assert (
        "not running"
        in cli(
            "--record", str(tmp_path / "x.jsonl"), str(P.save(make_preset(tmp_path, "off"), tmp_path / "off.yaml"))
        ).stderr
    )


@pytest.mark.sim_clock  # its best (2 steps, 1.7 % ahead of 3) read off the simulator's clock: 3 won at -n 4
def test_sweep_finds_the_seeds_answer_and_resumes(tmp_path):
    port = free_port()

    def twin(name: str) -> Path:
        # low-noise simulator (quasi-random acceptance draws, no launch-to-launch spread): 2 and 3
        # steps are 1.7 % apart in the model, closer than random draws over a short test resolve
        p = P.with_changes(
            P.resolve(name),
            {
                "server.log": str(tmp_path / f"{name}.log"),
                "server.port": port,
                "server.args.sim-speedup": 10,
                "server.args.sim-load-seconds": 0.2,
                "server.args.sim-draws": "quasi",
                "server.args.sim-launch-sigma": 0.0,
                "bench.requests": 5,
                "bench.warmup": 0,
                "bench.max_tokens": 500,
            },
        )
        return P.save(p, tmp_path / f"{name}.yaml")

    c4, c2, c1 = twin("sim-c4-eagle3-2step-nccl"), twin("sim-c2-baseline-nccl"), twin("sim-c1-baseline-untuned")
    out = tmp_path / "out"
    args = [
        "sweep",
        str(c4),
        "--grid",
        "speculative.num_steps=1,2,3,4",
        "--grid",
        f"env=@{c2},@{c1}",
        "--baseline",
        str(c2),
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuitune", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},
        # as a shell's background job starts it: SIGINT ignored. It once ran on unseen to its last trial
        # (a test before it had left the suite's worker with SIGINT ignored, and the child inherited that)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    wait_for(
        lambda: (out / "results.jsonl").exists() and len((out / "results.jsonl").read_text().splitlines()) >= 5,
        120,
        what="five trials",
    )
    proc.send_signal(signal.SIGINT)
    assert wait_or_dump(proc, 30, "sweep after SIGINT") == 130
    assert proc.stderr is not None and "interrupted by SIGINT" in proc.stderr.read().decode()
    first = [json.loads(x)["trial"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert 5 <= len(first) < 11
    assert cli(*args).returncode == 2  # existing results without --resume: refused
    r = cli(*args, "--resume", timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    ids = [x["trial"] for x in rows]
    assert len(ids) == len(set(ids)) == 11 and ids[: len(first)] == first  # 8 configs + 3 baselines, once each
    assert (out / "results.csv").read_text().count("\n") == 12
    assert len(list((out / "captures").glob("*.jsonl.gz"))) >= 11
    table = r.stdout
    assert "best: num_steps=2 env=@sim-c2-baseline-nccl" in table
    best_line = next(x for x in table.splitlines() if x.startswith("num_steps=2 env=@sim-c2-baseline-nccl"))
    assert "▲" in best_line  # beats the NCCL baseline
    untuned = [x for x in table.splitlines() if x.startswith("num_steps=") and "env=@sim-c1-baseline-untuned" in x]
    assert len(untuned) == 4 and all("▼" in x for x in untuned)
    assert "tok/s against speculative steps" in table
    assert "env=@sim-c2-baseline-nccl" in table.split("tok/s against speculative steps")[1]  # legend, after resume
    best = P.load(out / "best.yaml")
    assert best.speculative.num_steps == 2 and best.env.get("NCCL_PROTO") == "LL"


def test_record_on_a_running_server_starts_at_the_end(tmp_path):
    """Issue 13 item 9: the old log used to be recorded as new events (110 historic cycles in 0.6 s)."""
    p = make_preset(tmp_path, "hist")
    path = P.save(p, tmp_path / "hist.yaml")
    env = {**os.environ, "HOME": str(tmp_path)}
    assert cli("launch", str(path), env=env).returncode == 0
    r = cli("bench", str(path), "--requests", "4", env=env)  # the log now holds profiled cycles
    assert r.returncode == 0, r.stderr
    assert "PROFILE" in Path(p.server.log).read_text() or "profile" in Path(p.server.log).read_text().lower()
    log = Path(p.server.log)
    lines = [x for x in log.read_text().splitlines() if isinstance(parse_line(x), ProfileWindow)]
    assert lines
    with log.open("a") as f:  # a long history (the idle server writes nothing meanwhile): seconds to read
        f.write("\n".join(lines * (100_000 // len(lines) + 1)) + "\n")
    logged = [x for x in map(parse_line, log.read_text().splitlines()) if isinstance(x, ProfileWindow)]
    r = cli("--record", str(tmp_path / "new.jsonl"), str(path), "--duration", "1", env=env)
    assert r.returncode == 0, r.stderr
    assert not [x for x in read_capture(tmp_path / "new.jsonl").records if isinstance(x.event, ProfileWindow)]
    # --from-start: all of the history, however short the duration (it counts from when the history
    # has been read: a 1 s recording under CI's load once ended before any of it had arrived)
    r = cli("--record", str(tmp_path / "all.jsonl"), str(path), "--duration", "0.01", "--from-start", env=env)
    assert r.returncode == 0, r.stderr
    windows = [x for x in read_capture(tmp_path / "all.jsonl").records if isinstance(x.event, ProfileWindow)]
    assert len(windows) == len(logged), (len(windows), len(logged))
    cli("stop", str(path), env=env)


def test_ctrl_c_during_relaunch_or_bench_stops_quickly_with_a_closed_capture(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    for name, args, extra in (
        ("slowstart", {"sim-load-seconds": 60, "sim-speedup": 1}, ["--relaunch"]),
        ("longbench", {}, ["--relaunch", "--bench", "100000"]),
    ):
        p = make_preset(tmp_path, name, args=args)
        path = P.save(p, tmp_path / f"{name}.yaml")
        out = tmp_path / f"{name}.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuitune", "--record", str(out), str(path), *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        state = tmp_path / ".cache" / "tuitune" / "servers" / f"{p.server.port}.json"
        wait_for(state.exists, 30, what="the server to start")
        if "--bench" in extra:
            wait_for(
                lambda log=Path(p.server.log): (
                    "Prefill batch" in log.read_text(errors="replace")
                    or "Decode batch" in log.read_text(errors="replace")
                ),
                30,
                what="the bench",
            )
        else:
            import time

            time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        import time

        t0 = time.monotonic()
        proc.wait(30)
        took = time.monotonic() - t0
        # the target is 2 s; measured 0.1-0.6 s on a loaded 2-core machine (benchmarks/ctrl_c_latency.py)
        assert proc.returncode == 0 and took < 4, (name, took, proc.stderr.read()[-500:])
        cap = read_capture(out)
        assert not cap.truncated and len(cap.records) >= 1
        cli("stop", str(path), env=env)
