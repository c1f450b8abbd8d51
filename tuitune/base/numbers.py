"""Numbers read from text (log lines) without ever raising anything but ValueError.

Only ASCII is a number here: Python's ``int()`` and ``float()`` read any script's digits
(``int("１２")`` is 12, a fullwidth "12"), which no engine writes; a log line with them is damaged
or forged, and is read as malformed.

``float("1e309")`` is ``inf`` and ``int(inf)`` raises OverflowError; ``int()`` of a literal longer
than Python's digit limit raises ValueError. A parser that converts a field with these helpers
only has to catch ValueError, which it turns into a reading of the line with its reason.
"""

from __future__ import annotations

import math


def to_int(text: str, integral: bool = True) -> int:
    """An integer literal exactly (17+ digits included); another number literal ("1e3", "12.0")
    only when it is finite and, with ``integral``, a whole number (read as msgspec's lax mode
    reads it); without ``integral`` a finite fraction is cut toward zero. Anything else (``inf``,
    ``nan``, ``1e309``, more digits than Python reads, digits of another script) is a ValueError,
    never an OverflowError."""
    _ascii(text)
    try:
        return int(text)
    except ValueError:
        pass
    f = float(text)  # ValueError when it is no number at all
    if not math.isfinite(f):
        raise ValueError(f"{text!r} is out of range")
    if integral and not f.is_integer():
        raise ValueError(f"{text!r} is not a whole number")
    return int(f)


def to_float(text: str) -> float:
    """A finite number literal in ASCII; anything else (``inf``, ``nan``, ``1e309``, a fullwidth
    digit) is a ValueError."""
    _ascii(text)
    f = float(text)
    if not math.isfinite(f):
        raise ValueError(f"{text!r} is out of range")
    return f


def _ascii(text: str) -> None:
    if not text.isascii():
        raise ValueError(f"{text!r} is not a number")
