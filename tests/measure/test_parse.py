"""Parser: golden lines for every documented format, fuzzing, the `tuitune parse` command."""

from __future__ import annotations

import io
import itertools
import json
import math
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuitune.base.events import ServerError, from_dict
from tuitune.engines import sglang_log
from tuitune.measure import parse
from tuitune.measure.parse import parse_line, parse_lines, summarize

PROFILE_EXAMPLES = [
    "[2026-11-29 16:02:11 TP0] EAGLE3_PROFILE v=1 cycles=40 bs=1 steps=2 topk=1 draft_tokens=3 "
    "draft_ms=0.71 verify_ms=19.12 extend_ms=0.31 cycle_ms=20.14 accept_len=1.87 eff_tok_s=92.85 sync=event",
    "[2026-11-29 16:02:11.513 DP0 TP0] EAGLE3_PROFILE cycles=1 draft_ms=0.9 verify_ms=21.7 extend_ms=0.2 accept_len=2",
    "EAGLE3_PROFILE draft_ms=0.83 verify_ms=28.7 extend_ms=0.1 accept_len=1.73 p90_verify_ms=29.4 gpu=7",
]
PROFILE_V2 = (
    "[2026-11-29 16:37:09 TP0] EAGLE3_PROFILE v=2 cycles=40 bs=8 steps=3 topk=1 draft_tokens=4 "
    "verify_tokens=32 draft_ms=0.600 verify_ms=5.100 extend_ms=0.200 other_ms=0.400 cycle_ms=6.300 "
    "accept_len=2.375 accept_hist=1:100,2:80,4:140 bs_hist=7:3,8:37 eff_tok_s=3015.87 sync=sim"
)


def test_profile_v2_fields_and_their_round_trip():
    ev = parse_line(PROFILE_V2)
    assert ev.v == 2 and ev.verify_tokens == 32 and ev.accept_counts == (100, 80, 0, 140) and ev.extra == {}
    assert ev.batch_sizes == ((7, 3), (8, 37)) and ev.accept_hist == "1:100,2:80,4:140"
    at = PROFILE_V2.find("EAGLE3_PROFILE")
    assert parse._profile(PROFILE_V2, at, fast=False) == ev
    assert from_dict(json.loads(json.dumps(ev.to_dict()))) == ev  # captures keep them
    # a bad histogram reads as none (both paths), never costs the line
    for bad in ("1:2,1:3", "0:5", "65:1", "1:x", "", "1:2,,3:4", "1:2:3,4", "1:-0", "1:1e2"):
        line = PROFILE_V2.replace("accept_hist=1:100,2:80,4:140", f"accept_hist={bad}")
        for fast in (True, False):
            got = parse._profile(line, at, fast=fast)
            assert got.kind == "profile" and got.accept_counts is None and got.batch_sizes == ev.batch_sizes, (
                bad,
                fast,
            )
    # what JSON would refuse is read field by field, with the same meaning
    assert parse_line(PROFILE_V2.replace("1:100,2:80,4:140", "01:5,2:007")).accept_counts == (5, 7)


def test_profile_held_is_a_typed_field_on_both_paths():
    """``held=K`` (a tuitune hold in force, docs/switch.md) parses as an int; absent, None."""
    assert parse_line(PROFILE_V2).held is None
    line = PROFILE_V2.replace(" sync=", " held=3 sync=") if " sync=" in PROFILE_V2 else PROFILE_V2 + " held=3"
    at = line.find("EAGLE3_PROFILE")
    for fast in (True, False):
        ev = parse._profile(line, at, fast=fast)
        assert ev.kind == "profile" and ev.held == 3 and ev.extra == {}, fast
    assert from_dict(json.loads(json.dumps(ev.to_dict()))).held == 3
    bad = parse._profile(line.replace("held=3", "held=x"), at, fast=False)
    assert bad.kind == "profile" and bad.held is None  # as any optional key that is not a number


