"""The parser's fast paths against a plain reference reading, on mixed corpora.

The parser reads a busy log fast: a substring dispatch with a memo of quiet lines, the probe's
and SGLang's stats lines rewritten into JSON and decoded by msgspec many lines at once (values
quoted for the probe's lines, unquoted rows for Decode/Prefill batches), each with its own way of
giving up. ``reference`` below reads a line the plain way: each rule's marker looked for in
order, every line read field by field by the exact readers, no batch, no memo. Every way the
parser offers (``parse_many`` in one batch and in chunks, ``parse_lines``, ``parse_line``) must
give the reference's events, exactly (type, every field, -0.0 apart from 0.0, 1 apart from 1.0),
on the benchmark's busy log mixed with garbage, truncated, perturbed and hostile lines.
"""

from __future__ import annotations

import json
import random
import re

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from test_parse import DECODE_NEW, DECODE_OLD, KNOWN, PROFILE_EXAMPLES, PROFILE_V2, TRICKY, VALUE

from tuitune.base.events import Malformed
from tuitune.engines import sglang_log
from tuitune.measure import parse
from tuitune.measure.parse import parse_line, parse_lines, parse_many
from tuitune_support import loglines as bench_parse  # the benchmark's log: the lines a busy server prints

# the exact (field by field) reader of each rule that has a fast one
_EXACT = {
    sglang_log.DECODE: lambda line, at: sglang_log._decode(line, at, fast=False),
    sglang_log.PREFILL: lambda line, at: sglang_log._prefill(line, at, fast=False),
}


def _reference_head(line: str):
    at = line.find("EAGLE3_PROFILE")
    if at >= 0:
        if line.startswith(" ", at + 14):
            return parse._profile(line, at, fast=False)
        if not line[at + 14 :].strip():
            ts, rank = parse.prefix(line, at)
            return Malformed("EAGLE3_PROFILE", "marker without key=value pairs", line[:500], ts, rank)
    for rule in parse._RULES:
        at = line.find(rule.marker)
        if at >= 0:
            return _EXACT.get(rule.marker, rule.parse)(line, at)
    if any(hint in line for hint in parse._ERROR_HINTS):
        return parse._errorish(line)
    return None


def reference(line: str):
    """The event of one line, read the plain way (what the parser's documentation says it does)."""
    if len(line) <= parse.MAX_LINE:
        return _reference_head(line)
    head = line[: parse.MAX_LINE]
    ev = _reference_head(head)
    if ev is None or ev.kind not in parse._MEASURED + ("malformed",):
        return ev
    if ev.kind == "malformed":
        marker = ev.marker
    elif ev.kind == "profile":
        marker = "EAGLE3_PROFILE"
    else:
        marker = next(r.name for r in parse._RULES if r.marker in head)
    reason = f"line of {len(line)} characters, longer than {parse.MAX_LINE}: not read"
    return Malformed(marker, reason, line[:500], ev.ts, ev.rank)


def _text(ev) -> str | None:
    """An event as its type and every field, written so that nothing two readings could differ in
    is lost: -0.0 is not 0.0, 1 is not 1.0, NaN is not None (and equals NaN); None stays None."""
    if ev is None:
        return None
    return type(ev).__name__ + json.dumps(msgspec.structs.asdict(ev), sort_keys=True, allow_nan=True)


# clean lines of each kind, to stand around an odd one: a batch reader must give up on that line
# alone (or on the batch, reading each line on its own), never read it as its neighbours
_rng = random.Random(0)
_NEIGHBOURS = [bench_parse.MAKERS[k](_rng, "2026-11-29 16:02:00") for k in ("profile", "decode", "prefill") * 3]


def _check(lines: list[str]) -> None:
    want = [_text(reference(line)) for line in lines]
    around = len(_NEIGHBOURS)
    for name, got in (
        ("parse_many", [_text(ev) for ev in parse_many(lines)]),
        ("parse_many again (quiet lines remembered)", [_text(ev) for ev in parse_many(lines)]),
        ("parse_line", [_text(parse_line(line)) for line in lines]),
        ("parse_many of one line", [_text(parse_many([line])[0]) for line in lines]),
        (
            "parse_many of one line among clean ones",
            [_text(parse_many(_NEIGHBOURS + [line] + _NEIGHBOURS)[around]) for line in lines],
        ),
    ):
        bad = [(i, lines[i][:300], w, g) for i, (w, g) in enumerate(zip(want, got, strict=True)) if w != g]
        assert not bad, f"{name}: {len(bad)} line(s) differ from the reference, the first: {bad[0]}"
    events = [w for w in want if w is not None]
    assert [_text(ev) for ev in parse_lines(lines)] == events, "parse_lines"
    rng = random.Random(len(lines))
    got_chunked: list[str | None] = []
    at = 0
    while at < len(lines):  # chunks of every size, the batch readers' edges anywhere
        n = rng.choice((1, 2, 3, 7, 64, 255, 256, 1000))
        got_chunked += [_text(ev) for ev in parse_many(lines[at : at + n])]
        at += n
    assert got_chunked == want, "parse_many in chunks"


