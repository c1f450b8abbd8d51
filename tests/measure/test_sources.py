"""The probe's figures against the engine's own counters (tuitune.measure.sources): SGLang's /metrics read
by the scraper, compared over the span both cover, 10 % apart flagged, in `report` and the TUI's cycle
panel. The real SGLang's side is in tests/real/test_real_sglang.py; here the simulator as a process renders
SGLang's counters, the device timer's included (a GPU's path: SGLang's timer needs CUDA events)."""

from __future__ import annotations

import json

from tuitune import preset as P
from tuitune.base.events import MetricsWindow, ProfileWindow
from tuitune.measure import promscrape
from tuitune.measure.sources import SecondSource
from tuitune_support.presets import make_preset
from tuitune_support.procs import tuitune_cli

SGLANG_PAGE = """# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{{model_name="m"}} {v}
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="m",is_streaming="false"}} {g}
# TYPE sglang:spec_num_steps gauge
sglang:spec_num_steps{{model_name="m",tp_rank="0"}} 2.0
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{{model_name="m",category="target_verify"}} {t}
sglang:forward_execution_seconds_total{{model_name="m",category="eagle_draft"}} {d}
"""


def window(accept: float, cycles: int = 40, verify: float = 6.0) -> ProfileWindow:
    return ProfileWindow(
        draft_ms=2.0,
        verify_ms=verify,
        extend_ms=0.0,
        accept_len=accept,
        cycle_ms=2.0 + verify,
        cycles=cycles,
        v=2,
        bs=1,
        steps=2,
        topk=1,
        draft_tokens=3,
    )


def test_the_scraper_reads_sglangs_counters_as_a_window():
    """SGLang 0.5.18's names (seen on its CPU build): request-verifies and tokens (their ratio its
    accept length), its steps, and the device timer's seconds by category; a counter that went down
    (a restart) gives no window."""
    a = promscrape.parse(SGLANG_PAGE.format(v=100, g=300, t=1.0, d=0.5), t=0.0)
    b = promscrape.parse(SGLANG_PAGE.format(v=140, g=420, t=1.3, d=0.6), t=2.0)
    w = promscrape.window(a, b)
    assert (w.engine, w.verify_calls, w.gen_tokens, w.num_steps) == ("sglang", 40, 120, 2.0)
    assert w.accept_len == 3.0 and abs(w.verify_s - 0.3) < 1e-9 and abs(w.draft_s - 0.1) < 1e-9
    assert promscrape.window(b, a) is None


def test_a_disagreement_over_ten_percent_is_flagged_and_counts_are_only_shown():
    s = SecondSource()
    for i in range(10):
        s.feed(window(3.0), 0.5 + i)  # arrives at 0.5 .. 9.5; its 40 cycles take 0.32 s before
    s.feed(MetricsWindow("sglang", 10.0, verify_calls=500, gen_tokens=1000, num_steps=2.0), 10.0)
    figs = {f.name: f for f in s.figures()}
    assert figs["accept length"].disagrees and figs["accept length"].server == 2.0
    assert not figs["steps"].disagrees
    assert not figs["request-cycles / verifies"].compared and not figs["request-cycles / verifies"].disagrees
    assert s.disagreements() == ["accept length: the probe reads 3, the server 2 (+50%)"]
    # probe windows outside the span the metrics cover are left out (their cycles ran before it)
    late = SecondSource()
    late.feed(window(1.0), 0.1)
    late.feed(window(3.0), 5.0)
    late.feed(MetricsWindow("sglang", 4.0, verify_calls=40, gen_tokens=120), 5.0)
    assert {f.name: f.probe for f in late.figures()}["accept length"] == 3.0


def test_report_compares_the_probe_with_the_simulators_sglang_counters(tmp_path):
    """`--record` of the simulator with SGLang's device timer on: the capture's metrics windows carry
    SGLang's verify calls, tokens, steps and forward seconds by category, and `report` puts the probe's
    accept length, steps and verify share beside them: they agree (one model draws both)."""
    p = make_preset(
        tmp_path, "src", args={"enable-metrics": True}, env={"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}, requests=4
    )
    path = tmp_path / "src.yaml"
    P.save(p, path)
    cap = tmp_path / "src.jsonl"
    r = tuitune_cli(
        "--record",
        str(cap),
        str(path),
        "--relaunch",
        "--load",
        "1",
        "--duration",
        "8",
        env={"HOME": str(tmp_path)},
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        rep = tuitune_cli("report", str(cap), "--json", env={"HOME": str(tmp_path)}, timeout=60)
        assert rep.returncode == 0, rep.stderr
        (summary,) = json.loads(rep.stdout)
        figs = {f["figure"]: f for f in summary["second_source"]}
        assert {"accept length", "steps", "verify share of forward"} <= set(figs), summary["second_source"]
        assert not summary["disagreements"], summary["second_source"]
        assert figs["steps"]["probe"] == figs["steps"]["server"] == 2
        text = tuitune_cli("report", str(cap), "--no-chart", env={"HOME": str(tmp_path)}, timeout=60).stdout
        assert "the probe against the server's own counters" in text and "verify share of forward" in text
    finally:
        tuitune_cli("stop", str(path), "--any", env={"HOME": str(tmp_path)}, timeout=60)
