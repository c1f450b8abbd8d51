"""Everything that flows through tuitune is one of these small immutable records.

Parsed log events carry ``ts`` (the log line's timestamp text, if any) and ``rank`` (``TP0``,
``DP0 TP0``…). Session events (server state, link state, bench results) are produced by the core.
``to_dict`` / ``from_dict`` give the JSON shape used by ``tuitune parse --json`` and by captures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # NaN / inf are not JSON
    if isinstance(v, tuple):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


class Event:
    """Base of every event; ``kind`` names it in JSON."""

    __slots__ = ()
    kind: ClassVar[str] = "event"
    _names: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        names = type(self)._names or tuple(f.name for f in fields(self))  # type: ignore[arg-type]
        d: dict[str, Any] = {"kind": self.kind}
        for n in names:
            v = getattr(self, n)
            if v is None or (n == "extra" and not v):
                continue
            d[n] = _clean(v)
        return d


def _event(kind: str):
    def wrap(cls):
        cls = dataclass(frozen=True, slots=True)(cls)
        cls.kind = kind
        cls._names = tuple(f.name for f in fields(cls))
        EVENT_TYPES[kind] = cls
        return cls
    return wrap


EVENT_TYPES: dict[str, type] = {}


@_event("profile")
class ProfileWindow(Event):
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
    sync: str | None = None
    extra: dict = field(default_factory=dict)
    ts: str | None = None
    rank: str | None = None

    @property
    def tok_s(self) -> float:
        """Tokens a second of cycle time (per request)."""
        if self.eff_tok_s is not None and math.isfinite(self.eff_tok_s):
            return self.eff_tok_s / max(1, self.bs or 1)
        return self.accept_len / self.cycle_ms * 1000.0 if self.cycle_ms > 0 else 0.0


@_event("decode")
class DecodeStats(Event):
    gen_throughput: float
    running_req: int | None = None
    token: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    queue_req: int | None = None
    iteration: int | None = None
    extra: dict = field(default_factory=dict)
    ts: str | None = None
    rank: str | None = None


@_event("prefill")
class PrefillStats(Event):
    new_seq: int | None = None
    new_token: int | None = None
    cached_token: int | None = None
    token_usage: float | None = None
    running_req: int | None = None
    queue_req: int | None = None
    input_throughput: float | None = None
    extra: dict = field(default_factory=dict)
    ts: str | None = None
    rank: str | None = None


@_event("http_up")
class HttpUp(Event):
    url: str
    ts: str | None = None
    rank: str | None = None


@_event("ready")
class Ready(Event):
    ts: str | None = None
    rank: str | None = None


@_event("nccl_env")
class NcclEnv(Event):
    name: str
    value: str
    ts: str | None = None
    rank: str | None = None


@_event("nccl_algo")
class NcclAlgo(Event):
    collective: str
    bytes: int
    algo: str
    proto: str
    channels: int | None = None
    ts: str | None = None
    rank: str | None = None


@_event("error")
class ServerError(Event):
    category: str  # traceback | exception | oom | nccl | init_failed | port_in_use | bad_argument
    message: str
    ts: str | None = None
    rank: str | None = None


@_event("vllm_spec")
class VllmSpec(Event):
    draft_acceptance_rate: float | None = None
    mean_accept_len: float | None = None
    accepted_tok_s: float | None = None
    drafted_tok_s: float | None = None
    accepted: int | None = None
    drafted: int | None = None
    per_position: tuple[float, ...] | None = None
    ts: str | None = None
    rank: str | None = None


@_event("malformed")
class Malformed(Event):
    marker: str
    reason: str
    line: str
    ts: str | None = None
    rank: str | None = None


# ---- session events (made by the core, not parsed) ----------------------------------------


@_event("log")
class LogLine(Event):
    text: str


@_event("server_state")
class ServerState(Event):
    state: str  # stopped | starting | ready | failed | stopping
    phase: str | None = None  # starting | loading weights | capturing graphs | http up | ready
    detail: str | None = None
    pid: int | None = None
    elapsed_s: float | None = None


@_event("link")
class LinkState(Event):
    state: str  # connected | reconnecting | closed
    attempt: int = 0
    detail: str | None = None


@_event("bench")
class BenchSummary(Event):
    label: str
    tok_s_median: float
    tok_s_ci_low: float
    tok_s_ci_high: float
    accept_len: float | None
    ttft_ms_median: float | None
    requests: int
    failed: int


@_event("marker")
class Marker(Event):
    """A note in the stream: a relaunch began, a config changed, load toggled…"""
    text: str
    preset: str | None = None
    preset_hash: str | None = None


PARSED_KINDS = ("profile", "decode", "prefill", "http_up", "ready", "nccl_env", "nccl_algo",
                "error", "vllm_spec", "malformed")


def from_dict(d: dict[str, Any]) -> Event | None:
    """Rebuild an event from its JSON shape; unknown kinds or fields give None / are dropped."""
    cls = EVENT_TYPES.get(d.get("kind", ""))
    if cls is None:
        return None
    kw = {}
    for n in cls._names:
        if n in d:
            v = d[n]
            if n == "per_position" and isinstance(v, list):
                v = tuple(v)
            kw[n] = v
    try:
        ev = cls(**kw)
    except TypeError:
        return None
    if isinstance(ev, ProfileWindow):
        # NaN was written as null; restore it so that the record is still a number
        for n in ("draft_ms", "verify_ms", "extend_ms", "accept_len", "cycle_ms"):
            if getattr(ev, n) is None:
                object.__setattr__(ev, n, math.nan)
    return ev
