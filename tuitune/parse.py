"""Log lines -> events. Each line gives at most one event; no input ever raises.

Formats (FACTS.md §2-§4, profile-format.md) change between releases, so fields are read by name,
never by position, and unknown fields are kept in ``extra``. A cheap substring test picks the
parser for a line before any regular expression runs: most lines of a busy log match nothing.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Iterator

from .events import (DecodeStats, Event, HttpUp, Malformed, NcclAlgo, NcclEnv, PrefillStats,
                     ProfileWindow, Ready, ServerError, VllmSpec)

PROFILE_MARKER = "EAGLE3_PROFILE "
_PREFIX = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)((?: [A-Z]+\d+)*)\]")
_KEY = re.compile(r"[a-z0-9_]+\Z")
_NCCL_ENV = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (.*)$")
_NCCL_ALGO = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
                        r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?")
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.*)")
_UVICORN = re.compile(r"Uvicorn running on (\S+)")
_VLLM_NUM = re.compile(r"([A-Za-z][A-Za-z -]*?): ([0-9.]+(?:, [0-9.]+)*)(%?)")

PROFILE_REQUIRED = ("draft_ms", "verify_ms", "extend_ms", "accept_len")

VLLM_NAMES = {
    "Mean acceptance length": "mean_accept_len", "Accepted throughput": "accepted_tok_s",
    "Drafted throughput": "drafted_tok_s", "Accepted": "accepted", "Drafted": "drafted",
    "Per-position acceptance rate": "per_position", "Avg Draft acceptance rate": "draft_acceptance_rate",
    "Draft acceptance rate": "draft_acceptance_rate",
}


def _prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """Timestamp and rank of the logger prefix before position ``end``."""
    if line.startswith("[") and line[5:6] == "-" and line[14:15] == ":":
        close = line.find("]", 1, end)
        if close > 0:
            inner = line[1:close]
            cut = inner.find(" ", 11)
            if cut < 0:
                return inner, None
            return inner[:cut], inner[cut + 1:] or None
    m = _PREFIX.search(line, 0, end)
    if m is None:
        return None, None
    return m.group(1), m.group(2).strip() or None


def _number(text: str) -> int | float | None:
    if text.isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        try:
            return int(text)  # "-3"
        except ValueError:
            return None


def _value(text: str):
    """A log field value: int, float, bool, or the text itself."""
    if text == "True":
        return True
    if text == "False":
        return False
    n = _number(text)
    return text if n is None else n


def _field_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _int(v: str) -> int:
    return int(v) if v.isdigit() else int(float(v))


def _bool(v: str) -> bool:
    if v == "True":
        return True
    if v == "False":
        return False
    raise ValueError(v)


_PROFILE_CONV = {**{k: float for k in ("draft_ms", "verify_ms", "extend_ms", "accept_len", "cycle_ms", "other_ms",
                                       "eff_tok_s", "p50_verify_ms", "p90_verify_ms", "max_verify_ms")},
                 **{k: _int for k in ("v", "cycles", "bs", "steps", "topk", "draft_tokens")}, "sync": str}


def _pairs(rest: str) -> dict[str, str]:
    """``k=v k=v`` -> dict, with C-level splitting; tokens without '=' are ignored."""
    flat = rest.replace("=", " ").split()
    if len(flat) == 2 * rest.count("="):
        return dict(zip(flat[::2], flat[1::2]))
    out = {}
    for tok in rest.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k] = v
    return out


def _profile(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    kv = _pairs(line[at + 15:])
    fields: dict = {}
    extra: dict = {}
    for k, v in kv.items():
        conv = _PROFILE_CONV.get(k)
        if conv is None:
            if _KEY.match(k):
                n = _number(v)
                extra[k] = v if n is None else n
            continue
        try:
            fields[k] = conv(v)
        except ValueError:
            if k in PROFILE_REQUIRED:
                return Malformed("EAGLE3_PROFILE", f"{k}={v!r} is not a number", line[:500], ts, rank)
    if "cycle_ms" not in fields:
        missing = [k for k in PROFILE_REQUIRED if k not in fields]
        if missing:
            return Malformed("EAGLE3_PROFILE", "missing " + ", ".join(missing), line[:500], ts, rank)
        fields["cycle_ms"] = (fields["draft_ms"] + fields["verify_ms"] + fields["extend_ms"]
                              + (fields.get("other_ms") or 0.0))
    elif len(fields) < 5 or any(k not in fields for k in PROFILE_REQUIRED):
        missing = [k for k in PROFILE_REQUIRED if k not in fields]
        return Malformed("EAGLE3_PROFILE", "missing " + ", ".join(missing), line[:500], ts, rank)
    return ProfileWindow(**fields, extra=extra, ts=ts, rank=rank)


def _fields(body: str, spec: dict) -> tuple[dict, dict]:
    """``name: value, name: value`` -> (known fields converted, extra fields keyed by name)."""
    body = body.rstrip().rstrip(",")
    flat = body.replace(": ", ", ").split(", ")
    if len(flat) % 2 == 0 and body.count(": ") * 2 == len(flat):
        items = zip(flat[::2], flat[1::2])
    else:
        items = []
        for part in body.split(", "):
            name, sep, v = part.rpartition(": ")
            if sep:
                items.append((name, v))
    known: dict = {}
    extra: dict = {}
    for name, v in items:
        name = name.strip()
        s = spec.get(name)
        if s is not None:
            try:
                known[s[0]] = s[1](v.strip())
                continue
            except ValueError:
                pass
        extra[_field_key(name)] = _value(v.strip())
    return known, extra


_DECODE_SPEC = {"#running-req": ("running_req", _int), "#token": ("token", _int),
                "token usage": ("token_usage", float), "accept len": ("accept_len", float),
                "accept rate": ("accept_rate", float), "cuda graph": ("cuda_graph", _bool),
                "cpu graph": ("cuda_graph", _bool), "npu graph": ("cuda_graph", _bool),
                "gen throughput (token/s)": ("gen_throughput", float), "#queue-req": ("queue_req", _int)}
_PREFILL_SPEC = {"#new-seq": ("new_seq", _int), "#new-token": ("new_token", _int),
                 "#cached-token": ("cached_token", _int), "token usage": ("token_usage", float),
                 "#running-req": ("running_req", _int), "#queue-req": ("queue_req", _int),
                 "input throughput (token/s)": ("input_throughput", float)}


def _decode(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    rest = line[at + 12:]
    iteration = None
    if rest.startswith(" ["):
        close = rest.find("]")
        if close > 0:
            n = _number(rest[2:close])
            iteration = n if isinstance(n, int) else None
            rest = rest[close + 1:]
    known, extra = _fields(rest.lstrip(".,").strip(), _DECODE_SPEC)
    gen = known.pop("gen_throughput", None)
    if gen is None:
        return Malformed("Decode batch", "missing gen throughput", line[:500], ts, rank)
    return DecodeStats(gen, iteration=iteration, extra=extra, ts=ts, rank=rank, **known)


def _prefill(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    known, extra = _fields(line[at + 13:].lstrip(".,").strip(), _PREFILL_SPEC)
    return PrefillStats(extra=extra, ts=ts, rank=rank, **known)


def _vllm(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    kw: dict = {}
    for m in _VLLM_NUM.finditer(line, at + 21):
        key = VLLM_NAMES.get(m.group(1).strip())
        if key is None:
            continue
        if key == "per_position":
            kw[key] = tuple(float(x) for x in m.group(2).split(", "))
            continue
        text = m.group(2).split(",")[0]
        n = _number(text)
        if n is None:
            continue
        kw[key] = n / 100.0 if m.group(3) == "%" else n
    if not kw:
        return Malformed("SpecDecoding metrics", "no known field", line[:500], ts, rank)
    return VllmSpec(ts=ts, rank=rank, **kw)


def _error(line: str, category: str, message: str, at: int = 0) -> ServerError:
    ts, rank = _prefix(line, max(at, 0) + 1 if at >= 0 else len(line))
    return ServerError(category, message.strip()[:500], ts, rank)


def parse_line(line: str) -> Event | None:
    """The event one log line describes, or None. Never raises."""
    try:
        return _parse(line)
    except Exception as e:  # noqa: BLE001 - a parser bug must not stop a tail; report it instead
        return Malformed("?", f"parser error: {type(e).__name__}", line[:500])


def _parse(line: str) -> Event | None:
    at = line.find("EAGLE3_PROFILE")
    if at >= 0:
        if line.startswith(" ", at + 14):
            return _profile(line, at)
        if not line[at + 14:].strip():
            ts, rank = _prefix(line, at)
            return Malformed("EAGLE3_PROFILE", "marker without key=value pairs", line[:500], ts, rank)
    at = line.find("Decode batch")
    if at >= 0:
        return _decode(line, at)
    at = line.find("Prefill batch")
    if at >= 0:
        return _prefill(line, at)
    if "NCCL" in line:
        return _nccl(line)
    at = line.find("Uvicorn running on")
    if at >= 0:
        m = _UVICORN.search(line, at)
        ts, rank = _prefix(line, at)
        return HttpUp(m.group(1), ts, rank) if m else None
    at = line.find("fired up and ready to roll")
    if at >= 0:
        ts, rank = _prefix(line, at)
        return Ready(ts, rank)
    at = line.find("SpecDecoding metrics: ")
    if at >= 0:
        return _vllm(line, at)
    if "rror" in line or "raceback" in line or "out of memory" in line or "ailed" in line \
            or "in use" in line:
        return _errorish(line)
    return None


def _nccl(line: str) -> Event | None:
    m = _NCCL_ENV.search(line)
    if m:
        value = m.group(2).rstrip()
        if value.endswith(".") and value[:-1].lstrip("-").isdigit():
            value = value[:-1]
        return NcclEnv(m.group(1), value)
    m = _NCCL_ALGO.search(line)
    if m:
        chans = int(m.group(6)) - int(m.group(5)) + 1 if m.group(5) is not None else None
        return NcclAlgo(m.group(1), int(m.group(2)), m.group(3), m.group(4), chans)
    if "NCCL WARN" in line:
        return ServerError("nccl", line.split("NCCL WARN", 1)[1].strip()[:500])
    if "NCCL error" in line or "ncclInvalidUsage" in line or "ncclSystemError" in line \
            or "ncclUnhandledCudaError" in line:
        m = _EXC.match(line)
        return ServerError("nccl", (m.group(2) if m else line).strip()[:500])
    return None


def _errorish(line: str) -> Event | None:
    if "Traceback (most recent call last)" in line:
        return _error(line, "traceback", "Traceback (most recent call last)", line.find("Traceback"))
    if "CUDA out of memory" in line or "OutOfMemoryError" in line:
        m = _EXC.match(line)
        return _error(line, "oom", m.group(2) if m else line)
    at = line.find("Initialization failed")
    if at >= 0:
        return _error(line, "init_failed", line[at:], at)
    if "address already in use" in line.lower() or "Address already in use" in line:
        return _error(line, "port_in_use", line[line.find("]") + 1:] if line.startswith("[") else line)
    at = line.find(": error: ")
    if at >= 0 and ("unrecognized arguments" in line or "argument " in line or "invalid choice" in line):
        return _error(line, "bad_argument", line[at + 2:])
    m = _EXC.match(line)
    if m:
        return ServerError("exception", f"{m.group(1)}: {m.group(2)}"[:500])
    return None


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    """Events of many lines, in order (lines that describe nothing are skipped)."""
    parse = parse_line
    for line in lines:
        ev = parse(line)
        if ev is not None:
            yield ev


def summarize(events: Iterable[Event]) -> dict:
    """Counts per kind and the phase means of profile windows (the text form of `tuitune parse`)."""
    counts: dict[str, int] = {}
    sums = {"draft_ms": 0.0, "verify_ms": 0.0, "extend_ms": 0.0, "cycle_ms": 0.0, "accept_len": 0.0}
    n_profile = 0
    gen: list[float] = []
    for ev in events:
        counts[ev.kind] = counts.get(ev.kind, 0) + 1
        if isinstance(ev, ProfileWindow):
            if all(math.isfinite(getattr(ev, k)) for k in sums):
                n_profile += 1
                for k in sums:
                    sums[k] += getattr(ev, k)
        elif isinstance(ev, DecodeStats):
            gen.append(ev.gen_throughput)
    means = {k: v / n_profile for k, v in sums.items()} if n_profile else {}
    return {"counts": counts, "profile_means": means,
            "decode_gen_throughput_mean": sum(gen) / len(gen) if gen else None}
