"""Issue 13, items 10-14: verdicts that the tool could have checked (pure, plus the CLI where it is cheap)."""

from __future__ import annotations

import math
import subprocess
import sys
import time

from tuitune import preset as P
from tuitune.cli import build_command_parser
from tuitune.experiments.ab import ab_notes, verdict
from tuitune.experiments.abreport import format_ab
from tuitune.experiments.sweep import format_table, summarize
from tuitune.machine.readiness import nccl_confirmation, nccl_note
from tuitune.measure.runs import RunBook
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.presets import make_preset
from tuitune_support.results import ab_result


def _row(arm: str, preset: str, tok: float, r: int) -> dict:
    return {
        "arm": arm,
        "preset": preset,
        "median_tok_s": tok,
        "failed": 0,
        "errors": [],
        "round": r,
        "ci95": [tok - 1, tok + 1],
        "accept_len": None,
    }


def test_ab_arms_are_positional_even_with_the_same_name():
    """Two presets with the same name: B ran at 661 vs 1179 tok/s; the old name split saw ratio 1."""
    rows = [x for r in range(1, 5) for x in (_row("A", "same", 1179 + r, r), _row("B", "same", 661 + r, r))]
    v = verdict(rows, 0.01)
    assert v["verdict"] == "slower" and 0.55 < v["ratio"] < 0.57 and v["n_baseline"] == v["n_candidate"] == 4
    text = format_ab(ab_result(rows, v, "same", "same"))
    assert "B (same) is slower" in text


def test_ab_notes_for_a_a_runs_and_too_few_rounds(tmp_path):
    a = make_preset(tmp_path, "a", port=1234)
    b = P.with_changes(a, {"server.args.sim-scale": 1.2})
    assert ab_notes(a, b, 4) == []
    aa, few = ab_notes(a, a, 3)
    assert aa.startswith("A/A run") and "--rounds 3 cannot reach p < 0.05" in few