def test_profile_examples():
    a, b, c = map(parse_line, PROFILE_EXAMPLES)
    assert a.kind == "profile" and a.ts == "2026-11-29 16:02:11" and a.rank == "TP0"
    assert (a.cycles, a.bs, a.steps, a.topk, a.draft_tokens) == (40, 1, 2, 1, 3)
    assert (a.draft_ms, a.verify_ms, a.extend_ms, a.cycle_ms, a.accept_len) == (0.71, 19.12, 0.31, 20.14, 1.87)
    assert a.sync == "event" and a.eff_tok_s == 92.85
    assert b.rank == "DP0 TP0" and b.ts.endswith(".513") and b.cycle_ms == 0.9 + 21.7 + 0.2 and b.v == 1
    assert c.ts is None and c.extra == {"gpu": 7} and c.p90_verify_ms == 29.4 and c.cycles == 1


def test_profile_malformed_and_nan():
    bad = parse_line("[t] EAGLE3_PROFILE draft_ms=0.1 verify_ms=abc extend_ms=0.1 accept_len=2")
    assert bad.kind == "malformed" and "verify_ms" in bad.reason
    missing = parse_line("EAGLE3_PROFILE draft_ms=0.1 verify_ms=1")
    assert missing.kind == "malformed" and "extend_ms" in missing.reason and "accept_len" in missing.reason
    assert parse_line("x EAGLE3_PROFILE").kind == "malformed"
    n = parse_line("EAGLE3_PROFILE draft_ms=nan verify_ms=1 extend_ms=0.1 accept_len=2")
    assert n.kind == "profile" and math.isnan(n.draft_ms)
    assert json.dumps(n.to_dict())  # NaN written as null, valid JSON


DECODE_NEW = (
    "[2026-03-16 11:32:10 TP0] Decode batch, #running-req: 8, #token: 5120, token usage: 0.03, "
    "accept len: 3.12, accept rate: 0.71, cuda graph: True, gen throughput (token/s): 812.40, #queue-req: 0"
)
DECODE_OLD = (
    "[2025-10-22 10:27:57 TP0] Decode batch. #running-req: 1, #token: 186, token usage: 0.00, "
    "accept len: 1.95, accept rate: 0.49, cuda graph: True, gen throughput (token/s): 178.86, #queue-req: 0, "
)


def test_decode_forms():
    a, b = parse_line(DECODE_NEW), parse_line(DECODE_OLD)
    assert a.kind == b.kind == "decode"
    assert (a.running_req, a.token, a.accept_len, a.accept_rate, a.cuda_graph, a.gen_throughput, a.queue_req) == (
        8,
        5120,
        3.12,
        0.71,
        True,
        812.40,
        0,
    )
    assert (b.accept_len, b.gen_throughput, b.queue_req, b.extra) == (1.95, 178.86, 0, {})
    it = parse_line(
        "[2026-03-16 11:32:10.120 TP0] Decode batch [1234], #running-req: 2, #token: 9, "
        "#cached-token: 3, token usage: 0.01, cap len: 7, cpu graph: False, "
        "gen throughput (token/s): 50.00, #queue-req: 1, est. decode TFLOPS/s (per GPU): 12.5"
    )
    assert it.iteration == 1234 and it.cuda_graph is False and it.accept_len is None
    assert it.extra == {"cached_token": 3, "cap_len": 7, "est_decode_tflops_s_per_gpu": 12.5}
    assert parse_line("[t TP0] Decode batch, #running-req: 1").kind == "malformed"


def test_prefill_forms():
    old = parse_line(
        "[2025-10-22 10:27:56 TP0] Prefill batch. #new-seq: 1, #new-token: 28, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0, "
    )
    new = parse_line(
        "[2026-03-16 11:32:09 TP0] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, "
        "token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 9000.50"
    )
    assert (old.new_seq, old.new_token, old.cached_token) == (1, 28, 0)
    assert new.input_throughput == 9000.5 and new.pending_token == 0 and new.cuda_graph is False and not new.extra


