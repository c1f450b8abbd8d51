"""vLLM's log lines: its logger's prefix (timestamp, rank), the ``SpecDecoding metrics:`` and
``Avg prompt throughput:`` lines as events (the rules the parser dispatches on), and its request log
(``--enable-log-requests``) read back as prompts. The engine (``engines/vllm.py``) hands them out."""

from __future__ import annotations

import math
import re

from tuitune.base.events import DecodeStats, Event, Malformed, VllmSpec
from tuitune.base.logline import NO_PREFIX, Rule
from tuitune.base.numbers import to_float, to_int
from tuitune.engines.base import LoggedRequest

SPEC_MARKER = "SpecDecoding metrics: "
STATS_MARKER = "Avg prompt throughput: "

_PREFIX = re.compile(
    r"(?:\(([\w.-]+) pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) \[?[\w.-]+:\d+\] "
)  # older releases: no "["
_RANK = re.compile(r"(?:DP|TP|PP|EP)\d+")

SPEC_FIELDS = {
    "Mean acceptance length": "mean_accept_len",
    "Accepted throughput": "accepted_tok_s",
    "Drafted throughput": "drafted_tok_s",
    "Accepted": "accepted",
    "Drafted": "drafted",
    "Per-position acceptance rate": "per_position",
    "Avg Draft acceptance rate": "draft_acceptance_rate",
    "Draft acceptance rate": "draft_acceptance_rate",
}  # the older line's name
_SPEC_INT = ("accepted", "drafted")
STATS_FIELDS = {"Avg generation throughput": "gen_throughput", "Running": "running_req", "Waiting": "queue_req"}

# ---- log lines ------------------------------------------------------------------------------------


def message(line: str) -> str:
    """The line without vLLM's logger prefix (the whole line when it has none)."""
    m = _PREFIX.search(line)
    return line[m.end() :] if m else line


def log_prefix(line: str, end: int) -> tuple[str | None, str | None] | None:
    """Timestamp and rank (TP0, DP0 … from the process name) of vLLM's logger prefix, or None."""
    m = _PREFIX.search(line, 0, end)
    if m is None:
        return None
    rank = " ".join(_RANK.findall(m.group(1) or "")) or None
    return m.group(2), rank


def prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """vLLM's own lines read vLLM's own prefix: (None, None) when there is none."""
    return log_prefix(line, end) or NO_PREFIX


def _items(body: str) -> list[tuple[str, str]]:
    """``Name: value, Name: value`` -> pairs; a part without ``: `` continues the previous value
    (the per-position list and ``KV fetch: 1 waiting to start, 0 in progress, …``)."""
    out: list[tuple[str, list[str]]] = []
    for part in body.split(", "):
        name, sep, value = part.partition(": ")
        if sep:
            out.append((name.strip(), [value.strip()]))
        elif out:
            out[-1][1].append(part.strip())  # (joined once below: growing the text each time was quadratic)
    return [(name, ", ".join(values)) for name, values in out]


def _num(text: str) -> float:
    """A rate, length or percentage: a non-negative number in ASCII, or NaN (vLLM prints ``nan%``
    for the acceptance rate of an interval without drafts); ValueError for anything else (a
    negative figure, ``inf``, a fullwidth digit: no engine writes one)."""
    word = text.split()[0].rstrip("%")
    if word.isascii() and word.lower() in ("nan", "-nan", "+nan"):
        return math.nan
    n = to_float(word)
    if n < 0:
        raise ValueError(f"{word!r} is negative")
    return n


def _count(text: str) -> int:
    """A count (``412 tokens``, ``3 reqs``): exact, a finite number cut to a whole one; ValueError
    (never OverflowError) for ``1e309``, ``inf``, more digits than Python reads, digits of
    another script, or a negative count."""
    n = to_int(text.split()[0].rstrip("%"), integral=False)
    if n < 0:
        raise ValueError(f"{n} is negative")
    return n


def _why(e: Exception) -> str:
    for reason in ("out of range", "negative"):
        if reason in str(e):
            return "is " + reason
    return "is not a number"


def _leading_numbers(texts: list[str]) -> tuple[float, ...]:
    """The run of numbers a list starts with (what follows a non-number is not the list's);
    ValueError when it does not start with one."""
    out = []
    for t in texts:
        try:
            out.append(to_float(t))
        except ValueError:
            break
    if not out:
        raise ValueError(texts[0])
    if not all(0.0 <= x <= 1.0 for x in out):
        raise ValueError(f"{texts[0]!r} is out of range")  # a rate per position lies in 0-1
    return tuple(out)


