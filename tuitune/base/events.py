"""Everything that flows through tuitune is one of these small immutable records.

Parsed log events carry ``ts`` (the log line's timestamp text, if any) and ``rank`` (``TP0``,
``DP0 TP0``…). Session events (server state, link state, bench results) are produced by the core.
``to_dict`` / ``from_dict`` give the JSON shape used by ``tuitune parse --json`` and by captures.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec


class Event(msgspec.Struct, frozen=True, tag_field="kind", omit_defaults=True):
    """Base of every event; ``kind`` (the msgspec tag) names it in JSON."""

    @property
    def kind(self) -> str:
        return _tag(type(self))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``kind`` first, unset fields left out, NaN/inf as None."""
        d: dict[str, Any] = {"kind": self.kind}
        for n in self.__struct_fields__:
            v = getattr(self, n)
            if v is None or (n == "extra" and not v):
                continue
            d[n] = _clean(v)
        return d


def _tag(cls: type[Event]) -> str:
    tag = cls.__struct_config__.tag
    if not isinstance(tag, str):  # every event class names its kind: tag="..."
        raise TypeError(f"{cls.__name__} has no kind")
    return tag


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # NaN / inf are not JSON
    if isinstance(v, tuple):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


MAX_ACCEPT = 64  # the longest accepted length a histogram may name (steps are at most a few dozen)
_decode_pairs = msgspec.json.Decoder(list[tuple[int, int]]).decode


def histogram(text: str | None, limit: int) -> dict[int, int] | None:
    """``1:12,2:20,3:8`` -> {1: 12, 2: 20, 3: 8}: keys 1..limit, each once, counts >= 0; None when
    absent or malformed. msgspec reads it as JSON pairs (``[[1,12],[2,20],[3,8]]``) when it holds
    no sign; what JSON refuses (leading zeros, other digits) is read field by field, the same way."""
    if not text:
        return None
    pairs = None
    if "-" not in text and "+" not in text:
        try:
            pairs = _decode_pairs("[[" + text.replace(",", "],[").replace(":", ",") + "]]")
        except msgspec.DecodeError:
            pairs = None
    if pairs is None:
        pairs = []
        for part in text.split(","):
            key, sep, n = part.partition(":")
            if not sep or not key.isdigit() or not n.isdigit():
                return None
            pairs.append((int(key), int(n)))
    counts = dict(pairs)
    if len(counts) != len(pairs) or not counts or min(counts) < 1 or max(counts) > limit:
        return None
    return counts


class ProfileWindow(Event, frozen=True, tag="profile", forbid_unknown_fields=True):
    # forbid_unknown_fields: the parser's fast path decodes straight into this type and must fail
    # (and fall back to the exact path, which keeps unknown keys in ``extra``) on any other key.
    draft_ms: float
    verify_ms: float
    extend_ms: float
    accept_len: float
    cycle_ms: float  # draft + verify + extend (+ other) when the line has no cycle_ms
    cycles: int = 1
    v: int = 1
    other_ms: float | None = None
    bs: int | None = None
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    eff_tok_s: float | None = None
    p50_verify_ms: float | None = None
    p90_verify_ms: float | None = None
    max_verify_ms: float | None = None
    sync: str | None = None  # how phases were timed: event, host, cpu (a CPU engine's host clock), sim
    drafter: str | None = None  # a look-up drafter (ngram, suffix); None: a draft model (EAGLE)
    drafts: int | None = None  # vLLM: request-steps that verified a draft (its num_drafts)
    draft_accept_len: float | None = None  # vLLM's Mean acceptance length: 1 + accepted / drafts
    # format v2. The histograms stay the line's text ("1:12,2:20,3:8"), so that parsing a line costs
    # no more than a v1 line; accept_counts and batch_sizes read them when asked.
    accept_hist: str | None = None  # request-cycles per accepted length, bonus token included
    verify_tokens: int | None = None  # tokens in one verify forward: bs x draft tokens
    bs_hist: str | None = None  # cycles per batch size
    held: int | None = None  # the step count a tuitune hold kept in force (docs/switch.md); None: the engine's own
    extra: dict = {}
    ts: str | None = None
    rank: str | None = None

    @property
    def accept_counts(self) -> tuple[int, ...] | None:
        """``accept_hist`` as counts indexed by length - 1; None when absent or malformed."""
        counts = histogram(self.accept_hist, MAX_ACCEPT)
        if counts is None:
            return None
        out = [0] * max(counts)
        for k, n in counts.items():
            out[k - 1] = n
        return tuple(out)

    @property
    def batch_sizes(self) -> tuple[tuple[int, int], ...] | None:
        """``bs_hist`` as (batch size, cycles) pairs by batch size; None when absent or malformed."""
        counts = histogram(self.bs_hist, 1 << 20)
        return tuple(sorted(counts.items())) if counts is not None else None

    @property
    def tok_s(self) -> float:
        """Tokens a second of cycle time (per request)."""
        if self.eff_tok_s is not None and math.isfinite(self.eff_tok_s):
            return self.eff_tok_s / max(1, self.bs or 1)
        return self.accept_len / self.cycle_ms * 1000.0 if self.cycle_ms > 0 else 0.0


