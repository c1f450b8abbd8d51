"""`make bench`'s one runner (benchmarks/run.py), run as `make bench` runs it: every script in
benchmarks/ has a group and a world in its table, a run leaves one record with the figures the
script printed, a script that needs an argument is not run bare, and bad names get one sentence."""

from __future__ import annotations

import json
import subprocess
import sys

from tuitune_support.paths import ROOT

RUN = ROOT / "benchmarks" / "run.py"


def runner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_every_script_has_a_group_and_a_world():
    r = runner("--list")
    assert r.returncode == 0, r.stderr
    listed = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines()}
    on_disk = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"run"}
    assert set(listed) == on_disk
    assert set(listed.values()) == {"performance", "accuracy", "calibration", "real-engine"}
    grouped = runner("--list", "--group", "calibration").stdout
    assert "sim_calibration" in grouped and "bench_parse" not in grouped


def test_a_run_leaves_one_record_with_the_scripts_figures(tmp_path):
    out = tmp_path / "records.jsonl"
    r = runner("house_figures", "bench_pairs", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["name"] for x in recs] == ["house_figures", "bench_pairs"]
    figures = recs[0]
    assert figures["exit"] == 0 and figures["group"] == "performance" and figures["world"] == "the source tree"
    assert figures["command"] == "python benchmarks/house_figures.py"
    modules = next(line for line in figures["figures"] if line.startswith("modules"))
    assert int(modules.split()[-1]) > 100  # the script's own figure, as it printed it
    assert recs[1]["exit"] is None and recs[1]["figures"] == ["not run: needs PRESET (a server that is up)"]
    assert "1 run, 1 not run, 0 failed" in r.stdout


def test_a_failing_script_fails_the_run_and_bad_names_say_so(tmp_path):
    out = tmp_path / "records.jsonl"
    r = runner("acceptance_fit", "--out", str(out), "--", "/nonexistent/launches")
    assert r.returncode == 1 and "failed: acceptance_fit" in r.stderr
    assert json.loads(out.read_text())["exit"] not in (0, None)
    r = runner("cli_startup", "--timeout", "2", "--out", str(out), "--", "--runs", "100000")  # silent until done
    rec = json.loads(out.read_text().splitlines()[-1])
    assert r.returncode == 1 and rec["exit"] != 0 and rec["figures"][-1] == "runner: stopped after 2 s"
    assert rec["seconds"] < 30
    r = runner("no_such_bench")
    assert r.returncode == 2 and r.stderr.strip() == "run.py: no benchmark named no_such_bench (--list shows them)"
    r = runner("--group", "accuracy", "--", "--pairs", "3")
    assert r.returncode == 2 and "go to one script" in r.stderr
