"""Log lines -> events. Each line gives at most one event; no input ever raises.

Formats (FACTS.md §2-§4, profile-format.md) change between releases, so fields are read by name,
never by position, and unknown fields are kept in ``extra``. A cheap substring test picks the
parser for a line before any regular expression runs: most lines of a busy log match nothing.

The three lines a busy server prints most (EAGLE3_PROFILE, Decode batch, Prefill batch) take a
fast path first: the line is rewritten into a JSON object of strings with C-level string
operations and decoded by msgspec straight into the event type (lax mode turns "19.5" into
19.5). Anything unusual about a line (a quote or backslash, an unknown or repeated field, a value
msgspec would read differently) makes the fast path give up, and the exact field-by-field parser
below decides; tests check that both paths agree on every line the fast path accepts.
"""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Iterable, Iterator

import msgspec

from tuitune.base.events import (
    DecodeStats,
    Event,
    HttpUp,
    Malformed,
    NcclAlgo,
    NcclEnv,
    PrefillStats,
    ProfileWindow,
    Ready,
    ServerError,
)
from tuitune.base.lines import MAX_LINE, TRUNCATED, clip  # noqa: F401  (clip: part of the parser's API)
from tuitune.base.numbers import to_int
from tuitune.engines import error_category, vllm

PROFILE_MARKER = "EAGLE3_PROFILE "
_VLLM_SPEC, _VLLM_STATS = vllm.SPEC_MARKER, vllm.STATS_MARKER  # globals: no attribute lookup a line
_PREFIX = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?)((?: [A-Z]+\d+)*)\]")
_KEY = re.compile(r"[a-z0-9_]+\Z")
_NCCL_ENV = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (.*)$")
_NCCL_ALGO = re.compile(
    r"NCCL INFO (\w+): ([0-9]{1,30}) Bytes -> Algo (\w+) proto (\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{([0-9]{1,9})\.\.([0-9]{1,9})\})?"
)
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.*)")
_UVICORN = re.compile(r"Uvicorn running on (\S+)")

PROFILE_REQUIRED = ("draft_ms", "verify_ms", "extend_ms", "accept_len")


_last: tuple[str, tuple[str | None, str | None]] = ("", (None, None))  # one object: threads read it whole


def _prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """Timestamp and rank of the logger prefix before position ``end``.

    Consecutive lines of a busy log mostly share their prefix (SGLang stamps to the second, and
    one rank prints the stats lines), so the last answer is kept and reused when this line starts
    with the same text; consecutive events then also share their ts and rank strings. With
    millisecond stamps (SGLANG_LOG_MS) prefixes rarely repeat, and the check costs one compare.
    """
    global _last
    key, hit = _last
    if len(key) == end and line.startswith(key):
        return hit
    found: tuple[str | None, str | None] | None = None
    if line[14:15] == ":" and line[:1] == "[" and line[5:6] == "-":
        close = line.find("]", 1, end)
        if close > 0:
            cut = line.find(" ", 12, close)
            found = (line[1:close], None) if cut < 0 else (line[1:cut], line[cut + 1 : close] or None)
    if found is None:
        m = _PREFIX.search(line, 0, end)
        found = vllm.prefix(line, end) if m is None else (m.group(1), m.group(2).strip() or None)
    if end > 15:  # the checks above read line[14] and line[5]: inside line[:end], the key
        _last = (line[:end], found)
    return found


def _number(text: str) -> int | float | None:
    """An integer literal as an exact int (any length Python reads), else a float, else None."""
    try:
        return int(text)
    except ValueError:
        pass
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


def _float(v: str) -> float:
    """float(), except that "-0" reads as 0.0, as the fast path (msgspec) reads an integer zero."""
    return 0.0 if v == "-0" else float(v)


def _int(v: str) -> int:
    """An integer literal exactly (17+ digits included); a number literal only when it is integral
    ("1e3", "12.0"), read as msgspec's lax mode (the fast path) reads it; anything else (1.5, nan,
    inf, 1e309) is a ValueError."""
    return to_int(v)


_BOOLS = {"true": True, "1": True, "false": False, "0": False, "-0": False}


def _bool(v: str) -> bool:
    """True/False as SGLang prints them; also what msgspec's lax mode (the fast path) takes as a
    bool: any case, 1, 0 and -0."""
    b = _BOOLS.get(v.lower())
    if b is None:
        raise ValueError(v)
    return b


