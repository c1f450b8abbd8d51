"""Reading one log line, for every engine's grammar (``Engine.rules``) and the parser.

What no engine owns: ``Rule``, the record of one kind of log line; the logger prefix (timestamp,
rank) with its memo, each engine's reader registered at import (``engines/__init__``); the values
of a line as the fast path reads them (``number``, ``as_int``, ``as_float``, ``as_bool``); and
``name: value, name: value`` lines, exactly (``fields``) and fast (``FastFields``, msgspec).
How long a line may be is ``tuitune.base.lines``'s.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Sequence
from itertools import starmap
from operator import add
from typing import NamedTuple

import msgspec


class Rule(NamedTuple):
    """One kind of log line: the parser runs ``parse(line, at)`` on a line holding ``marker``
    (``at``: where it is first found); ``many(lines)``, when given, does the same for many such
    lines at once and gives a list equal to ``[parse(line, line.find(marker)) for line in lines]``.
    ``name``: what a line of this kind too long to read is reported as (``Malformed.marker``)."""

    marker: str
    parse: Callable[[str, int], typing.Any]
    many: Callable[[Sequence[str]], list] | None = None
    name: str | None = None


# ---- the logger prefix -----------------------------------------------------------------------------

_READERS: list[Callable[[str, int], tuple[str | None, str | None] | None]] = []  # engines/__init__ fills it
_last: tuple[str, tuple[str | None, str | None]] = ("", (None, None))  # one object: threads read it whole
NO_PREFIX: tuple[None, None] = (None, None)


def register_prefix(reader: Callable[[str, int], tuple[str | None, str | None] | None]) -> None:
    if reader not in _READERS:
        _READERS.append(reader)


def prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """Timestamp and rank of the logger prefix before position ``end``: the first engine's
    reader that knows the line's prefix answers (``ENGINES`` order), else (None, None).

    Consecutive lines of a busy log mostly share their prefix (SGLang stamps to the second, and
    one rank prints the stats lines), so the last answer is kept and reused when this line starts
    with the same text; consecutive events then also share their ts and rank strings. With
    millisecond stamps (SGLANG_LOG_MS) prefixes rarely repeat, and the check costs one compare.
    """
    global _last
    key, hit = _last
    if len(key) == end and line.startswith(key):
        return hit
    found: tuple[str | None, str | None] = NO_PREFIX
    for read in _READERS:
        got = read(line, end)
        if got is not None:
            found = got
            break
    if end > 15:  # a reader may look at line[14]: keys shorter than that could mislead the memo
        _last = (line[:end], found)
    return found


def prefixes(lines: Sequence[str], heads: Sequence[str]) -> list[tuple[str | None, str | None]]:
    """``[prefix(line, len(head)) for …]`` where each head is the line's text before its marker,
    with the memo's test made here (no call for a repeated prefix)."""
    out = []
    key: str | None
    key, hit = _last
    for line, head in zip(lines, heads, strict=True):
        if head != key:
            hit = prefix(line, len(head))
            key = head if len(head) > 15 else None
        out.append(hit)
    return out


# ---- log values --------------------------------------------------------------------------------------


def number(text: str) -> int | float | None:
    """An integer literal as an exact int (any length Python reads), else a float, else None."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def value(text: str):
    """A log field value: int, float, bool, or the text itself."""
    if text == "True":
        return True
    if text == "False":
        return False
    n = number(text)
    return text if n is None else n


def field_key(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def as_float(v: str) -> float:
    """float(), except that "-0" reads as 0.0, as the fast path (msgspec) reads an integer zero."""
    return 0.0 if v == "-0" else float(v)


def as_int(v: str) -> int:
    """An integer literal exactly (17+ digits included); a number literal only when it is integral
    ("1e3", "12.0"), read as msgspec's lax mode (the fast path) reads it; anything else is an error."""
    try:
        return int(v)
    except ValueError:
        pass
    f = float(v)
    if not f.is_integer():  # 1.5, nan, inf
        raise ValueError(v)
    return int(f)


_BOOLS = {"true": True, "1": True, "false": False, "0": False, "-0": False}


def as_bool(v: str) -> bool:
    """True/False as SGLang prints them; also what msgspec's lax mode (the fast path) takes as a
    bool: any case, 1, 0 and -0."""
    b = _BOOLS.get(v.lower())
    if b is None:
        raise ValueError(v)
    return b


# ---- "name: value, name: value" lines ----------------------------------------------------------------


def fields(body: str, spec: dict) -> tuple[dict, dict]:
    """``name: value, name: value`` -> (known fields converted, extra fields by name); ``spec``
    maps a log name to (event field, converter). A value the converter refuses is kept in extra."""
    flat = body.replace(": ", ", ").split(", ")
    if len(flat) % 2 == 0 and body.count(": ") * 2 == len(flat):
        items: typing.Iterable = zip(flat[::2], flat[1::2], strict=False)
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
        extra[field_key(name)] = value(v.strip())
    return known, extra


def _required(t):
    """``int | None`` -> ``int``."""
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 else t


_astuple = msgspec.structs.astuple
# ``events``: t and T, f and F swapped (a bijection, so names stay as distinct as they were), which
# turns Python's True and False into JSON's true and false; and a colon not followed by a space,
# which the exact reader does not split at
_SWAP_TF = bytes.maketrans(b"tTfF", b"TtFf")
_LONE_COLON = re.compile(rb":[^ ]")  # (one ending the text leaves JSON a key without a value)


