"""Engines tuitune drives; ``get(name)`` gives one (see base.py for what an engine module provides).

This package is the only door to engine knowledge: outside it, code asks an engine object (``get``,
``Preset.engine``) or the registry below, and never imports ``engines.sglang`` or ``engines.vllm``
(nor their ``_log`` and ``_schedule`` siblings: an import-linter contract in pyproject.toml).

Adding an engine: its module (its log lines and schedule file in siblings if it grows), and one entry in ``ENGINES`` below; everything else (the parser's
dispatch and prefixes, failure causes, info endpoints, the names the preset and the command line
accept) is read from here.
"""

from __future__ import annotations

from tuitune.base import logline
from tuitune.base.logline import Rule
from tuitune.engines.base import CAUSE_ORDER, CAUSE_TEXT, HF_ERRORS, Engine, Resolved
from tuitune.engines.sglang import SGLang
from tuitune.engines.sglang_log import log_prefix as _sglang_prefix
from tuitune.engines.vllm import VLLM
from tuitune.engines.vllm_log import message as _vllm_message

ENGINES: dict[str, Engine] = {e.name: e for e in (SGLang(), VLLM())}
NAMES = tuple(ENGINES)

for _e in ENGINES.values():
    logline.register_prefix(_e.log_prefix)

# every engine's log lines, engines in ENGINES order (the parser tries the probe's line first)
RULES: tuple[Rule, ...] = tuple(r for e in ENGINES.values() for r in e.rules)
# info endpoints, asked in this order of a server whose engine is not known
INFO_PATHS: tuple[str, ...] = tuple(dict.fromkeys(p for e in ENGINES.values() for p in e.info_paths))
ERRORS = HF_ERRORS + tuple(x for e in ENGINES.values() for x in e.errors)
# the speculative algorithms that draft with no draft model, on any engine
MODEL_FREE: tuple[str, ...] = tuple(dict.fromkeys(a for e in ENGINES.values() for a in e.model_free))
DEFAULT = "sglang"  # a preset's server.engine when it names none


def get(name: str) -> Engine:
    return ENGINES[name]


def resolve(spec) -> Resolved:
    """A speculative section's settings as its engine will run them. The section names no engine
    (``server.engine`` does): the first other engine that reads it in its own keys resolves it (vLLM:
    num_speculative_tokens, SUFFIX), else the default engine, whose rules answer any section (SGLang's)."""
    for e in ENGINES.values():
        if e.name != DEFAULT and (r := e.resolve(spec)) is not None:
            return r
    r = ENGINES[DEFAULT].resolve(spec)
    assert r is not None  # the default engine answers every section
    return r


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
    "DEFAULT",
    "ENGINES",
    "ERRORS",
    "Engine",
    "INFO_PATHS",
    "MODEL_FREE",
    "NAMES",
    "RULES",
    "error_category",
    "get",
    "label",
    "message",
    "resolve",
]