class DecodeStats(Event, frozen=True, tag="decode"):
    gen_throughput: float
    running_req: int | None = None
    token: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    queue_req: int | None = None
    iteration: int | None = None
    extra: dict = {}
    ts: str | None = None
    rank: str | None = None


class PrefillStats(Event, frozen=True, tag="prefill"):
    new_seq: int | None = None
    new_token: int | None = None
    cached_token: int | None = None
    token_usage: float | None = None
    running_req: int | None = None
    queue_req: int | None = None
    pending_token: int | None = None
    cuda_graph: bool | None = None
    input_throughput: float | None = None
    extra: dict = {}
    ts: str | None = None
    rank: str | None = None


class HttpUp(Event, frozen=True, tag="http_up"):
    url: str
    ts: str | None = None
    rank: str | None = None


class Ready(Event, frozen=True, tag="ready"):
    ts: str | None = None
    rank: str | None = None


class NcclEnv(Event, frozen=True, tag="nccl_env"):
    name: str
    value: str
    ts: str | None = None
    rank: str | None = None


class NcclAlgo(Event, frozen=True, tag="nccl_algo"):
    collective: str
    bytes: int
    algo: str
    proto: str
    channels: int | None = None
    ts: str | None = None
    rank: str | None = None


class ServerError(Event, frozen=True, tag="error"):
    category: str  # traceback | exception | oom | nccl | init_failed | port_in_use | bad_argument
    message: str
    ts: str | None = None
    rank: str | None = None


class VllmSpec(Event, frozen=True, tag="vllm_spec"):
    draft_acceptance_rate: float | None = None
    mean_accept_len: float | None = None
    accepted_tok_s: float | None = None
    drafted_tok_s: float | None = None
    accepted: int | None = None
    drafted: int | None = None
    per_position: tuple[float, ...] | None = None
    ts: str | None = None
    rank: str | None = None


class MetricsWindow(Event, frozen=True, tag="metrics"):
    """What a server's Prometheus /metrics said between two scrapes (counter deltas, last gauges)."""

    engine: str  # vllm | sglang: whose metric names were read
    seconds: float
    gen_tok_s: float | None = None
    accept_len: float | None = None  # bonus token included
    accept_rate: float | None = None  # drafts only
    per_position: tuple[float, ...] | None = None  # acceptance at draft position 1, 2, …
    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    running_req: int | None = None
    queue_req: int | None = None
    # SGLang: request-verifies and generated tokens in the window, the steps and draft tokens it runs,
    # and (its device timer, GPUs only) the seconds its forwards took by phase
    verify_calls: int | None = None
    gen_tokens: int | None = None
    num_steps: float | None = None
    num_draft_tokens: float | None = None
    draft_s: float | None = None
    verify_s: float | None = None
    extend_s: float | None = None


