"""How long a log line may be: parsed, shown and written up to MAX_LINE characters, marked when cut."""

from __future__ import annotations

MAX_LINE = 64 * 1024  # characters of a line that are parsed and shown; no format comes close
TRUNCATED = " …[line truncated]"


def clip(line: str) -> str:
    """A line as it is kept for display and captures: at most MAX_LINE characters, marked when cut."""
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + TRUNCATED
