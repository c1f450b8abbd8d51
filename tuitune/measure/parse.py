"""Log lines -> events. Each line gives at most one event; no input ever raises.

Formats (FACTS.md §2-§4, profile-format.md) change between releases, so fields are read by name,
never by position, and unknown fields are kept in ``extra``. A cheap substring test picks the
reader for a line before any regular expression runs: most lines of a busy log match nothing.

This module reads what no engine owns: the probe's EAGLE3_PROFILE line (tuitune's own format),
NCCL's lines, Uvicorn's, Python's tracebacks and exceptions; each engine's lines are read by its
module (``engines.RULES``: SGLang's Decode/Prefill batch lines and readiness, vLLM's stats and
SpecDecoding lines), its failure wording is ``engines.error_category``'s. A line is read in one
pass: the first rule whose marker it holds reads it whole (the probe's line first, then the
engines' rules in ``engines.ENGINES`` order, then NCCL, Uvicorn, failures). The logger prefix
(timestamp, rank) of any engine's log is ``base.logline.prefix``'s.

The lines a busy server prints most (EAGLE3_PROFILE, Decode batch, Prefill batch) take a fast
path first: the line is rewritten into JSON with C-level string operations and decoded by
msgspec (the probe's line straight into the event type, its values quoted: lax mode turns "19.5"
into 19.5; the stats lines as rows of the event's fields, their values unquoted: see
``base.logline.FastFields``). Anything unusual about a line (a quote or backslash, an unknown or
repeated field, a value msgspec would read differently) makes the fast path give up, and the
exact field-by-field reader decides. ``parse_many`` reads many lines at once (a one-character
test before each of those markers, a memo of quiet lines, then one rewrite and one decode for all
the lines of a kind), with results equal to ``parse_line``'s line by line; ``parse_lines`` and
``parse_chunks`` use it. ``tests/measure/test_parse_reference.py`` holds every one of these ways to a
plain reading of each line by the exact readers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import Any

import msgspec

from tuitune import engines
from tuitune.base.events import (
    DecodeStats,
    Event,
    HttpUp,
    Malformed,
    NcclAlgo,
    NcclEnv,
    ProfileWindow,
    ServerError,
)
from tuitune.base.lines import MAX_LINE, TRUNCATED, clip  # noqa: F401  (clip: part of the parser's API)
from tuitune.base.logline import Rule, as_float, as_int, number, prefix, prefixes

PROFILE_MARKER = "EAGLE3_PROFILE "
_KEY = re.compile(r"[a-z0-9_]+\Z")
_NCCL_ENV = re.compile(r"NCCL INFO (NCCL_[A-Z0-9_]+) set by environment to (.*)$")
_NCCL_ALGO = re.compile(
    r"NCCL INFO (\w+): ([0-9]{1,30}) Bytes -> Algo (\w+) proto (\w+)"
    r"(?: channel\{Lo\.\.Hi\}=\{([0-9]{1,9})\.\.([0-9]{1,9})\})?"
)
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): (.*)")
_UVICORN = re.compile(r"Uvicorn running on (\S+)")

PROFILE_REQUIRED = ("draft_ms", "verify_ms", "extend_ms", "accept_len")


# ---- the probe's EAGLE3_PROFILE line (profile-format.md) ---------------------------------------------

_PROFILE_CONV: dict[str, Callable[[str], Any]] = {
    **{
        k: as_float
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
            "draft_accept_len",
        )
    },
    **{k: as_int for k in ("v", "cycles", "bs", "steps", "topk", "draft_tokens", "verify_tokens", "drafts", "held")},
    "sync": str,
    "drafter": str,
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
_decode_profiles = msgspec.json.Decoder(list[ProfileWindow], strict=False).decode
_force_setattr = msgspec.structs.force_setattr


def _profile(line: str, at: int, fast: bool = True) -> Event:
    ts, rank = prefix(line, at)
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


def _profile_many(lines: Sequence[str]) -> list[Event | None]:
    """What ``parse_line`` gives for many lines holding the marker, their pairs rewritten
    together and decoded by one call (``_profile``'s fast path for all of them at once).

    Each line is cut at its marker and the space after it: the batch is the lines' texts after
    that. A line whose first marker has no space after it (the marker alone, or followed by
    other text) has another reading, and then each line is read on its own, as when any line
    spoils the batch's JSON or sets a ts= or rank= of its own."""
    if not lines:
        return []
    heads, _, rests = zip(*map(str.partition, lines, repeat(PROFILE_MARKER)), strict=True)  # (before, marker, after)
    joined = "\n".join(rests)
    evs: list[Any] | None = None
    if '"' not in joined and "\\" not in joined and "EAGLE3_PROFILE" not in "\n".join(heads):
        try:  # (a line holding "\n" adds an object: the count below tells)
            text = joined.encode().replace(b"=", b'":"').replace(b" ", b'","').replace(b"\n", b'"},{"')
            evs = _decode_profiles(b"".join((b'[{"', text, b'"}]')))  # (one copy)
        except Exception:  # noqa: BLE001 - some line is unusual (or not UTF-8 at all): each on its own
            evs = None
    if evs is None or len(evs) != len(lines):
        return [parse_line(line) for line in lines]
    at = prefixes(lines, heads)
    for i, ev in enumerate(evs):
        if ev.ts is None and ev.rank is None:
            ts, rank = at[i]
            _force_setattr(ev, "ts", ts)  # the event is frozen once returned
            _force_setattr(ev, "rank", rank)
        else:  # the line names a ts= or rank= of its own: the exact reader keeps it in extra
            ts, rank = at[i]
            evs[i] = _profile_exact(lines[i], rests[i], ts, rank)
    return evs


def _profile_exact(line: str, rest: str, ts: str | None, rank: str | None) -> Event:
    kv = _pairs(rest)
    fields: dict = {}
    extra: dict = {}
    for k, v in kv.items():
        conv = _PROFILE_CONV.get(k)
        if conv is None:
            if _KEY.match(k):
                n = number(v)
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


# ---- NCCL, Uvicorn, failures ---------------------------------------------------------------------------


def _nccl(line: str, at: int = 0) -> Event | None:
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


def _http_up(line: str, at: int) -> Event | None:
    """Uvicorn (the HTTP server both engines run) says where it listens."""
    m = _UVICORN.search(line, at)
    ts, rank = prefix(line, at)
    return HttpUp(m.group(1), ts, rank) if m else None


def _error(line: str, category: str, message: str, at: int = 0) -> ServerError:
    ts, rank = prefix(line, max(at, 0) + 1 if at >= 0 else len(line))
    return ServerError(category, message.strip()[:500], ts, rank)


# what every failure line below holds (ConnectTimeout: an HTTP client's, httpx's, for a silent Hub;
# crashed: SGLang's words for a scheduler that died)
_ERROR_HINTS = ("rror", "raceback", "out of memory", "ailed", "in use", "died", "ConnectTimeout", "crashed")


def _errorish(line: str) -> Event | None:
    cause = engines.error_category(line)  # an engine's own wording of a failure
    if cause is not None:
        text = engines.message(line)  # without the engine's logger prefix, if it has one
        m = _EXC.match(text)
        return _error(line, cause, m.group(2) if m else text, len(line) - len(text) - 1 if text is not line else 0)
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


# ---- dispatch --------------------------------------------------------------------------------------------

# after the probe's line: each engine's lines, then the libraries' (first marker found wins)
_RULES: tuple[Rule, ...] = (
    *engines.RULES,
    Rule("NCCL", _nccl, None, "NCCL"),
    Rule("Uvicorn running on", _http_up),
)
# kinds of measurement: a line too long to read whole is malformed when its head reads as one of
# these (a failure or a start-up line is kept: its head is what matters)
_MEASURED = ("profile", "decode", "prefill", "vllm_spec", "nccl_env", "nccl_algo")


# The leading rules that read many lines at once: a line holding one of their markers is theirs
# whatever else it holds (nothing comes before them), so parse_many can hand them their lines.
_LEAD: list[Rule] = []
for _r in _RULES:
    if _r.many is None:
        break
    _LEAD.append(_r)
_LEAD_DISPATCH = tuple((r.marker, r.parse) for r in _LEAD)
_LEAD_MANY = tuple(r.many for r in _LEAD if r.many is not None)
_MANY = (_profile_many, *_LEAD_MANY)  # the batch readers: the probe's lines, then the leading rules'
# parse_many tests the first two leading markers one after the other; with fewer rules, the probe's
# marker stands in (a line holding it never gets that far)
_LEAD_FIRST = tuple([r.marker for r in _LEAD[:2]] + [PROFILE_MARKER.strip()] * (2 - len(_LEAD[:2])))
# Each of those three markers is looked for only in a line that holds one of its characters, the
# one rarest in the lines that are not the parser's (the one-character test is a memchr; looking
# for a marker in a line that lacks it costs several times more).
_TYPICAL = (  # lines a busy server prints that no reader reads
    '[2026-11-29 16:02:00] INFO:     127.0.0.1:45678 - "POST /generate HTTP/1.1" 200 OK\n'
    '[2026-11-29 16:02:00] INFO:     127.0.0.1:45678 - "GET /health HTTP/1.1" 200 OK\n'
    "[2026-11-29 16:02:00 TP0] Receive: obj=GenerateReqInput(rid='7f3a', text=None, input_ids=None)\n"
    "[2026-11-29 16:02:00 TP0] Cache flushed successfully! memory usage 1234 tokens\n"
    "INFO 05-01 12:00:00 [logger.py:43] Received request cmpl-7f3a: prompt: 'x', params: SamplingParams(n=1)\n"
)


def _hint(marker: str) -> str:
    return min(marker, key=lambda c: (_TYPICAL.count(c), marker.index(c)))


_HINTS = tuple(_hint(marker) for marker in (PROFILE_MARKER.strip(), *_LEAD_FIRST))
_OTHER_DISPATCH = tuple((r.marker, r.parse) for r in _RULES[len(_LEAD) :])
_OTHERS = tuple(r.marker for r in _RULES[len(_LEAD) :]) + _ERROR_HINTS
# Lines that describe nothing (most lines of a log) are remembered once their probe and lead
# markers were looked for: with their digits made 0 (no other marker holds a digit, so a line
# of the same shape holds the same markers), the next such line costs one lookup.
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_QUIET: set[bytes] = set()
_QUIET_LINE = 512  # longer lines are not remembered (the memo stays small)
if any(c.isdigit() for m in _OTHERS for c in m):
    raise ImportError("a log marker holds a digit: the memo of quiet lines would be wrong")


def _quiet(key: bytes) -> None:
    if len(_QUIET) >= 4096:
        _QUIET.clear()
    _QUIET.add(key)


def parse_line(line: str) -> Event | None:
    """The event one log line describes, or None. Never raises; the work is linear in the line
    and bounded (only the first MAX_LINE characters are read)."""
    if len(line) <= MAX_LINE:
        return _parse_line(line)
    head = line[:MAX_LINE]
    ev = _parse_line(head)
    if ev is None or ev.kind not in _MEASURED and ev.kind != "malformed":
        return ev
    if isinstance(ev, Malformed):
        marker = ev.marker
    elif ev.kind == "profile":
        marker = "EAGLE3_PROFILE"
    else:  # the rule that read the head
        marker = next((r.name for r in _RULES if r.marker in head), None) or "?"
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
                ts, rank = prefix(line, at)
                return Malformed("EAGLE3_PROFILE", "marker without key=value pairs", line[:500], ts, rank)
        for marker, read in _LEAD_DISPATCH:
            if marker in line:
                return read(line, line.find(marker))
        key = line.encode().translate(_DIGITS) if len(line) <= _QUIET_LINE and line.isascii() else None
        if key is not None and key in _QUIET:
            return None
        for marker, read in _OTHER_DISPATCH:
            if marker in line:
                return read(line, line.find(marker))
        for hint in _ERROR_HINTS:
            if hint in line:
                return _errorish(line)
        if key is not None:
            _quiet(key)
        return None
    except Exception as e:  # noqa: BLE001 - a parser bug must not stop a tail; report it instead
        return Malformed("?", f"parser error: {type(e).__name__}", line[:500])


def parse_many(lines: Sequence[str]) -> list[Event | None]:  # noqa: C901
    """``[parse_line(line) for line in lines]``, faster: the lines of each kind the fast paths
    read are decoded together."""
    single = parse_line
    out: list[Event | None] = [None] * len(lines)
    profile: list[int] = []
    first: list[int] = []
    second: list[int] = []
    groups: tuple[tuple[str, list[int]], ...] = tuple((r.marker, []) for r in _LEAD[2:])
    m1, m2 = _LEAD_FIRST
    others = _OTHERS
    quiet = _QUIET
    h0, h1, h2 = _HINTS
    for i, line in enumerate(lines):
        if h0 in line and "EAGLE3_PROFILE" in line:  # (a one-character test first: see _HINTS)
            profile.append(i)
        elif h1 in line and m1 in line:  # (the first two leading rules written out: most lines are theirs)
            first.append(i)
        elif h2 in line and m2 in line:
            second.append(i)
        else:
            for marker, group in groups:
                if marker in line:
                    group.append(i)
                    break
            else:  # (the memo of quiet lines: see _QUIET)
                if len(line) <= _QUIET_LINE and line.isascii():
                    key = line.encode().translate(_DIGITS)
                    if key in quiet:
                        continue
                else:
                    key = None
                for marker in others:
                    if marker in line:
                        out[i] = single(line)  # (a line too long to read whole included)
                        break
                else:
                    if key is not None:
                        _quiet(key)
    wheres = (profile, first, second, *(where for _, where in groups))
    for where, many in zip(wheres, _MANY, strict=False):  # (fewer than two leading rules: the rest are empty)
        if not where:
            continue
        mine = itemgetter(*where)(lines) if len(where) > 1 else (lines[where[0]],)  # (a tuple, in C)
        if max(map(len, mine)) > MAX_LINE:  # (a line too long to read whole: parse_line says so)
            evs = [single(line) for line in mine]
        else:
            try:
                evs = many(mine)
            except Exception:  # noqa: BLE001 - a bug in a batch reader: each line on its own, which reports it
                evs = [single(line) for line in mine]
        for i, ev in zip(where, evs, strict=True):
            out[i] = ev
    return out


CHUNK = 256  # lines parse_lines reads at a time (larger texts to rewrite cost more a line)


def _chunks(lines: Iterable[str]) -> Iterator[list[str]]:
    it = iter(lines)
    while chunk := list(islice(it, CHUNK)):
        yield chunk


def _events(chunk: list[str]) -> list[Event]:
    return list(filter(None, parse_many(chunk)))  # (an event is never false)


def parse_chunks(lines: Iterable[str]) -> Iterator[list[Event]]:
    """The events of each CHUNK lines (a list, maybe empty), in order: ``parse_lines`` in
    batches, for a consumer that handles events many at a time (``tuitune parse --json``)."""
    return map(_events, _chunks(lines))


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    """Events of many lines, in order (lines that describe nothing are skipped). Lazy: it reads
    CHUNK lines at a time (the events come out of C-level iterators, not a generator's frame)."""
    return chain.from_iterable(map(_events, _chunks(lines)))


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