def test_startup_nccl_errors_vllm():
    up = parse_line("[2026-03-16 11:30:00] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)")
    assert up.kind == "http_up" and up.url == "http://0.0.0.0:30000"
    assert parse_line("[2026-03-16 11:30:05] The server is fired up and ready to roll!").kind == "ready"
    env = parse_line("gpu-box:1234:1234 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.")
    assert (env.name, env.value) == ("NCCL_BUFFSIZE", "16777216")
    proto = parse_line("gpu-box:1234:1234 [0] NCCL INFO NCCL_PROTO set by environment to LL")
    assert proto.value == "LL"
    algo = parse_line(
        "gpu-box:1:1 [0] NCCL INFO AllReduce: 33554432 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}"
    )
    assert (algo.collective, algo.bytes, algo.algo, algo.proto, algo.channels) == (
        "AllReduce",
        33554432,
        "RING",
        "SIMPLE",
        32,
    )
    cases = {
        "Traceback (most recent call last):": "traceback",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "oom",
        "gpu-box:1:1 [0] NCCL WARN Invalid protocol 'lll' in NCCL_PROTO": "nccl",
        "torch.distributed.DistBackendError: NCCL error in: x.cpp:1, invalid usage": "nccl",
        "[2026-03-16 11:30:00] Initialization failed. warmup error: boom": "init_failed",
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use": "port_in_use",
        "launch_server.py: error: unrecognized arguments: --bogus": "bad_argument",
        "RuntimeError: CUDA error: an illegal memory access was encountered": "exception",
    }
    for line, cat in cases.items():
        ev = parse_line(line)
        assert ev is not None and ev.kind == "error" and ev.category == cat, line
    v = parse_line(
        "INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: 2.31, "
        "Accepted throughput: 41.20 tokens/s, Drafted throughput: 89.10 tokens/s, Accepted: 412 tokens, "
        "Drafted: 891 tokens, Per-position acceptance rate: 0.712, 0.455, 0.301, Avg Draft acceptance rate: 46.2%"
    )
    assert v.mean_accept_len == 2.31 and v.per_position == (0.712, 0.455, 0.301)
    assert v.draft_acceptance_rate == 0.462 and (v.accepted, v.drafted) == (412, 891)
    old = parse_line("SpecDecoding metrics: Draft acceptance rate: 46.2%, Accepted: 412 tokens, Drafted: 891 tokens")
    assert old.draft_acceptance_rate == 0.462 and old.accepted == 412
    assert parse_line("just some text") is None and parse_line("") is None


def test_json_round_trip():
    for line in PROFILE_EXAMPLES + [DECODE_NEW, DECODE_OLD]:
        ev = parse_line(line)
        assert from_dict(json.loads(json.dumps(ev.to_dict()))) == ev


def _no_parser_bug(ev):
    assert not (ev is not None and ev.kind == "malformed" and ev.marker == "?"), ev  # "parser error: ..."


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_never_raises_on_text(s):
    for line in (
        s,
        "EAGLE3_PROFILE " + s,
        "[2026-01-01 00:00:00 TP0] Decode batch, " + s,
        "Prefill batch, " + s,
        "NCCL INFO " + s,
        "SpecDecoding metrics: " + s,
    ):
        _no_parser_bug(parse_line(line))


# ---- the fast path (JSON + msgspec) must agree with the exact field-by-field parser -------------

# values that parse differently in Python and in msgspec's lax mode, or not at all
TRICKY = [
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "1e400",
    "1e3",
    "1E-2",
    "-0",
    "-0.0",
    "+1",
    ".5",
    "5.",
    "1_0",
    " 1",
    "1 ",
    "٣",
    "²",
    "1.2.3",
    "0x10",
    "null",
    "true",
    "True",
    "TRUE",
    "False",
    "false",
    "1",
    "0",
    "2",
    "01",
    "12.0",
    "12.5",
    "99999999999999999999",
    "-12345678901234567890",
    "12345678901234567.0",
    "9007199254740993.0",
    "9007199254740993",
    "1.00000000000000001",
    "2251799813685247.25",
    "1e30",
    "-1e30",
    "",
    "a b",
    "x,y",
    "1:2",
    "event",
    "é",
    "{}",
    "[1]",
]
# integers of 17+ digits, integral decimals, long fractions: where a float reading loses precision
VALUE = st.one_of(
    st.sampled_from(TRICKY),
    st.from_regex(r"-?[0-9]{1,30}(\.[0-9]{0,20})?([eE][-+]?[0-9]{1,3})?", fullmatch=True),
    st.text(alphabet="0123456789.-+eE naifTrueFls,:=[]{}_²٣", max_size=8),
)
PROFILE_KEYS = list(parse._PROFILE_CONV) + ["gpu", "ts", "rank", "kind", "extra", "X", "a-b"]
DECODE_NAMES = list(sglang_log._DECODE_SPEC) + ["#cached-token", "cap len", "ts", "iteration", "extra"]
PREFILL_NAMES = list(sglang_log._PREFILL_SPEC) + ["est. x", "ts", "rank"]
PREFIXES = ["", "[2026-11-29 16:02:11 TP0] ", "[2026-11-29 16:02:11.513 DP0 TP0] ", "[2026-11-29 16:02:11] ", "x "]