def test_cli_ab_a_a_says_so(tmp_path):
    p = P.save(make_preset(tmp_path, "aa", profile=False), tmp_path / "aa.yaml")
    r = subprocess.run(
        [sys.executable, "-m", "tuitune", "ab", str(p), str(p), "--rounds", "1", "--no-verdict", "--requests", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=180,
        env={**__import__("os").environ, "HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    assert "note: A/A run" in r.stderr and "note: --rounds 1 cannot reach p < 0.05" in r.stderr
    assert "this was an A/A run" in r.stdout


def _trial(label: str, kind: str, tok: float, i: int, changes: dict | None = None) -> dict:
    return {
        "trial": f"{kind}-{i}",
        "kind": kind,
        "label": label,
        "status": "ok",
        "tok_s_median": tok,
        "values": [tok * (1 + d / 1000) for d in range(-5, 6)],
        "changes": changes or {},
        "axes": {},
    }


def test_sweep_baseline_is_a_candidate(tmp_path):
    base = make_preset(tmp_path, "sw", port=1234)
    # the only configuration is 0.4 % slower than the baseline: no best.yaml
    rows = [
        _trial("baseline", "baseline", 100.0, 0),
        _trial("num_steps=3", "config", 99.6, 1, {"speculative.num_steps": 3}),
        _trial("baseline", "baseline", 100.0, 2),
    ]
    result = summarize(base, rows, tmp_path)
    assert result.best == "baseline" and result.best_preset is None and not (tmp_path / "best.yaml").exists()
    assert "the baseline stays best" in format_table(result)
    # a configuration 10 % faster wins and is written
    rows[1] = _trial("num_steps=3", "config", 110.0, 1, {"speculative.num_steps": 3})
    result = summarize(base, rows, tmp_path)
    assert result.best == "num_steps=3" and (tmp_path / "best.yaml").exists()


def test_staleness_is_about_the_baselines_own_conditions(tmp_path):
    a = make_preset(tmp_path, "a", port=1234, env={"NCCL_PROTO": "LL"})
    b = P.with_changes(a, {"env.NCCL_BUFFSIZE": "8388608"})
    book = RunBook(max_age_s=600)
    failed = book.add("failed", a, [], {"failed": 3})
    assert book.baseline_id is None  # a failed run never becomes the baseline
    try:
        book.mark_baseline(failed.id)
        raise AssertionError("a failed run was accepted as the baseline")
    except ValueError as e:
        assert "failed requests" in str(e)
    now = time.time()
    base = book.add("a", a, [1.0, 2.0], {"failed": 0}, started=now, env_drift=[])
    book.add("b", b, [1.0, 2.0], {"failed": 0}, started=now, env_drift=[])
    assert book.baseline_id == base.id and book.stale_reason(now) is None  # b differs: that is the comparison
    assert "min ago" in book.stale_reason(now + 601)
    lost = book.add("a again", a, [1.0], {"failed": 0}, started=now, env_drift=["NCCL_PROTO"])
    book.mark_baseline(lost.id)
    assert "did not have its preset's environment (NCCL_PROTO)" in book.stale_reason(now)


def test_nccl_confirmation_needs_nccl_debug_and_warns_when_nothing_echoed(tmp_path):
    quiet = make_preset(tmp_path, "q", port=1234, env={"NCCL_PROTO": "LL"})
    assert nccl_confirmation(quiet, {}) == [("NCCL_PROTO", "unconfirmed", None)]
    assert "NCCL_DEBUG=INFO is needed" in nccl_note(quiet, {})
    loud = P.with_changes(quiet, {"env.NCCL_DEBUG": "INFO"})
    assert nccl_confirmation(loud, {}) == [("NCCL_PROTO", "missing", None)]
    assert "NCCL echoed none" in nccl_note(loud, {})
    assert nccl_note(loud, {"NCCL_PROTO": "LL"}) is None


def test_nccl_bench_defaults_to_graphs_and_says_so_without_cuda(tmp_path):
    parse = build_command_parser("nccl-bench").parse_args
    assert parse(["x"]).graph is True and parse(["x", "--eager"]).graph is False
    import torch

    if torch.cuda.is_available():
        return  # the sentence is for machines without CUDA
    path = P.save(make_preset(tmp_path, "nb", port=free_port()), tmp_path / "nb.yaml")
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuitune",
            "nccl-bench",
            str(path),
            "--sizes",
            "4096",
            "--grid",
            "env.NCCL_PROTO=LL,Simple",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**__import__("os").environ, "HOME": str(tmp_path)},
    )
    took = time.monotonic() - t0
    err = [x for x in r.stderr.splitlines() if x.startswith("tuitune:")]
    assert r.returncode == 1 and len(err) == 1 and "no CUDA device(s)" in err[0], r.stderr
    assert "Traceback" not in r.stderr and "ProcessRaisedException" not in r.stderr
    assert took < 60 and math.isfinite(took)


async def test_sweep_refuses_two_configurations_that_read_the_same(tmp_path, monkeypatch):
    """Same class as item 10: results are keyed by label, so two presets named alike would merge."""
    import pytest

    from tuitune.experiments import grid as G
    from tuitune.experiments.sweep import SweepError, sweep

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    base = make_preset(tmp_path, "sw", port=free_port())
    one = P.save(P.with_changes(base, {"name": "twin", "env.NCCL_PROTO": "LL"}), tmp_path / "one.yaml")
    two = P.save(P.with_changes(base, {"name": "twin", "env.NCCL_PROTO": "Simple"}), tmp_path / "two.yaml")
    grid = G.parse([f"env=@{one},@{two}"])
    with pytest.raises(SweepError, match="read the same"):
        await sweep(base, grid, tmp_path / "out")


def test_sweep_rows_show_the_ratios_interval_beside_p_and_a_legend_explains_the_mark(tmp_path):
    """Issue 28: `-6.1% ≈ p=0.048` read as a bug: the interval of the ratio, which decided it, was not shown."""
    import random

    from tuitune.measure import stats

    rng = random.Random(3)
    a = [100 + rng.gauss(0, 6) for _ in range(8)]
    b = [94 + rng.gauss(0, 6) for _ in range(8)]
    cmp = stats.compare(a, b)
    lo, hi = cmp["ratio_ci"]
    assert cmp["p_value"] < 0.05 and hi > 0.99 and cmp["verdict"] == "no significant difference"  # the case
    base = make_preset(tmp_path, "sw", port=1234)
    rows = [
        {**_trial("baseline", "baseline", 100.0, 0), "values": a},
        {**_trial("num_steps=1", "config", 94.0, 1, {"speculative.num_steps": 1}), "values": b},
    ]
    text = format_table(summarize(base, rows))
    row = next(ln for ln in text.splitlines() if ln.startswith("num_steps=1"))
    pct = f"{(cmp['ratio'] - 1) * 100:+.1f}%"
    assert row.split()[-4:] == [pct, "≈", f"{lo:.3f}-{hi:.3f}", f"{cmp['p_value']:.3f}"], row
    header = text.splitlines()[0]
    assert header.rstrip().endswith("Δ vs baseline  ratio 95% CI      p")
    assert "▲ faster / ▼ slower: p < 0.05 (Mann-Whitney) and the ratio's 95% CI entirely beyond 1 ± 1%" in text
    assert "compared per request" in text
    why = f"num_steps=1: ≈ because p = {cmp['p_value']:.3f} < 0.05, but the ratio's 95% CI {lo:.3f}-{hi:.3f}"
    assert why + " reaches within 1% of 1" in text


def test_ab_and_crossover_say_why_the_verdict_is_what_it_is():
    from tuitune.experiments.crossover import format_result
    from tuitune.experiments.results import CrossoverArm, CrossoverLevel, CrossoverResult

    rows = [x for r in range(1, 5) for x in (_row("A", "a", 100 + r, r), _row("B", "b", 110 + r, r))]
    v = verdict(rows, 0.01)
    text = format_ab(ab_result(rows, v))
    lo, hi = v["ratio_ci"]
    assert (
        f"why: p = {v['p_value']:.3f} < 0.05: the ratio's 97.1% CI {lo:.3f}-{hi:.3f} lies above 1 "
        "(16 of 16 launch pairs favour B)" in text
    )
    level = CrossoverLevel(
        concurrency=4,
        on=CrossoverArm(goodput=300.0, batch_size=None, accept_len=None),
        off=CrossoverArm(goodput=290.0, batch_size=None, accept_len=None),
        speedup=300 / 290,
        ci95=[0.99, 1.08],
        verdict="no significant difference",
    )
    text = format_result(
        CrossoverResult(preset="p", twin="p-off", levels=[level], comparable=True, crossover=None, min_effect=0.02)
    )
    row = text.splitlines()[1].split()
    assert row[-4:] == [
        "0.990-1.080",
        "no",
        "significant",
        "difference",
    ], row
    assert "faster / slower when the speedup's 95% CI (bootstrap) lies entirely beyond 1 ± 2%" in text


def test_a_verdict_across_different_concurrency_limits_is_refused_where_the_limit_binds():
    """SGLang resets max_running_requests to 48 whenever speculation is on (GPU or CPU; seen on the real
    0.5.18 CPU build's /server_info: effective_max_running_requests_per_dp 48): an arm held to 48 at
    64 streams is not running 64. `ab` and `crossover` read the limit each arm's server reported and
    refuse a verdict where it binds, naming both; below it the arms compare as before."""
    from tuitune.experiments.crossover import level_verdict
    from tuitune.measure.benchconfig import BenchConfig
    from tuitune.measure.benchrun import BenchRun
    from tuitune.measure.request import RequestResult
    from tuitune.measure.serverinfo import _server_info, limit_confound

    assert _server_info({"internal_states": [{"effective_max_running_requests_per_dp": 48}]}) == {
        "max_running_requests": 48
    }
    assert _server_info({"max_running_requests": 256, "internal_states": [{}]})["max_running_requests"] == 256
    assert "max_running_requests" not in _server_info({"max_running_requests": "48", "internal_states": [{}]})
    assert limit_confound({"A": [48, 48], "B": [48, None]}, 64) is None
    bound, why = limit_confound({"A": [256], "B": [48]}, 64)
    assert bound and "A 256" in why and "B 48" in why and "concurrency 64 is above 48" in why
    assert limit_confound({"A": [256], "B": [48]}, 32)[0] is False

    def rows(conc: int) -> list[dict]:
        out = []
        for r in range(1, 5):
            for arm, tok, limit in (("A", 1000 + r, 256), ("B", 1300 + r, 48)):
                out.append(
                    {
                        **_row(arm, arm.lower(), tok, r),
                        "goodput": tok * conc,
                        "concurrency": conc,
                        "server": {"max_running_requests": limit},
                    }
                )
        return out

    v = verdict(rows(64), 0.01)
    assert v["verdict"] == "not comparable" and "max_running_requests" in v["reason"], v
    assert verdict(rows(16), 0.01)["verdict"] == "faster"  # the limit is not reached: a verdict as before

    def run(limit: int, level: int) -> BenchRun:
        results = [RequestResult(True, ttft_s=0.1, e2e_s=1.0 + i / 100, completion_tokens=100) for i in range(6)]
        for q in results:
            q.t0 = 0.0
        return BenchRun(BenchConfig("http://x", concurrency=level), results, server={"max_running_requests": limit})

    row = level_verdict([run(48, 64)], [run(256, 64)], 64, 0.02)
    assert row.verdict == "not comparable" and "speculation on 48" in row.reason and "off 256" in row.reason, row
    row = level_verdict([run(48, 8)], [run(256, 8)], 8, 0.02)
    assert row.verdict != "not comparable" and "not reached" in row.limits, row


def test_sweep_refuses_a_delta_across_concurrency_limits_where_they_bind(tmp_path):
    """A sweep of speculation off (the baseline, 256 at once) against a speculating configuration that
    SGLang held to 48: at 64 streams no delta and never the best, the limits named; at 16 a delta."""
    base = make_preset(tmp_path, "sw", port=1234)

    def rows(conc: int) -> list[dict]:
        out = []
        for i, (kind, label, tok, limit) in enumerate(
            [
                ("baseline", "baseline", 100.0, 256),
                ("config", "num_steps=3", 130.0, 48),
                ("baseline", "baseline", 100.0, 256),
            ]
        ):
            out.append(
                {
                    **_trial(label, kind, tok, i, {"speculative.num_steps": 3} if kind == "config" else None),
                    "concurrency": conc,
                    "max_running_requests": limit,
                }
            )
        return out

    result = summarize(base, rows(64), tmp_path)
    (cfg,) = [t for t in result.table if t.label == "num_steps=3"]
    assert cfg.delta is not None and cfg.delta.verdict == "not comparable" and "baseline 256" in (cfg.limits or ""), cfg
    assert result.best == "baseline" and not (tmp_path / "best.yaml").exists()
    text = format_table(result)
    assert "n/c (other limit)" in text and "num_steps=3 48" in text, text
    result = summarize(base, rows(16), tmp_path)
    assert result.best == "num_steps=3", result


def test_at_one_stream_a_launch_without_a_decode_rate_makes_the_verdict_goodputs_and_says_so():
    """The real vLLM CPU build, its API server sharing two cores with the engine, sent some blocks'
    outputs whole: those blocks had no decode rate, and the A/A check of an in-launch sweep was "not
    comparable" in 2 of its first 5 runs (benchmarks/live_aa.py, 2026-12-07). At one stream the launches are then all
    compared by goodput (the same prompts on both arms), and the verdict says why; where every launch
    has its rate, or a launch has neither, nothing changes."""
    from tuitune.experiments.ab import metric

    def rows(missing: set[int]) -> list[dict]:
        out = []
        for r in range(1, 5):
            for arm, tok in (("A", 50.0 + r / 10), ("B", 60.0 + r / 10)):
                x = _row(arm, arm, math.nan if (r, arm) in missing else tok, r)
                out.append({**x, "goodput": tok * 0.9, "concurrency": 1})
        return out

    whole = rows({(2, "A")})
    assert metric(whole) == "goodput" and metric(rows(set())) == "median_tok_s"
    v = verdict(whole, bootstrap=False)
    assert v["verdict"] == "faster" and v["metric"] == "goodput", v
    assert v["metric_why"].startswith("1 of 8 measured no decode rate"), v
    text = format_ab(ab_result(whole, v, "A", "B"))
    assert "goodputs at concurrency 1" in text and "compared by goodput: 1 of 8" in text, text
    assert "nan" not in text.lower(), text  # the launch without a rate shows "-" in its tok/s column
    full = verdict(rows(set()), bootstrap=False)
    assert full["metric"] == "median_tok_s" and "metric_why" not in full
    neither = rows({(2, "A")})
    neither[2]["goodput"] = math.nan  # nothing to compare that launch by: not comparable, as before
    assert metric(neither) == "median_tok_s" and verdict(neither)["verdict"] == "not comparable"
