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
PROFILE_INTS = frozenset({"v", "cycles", "bs", "steps", "topk", "draft_tokens"})
PROFILE_FIELDS = frozenset(ProfileWindow._names) - {"extra", "ts", "rank"}

DECODE_NAMES = {
    "#running-req": "running_req", "#token": "token", "token usage": "token_usage",
    "accept len": "accept_len", "accept rate": "accept_rate", "cuda graph": "cuda_graph",
    "cpu graph": "cuda_graph", "npu graph": "cuda_graph",
    "gen throughput (token/s)": "gen_throughput", "#queue-req": "queue_req",
}
PREFILL_NAMES = {
    "#new-seq": "new_seq", "#new-token": "new_token", "#cached-token": "cached_token",
    "token usage": "token_usage", "#running-req": "running_req", "#queue-req": "queue_req",
    "input throughput (token/s)": "input_throughput",
}
VLLM_NAMES = {
    "Mean acceptance length": "mean_accept_len", "Accepted throughput": "accepted_tok_s",
    "Drafted throughput": "drafted_tok_s", "Accepted": "accepted", "Drafted": "drafted",
    "Per-position acceptance rate": "per_position", "Avg Draft acceptance rate": "draft_acceptance_rate",
    "Draft acceptance rate": "draft_acceptance_rate",
}


def _prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """Timestamp and rank of the logger prefix before position ``end``."""
    m = _PREFIX.search(line, 0, end)
    if m is None:
        return None, None
    rank = m.group(2).strip() or None
    return m.group(1), rank


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
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


def _profile(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    kv: dict = {}
    extra: dict = {}
    for tok in line[at + len(PROFILE_MARKER):].split():
        k, eq, v = tok.partition("=")
        if not eq or not _KEY.match(k):
            continue
        if k == "sync":
            kv[k] = v
            continue
        n = _number(v)
        if k in PROFILE_FIELDS:
            if n is None:
                if k in PROFILE_REQUIRED:
                    return Malformed("EAGLE3_PROFILE", f"{k}={v!r} is not a number", line[:500], ts, rank)
                continue
            kv[k] = int(n) if k in PROFILE_INTS and n == int(n) else (n if k not in PROFILE_INTS else None)
        else:
            extra[k] = v if n is None else n
    missing = [k for k in PROFILE_REQUIRED if k not in kv]
    if missing:
        return Malformed("EAGLE3_PROFILE", "missing " + ", ".join(missing), line[:500], ts, rank)
    if "cycle_ms" not in kv:
        kv["cycle_ms"] = kv["draft_ms"] + kv["verify_ms"] + kv["extend_ms"] + (kv.get("other_ms") or 0.0)
    kv = {k: v for k, v in kv.items() if v is not None}
    for k in ("draft_ms", "verify_ms", "extend_ms", "accept_len", "cycle_ms"):
        kv[k] = float(kv[k])
    return ProfileWindow(**kv, extra=extra, ts=ts, rank=rank)


def _fields(body: str, names: dict[str, str]) -> tuple[dict, dict]:
    known: dict = {}
    extra: dict = {}
    for part in body.split(", "):
        name, sep, v = part.rpartition(": ")
        if not sep:
            continue
        name = name.strip()
        v = v.strip().rstrip(",")
        key = names.get(name)
        if key is None:
            extra[_field_key(name)] = _value(v)
        else:
            known[key] = _value(v)
    return known, extra


def _decode(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    rest = line[at + 12:]  # after "Decode batch"
    iteration = None
    if rest.startswith(" ["):
        close = rest.find("]")
        iteration = _number(rest[2:close]) if close > 0 else None
        rest = rest[close + 1:] if close > 0 else rest
    known, extra = _fields(rest.lstrip(".,").strip(), DECODE_NAMES)
    gen = known.pop("gen_throughput", None)
    if not isinstance(gen, (int, float)) or isinstance(gen, bool):
        return Malformed("Decode batch", "missing gen throughput", line[:500], ts, rank)
    for k, v in list(known.items()):
        if k == "cuda_graph":
            if not isinstance(v, bool):
                known[k] = None
        elif not isinstance(v, (int, float)) or isinstance(v, bool):
            extra[k] = known.pop(k)
    return DecodeStats(gen_throughput=float(gen), iteration=iteration if isinstance(iteration, int) else None,
                       extra=extra, ts=ts, rank=rank, **known)


def _prefill(line: str, at: int) -> Event:
    ts, rank = _prefix(line, at)
    known, extra = _fields(line[at + 13:].lstrip(".,").strip(), PREFILL_NAMES)
    for k, v in list(known.items()):
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            extra[k] = known.pop(k)
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


def decode_bytes(data: bytes) -> str:
    """Log bytes -> text; invalid UTF-8 becomes U+FFFD, never an error."""
    return data.decode("utf-8", "replace")


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
