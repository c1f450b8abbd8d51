"""SGLang's log lines: its logger's prefix (timestamp, rank), the ``Decode batch`` / ``Prefill batch``
lines as events (one at a time and many together: the rules the parser dispatches on), its ready
line, and its request log (``--log-requests --log-requests-format json``) read back as prompts. The
engine (``engines/sglang.py``) hands them out."""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Sequence
from itertools import repeat

from tuitune.base.events import DecodeStats, Event, Malformed, PrefillStats, Ready
from tuitune.base.logline import FastFields, Rule, as_bool, as_float, as_int, number, prefix, prefixes
from tuitune.base.logline import fields as _fields
from tuitune.engines.base import LoggedRequest

# ---- log lines -----------------------------------------------------------------------------------------

DECODE, PREFILL = "Decode batch", "Prefill batch"
READY = "fired up and ready to roll"  # "The server is fired up and ready to roll!"
_PREFIX = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)((?: [A-Z]+\d+)*)\]")


def log_prefix(line: str, end: int) -> tuple[str | None, str | None] | None:
    """``[2026-11-29 16:02:11 TP0] …`` (milliseconds with SGLANG_LOG_MS, ``DP0 TP0`` …): the
    timestamp and rank of SGLang's logger prefix before ``end``, or None."""
    if line[14:15] == ":" and line[:1] == "[" and line[5:6] == "-":
        close = line.find("]", 1, end)
        if close > 0:
            cut = line.find(" ", 12, close)
            return (line[1:close], None) if cut < 0 else (line[1:cut], line[cut + 1 : close] or None)
    m = _PREFIX.search(line, 0, end)
    return None if m is None else (m.group(1), m.group(2).strip() or None)


_DECODE_SPEC = {
    "#running-req": ("running_req", as_int),
    "#token": ("token", as_int),
    "token usage": ("token_usage", as_float),
    "accept len": ("accept_len", as_float),
    "accept rate": ("accept_rate", as_float),
    "cuda graph": ("cuda_graph", as_bool),
    "cpu graph": ("cuda_graph", as_bool),
    "npu graph": ("cuda_graph", as_bool),
    "gen throughput (token/s)": ("gen_throughput", as_float),
    "#queue-req": ("queue_req", as_int),
}
_PREFILL_SPEC = {
    "#new-seq": ("new_seq", as_int),
    "#new-token": ("new_token", as_int),
    "#cached-token": ("cached_token", as_int),
    "token usage": ("token_usage", as_float),
    "#running-req": ("running_req", as_int),
    "#queue-req": ("queue_req", as_int),
    "#pending-token": ("pending_token", as_int),
    "cuda graph": ("cuda_graph", as_bool),
    "cpu graph": ("cuda_graph", as_bool),
    "npu graph": ("cuda_graph", as_bool),
    "input throughput (token/s)": ("input_throughput", as_float),
}
_fast_decode = FastFields(DecodeStats, _DECODE_SPEC, ("iteration", "extra", "ts", "rank"))
_fast_prefill = FastFields(PrefillStats, _PREFILL_SPEC, ("extra", "ts", "rank"))
# the events built from a wire tuple and the fields after it (FastFields checked that they fit:
# a type checker cannot count a tuple's items)
_Decoded: typing.Any = DecodeStats
_Prefilled: typing.Any = PrefillStats


def _stats_body(text: str) -> str:
    """The fields of a Decode/Prefill batch line: without the ", " or ". " after the marker and
    the trailing ", " of older releases. Both the fast and the exact path read this."""
    return text.lstrip(".,").strip().rstrip(",").rstrip().rstrip(",")


def _decode(line: str, at: int, fast: bool = True) -> Event:
    """``Decode batch, #running-req: 8, #token: 5120, …, gen throughput (token/s): 812.40, …``;
    ``Decode batch [1234], …`` with the iteration; ``Decode batch. …, `` (older releases)."""
    ts, rank = prefix(line, at)
    rest = line[at + 12 :]
    iteration = None
    if rest.startswith(" ["):
        close = rest.find("]")
        if close > 0:
            n = number(rest[2:close])
            iteration = n if isinstance(n, int) else None
            rest = rest[close + 1 :]
    body = _stats_body(rest)
    values = _fast_decode(body) if fast else None
    if values is not None:
        return _Decoded(*values, iteration, {}, ts, rank)
    known, extra = _fields(body, _DECODE_SPEC)
    gen = known.pop("gen_throughput", None)
    if gen is None:
        return Malformed("Decode batch", "missing gen throughput", line[:500], ts, rank)
    return DecodeStats(gen, iteration=iteration, extra=extra, ts=ts, rank=rank, **known)


