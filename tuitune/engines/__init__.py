"""Engines tuitune drives; ``get(name)`` gives one (see base.py for what an engine module provides).

Adding an engine: its module, and one entry in ``ENGINES`` below; everything else (the parser's
dispatch and prefixes, failure causes, info endpoints, the names the preset and the command line
accept) is read from here.
"""

from __future__ import annotations

from tuitune.base import logline
from tuitune.base.logline import Rule
from tuitune.engines.base import CAUSE_ORDER, CAUSE_TEXT, HF_ERRORS, Engine
from tuitune.engines.sglang import SGLang
from tuitune.engines.sglang import log_prefix as _sglang_prefix
from tuitune.engines.vllm import VLLM
from tuitune.engines.vllm import message as _vllm_message

ENGINES: dict[str, Engine] = {e.name: e for e in (SGLang(), VLLM())}
NAMES = tuple(ENGINES)

for _e in ENGINES.values():
    logline.register_prefix(_e.log_prefix)

# every engine's log lines, engines in ENGINES order (the parser tries the probe's line first)
RULES: tuple[Rule, ...] = tuple(r for e in ENGINES.values() for r in e.rules)
# info endpoints, asked in this order of a server whose engine is not known
INFO_PATHS: tuple[str, ...] = tuple(dict.fromkeys(p for e in ENGINES.values() for p in e.info_paths))
ERRORS = HF_ERRORS + tuple(x for e in ENGINES.values() for x in e.errors)


def get(name: str) -> Engine:
    return ENGINES[name]


def label(name: str) -> str:
    """The engine's name as users write it ("SGLang", "vLLM")."""
    return ENGINES[name].label


def error_category(line: str) -> str | None:
    """The failure cause an engine's own error text names, if the line holds one."""
    for needle, category in ERRORS:
        if needle in line:
            return category
    return None


def message(line: str) -> str:
    """A failure line without its engine's logger prefix (vLLM's ``(EngineCore pid=…) ERROR … [file:n]``,
    SGLang's ``[2026-12-04 18:35:38 TP0]``), so the cause quotes the engine's words; the whole line
    when it has none."""
    text = _vllm_message(line)
    if text is line and _sglang_prefix(line, len(line)) is not None:
        return line[line.find("]") + 1 :].lstrip()
    return text


__all__ = [
    "CAUSE_ORDER",
    "CAUSE_TEXT",
    "ENGINES",
    "ERRORS",
    "Engine",
    "INFO_PATHS",
    "NAMES",
    "RULES",
    "error_category",
    "get",
    "label",
    "message",
]
