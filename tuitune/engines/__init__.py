"""Engines tuitune drives; ``get(name)`` gives one (see base.Engine for what an engine knows)."""

from __future__ import annotations

from tuitune.engines.base import CAUSE_ORDER, CAUSE_TEXT, HF_ERRORS, Engine
from tuitune.engines.sglang import SGLang
from tuitune.engines.vllm import VLLM

ENGINES: dict[str, Engine] = {e.name: e for e in (SGLang(), VLLM())}
NAMES = tuple(ENGINES)


_ERRORS = HF_ERRORS + tuple(x for e in ENGINES.values() for x in e.errors)


def get(name: str) -> Engine:
    return ENGINES[name]


def error_category(line: str) -> str | None:
    """The failure cause an engine's own error text names, if the line holds one."""
    for needle, category in _ERRORS:
        if needle in line:
            return category
    return None


__all__ = ["CAUSE_ORDER", "CAUSE_TEXT", "ENGINES", "Engine", "NAMES", "error_category", "get"]
