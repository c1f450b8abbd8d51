"""Issue 42: every byte from outside treated as hostile. Preset values the target cannot carry, a
benchmark server that replies badly, damaged captures and logs, a resumed log cut at any byte,
secrets by their shape, cancels that reach their task, impossible figures in the engine's lines.
The real pieces run: a real aiohttp server on loopback, real files, the simulator as a process."""

from __future__ import annotations

import pytest

from tuitune.measure.parse import parse_line

# ---- 8. the vLLM parsers refuse impossible values --------------------------------------------------------

SPEC = (
    "(APIServer pid=1) INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: {mal}, "
    "Accepted throughput: 41.20 tokens/s, Drafted throughput: 89.10 tokens/s, Accepted: {acc} tokens, "
    "Drafted: {dra} tokens, Per-position acceptance rate: {pos}, Avg Draft acceptance rate: {rate}%"
)
STATS = (
    "(APIServer pid=1) INFO 05-01 12:00:01 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
    "Avg generation throughput: {gen} tokens/s, Running: {run} reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%"
)
GOOD = {"mal": "2.31", "acc": "412", "dra": "891", "pos": "0.712, 0.455", "rate": "46.2"}


def spec(**kw) -> str:
    return SPEC.format(**{**GOOD, **kw})


def test_vllm_lines_with_impossible_values_are_malformed():
    assert parse_line(spec()).kind == "vllm_spec"
    bad = {
        "negative accepted": spec(acc="-5"),
        "negative drafted": spec(dra="-891", acc="0"),
        "accepted over drafted": spec(acc="900", dra="891"),
        "fullwidth digits": spec(acc="４１２"),
        "arabic-indic digits": spec(dra="٨٩١"),
        "negative length": spec(mal="-2.31"),
        "fullwidth length": spec(mal="２.31"),
        "rate over 100 %": spec(rate="146.2"),
        "negative rate": spec(rate="-46.2"),
        "per-position over 1": spec(pos="1.712, 0.455"),
        "per-position negative": spec(pos="-0.1, 0.455"),
    }
    for what, line in bad.items():
        ev = parse_line(line)
        assert ev.kind == "malformed" and ev.marker == "SpecDecoding metrics", what
        assert ev.ts == "05-01 12:00:00", what
    assert "more than Drafted" in parse_line(spec(acc="900", dra="891")).reason
    assert "negative" in parse_line(spec(acc="-5")).reason
    assert parse_line(STATS.format(gen="150.2", run="3")).kind == "decode"
    for gen, run in (("-150.2", "3"), ("150.2", "-3"), ("１５０", "3"), ("150.2", "３")):
        ev = parse_line(STATS.format(gen=gen, run=run))
        assert ev.kind == "malformed" and ev.marker == "Avg prompt throughput", (gen, run)
    # an interval without drafts: vLLM prints nan% for its rate; that is an unknown, not a damaged line
    assert parse_line(spec(acc="0", dra="0", rate="nan")).kind == "vllm_spec"
