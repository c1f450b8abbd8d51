"""Engines tuitune drives; ``get(name)`` gives one (see base.Engine for what an engine knows)."""

from __future__ import annotations

from .base import CAUSE_ORDER, CAUSE_TEXT, Engine
from .sglang import SGLang
from .vllm import VLLM

ENGINES: dict[str, Engine] = {e.name: e for e in (SGLang(), VLLM())}
NAMES = tuple(ENGINES)


def get(name: str) -> Engine:
    return ENGINES[name]


__all__ = ["CAUSE_ORDER", "CAUSE_TEXT", "ENGINES", "Engine", "NAMES", "get"]