class Malformed(Event, frozen=True, tag="malformed"):
    marker: str
    reason: str
    line: str
    ts: str | None = None
    rank: str | None = None


# ---- session events (made by the core, not parsed) ----------------------------------------


class LogLine(Event, frozen=True, tag="log"):
    text: str
    node: int | None = None  # a multi-node server's node (None: the server itself, rank 0)


class ServerState(Event, frozen=True, tag="server_state"):
    state: str  # stopped | starting | ready | failed | stopping
    phase: str | None = None  # starting | loading weights | capturing graphs | http up | ready
    detail: str | None = None
    pid: int | None = None
    elapsed_s: float | None = None


class LinkState(Event, frozen=True, tag="link"):
    state: str  # connected | reconnecting | closed
    attempt: int = 0
    detail: str | None = None


class BenchSummary(Event, frozen=True, tag="bench"):
    label: str
    tok_s_median: float
    tok_s_ci_low: float
    tok_s_ci_high: float
    accept_len: float | None
    ttft_ms_median: float | None
    requests: int
    failed: int
    gpu_note: str | None = None  # GPUs capped or a straggler during the run (telemetry), else None


class Marker(Event, frozen=True, tag="marker"):
    """A note in the stream: a relaunch began, a config changed, load toggled…"""

    text: str
    preset: str | None = None
    preset_hash: str | None = None


class GpuSample(Event, frozen=True, tag="gpu"):
    """One GPU at one telemetry tick (every GPU of a tick shares ``seq``); None = nvidia-smi had no value."""

    index: int
    seq: int
    util: float | None = None
    mem_util: float | None = None
    mem_used: float | None = None  # MiB
    mem_total: float | None = None
    power: float | None = None  # W
    power_limit: float | None = None
    sm_clock: float | None = None  # MHz
    sm_clock_max: float | None = None
    mem_clock: float | None = None
    temp: float | None = None  # °C
    reasons: int | None = None  # clock event reasons bitmask (smi.decode_reasons)
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_rx: float | None = None  # MB/s, from `nvidia-smi dmon -s t` where it works (latest second)
    pcie_tx: float | None = None
    name: str | None = None
    stamp: str | None = None  # nvidia-smi's own timestamp of the sample


class TelemetryState(Event, frozen=True, tag="telemetry"):
    state: str  # starting | on | unavailable | interrupted | stopped
    detail: str | None = None
    gpus: int | None = None


EVENT_TYPES: dict[str, type[Event]] = {_tag(c): c for c in Event.__subclasses__()}
# Consumers read ``kind`` of every event (the parser's batch readers make a million a second): each
# event class carries its tag as a plain class attribute, which the property above only answers
# for when it is missing (an attribute lookup rather than a property reading the struct config).
for _kind, _cls in EVENT_TYPES.items():
    _cls.kind = _kind  # type: ignore[method-assign,assignment]


# fields that are plain floats: the JSON writers turn NaN into null, so null reads back as NaN
_NAN_FIELDS = {
    tag: frozenset(f.name for f in msgspec.structs.fields(c) if f.type is float) for tag, c in EVENT_TYPES.items()
}


def from_dict(d: dict[str, Any]) -> Event | None:
    """Rebuild an event from its JSON shape, types checked; None for an unknown kind or a record
    whose fields have the wrong types (a string where a number belongs). Unknown fields are dropped."""
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        return None
    cls = EVENT_TYPES[kind]
    kw = {n: d[n] for n in cls.__struct_fields__ if n in d}
    for n in _NAN_FIELDS[kind]:
        if n in kw and kw[n] is None:
            kw[n] = math.nan
    try:
        return msgspec.convert(kw, cls)
    except msgspec.ValidationError:
        return None