_NUMBER = re.compile(r"(?<=[=:] )-?[0-9.]+|(?<==)-?[0-9.]+|True|False")


def _perturbed(rng: random.Random, line: str) -> str:
    """A real line with one thing about it changed the way logs and bugs change lines."""
    how = rng.randrange(13)
    spots = list(_NUMBER.finditer(line))
    if how <= 3 and spots:  # one value replaced by a tricky one
        m = rng.choice(spots)
        return line[: m.start()] + rng.choice(TRICKY) + line[m.end() :]
    if how == 4:
        return line.replace(": ", ":", 1) if rng.random() < 0.5 else line.replace(", ", ",", 1)
    if how == 5:
        return line.replace(": ", ":  ", 1) if rng.random() < 0.5 else line.replace("=", " = ", 1)
    if how == 6:
        return line.replace("True", rng.choice(("true", "TRUE", "1", "0", "-0", "False", "true "))).replace(
            "cuda graph", rng.choice(("cuda graph", "cpu graph", "Cuda graph", "cuda Graph"))
        )
    if how == 7:  # a field repeated or unknown, a name in another case
        sep, pair = (" ", "cycles=7") if "EAGLE3" in line else (", ", "#token: 7")
        return line + sep + rng.choice((pair, pair.upper(), "Token usage: 1", "ts=5", "rank=x", "kind=decode", "x"))
    if how == 8:  # a quote, a backslash, a tab, a newline, a colon, a brace somewhere
        i = rng.randrange(len(line) + 1)
        return line[:i] + rng.choice(('"', "\\", "\t", "\n", ":", "}", "{", "],[", "null", "\r")) + line[i:]
    if how == 9:  # text that JSON would read as something else: a quoted value, an escape, a key let in
        if spots and rng.random() < 0.5:
            m = rng.choice(spots)
            return (
                line[: m.start()]
                + rng.choice(('"{0}"', "{0}\\u0030", "\\u003{1}")).format(m.group(), m.group()[-1])
                + line[m.end() :]
            )
        names = ("#token", "token usage", "gen throughput", "draft_ms", "verify_ms", "cycles")
        name = next((n for n in names if n in line), "x")
        tricks = (name[:-1] + f"\\u{ord(name[-1]):04x}", 'x","bs":"9', 'x", " #token": 9, "x": "1', name + '"')
        return line.replace(name, rng.choice(tricks), 1) if rng.random() < 0.7 else line + " sync=" + tricks[1]
    if how == 10:  # older releases' forms
        return line.replace("batch, ", rng.choice(("batch. ", "batch [12], ", "batch,, ", "batch,"))) + rng.choice(
            ("", ", ", ",")
        )
    if how == 11:  # other prefixes
        return line.replace("TP0]", rng.choice(("DP0 TP0]", "]", "TP1]", "PP1 TP0]")), 1).replace(
            ":00 ", rng.choice((":00 ", ":00.123 ", ":00,5 ")), 1
        )
    return line[: rng.randrange(len(line) + 1)]  # cut anywhere


