"""engines/: every engine provides what base.py says an engine module provides, and the rest of
tuitune reads it from there (the parser's dispatch and prefixes, failure causes, metric names,
info endpoints, the TUI's flags, the configuration space)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuitune import engines
from tuitune.base import logline
from tuitune.engines import base, sglang, vllm
from tuitune.measure import parse, promscrape

ALL = list(engines.ENGINES.values())


@pytest.mark.parametrize("e", ALL, ids=[e.name for e in ALL])
def test_each_engine_fills_in_the_interface(e):
    assert e.name and e.label and e.default_module and 0 < e.default_port < 65536
    assert e.algorithms and all(a == a.upper() for a in e.algorithms)
    assert e.rules and all(isinstance(r, base.Rule) and r.marker and callable(r.parse) for r in e.rules)
    assert e.info_paths and all(p.startswith("/") for p in e.info_paths)
    assert e.editable_flags and all(
        f.kind in ("int", "float", "bool") and f.name == f.name.lower() for f in e.editable_flags
    )
    assert not any(f.name in e.reserved_args for f in e.editable_flags)  # the preset owns those elsewhere
    assert (e.counters or e.gauges) and set(e.counters.values()) | set(e.gauges.values())
    assert e.log_prefix("no prefix here", 14) is None
    space = e.space()
    assert space[0] == (0, 1, 1) and len(set(space)) == len(space)
    assert all(k in e.topks for _, k, _ in space[1:]) and max(s for s, _, _ in space) == base.MAX_STEPS
    assert engines.get(e.name) is e and e.name in engines.NAMES and engines.label(e.name) == e.label


def test_the_parser_scraper_and_bench_read_every_engine_from_here():
    for e in ALL:
        assert e.log_prefix in logline._READERS  # the prefix of its log, for every rule's ts and rank
        for r in e.rules:
            assert r in parse._RULES  # its lines in the parser's one pass
        for needle, cause in e.errors:
            assert engines.error_category(f"x {needle} y") == cause and cause in engines.CAUSE_TEXT
        assert set(e.info_paths) <= set(engines.INFO_PATHS)
    assert promscrape.SGLANG_GAUGES == sglang.SGLang.gauges and set(promscrape.VLLM_COUNTERS) == set(vllm.VLLM.counters)


def test_each_engines_log_prefix_and_lines():
    sg = sglang.SGLang().log_prefix
    assert sg("[2026-11-29 16:02:11 TP0] Decode batch", 26) == ("2026-11-29 16:02:11", "TP0")
    assert sg("[2026-11-29 16:02:11.513 DP0 TP0] x", 34) == ("2026-11-29 16:02:11.513", "DP0 TP0")
    assert sg("(APIServer pid=1) INFO 05-01 12:00:00 [api.py:1] x", 40) is None
    vl = vllm.VLLM().log_prefix
    assert vl("(EngineCore_DP0 pid=7) INFO 05-01 12:00:00 [loggers.py:1] x", 58) == ("05-01 12:00:00", "DP0")
    assert vl("[2026-11-29 16:02:11 TP0] Decode batch", 26) is None
    # the composed prefix: the first engine's reader that knows the line
    assert logline.prefix("(EngineCore_DP0 pid=7) INFO 05-01 12:00:00 [loggers.py:1] x", 58) == (
        "05-01 12:00:00",
        "DP0",
    )
    assert logline.prefix("plain", 5) == (None, None)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.sampled_from([r for e in ALL for r in e.rules]))
def test_every_rule_reads_any_line_holding_its_marker_without_raising(s, rule):
    line = s[: len(s) // 2] + rule.marker + s[len(s) // 2 :]
    ev = rule.parse(line, line.find(rule.marker))
    assert ev is None or ev.kind
    if rule.many is not None:
        got = rule.many([line, line])
        assert [x.to_dict() if x else x for x in got] == [ev.to_dict() if ev else ev] * 2


def test_sglangs_adaptive_schedule_format():
    cfg = {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}}
    assert sglang.check_adaptive(cfg) == {1: [1, 3], 8: [0, 1]}
    text = sglang.adaptive_text(cfg)
    assert text.count("\n") == 4 and '"8": {"candidate_steps": [0, 1]}' in text
    assert sglang.SGLang.schedule == "sglang-adaptive" and vllm.VLLM.schedule == "vllm-dsd"