def _same(a, b):
    assert type(a) is type(b) and json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True), (
        a,
        b,
    )


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(PREFIXES),
    st.lists(st.tuples(st.sampled_from(PROFILE_KEYS), VALUE), max_size=16),
    st.sampled_from([" ", "  ", " \t"]),
)
def test_profile_fast_path_agrees_with_exact(prefix, pairs, sep):
    line = prefix + "EAGLE3_PROFILE " + sep.join(f"{k}={v}" for k, v in pairs)
    at = line.find("EAGLE3_PROFILE")
    _same(parse._profile(line, at), parse._profile(line, at, fast=False))


def _canonical_profile(pairs):
    required = dict(draft_ms="0.5", verify_ms="19.5", extend_ms="0.2", accept_len="1.9", cycle_ms="20.2")
    return " ".join(f"{k}={v}" for k, v in {**required, **dict(pairs)}.items())


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(PREFIXES),
    st.sampled_from(["Decode batch", "Decode batch [1234]", "Prefill batch"]),
    st.sampled_from([", ", ". ", ",", " "]),
    st.lists(st.tuples(st.sampled_from(DECODE_NAMES + PREFILL_NAMES), VALUE), max_size=12),
    st.sampled_from(["", ", ", ",", " "]),
)
def test_stats_fast_path_agrees_with_exact(prefix, marker, sep, pairs, tail):
    line = prefix + marker + sep + ", ".join(f"{k}: {v}" for k, v in pairs) + tail
    fn = sglang_log._prefill if marker.startswith("Prefill") else sglang_log._decode
    at = line.find(marker[:12])
    _same(fn(line, at), fn(line, at, fast=False))


def test_fast_paths_take_the_lines_servers_print(monkeypatch):
    """The canonical lines do go the fast way (so the benchmark measures what users get): with the
    exact paths made to fail, they still parse."""

    def exact(*_a, **_k):
        raise AssertionError("the exact path ran")

    monkeypatch.setattr(parse, "_profile_exact", exact)
    monkeypatch.setattr(sglang_log, "_fields", exact)
    prefill = (
        "[2026-03-16 11:32:09 TP0] Prefill batch, #new-seq: 2, #new-token: 512, #cached-token: 0, "
        "token usage: 0.01, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 9000.50"
    )
    for line in [PROFILE_EXAMPLES[0], PROFILE_V2, DECODE_NEW, DECODE_OLD, prefill]:
        ev = parse_line(line)
        assert ev.kind in ("profile", "decode", "prefill") and ev.ts and ev.rank == "TP0", ev
    monkeypatch.undo()
    # and lines the fast path refuses still parse, exactly
    ev = parse_line(
        "[2026-11-29 16:02:11 TP0] EAGLE3_PROFILE draft_ms=1 verify_ms=2 extend_ms=3 accept_len=1.5 "
        'cycle_ms=6 ts=7 note="x"'
    )
    assert ev.ts == "2026-11-29 16:02:11" and ev.extra == {"ts": 7, "note": '"x"'} and ev.cycle_ms == 6.0


