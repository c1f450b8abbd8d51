"""engines/: every engine provides what base.py says an engine module provides, and the rest of
tuitune reads it from there (the parser's dispatch and prefixes, failure causes, metric names,
info endpoints, the TUI's flags, the configuration space)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuitune import engines
from tuitune.base import logline
from tuitune.engines import base, sglang, sglang_schedule, vllm
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
        assert set(e.metric_families()) <= set(promscrape._NAMES)  # its /metrics families, read by the scraper
    assert set(sglang.SGLang.gauges) | set(vllm.VLLM.counters) <= set(promscrape._NAMES)


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
    assert sglang_schedule.check_adaptive(cfg) == {1: [1, 3], 8: [0, 1]}
    text = sglang_schedule.adaptive_text(cfg)
    assert text.count("\n") == 4 and '"8": {"candidate_steps": [0, 1]}' in text
    assert sglang.SGLang.schedule == "sglang-adaptive" and vllm.VLLM.schedule == "vllm-dsd"


# ---- the door: what callers outside engines/ ask an engine (issue 43) ---------------------------------

# a schedule each engine loads, in its table form (what a preset holds and advise decides)
SCHEDULES = {
    "sglang-adaptive": {"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}},
    "vllm-dsd": [[1, 4, 3], [5, 16, 1], [17, 1024, 0]],
}
BAD_SCHEDULES = {"sglang-adaptive": {"1": {"candidate_steps": []}}, "vllm-dsd": [[2, 4, 3]]}
SCHEDULING = [e for e in ALL if e.schedule]


def test_every_schedule_format_is_tested_here():
    assert {e.schedule for e in SCHEDULING} == set(SCHEDULES) == set(BAD_SCHEDULES)


@pytest.mark.parametrize("e", SCHEDULING, ids=[e.name for e in SCHEDULING])
def test_each_engines_schedule_round_trips_through_its_file(e, tmp_path):
    import json

    table = SCHEDULES[e.schedule]
    checked = e.check_schedule_table(table)
    doc = e.schedule_document(table)
    path = tmp_path / "schedule.json"
    e.write_schedule(str(path), doc)
    assert json.loads(path.read_text()) == doc  # the file holds the document
    assert e.read_schedule(str(path)) == checked  # and reads back as the checked table
    assert not list(tmp_path.glob("*.tmp"))  # written atomically: no temporary file left
    with pytest.raises(ValueError):
        e.check_schedule_table(BAD_SCHEDULES[e.schedule])
    with pytest.raises(ValueError):
        e.schedule_document(BAD_SCHEDULES[e.schedule])
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        e.read_schedule(str(path), "the test's file")
    with pytest.raises(ValueError, match="cannot be read"):
        e.read_schedule(str(tmp_path / "missing.json"))


def test_each_engine_resolves_a_section_in_its_own_keys():
    from types import SimpleNamespace as S

    sg, vl = engines.get("sglang"), engines.get("vllm")
    eagle = S(algorithm="EAGLE3", num_steps=3, draft_model_path="/d")
    r = sg.resolve(eagle)
    assert (r.num_steps, r.eagle_topk, r.num_draft_tokens) == (3, 1, 4) and "eagle_topk" in r.derived
    assert vl.resolve(eagle) is None  # not in vLLM's keys
    chain = S(algorithm="EAGLE3", num_speculative_tokens=2, draft_model_path="/d")
    assert vl.resolve(chain) == base.Resolved("EAGLE3", 2, 1, 3)
    assert vl.resolve(S(algorithm="SUFFIX")) == base.Resolved("SUFFIX", None, None, None)
    # the registry: a section names no engine; the one whose keys it uses resolves it
    assert engines.resolve(chain) == base.Resolved("EAGLE3", 2, 1, 3) and engines.resolve(eagle) == r
    assert engines.resolve(S(algorithm=None)) == base.Resolved(None, None, None, None)
    with pytest.raises(ValueError, match="draft_model_path is required"):
        engines.resolve(S(algorithm="EAGLE", num_steps=2))
    with pytest.raises(ValueError, match="SUFFIX is vLLM's"):
        sg.resolve(S(algorithm="SUFFIX"))
    for e in ALL:
        assert set(e.model_free) <= set(e.algorithms) and set(e.model_free) <= set(engines.MODEL_FREE)
    assert engines.MODEL_FREE == ("NGRAM", "SUFFIX")


# a page of each engine's /metrics at two scrapes (a: before, b: 2 s later)
PAGES = {
    "sglang": (
        "sglang:spec_accept_length 2.5\nsglang:num_running_reqs 4\n"
        "sglang:spec_verify_calls_total {v}\nsglang:generation_tokens_total {g}\n"
    ),
    "vllm": (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{{engine="0"}} {v}\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {g}\n'
        'vllm:num_requests_running{{engine="0"}} 4\n'
    ),
}


@pytest.mark.parametrize("e", ALL, ids=[e.name for e in ALL])
def test_each_engine_reads_its_metrics_page_into_windows(e):
    assert set(PAGES) == set(engines.NAMES)
    a = promscrape.parse(PAGES[e.name].format(v=100, g=300), t=0.0)
    b = promscrape.parse(PAGES[e.name].format(v=140, g=420), t=2.0)
    assert e.on_page(b) and not any(o.on_page(b) for o in ALL if o is not e)
    w = e.metrics_window(a, b, 2.0)
    assert w is not None and w.engine == e.name and w.running_req == 4
    assert w.to_dict() == promscrape.window(a, b).to_dict()  # the scraper's window is the engine's
    assert e.metrics_window(b, a, 2.0) is None  # counters went down: a restart
    assert w.accept_len == ((420 - 300) / 40 if e.name == "sglang" else 1 + 120 / 40)