class FastFields:
    """The fast paths for ``name: value, name: value`` lines of one event type.

    ``events`` reads many lines at once, each given as its text after the marker in the form
    servers print (``, name: value, name: value``): the lines are joined into one JSON array of
    objects with the values left unquoted, ``{…," name": 8," other name": 0.5}``, by C-level
    passes over all of them (a swap of t/T and f/F that makes True and False JSON, then three
    one-character replaces), and msgspec decodes it in one call into a row struct whose field
    names are the log's names (swapped alike), and whose last fields, the event's own (the
    iteration, ``extra``: all but ts and rank), take their defaults, the first from a key no log
    text can spell that opens each object (a name between a comma and a colon holds neither).
    Each row is the event's constructor arguments but ts and rank (C-level loops add them). JSON reads numbers as the exact reader does (``-0`` is 0.0, ``1e3``
    an integer, an integer of any length exact); what it would read otherwise (``nan``, ``1_0``,
    ``True`` in a number field, a value the exact reader strips differently) is not JSON, or not
    of the row's type, and any of that, an unknown name (msgspec forbids them), a quote, a
    backslash, a colon without its space or text not of that form makes ``events`` give None: the
    caller then reads each line on its own.

    ``__call__`` reads one line's fields (``body``: without the marker and separators), values
    quoted: ``{" name":"value"," name":"value",...}`` through two replaces ("," is the cheaper
    pattern to replace than ", ", so each name keeps its leading space), decoded by msgspec's lax
    mode into a wire struct of the event's leading fields (those with a log name); its values as
    a tuple for the event's constructor, or None when the exact reader must decide (``fields``,
    which keeps unknown names in ``extra``). ``many`` does the same for many bodies with one
    decode (one replace pass over them all), None where a body needs the exact reader.
    """

    def __init__(self, cls: type, spec: dict, own: tuple[str, ...]):
        names: dict[str, str] = {}
        for log_name, (field, _conv) in spec.items():
            names.setdefault(field, log_name)  # "cpu graph"/"npu graph" take the exact path
        struct_fields = msgspec.structs.fields(cls)
        logged = struct_fields[: len(struct_fields) - len(own)]
        if tuple(f.name for f in struct_fields[len(logged) :]) != own or any(f.name not in names for f in logged):
            raise ValueError(f"{cls.__name__}: fields with a log name must come first, then {own}")
        if own[-2:] != ("ts", "rank") or len(own) < 3:
            raise ValueError(f"{cls.__name__}: rows need a field between the logged ones and ts, rank")
        # Types without their "| None": lax mode would read the text "null" as None.
        wire = msgspec.defstruct(
            "_Wire" + cls.__name__,
            [(f.name, _required(f.type), f.default) for f in logged],
            rename={f.name: " " + names[f.name] for f in logged},
            forbid_unknown_fields=True,
        )
        self.decode = msgspec.json.Decoder(wire, strict=False).decode
        self.decode_many = msgspec.json.Decoder(types.GenericAlias(list, (wire,)), strict=False).decode
        filled = struct_fields[len(logged) : -2]  # given by the decoder: their defaults
        defaults = [f.default_factory() if f.default is msgspec.NODEFAULT else f.default for f in filled]
        row = msgspec.defstruct(
            "_Row" + cls.__name__,
            [(f.name, _required(f.type), f.default) for f in logged]
            + [(f.name, type(d), d) for f, d in zip(filled, defaults, strict=True)],
            rename={
                **{f.name: " " + names[f.name].encode().translate(_SWAP_TF).decode() for f in logged},
                **{f.name: ":" + f.name for f in filled},
            },
            forbid_unknown_fields=True,
        )
        self.decode_rows = msgspec.json.Decoder(types.GenericAlias(list, (row,)), strict=False).decode
        self.cls = cls
        # each object opens with the first of them (the others take their defaults, the same values)
        opening = b'{":%s":%s' % (filled[0].name.encode(), msgspec.json.encode(defaults[0]))
        self._first = b"[" + opening
        self._between = b"}," + opening

    def events(self, rests: Sequence[str], heads: Sequence[tuple]) -> list | None:
        """The events of many lines, each given as its text after the marker and its (ts, rank),
        read as rows (see above); None when any of them is not of that form."""
        joined = "\n".join(rests)
        if '"' in joined or "\\" in joined:
            return None
        try:
            text = joined.encode()
            if _LONE_COLON.search(text):
                return None
            text = text.translate(_SWAP_TF).replace(b",", b',"').replace(b":", b'":').replace(b"\n", self._between)
            rows = self.decode_rows(b"".join((self._first, text, b"}]")))  # (one copy)
        except Exception:  # noqa: BLE001 - some line is unusual (or not UTF-8 at all): each on its own
            return None
        if len(rows) != len(rests):  # (a line holding "\n" splits)
            return None
        # each event: the row's values, then its (ts, rank), in C-level loops
        return list(starmap(self.cls, map(add, map(_astuple, rows), heads)))

    def __call__(self, body: str) -> tuple[typing.Any, ...] | None:
        if '"' in body or "\\" in body:
            return None
        try:
            return _astuple(self.decode('{" ' + body.replace(",", '","').replace(": ", '":"') + '"}'))
        except Exception:  # noqa: BLE001 - any doubt: the exact reader decides
            return None

    def many(self, bodies: list[str]) -> list[tuple[typing.Any, ...] | None]:
        joined = "\n".join(bodies)
        if '"' not in joined and "\\" not in joined:
            # as bytes: CPython's bytes.replace is the faster (UTF-8 keeps every character here)
            try:
                text = joined.encode().replace(b",", b'","').replace(b": ", b'":"')
                wires = self.decode_many(b'[{" ' + text.replace(b"\n", b'"},{" ') + b'"}]')
            except Exception:  # noqa: BLE001 - some body is unusual: each on its own
                wires = None
            if wires is not None and len(wires) == len(bodies):  # (a body holding "\n" splits)
                return [_astuple(w) for w in wires]
        return [self(b) for b in bodies]