def test_no_parser_error_and_exact_integers():
    """Lines that used to end as Malformed("parser error: ValueError"), and integers that lost
    precision through float(): each now has a real reading or a real reason."""
    for line in [
        "SpecDecoding metrics: Per-position acceptance rate: 1.2.3, 0.5",
        "SpecDecoding metrics: Accepted: ²",
        "EAGLE3_PROFILE draft_ms=1 verify_ms=2 extend_ms=1 accept_len=2 gpu=²",
        "Decode batch [²], gen throughput (token/s): 5",
        "Decode batch, #token: ², gen throughput (token/s): 5",
        "NCCL INFO AllReduce: " + "9" * 5000 + " Bytes -> Algo RING proto LL",
    ]:
        _no_parser_bug(parse_line(line))
    big = "-12345678901234567890"
    for fast in (True, False):
        line = f"EAGLE3_PROFILE cycles={big} draft_ms=1 verify_ms=2 extend_ms=1 accept_len=2"
        assert parse._profile(line, 0, fast=fast).cycles == int(big)
    dec = parse_line(
        "Decode batch, #token: 123456789012345678901, gen throughput (token/s): 5, x: 98765432109876543210"
    )
    assert dec.token == 123456789012345678901 and dec.extra == {"x": 98765432109876543210}
    assert (
        parse_line("EAGLE3_PROFILE cycles=2.5 draft_ms=1 verify_ms=2 extend_ms=1 accept_len=2").cycles == 1
    )  # ignored, not cut to 2
    v = parse_line("SpecDecoding metrics: Per-position acceptance rate: 0.5, 1.2.3, Accepted: 7 tokens")
    assert v.per_position == (0.5,) and v.accepted == 7


# ---- many lines at once: parse_many gives what parse_line gives, line by line ------------------


def _same_list(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        if a is None or b is None:
            assert a is b, (a, b)
        else:
            _same(a, b)


PROFILE_LINE = st.builds(
    lambda prefix, pairs, sep: prefix + "EAGLE3_PROFILE " + sep.join(f"{k}={v}" for k, v in pairs),
    st.sampled_from(PREFIXES),
    st.lists(st.tuples(st.sampled_from(PROFILE_KEYS), VALUE), max_size=16),
    st.sampled_from([" ", "  "]),
)
CANONICAL_PROFILE = st.builds(
    lambda prefix, pairs: prefix + "EAGLE3_PROFILE " + _canonical_profile(pairs),
    st.sampled_from(PREFIXES),
    st.lists(st.tuples(st.sampled_from(PROFILE_KEYS), VALUE), max_size=3),
)
STATS_LINE = st.builds(
    lambda prefix, marker, sep, pairs, tail: prefix + marker + sep + ", ".join(f"{k}: {v}" for k, v in pairs) + tail,
    st.sampled_from(PREFIXES),
    st.sampled_from(["Decode batch", "Decode batch [1234]", "Prefill batch"]),
    st.sampled_from([", ", ". ", ","]),
    st.lists(st.tuples(st.sampled_from(DECODE_NAMES + PREFILL_NAMES), VALUE), max_size=12),
    st.sampled_from(["", ", ", " "]),
)
VLLM_SPEC = (
    "INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: 2.31, Accepted: 412 tokens"
)
VLLM_STATS = (
    "INFO 05-01 12:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
    "Avg generation throughput: 90.5 tokens/s, Running: 2 reqs, Waiting: 0 reqs"
)
KNOWN = (
    PROFILE_EXAMPLES
    + [PROFILE_V2, DECODE_NEW, DECODE_OLD, VLLM_SPEC, VLLM_STATS]
    + [
        "[2026-03-16 11:30:00] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
        "[2026-03-16 11:30:05] The server is fired up and ready to roll!",
        "gpu-box:1234:1234 [0] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.",
        "Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        '[2026-03-16 11:32:09] INFO:     127.0.0.1:45678 - "POST /generate HTTP/1.1" 200 OK',
        "[2026-03-16 11:32:09] INFO:     127.0.0.1:45678 - Error 500",  # the noise line's shape, with a marker
        "x EAGLE3_PROFILE",
        "a EAGLE3_PROFILEx Decode batch, gen throughput (token/s): 5",  # the marker without pairs, then another
        "EAGLE3_PROFILE draft_ms=1 verify_ms=2 extend_ms=3 accept_len=1 ts=5",
        "Decode batch, #running-req: 1\nPrefill batch, #new-seq: 1",  # a "line" holding a newline
        'EAGLE3_PROFILE draft_ms=1 verify_ms=2 extend_ms=3 accept_len=1\nsync="x"',
        "[2026-03-16 11:32:09 TP0] Décode batch, héllo: 1 — rror",
        "just some text 12345",
        "just some text 67890",
        "RuntimeError: CUDA error: an illegal memory access was encountered",  # each failure hint alone
        "[2026-03-16 11:30:00] Initialization failed. warmup boom",
        "[2026-03-16 11:30:00] Traceback (most recent call last):",
        "[2026-03-16 11:30:00] something went out of memory 12",
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
        "",
    ]
)
LINE = st.one_of(PROFILE_LINE, CANONICAL_PROFILE, STATS_LINE, st.sampled_from(KNOWN), st.text(max_size=80))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(LINE, max_size=48), st.lists(st.one_of(CANONICAL_PROFILE, STATS_LINE), max_size=48)))
def test_parse_many_gives_what_parse_line_gives(lines):
    want = [parse_line(line) for line in lines]
    _same_list(parse.parse_many(lines), want)
    _same_list(parse.parse_many(lines), want)  # again, with the memo of quiet lines filled
    _same_list(list(parse_lines(lines)), [ev for ev in want if ev is not None])


