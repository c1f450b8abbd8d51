"""The prompts a benchmark sends: tuitune's built-in twelve, or the operator's own from a file.

Acceptance, and so every answer of `bench`, `ab`, `sweep`, `tune` and `advise`, depends on what the
prompts are: an n-gram drafter accepts what the request repeats, a draft model what it was trained
on. So a workload has a name and a hash (of its prompts and output lengths, in order), every run
names it, and results measured on two different workloads are not compared as if they were one.

A prompt file is read on this machine (not the target), in the formats benchmarking tools take:

* plain text: one prompt a line (blank lines skipped; a prompt with line breaks needs JSONL);
* JSONL: one prompt a line, a JSON string or an object whose ``prompt`` (or ``text``, ``input``)
  is the prompt and whose ``max_tokens`` (or ``output_len``, ``output_tokens``) is the output
  length to ask for; an object with ``conversations`` (ShareGPT) or ``messages`` (OpenAI chat)
  gives its first human / user turn;
* JSON: a list of the same (ShareGPT's datasets are such a list).

Every prompt is checked: a line that is not what its format says is refused in one sentence naming
the line, never skipped (a workload that silently lost prompts would be another workload).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from tuitune.base.errors import TuituneError

MAX_FILE = 256 << 20  # bytes of a prompt file
MAX_PROMPTS = 1_000_000
MAX_OUTPUT = 1_000_000  # an output length from the data (the preset's bench.max_tokens bound)
PROMPT_KEYS = ("prompt", "text", "input")
LENGTH_KEYS = ("max_tokens", "output_len", "output_tokens")
HUMAN = ("human", "user")


class WorkloadError(TuituneError):
    """One sentence: the prompt file cannot be used as a workload."""

    code = 2


@dataclass(frozen=True, slots=True)
class Item:
    prompt: str
    max_tokens: int | None = None  # from the data; None: the benchmark's max_tokens


@dataclass(frozen=True)
class Workload:
    name: str
    items: tuple[Item, ...]
    source: str = "built-in"  # the file's path, or "built-in"

    @functools.cached_property
    def hash(self) -> str:  # every run's summary names it: hashed once (a file may hold a million prompts)
        h = hashlib.sha256()
        for it in self.items:
            h.update(json.dumps([it.prompt, it.max_tokens]).encode())
        return h.hexdigest()[:12]

    @property
    def label(self) -> str:
        """``code.jsonl (3f2a9c0e1b7d, 40 prompts)``: how every output names it."""
        return describe(self.as_dict())

    def as_dict(self) -> dict:
        lengths = sum(1 for it in self.items if it.max_tokens is not None)
        return {"name": self.name, "hash": self.hash, "prompts": len(self.items), "lengths": lengths}

    def item(self, i: int) -> Item:
        return self.items[i % len(self.items)]


def describe(w: dict) -> str:
    """A run's workload (``Workload.as_dict``) as every output names it: ``code.jsonl (3f2a9c0e1b7d, 40 prompts)``."""
    n = w.get("prompts")
    return f"{w.get('name')} ({w.get('hash')}, {n} prompt{'' if n == 1 else 's'})"


@functools.cache
def builtin() -> Workload:
    """tuitune's twelve prompts (code, chat, summaries), ``tuitune/data/prompts.json``."""
    prompts = json.loads(resources.files("tuitune").joinpath("data/prompts.json").read_text("utf-8"))
    return Workload("built-in", tuple(Item(p) for p in prompts))


def same(a: dict | None, b: dict | None) -> bool:
    """Whether two runs' workloads (``Workload.as_dict``, or None for a run that named none: the
    built-in one, before workloads were named) are the same prompts."""
    return (a or {}).get("hash", builtin_hash()) == (b or {}).get("hash", builtin_hash())


def differ(a: dict | None, b: dict | None, traffic: bool = False) -> str | None:
    """A clause saying how two runs' workloads differ, or None when they are the same. ``traffic``:
    None is no workload of tuitune's (a capture of the server's own traffic), not the built-in one."""
    if traffic and (a is None or b is None):
        return None if a is None and b is None else f"workload {_named(a, traffic)} vs {_named(b, traffic)}"
    if same(a, b):
        return None
    return f"workload {_named(a)} vs {_named(b)}"


def _named(w: dict | None, traffic: bool = False) -> str:
    if w is None and traffic:
        return "the server's own traffic"
    w = w or {"name": "built-in", "hash": builtin_hash()}
    return f"{w.get('name')} ({w.get('hash')})"


def builtin_hash() -> str:
    return builtin().hash


def for_preset(preset, overrides: dict | None = None) -> Workload:
    """The workload a preset's benchmarks send: ``--prompts`` (in ``overrides``), else its
    ``bench.prompts``, else the built-in one."""
    path = (overrides or {}).get("prompts") or preset.bench.prompts
    return load(path) if path else builtin()