def _hostile(n: int) -> list[str]:
    stamp = "[2026-11-29 16:02:00 TP0] "
    bodies = [
        "EAGLE3_PROFILE " + "x=1 " * (n // 4),
        "EAGLE3_PROFILE " + "=" * n,
        "EAGLE3_PROFILE " + " " * n,
        "Decode batch, " + "a: " * (n // 3),
        "Decode batch, " + ", " * (n // 2),
        "Decode batch, " + "#token: 1, " * (n // 11) + "gen throughput (token/s): 5",
        "Prefill batch, " + ":" * n,
        "NCCL INFO " * (n // 10),
        "rror " * (n // 5),
        "[" * n,
        "9" * n,
    ]
    return bodies + [stamp + b for b in bodies]


def _corpus(seed: int, n: int = 3000) -> list[str]:
    rng = random.Random(seed)
    stamps = [f"2026-11-29 16:02:{s:02d}" for s in range(4)]
    real = [bench_parse.MAKERS[k](rng, rng.choice(stamps)) for k in rng.choices(list(bench_parse.MAKERS), k=n)]
    canonical = [PROFILE_V2, DECODE_NEW, DECODE_OLD, *PROFILE_EXAMPLES]
    lines = real + KNOWN + canonical
    lines += [_perturbed(rng, rng.choice(real + canonical)) for _ in range(n // 2)]
    lines += [
        bytes(rng.randrange(256) for _ in range(rng.randrange(120))).decode("utf-8", "replace") for _ in range(50)
    ]
    lines += [
        "EAGLE3_PROFILE draft_ms=" + bytes(rng.randrange(256) for _ in range(20)).decode("utf-8", "surrogateescape")
        for _ in range(20)
    ]
    lines += [
        "[2026-11-29 16:02:00 TP0] Decode batch, #token: "
        + bytes(rng.randrange(256) for _ in range(9)).decode("utf-8", "surrogateescape")
        + ", gen throughput (token/s): 5"
        for _ in range(20)
    ]
    lines += _hostile(5000)
    too_long = "x" * parse.MAX_LINE
    lines += [PROFILE_V2 + " pad=" + too_long, DECODE_NEW + ", x: " + too_long, too_long + "Decode batch, a: 1"]
    rng.shuffle(lines)
    return lines


def test_fast_paths_give_the_reference_events_on_a_mixed_corpus():
    for seed in (1, 2, 3):
        lines = _corpus(seed)
        _check(lines)
        _check(sorted(lines))  # runs of one kind: the batch readers' common case


def test_the_corpus_reaches_every_path():
    """The corpus is not all easy lines, nor all odd ones: each kind is there in numbers, and the
    benchmark's stats lines are read as rows (the batch decode that gives up on an odd line)."""
    kinds: dict[str, int] = {}
    for ev in map(reference, _corpus(1)):
        if ev is not None:
            kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
    assert kinds["profile"] > 800 and kinds["decode"] > 800 and kinds["prefill"] > 800 and kinds["malformed"] > 50
    assert kinds["error"] >= 5 and {"http_up", "ready", "nccl_env", "vllm_spec"} <= set(kinds)
    rng = random.Random(5)
    for marker, fast in ((sglang_log.DECODE, sglang_log._fast_decode), (sglang_log.PREFILL, sglang_log._fast_prefill)):
        kind = "decode" if marker == sglang_log.DECODE else "prefill"
        rests = [bench_parse.MAKERS[kind](rng, "2026-11-29 16:02:00").partition(marker)[2] for _ in range(100)]
        heads = [("2026-11-29 16:02:00", "TP0")] * 100
        events = fast.events(rests, heads)
        assert events is not None and len(events) == 100 and all(ev.kind == kind for ev in events)
        assert fast.events(rests[:50] + [rests[50].replace(": ", ":", 1)] + rests[51:], heads) is None  # one odd line


# values and separators in the canonical lines, batched: the rows and the profile batch against
# the exact readers (the fast paths' semantics are JSON's, the exact readers' are Python's)
def _fill(template: str, values: list[str]) -> str:
    out = template
    for v in values:
        out = out.replace("{}", v, 1)
    return out.replace("{}", "1")


STATS_TEMPLATES = [
    "[2026-11-29 16:02:00 TP0] Decode batch, #running-req: {}, #token: {}, token usage: {}, accept len: {}, "
    "accept rate: {}, cuda graph: {}, gen throughput (token/s): {}, #queue-req: {}",
    "[2026-11-29 16:02:00 TP0] Prefill batch, #new-seq: {}, #new-token: {}, #cached-token: {}, token usage: {}, "
    "#running-req: {}, #queue-req: {}, #pending-token: {}, cuda graph: {}, input throughput (token/s): {}",
    "[2026-11-29 16:02:00 TP0] EAGLE3_PROFILE v={} cycles={} bs={} steps={} topk=1 draft_tokens={} verify_tokens={} "
    "draft_ms={} verify_ms={} extend_ms={} cycle_ms={} accept_len={} accept_hist={} eff_tok_s={} sync={}",
]
SEPARATOR = st.sampled_from([": ", ":", ":  ", ": \t", ", ", ",", ",  ", " ", "  ", "=", " = ", "\t"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(STATS_TEMPLATES),
            st.lists(VALUE, max_size=15),
            st.one_of(st.none(), st.tuples(st.sampled_from(["=", ": ", ", ", " "]), SEPARATOR, st.integers(0, 20))),
        ),
        min_size=1,
        max_size=24,
    )
)
def test_batched_lines_with_tricky_values_read_as_the_reference_does(specs):
    """Batches of the lines servers print, any value tricky, one separator changed here and there."""
    lines = []
    for template, values, change in specs:
        line = _fill(template, values)
        if change is not None:  # the n-th separator of a kind replaced by another
            old, new, n = change
            spots = [m.start() for m in re.finditer(re.escape(old), line)]
            if spots:
                i = spots[n % len(spots)]
                line = line[:i] + new + line[i + len(old) :]
        lines.append(line)
    _check(lines)