def test_parse_many_reads_real_logs_as_parse_line_does():
    """The benchmark's busy log (every kind, the probe's full lines, second stamps) and the
    lines of each kind in batches of one kind, and a too-long line among them."""
    import random

    from tuitune_support import loglines as bench_parse

    rng = random.Random(7)
    stamp = "2026-11-29 16:02:11"
    mixed = [bench_parse.MAKERS[k](rng, stamp) for k in rng.choices(list(bench_parse.MAKERS), k=3000)]
    for lines in (mixed, sorted(mixed), mixed[:100] + [PROFILE_EXAMPLES[0] + " pad=" + "x" * parse.MAX_LINE]):
        _same_list(parse.parse_many(lines), [parse_line(line) for line in lines])
    assert sum(1 for ev in parse_lines(mixed) if ev.kind == "profile") > 500


def test_batches_take_the_lines_servers_print_and_keep_the_odd_one(monkeypatch):
    """A busy log's lines are decoded in batches (the readers one line at a time never run), and
    a line the batch must not read as the others (its own ts= or kind=, an iteration, a field
    msgspec would read differently) gets its line-by-line reading in the middle of a batch."""
    import random

    from tuitune_support import loglines as bench_parse

    rng = random.Random(8)
    stamp = "2026-11-29 16:02:11"
    busy = [bench_parse.MAKERS[k](rng, stamp) for k in ["profile", "decode", "prefill", "http"] * 50]
    want = [parse_line(line) for line in busy]

    def one_at_a_time(*_a, **_k):
        raise AssertionError("a line-by-line reader ran")

    with monkeypatch.context() as m:
        for mod, name in [
            (parse, "_profile"),
            (parse, "parse_line"),
            (sglang_log, "_decode"),
            (sglang_log, "_prefill"),
        ]:
            m.setattr(mod, name, one_at_a_time)
        _same_list(parse.parse_many(busy), want)
    profile = PROFILE_EXAMPLES[0]
    odd = [
        profile + " ts=7",
        profile + " rank=x",
        profile + " kind=profile",
        profile.replace("draft_ms=0.71", "draft_ms=-0"),
        profile.replace("cycles=40", "cycles=1e3"),
        profile.replace("sync=event", 'sync="x"'),
        DECODE_NEW.replace("Decode batch,", "Decode batch [7],"),
        DECODE_NEW + ", ts: 5",
        DECODE_NEW.replace("#queue-req: 0", "#queue-req: null"),
        DECODE_NEW.replace("cuda graph: True", "cuda graph: 1"),
        DECODE_OLD,
    ]
    for line in odd:
        lines = [profile, DECODE_NEW] * 5 + [line] + [profile, DECODE_NEW] * 5
        _same_list(parse.parse_many(lines), [parse_line(x) for x in lines])


