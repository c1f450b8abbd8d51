"""Append-only JSON Lines logs (sweep results, tune steps): each row synced as it is written, so
an interrupted run loses at most the row being written, and a row cut short is skipped on reading
(that step runs again on --resume).

A log is read as hostile (issue 42): a line that is not UTF-8, not JSON, not an object, longer
than MAX_ROW bytes, or that the caller's ``check`` refuses (``"config": null``, a count of -3) is
skipped with a warning that names its line and why; the rows around it are kept. A writer that
finds the file's last line cut short (the run before was killed mid-row) ends that line before it
appends, so that the new row is never written onto the broken one.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

MAX_ROW = 16 * 1024 * 1024  # bytes of one row; tuitune's own rows are a few kilobytes


def _stderr(message: str) -> None:
    print(f"tuitune: warning: {message}", file=sys.stderr)


def read_rows(
    path: Path,
    check: Callable[[dict], str | None] | None = None,
    warn: Callable[[str], None] | None = _stderr,
) -> list[dict]:
    """Every usable row of the log at ``path`` ([] when there is none). ``check`` says why a row
    cannot be used (None when it can); ``warn`` hears one sentence for each line skipped (the last
    line cut short included: the interrupted row, which --resume runs again)."""
    if not path.exists():
        return []
    rows = []
    with open(path, "rb") as f:
        for n, raw in enumerate(_lines(f), 1):
            row = _row(raw)
            why = row if isinstance(row, str) else check(row) if check is not None else None
            if why is None and isinstance(row, dict):
                rows.append(row)
            elif why and warn is not None:
                said = (str(path), n, why)
                if warn is not _stderr or said not in _WARNED:  # a log read again in one run warns once
                    _WARNED.add(said)
                    warn(f"{path} line {n} skipped: {why}")
    return rows


_WARNED: set[tuple] = set()


def _lines(f):
    """The file's lines, each at most MAX_ROW + 1 bytes read (a longer one is kept cut, then the rest
    of it passed over), so that one huge line costs no more memory than the cap."""
    while True:
        raw = f.readline(MAX_ROW + 1)
        if not raw:
            return
        if len(raw) > MAX_ROW and not raw.endswith(b"\n"):
            while True:  # the rest of the over-long line
                more = f.readline(1 << 20)
                if not more or more.endswith(b"\n"):
                    break
            raw = raw[: MAX_ROW + 1]
        yield raw


def _row(raw: bytes) -> dict | str:
    """The row of a raw line, or why it is none ("" for a blank line: passed over silently). A
    last line without its newline is a row when it is whole (cut just before the newline)."""
    if len(raw) > MAX_ROW:
        return f"longer than {MAX_ROW // (1024 * 1024)} MiB"
    if not raw.strip():
        return ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8 (byte {e.start})" if raw.endswith(b"\n") else _CUT
    try:
        row = json.loads(text)
    except ValueError:
        return "not JSON" if raw.endswith(b"\n") else _CUT
    except RecursionError:
        return "nested too deep"
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    return row


_CUT = "cut short (the run was interrupted while writing it)"


def end_partial_line(path: Path) -> None:
    """End the file's last line with a newline when it was cut short (a killed writer): what is
    appended next starts a line of its own, and the broken row stays one skipped line."""
    try:
        with open(path, "rb+") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
    except FileNotFoundError:
        return


def append_row(path: Path, row: dict) -> None:
    end_partial_line(path)
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def is_count(v: object, low: int = 0, high: int = 1 << 20) -> bool:
    """An int (not a bool) in [low, high]: what a row's count, step or level must be."""
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def is_figure(v: object) -> bool:
    """A finite, non-negative number (not a bool): what a row's measured figure must be."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


class Result(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The base of an experiment's typed result (experiments/results.py): written as JSON by the
    one path every ``--json`` takes (``dumps``), its fields in order and an optional field at its
    default (None) left out, as the key was absent from the dict it replaces."""


def plain(obj):
    """A ``Result`` as the dicts and lists it was before it had a type (anything else as it is)."""
    if isinstance(obj, Result):
        return msgspec.to_builtins(obj, enc_hook=str)
    return obj


def finite(obj):
    """``obj`` with every non-finite float (NaN, ±Infinity) as None, lists and dicts walked, result
    Structs as builtins (``plain``): what a strict JSON writer (``allow_nan=False``) takes. NaN is
    tuitune's "unknown"; JSON has no word for it but null."""
    obj = plain(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj, **kw) -> str:
    """Strict JSON text of ``obj`` (``finite`` first; ``default=str`` for what JSON has no type for)."""
    return json.dumps(finite(obj), allow_nan=False, default=str, **kw)