def load(path: str | Path) -> Workload:
    """The workload in a prompt file (format by content: JSON list, JSONL, else plain text); read
    again only when the file changed (a benchmark asks for it at every load level)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read it ({e.strerror or e})") from None
    if st.st_size > MAX_FILE:
        raise WorkloadError(f"{path}: {st.st_size >> 20} MiB is over the {MAX_FILE >> 20} MiB a prompt file may have")
    return _read(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _read(path: str, _mtime_ns: int, _size: int) -> Workload:
    p = Path(path).expanduser()
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise WorkloadError(f"{path}: a directory, not a prompt file") from None
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise WorkloadError(f"{path}:{line}: not UTF-8 text") from None
    items = _parse(text, str(path))
    if not items:
        raise WorkloadError(f"{path}: no prompt in it")
    if len(items) > MAX_PROMPTS:
        raise WorkloadError(f"{path}: {len(items)} prompts, over the {MAX_PROMPTS} a workload may have")
    return Workload(p.name, tuple(items), str(p))


def _parse(text: str, where: str) -> list[Item]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as e:
            raise WorkloadError(f"{where}: starts as a JSON list but is not JSON ({e})") from None
        if not isinstance(rows, list):
            raise WorkloadError(f"{where}: not a JSON list of prompts")
        return [_item(row, f"{where}: item {i + 1}") for i, row in enumerate(rows)]
    lines = text.splitlines()
    if stripped.startswith(("{", '"')):
        out = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise WorkloadError(f"{where}:{n}: not a JSON value (a JSONL file has one prompt a line)") from None
            out.append(_item(row, f"{where}:{n}"))
        return out
    return [Item(line) for line in lines if line.strip()]


def _item(row, where: str) -> Item:
    if isinstance(row, str):
        return Item(_text(row, where))
    if not isinstance(row, dict):
        raise WorkloadError(f"{where}: a {type(row).__name__}, not a prompt (a string or an object)")
    turns = row.get("conversations", row.get("messages"))
    if turns is not None:
        return Item(_text(_first_human(turns, where), where), _length(row, where))
    for key in PROMPT_KEYS:
        if key in row:
            return Item(_text(row[key], f"{where}: {key!r}"), _length(row, where))
    raise WorkloadError(
        f"{where}: an object with none of {', '.join(PROMPT_KEYS)}, conversations (ShareGPT) or messages (chat)"
    )


def _first_human(turns, where: str):
    if not isinstance(turns, list):
        raise WorkloadError(f"{where}: its conversation is not a list of turns")
    for t in turns:
        if isinstance(t, dict) and (t.get("from") in HUMAN or t.get("role") in HUMAN):
            return t.get("value", t.get("content"))
    raise WorkloadError(f"{where}: its conversation has no human or user turn")


def _text(v, where: str) -> str:
    if not isinstance(v, str):
        raise WorkloadError(f"{where}: the prompt is a {type(v).__name__}, not text")
    if not v.strip():
        raise WorkloadError(f"{where}: an empty prompt")
    return v


def _length(row: dict, where: str) -> int | None:
    for key in LENGTH_KEYS:
        if key in row:
            v = row[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 2 <= v <= MAX_OUTPUT:
                raise WorkloadError(f"{where}: {key} {json.dumps(v)[:40]} is not an output length (2 to {MAX_OUTPUT})")
            return v
    return None


# ---- a workload recorded from the server's own traffic ---------------------------------------------


class FromLog:
    """The requests an engine's log names, read line by line (``feed``), in the order they were logged:
    each prompt as the model saw it (after a chat template) and the output length it got or asked
    for. A prompt the log cut short is counted, never kept; ``mask`` (text -> text) masks what looks
    like a secret in each prompt (tuitune writes no credential it reads). WorkloadError when the
    engine's log cannot name its requests. Only the last ``keep`` requests are kept (``total`` counts all)."""

    def __init__(self, engine, mask=None, keep: int | None = None):
        read = engine.request_reader()
        if read is None:
            raise WorkloadError(f"{engine.label}'s log does not name its requests' prompts")
        self.read, self.mask = read, mask
        # the last ``keep`` requests (at most MAX_PROMPTS: a workload's bound), in order
        self.items: collections.deque[Item] = collections.deque(maxlen=min(keep or MAX_PROMPTS, MAX_PROMPTS))
        self.total = 0  # requests read (kept or not)
        self.cut = 0  # requests whose prompt the log cut short (left out: not the prompts that were sent)
        self.unlengthed = 0  # requests whose output length the log did not say
        self.masked = 0  # prompts in which something that looks like a credential was masked

    def feed(self, line: str) -> None:
        r = self.read(line)
        if r is None:
            return
        if r.truncated:
            self.cut += 1
            return
        n = r.max_tokens if r.max_tokens is not None and 2 <= r.max_tokens <= MAX_OUTPUT else None
        self.unlengthed += n is None
        prompt = self.mask(r.prompt) if self.mask else r.prompt
        self.masked += prompt != r.prompt
        self.items.append(Item(prompt, n))
        self.total += 1


def from_log(lines, engine, mask=None, keep: int | None = None) -> FromLog:
    """``FromLog`` over all of ``lines``."""
    got = FromLog(engine, mask, keep)
    for line in lines:
        got.feed(line)
    return got


def write_jsonl(items, path: str | Path) -> Workload:
    """``items`` as a JSONL prompt file (``{"prompt": …, "max_tokens": …}`` a line), written to a
    temporary file and renamed (never half a file); the workload it now is, read back."""
    import os
    import tempfile

    p = Path(path).expanduser()
    body = "".join(
        json.dumps(
            {"prompt": it.prompt, **({"max_tokens": it.max_tokens} if it.max_tokens else {})}, ensure_ascii=False
        )
        + "\n"
        for it in items
    )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent if str(p.parent) else ".")
    except OSError as e:
        raise WorkloadError(f"{p.parent}: cannot write there ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
        os.replace(tmp, p)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise WorkloadError(f"{p}: cannot write it ({e.strerror or e})") from None
    return load(p)
