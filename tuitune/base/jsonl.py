"""Append-only JSON Lines logs (sweep results, tune steps): each row synced as it is written, so
an interrupted run loses at most the row being written, and a row cut short is skipped on reading
(that step runs again on --resume)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # cut short by an interruption
    return rows


def append_row(path: Path, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