_PROFILE_CONV = {
    **{
        k: _float
        for k in (
            "draft_ms",
            "verify_ms",
            "extend_ms",
            "accept_len",
            "cycle_ms",
            "other_ms",
            "eff_tok_s",
            "p50_verify_ms",
            "p90_verify_ms",
            "max_verify_ms",
        )
    },
    **{k: _int for k in ("v", "cycles", "bs", "steps", "topk", "draft_tokens", "verify_tokens")},
    "sync": str,
    "accept_hist": str,
    "bs_hist": str,
}


def _pairs(rest: str) -> dict[str, str]:
    """``k=v k=v`` -> dict, with C-level splitting; tokens without '=' are ignored."""
    flat = rest.replace("=", " ").split()
    if len(flat) == 2 * rest.count("="):
        return dict(zip(flat[::2], flat[1::2], strict=False))
    out = {}
    for tok in rest.split():
        k, eq, v = tok.partition("=")
        if eq:
            out[k] = v
    return out


_decode_profile = msgspec.json.Decoder(ProfileWindow, strict=False).decode
_force_setattr = msgspec.structs.force_setattr


def _profile(line: str, at: int, fast: bool = True) -> Event:
    ts, rank = _prefix(line, at)
    rest = line[at + 15 :]
    # Fast path: k=v k=v -> {"k":"v","k":"v"}. ts and rank are fields of the event, not of the
    # line: a line that sets them (the exact path keeps such keys in ``extra``) takes the exact
    # path, as do kind= and extra= (msgspec rejects them: the tag or the dict would be wrong).
    if fast and '"' not in rest and "\\" not in rest:
        try:
            ev = _decode_profile('{"' + rest.replace("=", '":"').replace(" ", '","') + '"}')
        except Exception:  # noqa: BLE001 - any doubt: the exact parser below decides
            ev = None
        if ev is not None and ev.ts is None and ev.rank is None:
            _force_setattr(ev, "ts", ts)  # the event is frozen once returned
            _force_setattr(ev, "rank", rank)
            return ev
    return _profile_exact(line, rest, ts, rank)


def _profile_exact(line: str, rest: str, ts: str | None, rank: str | None) -> Event:
    kv = _pairs(rest)
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
        except (ValueError, OverflowError):
            if k in PROFILE_REQUIRED:
                return Malformed("EAGLE3_PROFILE", f"{k}={v!r} is not a number", line[:500], ts, rank)
    if "cycle_ms" not in fields:
        missing = [k for k in PROFILE_REQUIRED if k not in fields]
        if missing:
            return Malformed("EAGLE3_PROFILE", "missing " + ", ".join(missing), line[:500], ts, rank)
        fields["cycle_ms"] = (
            fields["draft_ms"] + fields["verify_ms"] + fields["extend_ms"] + (fields.get("other_ms") or 0.0)
        )
    elif len(fields) < 5 or any(k not in fields for k in PROFILE_REQUIRED):
        missing = [k for k in PROFILE_REQUIRED if k not in fields]
        return Malformed("EAGLE3_PROFILE", "missing " + ", ".join(missing), line[:500], ts, rank)
    return ProfileWindow(**fields, extra=extra, ts=ts, rank=rank)


def _fields(body: str, spec: dict) -> tuple[dict, dict]:
    """``name: value, name: value`` (a ``_stats_body``) -> (known fields converted, extra fields by name)."""
    flat = body.replace(": ", ", ").split(", ")
    if len(flat) % 2 == 0 and body.count(": ") * 2 == len(flat):
        items = zip(flat[::2], flat[1::2], strict=False)
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
            except (ValueError, OverflowError):
                pass
        extra[_field_key(name)] = _value(v.strip())
    return known, extra