def test_too_long_lines_are_malformed_under_their_own_name():
    for line, marker in [
        (DECODE_NEW + ", x: " + "1" * parse.MAX_LINE, "Decode batch"),
        (VLLM_STATS + ", x: " + "1" * parse.MAX_LINE, "Avg prompt throughput"),
        (VLLM_SPEC + ", x: " + "1" * parse.MAX_LINE, "SpecDecoding metrics"),
        ("gpu-box:1:1 [0] NCCL INFO NCCL_PROTO set by environment to " + "L" * parse.MAX_LINE, "NCCL"),
    ]:
        ev = parse_line(line)
        assert ev.kind == "malformed" and ev.marker == marker and "longer than" in ev.reason, ev


# Each of these made some regular expression or loop quadratic (57 s for 100 k characters of
# the vLLM line); now every line costs time linear in its length, and only its first
# parse.MAX_LINE characters are read at all.
def _adversarial(n: int) -> dict[str, str]:
    return {
        "vllm": "SpecDecoding metrics: " + "a" * n,
        "vllm-fields": "SpecDecoding metrics: " + "Accepted: 1, " * (n // 13),
        "per-position": "SpecDecoding metrics: Per-position acceptance rate: " + "0.5, " * (n // 5),
        "tail-notice": "tail: " * (n // 6),
        "profile": "EAGLE3_PROFILE " + "x=1 " * (n // 4),
        "profile-eq": "EAGLE3_PROFILE " + "=" * n,
        "decode": "Decode batch, " + "a: " * (n // 3),
        "decode-commas": "Decode batch, " + ", " * (n // 2),
        "nccl": "NCCL INFO " * (n // 10),
        "nccl-name": "NCCL INFO NCCL_" + "A" * n,
        "nccl-algo": "NCCL INFO AllReduce: " * (n // 21),
        "exception": "a" * n + "Error",
        "exceptions": "Error: " * (n // 7),
        "brackets": "[" * n,
        "prefixes": "[2026-01-01 00:00:00" * (n // 20),
        "assignments": "key=" * (n // 4),
        "flags": "--api-key " * (n // 10),
        "json": '"api_key": "' * (n // 12),
        "bearer": "Bearer " * (n // 7),
        "digits": "9" * n,
        "errorish": "rror " * (n // 5),
        "dashes": "-" * n,
        "spaces": " " * n,
    }


@pytest.mark.parametrize("name", sorted(_adversarial(10)))
def test_long_adversarial_lines_take_linear_time(name):
    from tuitune.base import redact

    line = _adversarial(1024 * 1024)[name]
    t0 = time.perf_counter()
    ev = parse_line(line)
    head = line[: parse.MAX_LINE]
    many = parse.parse_many([head, head, "x"])  # as long as a line is read, in a batch of its kind
    shown = redact.Redactor()(line)
    masked = redact.text(line[: 256 * 1024])  # the patterns alone, on more than a line is ever clipped to
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"{name}: {elapsed:.2f} s"  # ~10 ms here; quadratic code took minutes
    _no_parser_bug(ev)
    _same_list(many, [parse_line(head), parse_line(head), None])
    assert len(shown) <= parse.MAX_LINE + len(parse.TRUNCATED) and shown.endswith(parse.TRUNCATED) and masked


def test_long_measurement_lines_are_malformed_with_the_reason():
    ev = parse_line(PROFILE_EXAMPLES[0] + " pad=" + "x" * parse.MAX_LINE)
    assert ev.kind == "malformed" and ev.marker == "EAGLE3_PROFILE" and "longer than" in ev.reason
    assert ev.ts == "2026-11-29 16:02:11" and len(ev.line) == 500
    err = parse_line("RuntimeError: CUDA error: " + "x" * 2 * parse.MAX_LINE)
    assert err.kind == "error" and err.category == "exception"  # the head of an error line is what matters
    assert parse.clip("short") == "short"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_never_raises_on_bytes(b):
    _no_parser_bug(parse_line(b.decode("utf-8", "replace")))
    _no_parser_bug(parse_line("EAGLE3_PROFILE draft_ms=" + b.decode("utf-8", "surrogateescape")))


def test_huge_line_and_empty_input():
    assert parse_line("EAGLE3_PROFILE " + "x=1 " * 500_000).kind == "malformed"
    assert parse_line("Decode batch, " + "a" * 5_000_000) is not None
    assert list(parse_lines([])) == [] and summarize([])["counts"] == {}


def test_parse_command(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(("\n".join(PROFILE_EXAMPLES + [DECODE_NEW, "noise"]) + "\n").encode() + b"\xff\xfe bad\n")
    out = subprocess.run(
        [sys.executable, "-m", "tuitune", "parse", str(log), "--json"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    objs = [json.loads(x) for x in out]
    assert [o["kind"] for o in objs] == ["profile"] * 3 + ["decode"]
    assert objs[0]["verify_ms"] == 19.12 and objs[0]["rank"] == "TP0" and isinstance(objs[0]["cycles"], int)
    table = subprocess.run(
        [sys.executable, "-m", "tuitune", "parse", "-"], input=log.read_bytes(), capture_output=True, check=True
    ).stdout.decode()
    assert "profile" in table and "3" in table and "verify_ms" in table
    missing = subprocess.run(
        [sys.executable, "-m", "tuitune", "parse", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "cannot open" in missing.stderr and "Traceback" not in missing.stderr


class _Trickle:
    """A binary stream that hands out its bytes a few at a time (as a pipe does)."""

    def __init__(self, data: bytes, sizes: list[int]):
        self.data, self.sizes, self.at = data, sizes or [1], 0

    def read1(self, n: int) -> bytes:
        size = min(n, self.sizes[self.at % len(self.sizes)])
        out = self.data[self.at : self.at + size]
        self.at += len(out)
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(st.binary(max_size=12), st.sampled_from([b"\n", b"\r\n", b"\r", b"\xe2\x82", b"\xac", b"\xff"]))
    ),
    st.lists(st.integers(1, 9), max_size=5),
)
def test_cli_reads_the_lines_a_binary_stream_holds(pieces, sizes):
    """`tuitune parse` reads its input in blocks; its lines are those of iterating the stream,
    each decoded on its own (invalid UTF-8 replaced) without its line end, whatever the blocks."""
    from tuitune.commands import common

    data = b"".join(pieces)
    want = [raw.decode("utf-8", "replace").rstrip("\r\n") for raw in io.BytesIO(data)]
    assert list(itertools.chain.from_iterable(common._blocks(_Trickle(data, sizes)))) == want
    assert list(itertools.chain.from_iterable(common._blocks(io.BytesIO(data)))) == want


def test_cli_lines_of_a_file_and_a_long_line(tmp_path):
    from tuitune.commands.common import open_lines

    log = tmp_path / "x.log"
    long = b"EAGLE3_PROFILE " + b"x=1 " * 600_000  # longer than a block
    log.write_bytes(b"a\r\n\nb\xff\n" + long + b"\nlast\r")
    assert list(open_lines(str(log))) == ["a", "", "b\ufffd", long.decode(), "last"]


def test_a_long_per_position_list_is_read_in_one_pass():
    """vLLM's per-position list was read by appending each value to a growing text (quadratic:
    64 KiB of it, the most of a line the parser reads, cost 8 times what 16 KiB did); now once."""
    from tuitune.engines import vllm_log

    n = 400_000
    line = "SpecDecoding metrics: Per-position acceptance rate: " + "0.5, " * n + "Accepted: 7 tokens"
    t0 = time.process_time()
    ev = vllm_log.spec_line(line, 0)
    took = time.process_time() - t0
    assert ev.per_position == (0.5,) * n and ev.accepted == 7
    assert took < 2.0, f"{took:.1f} s for a list of {n} (about 0.2 s read in one pass, 10 s before)"


def test_sglangs_words_for_a_dead_scheduler():
    """SGLang 0.5.18's HTTP server when its scheduler is killed (seen on its CPU build): a classified
    cause quoting SGLang's words without its logger prefix, with the prefix's time."""
    from tuitune.machine.readiness import classify

    e = parse_line(
        "[2026-12-04 18:35:38] Subprocess scheduler_0 (pid=26022) crashed with exit code -9. "
        "Triggering SIGQUIT for cleanup..."
    )
    assert isinstance(e, ServerError) and e.category == "engine_died", e
    assert e.message.startswith("Subprocess scheduler_0 (pid=26022) crashed") and e.ts == "2026-12-04 18:35:38"
    assert classify([e])[0] == "engine_died"