def _prefill(line: str, at: int, fast: bool = True) -> Event:
    """``Prefill batch, #new-seq: 2, #new-token: 512, …`` (``Prefill batch. …, `` older)."""
    ts, rank = prefix(line, at)
    body = _stats_body(line[at + 13 :])
    values = _fast_prefill(body) if fast else None
    if values is not None:
        return _Prefilled(*values, {}, ts, rank)
    known, extra = _fields(body, _PREFILL_SPEC)
    return PrefillStats(extra=extra, ts=ts, rank=rank, **known)


def _decode_many(lines: Sequence[str]) -> list[Event]:
    """``_decode`` of many lines: the lines servers print decoded together (``FastFields.events``);
    when one is unusual, their bodies (stripped as ``_decode`` strips them) together, each line
    with an iteration, or that the batch refuses, on its own."""
    if not lines:
        return []
    heads, _, rests = zip(*map(str.partition, lines, repeat(DECODE)), strict=True)  # (before, marker, after)
    at = prefixes(lines, heads)
    events = _fast_decode.events(rests, at)
    if events is not None:
        return events
    if "\n [" in "\n" + "\n".join(rests):  # iterations ("Decode batch [1234], …"): each line on its own
        return [_decode(line, len(head)) for line, head in zip(lines, heads, strict=True)]
    values = _fast_decode.many([_stats_body(rest) for rest in rests])
    return [
        _decode(line, len(head), False) if v is None else _Decoded(*v, None, {}, *h)
        for line, head, h, v in zip(lines, heads, at, values, strict=True)
    ]


def _prefill_many(lines: Sequence[str]) -> list[Event]:
    if not lines:
        return []
    heads, _, rests = zip(*map(str.partition, lines, repeat(PREFILL)), strict=True)
    at = prefixes(lines, heads)
    events = _fast_prefill.events(rests, at)
    if events is not None:
        return events
    values = _fast_prefill.many([_stats_body(rest) for rest in rests])
    return [
        _prefill(line, len(head), False) if v is None else _Prefilled(*v, {}, *h)
        for line, head, h, v in zip(lines, heads, at, values, strict=True)
    ]


def _ready(line: str, at: int) -> Event:
    ts, rank = prefix(line, at)
    return Ready(ts, rank)


RULES = (
    Rule(DECODE, _decode, _decode_many, "Decode batch"),
    Rule(PREFILL, _prefill, _prefill_many, "Prefill batch"),
    Rule(READY, _ready),
)


# ---- its request log (--log-requests --log-requests-format json) --------------------------------------
# SGLang 0.5.18, ``srt/utils/request_logger.py`` (RequestLogger.log_finished_request): one JSON object
# a request, ``{"timestamp": …, "event": "request.finished", "rid": …, "obj": {…, "text": PROMPT,
# "sampling_params": {"max_new_tokens": N, …}}, "out": {…, "meta_info": {"completion_tokens": N, …}}}``
# after the logger's prefix. ``text`` is the prompt as the model saw it (an OpenAI chat request's after
# its template: at level >= 2 the tokenizer manager decodes the input ids into it); a string over
# ``max_length`` (2,048 at level 2) is logged as its first and last halves joined by "...".
_FINISHED = '"event": "request.finished"'
_CUT = 2048  # level 2's max_length


def request_log(line: str) -> LoggedRequest | None:
    if _FINISHED not in line:
        return None
    at = line.find("{")
    if at < 0:
        return None
    try:
        d = json.loads(line[at:])
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("event") != "request.finished":
        return None
    obj, out = d.get("obj"), d.get("out")
    if not isinstance(obj, dict):
        return None
    text = obj.get("text")
    if not isinstance(text, str) or not text:
        return None  # a batch (a list of prompts) or token ids only: no one prompt to replay
    meta = out.get("meta_info") if isinstance(out, dict) else None
    n = meta.get("completion_tokens") if isinstance(meta, dict) else None
    if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
        sp = obj.get("sampling_params")
        n = sp.get("max_new_tokens") if isinstance(sp, dict) else None
        n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
    cut = len(text) == _CUT + 3 and text[_CUT // 2 : _CUT // 2 + 3] == "..."
    return LoggedRequest(text, n, cut)
