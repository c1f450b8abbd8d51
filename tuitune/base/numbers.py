"""Numbers read from text (log lines) without ever raising anything but ValueError.

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
    ``nan``, ``1e309``, more digits than Python reads) is a ValueError, never an OverflowError."""
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
