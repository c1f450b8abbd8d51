"""Command line details a new user hits first: bench output and URLs, JSON listings, plain charts,
shell completion."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tuitune import preset as P
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.benchrun import BenchRun
from tuitune.measure.request import RequestResult
from tuitune_support.cli import spent_search, tuitune
from tuitune_support.paths import ROOT

CAPTURE = ROOT / "tests" / "data" / "demo-capture.jsonl"


def test_bench_url_without_scheme_json_to_stdout_and_progress(sim_factory, tmp_path):
    sim = sim_factory("--tp-size", "2", "--sim-load-seconds", "0.2", "--sim-speedup", "10")
    sim.wait_ready()
    r = tuitune(
        "bench",
        "--url",
        f"127.0.0.1:{sim.port}",
        "--requests",
        "3",
        "--warmup",
        "0",
        "--max-tokens",
        "40",
        "--json",
        "-",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)  # stdout is the JSON alone
    assert len(data["results"]) == 3 and data["summary"]["requests"] == 3
    assert not (tmp_path / "-").exists()
    assert "bench: 3/3 requests" in r.stderr and "decode" in r.stderr  # progress and summary on stderr
    r = tuitune("bench", "--url", "ftp://x:1")
    assert r.returncode == 2 and "expected http://HOST:PORT" in r.stderr


def test_no_throughput_warning_on_a_short_run():
    """The server's last log interval is not the client's per-request rate: never compared."""
    run = BenchRun(
        BenchConfig("http://x"),
        results=[RequestResult(ok=True, ttft_s=0.1, e2e_s=1.09, completion_tokens=100, spec_verify_ct=50)],
        server={"last_gen_throughput": 236.0, "avg_spec_accept_length": 2.05},
    )
    assert run.cross_check() == []
    run.server["avg_spec_accept_length"] = 3.0  # like for like: still checked
    assert "accept length" in run.cross_check()[0]


def test_preset_list_and_validate_json(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    (tmp_path / "tuitune" / "presets").mkdir(parents=True)
    (tmp_path / "tuitune" / "presets" / "broken.yaml").write_text("name: broken\nserver: {log: /tmp/x.log, port: 0}\n")
    r = tuitune("preset", "list", "--json", env=env)
    rows = json.loads(r.stdout)
    demo = next(x for x in rows if x["name"] == "demo")
    assert demo["origin"] == "shipped" and demo["valid"] and demo["path"].endswith("demo.yaml")
    bad = next(x for x in rows if x["path"].endswith("broken.yaml"))
    assert not bad["valid"] and "port" in bad["error"]
    r = tuitune("preset", "validate", "demo", "broken", "--json", env=env)
    out = json.loads(r.stdout)
    assert r.returncode == 2 and [x["ok"] for x in out] == [True, False] and out[0]["hash"]
    r = tuitune("preset", "validate", "broken", "demo", env=env)  # plain: every preset is checked
    assert r.returncode == 2 and "demo: ok" in r.stdout


def test_charts_are_plain_text_when_piped_or_no_color():
    r = tuitune("report", str(CAPTURE))  # stdout is a pipe here
    assert r.returncode == 0 and "tok/s per profile window" in r.stdout and "\x1b" not in r.stdout
    from tuitune.measure.report import chart, summarize_capture

    rep = summarize_capture(str(CAPTURE))
    assert "\x1b" in chart([rep], colour=True) and "\x1b" not in chart([rep], colour=False)
    from tuitune.measure.report import colour_wanted

    class Tty:
        def isatty(self):
            return True

    os.environ["NO_COLOR"] = "1"
    try:
        assert not colour_wanted(Tty())
    finally:
        del os.environ["NO_COLOR"]
    assert colour_wanted(Tty())


def test_sweep_plot_plain():
    import msgspec

    from tuitune.experiments.results import SweepResult
    from tuitune.experiments.sweep import plot

    result = {
        "preset": "p",
        "best": None,
        "baseline_axes": {},
        "table": [
            {
                "label": f"num_steps={s}",
                "kind": "config",
                "tok_s": 100 + s,
                "changes": {"speculative.num_steps": s},
                "axes": {"speculative.num_steps": s},
            }
            for s in (1, 2, 3)
        ],
    }
    typed = msgspec.convert(result, SweepResult)
    assert "\x1b" not in plot(typed, colour=False) and "\x1b" in plot(typed, colour=True)


def complete(line: str, env=None) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "tuitune.cli"],
        env={
            **os.environ,
            **(env or {}),
            "_ARGCOMPLETE": "1",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_IFS": "\n",
        },
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        close_fds=False,
        preexec_fn=lambda: os.dup2(1, 8),
    )  # argcomplete answers on fd 8
    return r.stdout.split("\n")


def test_shell_completion_of_commands_presets_and_grid_keys(tmp_path):
    assert "status" in [c.strip() for c in complete("tuitune sta")]
    presets = [c.strip() for c in complete("tuitune status sim-c", env={"XDG_CONFIG_HOME": str(tmp_path)})]
    assert "sim-c1-baseline-untuned" in presets and all(p.startswith("sim-c") for p in presets if p)
    grid = [c.strip() for c in complete("tuitune sweep demo --grid speculative.num")]
    assert "speculative.num_steps=" in grid and "speculative.num_draft_tokens=" in grid
    nccl = [c.strip() for c in complete("tuitune sweep demo --grid env.NCCL_PR")]
    assert "env.NCCL_PROTO=" in nccl
    r = tuitune("completion", "bash")
    assert r.returncode == 0 and "complete" in r.stdout and "tuitune" in r.stdout


def test_demo_port_option_is_checked():
    r = tuitune("demo", "--port", "0")
    assert r.returncode == 2 and "--port must be between 1 and 65535" in r.stderr


# ---- one error mapper: every command says a failed server's last log lines -----------------------


def test_tune_prints_the_failed_servers_last_log_lines(tmp_path):
    """tune's final A/B relaunches the start; when that server dies at start, tune says why in the
    server's own words, as launch does (it used to drop the log tail)."""
    # the start does not fit in memory any more (the simulator's OOM at start, with its traceback);
    # an earlier search (resumed, budget spent) measured speculation off faster than the start
    _, path, out = spent_search(tmp_path, args={"mem-fraction-static": 0.97})
    r = tuitune(
        "tune", str(path), "--budget", "0", "--concurrency", "1", "--out", str(out), "--resume", "--ab-rounds", "1", "--no-verdict",
        env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    tail = [line for line in r.stderr.splitlines() if line.startswith("  | ")]
    ours = [line for line in r.stderr.splitlines() if not line.startswith("  | ")]
    assert "A/B:" in r.stdout and not any("Traceback" in line for line in ours), r.stderr
    assert tail and any("CUDA out of memory" in line for line in tail), r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("tuitune: ") and "out of memory" in last


def test_tune_without_a_final_ab_reports_its_answer_unconfirmed(tmp_path):
    """`--ab-rounds 0`: the search's answer (here from a resumed search whose budget is spent: off
    measured twice as fast) is reported as unconfirmed, no best.yaml, nothing launched; a negative
    count is refused in one sentence."""
    base, path, out = spent_search(tmp_path)
    env = {"HOME": str(tmp_path)}
    common = ["tune", str(path), "--budget", "0", "--concurrency", "1", "--out", str(out), "--resume"]
    r = tuitune(*common, "--ab-rounds", "-1", env=env)
    assert r.returncode == 2 and "--ab-rounds must be at least 0" in r.stderr and "Traceback" not in r.stderr
    r = tuitune(*common, "--ab-rounds", "0", "--json", str(tmp_path / "r.json"), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["chosen"]["steps"] == 0 and res["verdict"]["verdict"] == "not confirmed" and "ab" not in res, res
    assert "no verdict: --ab-rounds 0: no final A/B" in r.stdout and "A/B:" not in r.stdout, r.stdout
    assert not (out / "best.yaml").exists()
    assert not Path(base.server.log).exists()  # no server was started


def test_preset_validate_without_arguments_checks_every_preset_and_the_shipped_ones_are_clean(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    mine = tmp_path / "tuitune" / "presets"
    mine.mkdir(parents=True)
    seeds = (ROOT / "presets" / "c4-eagle3-2step-nccl.yaml").read_text()
    # the seeds' variable with another value is a slip of the user's, not the seeds' choice: it warns
    (mine / "c4-mine.yaml").write_text(
        seeds.replace("name: c4-eagle3-2step-nccl", "name: c4-mine").replace(
            "NCCL_MAX_NCHANNELS: 16", "NCCL_MAX_NCHANNELS: 8"
        )
    )
    r = tuitune("preset", "validate", env=env)
    shipped = sorted((ROOT / "presets").glob("*.yaml"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for path in shipped:
        assert f"shipped {path.stem}: ok (hash " in r.stdout, path
    warned = [ln for ln in lines[:-1] if "warning" in ln]
    assert warned == [
        "user c4-mine: ok (hash " + P.load(mine / "c4-mine.yaml").hash() + "), 1 warning(s)",
        "  warning: env.NCCL_MAX_NCHANNELS: NCCL_MAX_NCHANNELS is deprecated since NCCL 2.17; use NCCL_MAX_CTAS",
    ], warned
    notes = [ln for ln in lines if ln.startswith("note: ")]
    assert len(notes) == 1 and "the seeds' choice" in notes[0] and "c4-eagle3-2step-nccl" in notes[0], notes
    assert "c4-mine" not in notes[0]
    assert lines[-1] == f"{len(shipped) + 1} presets: {len(shipped) + 1} valid (1 with warnings), 0 invalid"


def test_preset_list_says_where_each_preset_runs_and_whether_it_can_run_here(tmp_path, sshd):
    from tuitune_support.ports import free_port

    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    mine = tmp_path / "tuitune" / "presets"
    mine.mkdir(parents=True)
    base = {"server": {"log": "/tmp/x.log", "module": "sglang.launch_server"}}
    P.save(P.from_dict({"name": "on-sshd", "target": sshd.target(), **base}), mine / "on-sshd.yaml")
    closed = {"host": "127.0.0.1", "port": free_port(), "user": "root"}
    P.save(P.from_dict({"name": "closed", "target": closed, **base}), mine / "closed.yaml")
    P.save(P.with_changes(P.resolve("demo"), {"description": "mine"}), mine / "demo.yaml")
    r = tuitune("preset", "list", env=env)
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[1]: ln for ln in r.stdout.splitlines()[1:] if ln.startswith("shipped ")}
    rows |= {ln.split()[1]: ln for ln in r.stdout.splitlines()[1:] if ln.startswith("user ")}
    assert re.search(r"^user +on-sshd +ssh root@127\.0\.0\.1:\d+ +yes$", rows["on-sshd"]), rows["on-sshd"]
    assert re.search(r" ssh root@127\.0\.0\.1:\d+ +no$", rows["closed"]), rows["closed"]
    assert re.search(r" ssh root@gpu-box +no ", rows["c4-eagle3-2step-nccl"])  # the seeds' box is not here
    assert re.search(r" local \(SGLang\) +no ", rows["h200x2-nccl-screen"])
    assert re.search(r" simulator +yes ", rows["sim-c4-eagle3-2step-nccl"])
    assert re.search(r" simulator, 2 nodes +yes ", rows["sim-2node-eagle3"])
    assert "(hides the shipped demo) mine" in rows["demo"]
    assert f"not here: 127.0.0.1:{closed['port']}: Connection refused (closed)" in r.stdout
    assert "not here: gpu-box is not a known host name (c1-baseline-untuned" in r.stdout
    assert "not here: sglang is not installed for python3 (h200x2-nccl-screen)" in r.stdout
    out = {x["path"]: x for x in json.loads(tuitune("preset", "list", "--json", env=env).stdout)}
    x = out[str(mine / "closed.yaml")]
    assert x["runs_on"].startswith("ssh root@127.0.0.1:") and x["runs_here"] is False and "refused" in x["why_not"]
    assert out[str(mine / "on-sshd.yaml")]["runs_here"] is True
    assert out[str(mine / "demo.yaml")]["shadows"] == str(ROOT / "presets" / "demo.yaml")


def test_the_nccl_debug_note_is_for_a_real_server_and_said_once(tmp_path, capsys):
    from tuitune.commands.server import _print_nccl
    from tuitune_support.presets import make_preset

    sim = make_preset(tmp_path, "s", env={"NCCL_PROTO": "LL"})
    _print_nccl(sim, {})
    assert capsys.readouterr().err == ""  # the simulator applies what it is given: nothing to confirm
    real = P.with_changes(sim, {"server.module": "sglang.launch_server"})
    said: set[str] = set()
    for i in range(2):  # the nodes of one launch
        _print_nccl(real, {}, f"node {i} ", said)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: node 0 NCCL_DEBUG=INFO is needed to confirm"), err