_DECODE_SPEC = {
    "#running-req": ("running_req", _int),
    "#token": ("token", _int),
    "token usage": ("token_usage", _float),
    "accept len": ("accept_len", _float),
    "accept rate": ("accept_rate", _float),
    "cuda graph": ("cuda_graph", _bool),
    "cpu graph": ("cuda_graph", _bool),
    "npu graph": ("cuda_graph", _bool),
    "gen throughput (token/s)": ("gen_throughput", _float),
    "#queue-req": ("queue_req", _int),
}
_PREFILL_SPEC = {
    "#new-seq": ("new_seq", _int),
    "#new-token": ("new_token", _int),
    "#cached-token": ("cached_token", _int),
    "token usage": ("token_usage", _float),
    "#running-req": ("running_req", _int),
    "#queue-req": ("queue_req", _int),
    "#pending-token": ("pending_token", _int),
    "cuda graph": ("cuda_graph", _bool),
    "cpu graph": ("cuda_graph", _bool),
    "npu graph": ("cuda_graph", _bool),
    "input throughput (token/s)": ("input_throughput", _float),
}


def _required(t):
    """``int | None`` -> ``int``."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 else t


class _Fast:
    """Fast path for ``name: value, name: value`` lines of one event type.

    The body becomes ``{" name":"value"," name":"value",...}`` through two C-level replaces ("," is
    the cheaper pattern to replace than ", ", so each name keeps its leading space), and msgspec
    decodes it into a wire struct whose field names are the log's names; an unknown name is an
    error, so such lines go to the exact parser, which keeps them in ``extra``. The wire struct holds the
    event's leading fields (those with a log name) in the event's order; ``__call__`` gives their
    values as a tuple for the event's constructor, or None when the exact parser must decide.
    """

    def __init__(self, cls: type, spec: dict, own: tuple[str, ...]):
        names: dict[str, str] = {}
        for log_name, (field, _conv) in spec.items():
            names.setdefault(field, log_name)  # "cpu graph"/"npu graph" take the exact path
        fields = msgspec.structs.fields(cls)
        logged = fields[: len(fields) - len(own)]
        if tuple(f.name for f in fields[len(logged) :]) != own or any(f.name not in names for f in logged):
            raise ValueError(f"{cls.__name__}: fields with a log name must come first, then {own}")
        # Types without their "| None": lax mode would read the text "null" as None.
        wire = msgspec.defstruct(
            "_Wire" + cls.__name__,
            [(f.name, _required(f.type), f.default) for f in logged],
            rename={f.name: " " + names[f.name] for f in logged},
            forbid_unknown_fields=True,
        )
        self.decode = msgspec.json.Decoder(wire, strict=False).decode

    def __call__(self, body: str) -> tuple | None:
        if '"' in body or "\\" in body:
            return None
        try:
            return _astuple(self.decode('{" ' + body.replace(",", '","').replace(": ", '":"') + '"}'))
        except Exception:  # noqa: BLE001 - any doubt: the exact parser decides
            return None


_astuple = msgspec.structs.astuple
_fast_decode = _Fast(DecodeStats, _DECODE_SPEC, ("iteration", "extra", "ts", "rank"))
_fast_prefill = _Fast(PrefillStats, _PREFILL_SPEC, ("extra", "ts", "rank"))


def _stats_body(text: str) -> str:
    """The fields of a Decode/Prefill batch line: without the ", " or ". " after the marker and
    the trailing ", " of older releases. Both the fast and the exact path read this."""
    return text.lstrip(".,").strip().rstrip(",").rstrip().rstrip(",")


def _decode(line: str, at: int, fast: bool = True) -> Event:
    ts, rank = _prefix(line, at)
    rest = line[at + 12 :]
    iteration = None
    if rest.startswith(" ["):
        close = rest.find("]")
        if close > 0:
            n = _number(rest[2:close])
            iteration = n if isinstance(n, int) else None
            rest = rest[close + 1 :]
    body = _stats_body(rest)
    values = _fast_decode(body) if fast else None
    if values is not None:
        return DecodeStats(*values, iteration, {}, ts, rank)
    known, extra = _fields(body, _DECODE_SPEC)
    gen = known.pop("gen_throughput", None)
    if gen is None:
        return Malformed("Decode batch", "missing gen throughput", line[:500], ts, rank)
    return DecodeStats(gen, iteration=iteration, extra=extra, ts=ts, rank=rank, **known)


def _prefill(line: str, at: int, fast: bool = True) -> Event:
    ts, rank = _prefix(line, at)
    body = _stats_body(line[at + 13 :])
    values = _fast_prefill(body) if fast else None
    if values is not None:
        return PrefillStats(*values, {}, ts, rank)
    known, extra = _fields(body, _PREFILL_SPEC)
    return PrefillStats(extra=extra, ts=ts, rank=rank, **known)


def _error(line: str, category: str, message: str, at: int = 0) -> ServerError:
    ts, rank = _prefix(line, max(at, 0) + 1 if at >= 0 else len(line))
    return ServerError(category, message.strip()[:500], ts, rank)


_MARKERS = {
    "profile": "EAGLE3_PROFILE",
    "decode": "Decode batch",
    "prefill": "Prefill batch",
    "vllm_spec": "SpecDecoding metrics",
    "nccl_env": "NCCL",
    "nccl_algo": "NCCL",
}


def parse_line(line: str) -> Event | None:
    """The event one log line describes, or None. Never raises; the work is linear in the line
    and bounded (only the first MAX_LINE characters are read)."""
    if len(line) <= MAX_LINE:
        return _parse_line(line)
    ev = _parse_line(line[:MAX_LINE])
    if ev is None or ev.kind not in _MARKERS and ev.kind != "malformed":
        return ev  # an error or a start-up line: its head is what matters
    marker = ev.marker if isinstance(ev, Malformed) else _MARKERS[ev.kind]
    return Malformed(
        marker,
        f"line of {len(line)} characters, longer than {MAX_LINE}: not read",
        line[:500],
        getattr(ev, "ts", None),
        getattr(ev, "rank", None),
    )


def _parse_line(line: str) -> Event | None:
    # `in` before `find`: most lines carry no marker, and `in` is the cheaper question.
    try:
        if "EAGLE3_PROFILE" in line:
            at = line.find("EAGLE3_PROFILE")
            if line.startswith(" ", at + 14):
                return _profile(line, at)
            if not line[at + 14 :].strip():
                ts, rank = _prefix(line, at)
                return Malformed("EAGLE3_PROFILE", "marker without key=value pairs", line[:500], ts, rank)
        if "Decode batch" in line:
            return _decode(line, line.find("Decode batch"))
        if "Prefill batch" in line:
            return _prefill(line, line.find("Prefill batch"))
        if "NCCL" in line:
            return _nccl(line)
        if "Uvicorn running on" in line:
            at = line.find("Uvicorn running on")
            m = _UVICORN.search(line, at)
            ts, rank = _prefix(line, at)
            return HttpUp(m.group(1), ts, rank) if m else None
        if "fired up and ready to roll" in line:
            ts, rank = _prefix(line, line.find("fired up and ready to roll"))
            return Ready(ts, rank)
        if _VLLM_SPEC in line:
            return vllm.spec_line(line, line.find(_VLLM_SPEC))
        if _VLLM_STATS in line:
            return vllm.stats_line(line, line.find(_VLLM_STATS))
        if "rror" in line or "raceback" in line or "out of memory" in line or "ailed" in line or "in use" in line:
            return _errorish(line)
        return None
    except Exception as e:  # noqa: BLE001 - a parser bug must not stop a tail; report it instead
        return Malformed("?", f"parser error: {type(e).__name__}", line[:500])


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
    if (
        "NCCL error" in line
        or "ncclInvalidUsage" in line
        or "ncclSystemError" in line
        or "ncclUnhandledCudaError" in line
    ):
        m = _EXC.match(line)
        return ServerError("nccl", (m.group(2) if m else line).strip()[:500])
    return None


def _errorish(line: str) -> Event | None:
    cause = error_category(line)  # an engine's own wording of a failure
    if cause is not None:
        m = _EXC.match(line)
        return _error(line, cause, m.group(2) if m else line)
    if "Traceback (most recent call last)" in line:
        return _error(line, "traceback", "Traceback (most recent call last)", line.find("Traceback"))
    if "CUDA out of memory" in line or "OutOfMemoryError" in line:
        m = _EXC.match(line)
        return _error(line, "oom", m.group(2) if m else line)
    at = line.find("Initialization failed")
    if at >= 0:
        return _error(line, "init_failed", line[at:], at)
    if "address already in use" in line.lower() or "Address already in use" in line:
        return _error(line, "port_in_use", line[line.find("]") + 1 :] if line.startswith("[") else line)
    at = line.find(": error: ")
    if at >= 0 and ("unrecognized arguments" in line or "argument " in line or "invalid choice" in line):
        return _error(line, "bad_argument", line[at + 2 :])
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
    return {
        "counts": counts,
        "profile_means": means,
        "decode_gen_throughput_mean": sum(gen) / len(gen) if gen else None,
    }