def spec_line(line: str, at: int) -> Event:
    """A ``SpecDecoding metrics:`` line, newest or older format."""
    ts, rank = prefix(line, at)
    kw: dict = {}
    for name, value in _items(line[at + len(SPEC_MARKER) :].rstrip()):
        key = SPEC_FIELDS.get(name)
        if key is None:
            continue
        try:
            if key == "per_position":
                kw[key] = _leading_numbers(value.split(", "))
            elif key in _SPEC_INT:
                kw[key] = _count(value)
            else:
                n = _num(value)
                kw[key] = n / 100.0 if value.endswith("%") else n
        except (ValueError, IndexError) as e:
            return Malformed("SpecDecoding metrics", f"{name}: {value!r} {_why(e)}", line[:500], ts, rank)
    if not kw:
        return Malformed("SpecDecoding metrics", "no known field", line[:500], ts, rank)
    if kw.get("accepted") is not None and kw.get("drafted") is not None and kw["accepted"] > kw["drafted"]:
        why = f"Accepted: {kw['accepted']} is more than Drafted: {kw['drafted']}"
        return Malformed("SpecDecoding metrics", why, line[:500], ts, rank)
    rate = kw.get("draft_acceptance_rate")
    if rate is not None and rate > 1.0:
        return Malformed("SpecDecoding metrics", f"acceptance rate {rate:.0%} is over 100 %", line[:500], ts, rank)
    return VllmSpec(ts=ts, rank=rank, **kw)


def stats_line(line: str, at: int) -> Event:
    """The periodic ``Avg prompt throughput: …`` line, as decode stats."""
    ts, rank = prefix(line, at)
    kw: dict = {}
    extra: dict = {}
    for name, value in _items(line[at:].rstrip()):
        key = STATS_FIELDS.get(name)
        try:
            if key == "gen_throughput":
                kw[key] = _num(value)
            elif key is not None:
                kw[key] = _count(value)
            elif name.endswith("KV cache usage"):
                kw["token_usage"] = _num(value) / 100.0
            else:
                n = value.split()[0].rstrip("%") if value else ""
                extra[re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")] = (
                    float(n) if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", n) and len(value.split()) <= 2 else value
                )
        except (ValueError, IndexError) as e:
            return Malformed("Avg prompt throughput", f"{name}: {value!r} {_why(e)}", line[:500], ts, rank)
    if "gen_throughput" not in kw:
        return Malformed("Avg prompt throughput", "missing Avg generation throughput", line[:500], ts, rank)
    return DecodeStats(extra=extra, ts=ts, rank=rank, **kw)


RULES = (
    Rule(SPEC_MARKER, spec_line, None, "SpecDecoding metrics"),
    Rule(STATS_MARKER, stats_line, None, "Avg prompt throughput"),
)


# ---- its request log (--enable-log-requests) ---------------------------------------------------------
# vLLM 0.32.0, ``entrypoints/serve/utils/request_logger.py`` (RequestLogger.log_inputs): at DEBUG,
# ``Request ID details: prompt: REPR, prompt_token_ids: [...], prompt_embeds shape: …`` (the prompt
# as Python's repr, after the chat template for a chat request; None for a request sent as token ids),
# then at INFO ``Received request ID: params: SamplingParams(…, max_tokens=N, …), lora_request: …``.
_DETAILS = re.compile(r"\bRequest (\S+) details: prompt: ")
_RECEIVED = re.compile(r"\bReceived request (\S+): params: ")
_MAX_TOKENS = re.compile(r"\bmax_tokens=(\d+)")


class RequestLog:
    """vLLM's request log read line by line: a request is complete at its ``Received request`` line,
    its prompt from the ``details`` line before it (a request without one, or sent as token ids, is
    no workload prompt and is skipped)."""

    MAX_PENDING = 4096  # details lines waiting for their Received line (a log cut mid-request)

    def __init__(self) -> None:
        self.prompts: dict[str, str | None] = {}

    def __call__(self, line: str) -> LoggedRequest | None:
        if (m := _DETAILS.search(line)) is not None:
            end = line.rfind(", prompt_token_ids: ")
            if end < m.end():
                return None
            prompt = _string_literal(line[m.end() : end])
            if len(self.prompts) >= self.MAX_PENDING:
                self.prompts.pop(next(iter(self.prompts)))
            self.prompts[m.group(1)] = prompt
            return None
        if (m := _RECEIVED.search(line)) is None:
            return None
        prompt = self.prompts.pop(m.group(1), None)
        if prompt is None:
            return None
        n = _MAX_TOKENS.search(line, m.end())
        return LoggedRequest(prompt, int(n.group(1)) if n else None)


def _string_literal(text: str) -> str | None:
    """A Python string literal (what ``%r`` of a str writes), or None for anything else."""
    import ast

    text = text.strip()
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return v if isinstance(v, str) else None
