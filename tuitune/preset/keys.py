"""Dotted preset keys (``env.NCCL_PROTO``, ``speculative.num_steps``): checking them and applying
changes by them, as --grid and the TUI's edits do."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tuitune.preset.io import from_dict, near_key
from tuitune.preset.model import Preset, PresetError


def _section(annotation: Any) -> Any:
    """The model a field holds (``Speculative | None`` -> Speculative), ``dict`` for env and
    server.args (any name, one level), or None for a plain value."""
    import typing

    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
        if t is dict or typing.get_origin(t) is dict:
            return dict
    return None


def check_key(key: str) -> None:
    """Raise PresetError unless ``key`` is a dotted path a preset has (``server.args.tp-size``,
    ``env.NCCL_PROTO``, ``speculative.num_steps``): --grid and edits name keys this way."""
    node: Any = Preset
    parts = key.split(".")
    for i, part in enumerate(parts):
        if node is None or node is dict and i < len(parts) - 1:
            raise PresetError(f"{key}: {'.'.join(parts[: i + (node is dict)])} is a value, not a section")
        if node is dict:
            return
        field = node.model_fields.get(part)
        if field is None or not part:
            near = near_key(parts[: i + 1])
            raise PresetError(
                f"{key}: unknown key {'.'.join(parts[: i + 1])}"
                + (f"; did you mean {'.'.join([*parts[:i], near])}?" if near else "")
                + " (allowed keys are listed by `tuitune preset schema`)"
            )
        node = _section(field.annotation)


def with_changes(preset: Preset, changes: dict[str, Any]) -> Preset:
    """A copy with dotted-path changes applied (``env.NCCL_PROTO``, ``speculative.num_steps``,
    ``server.args.tp-size``); the value ``None`` removes a key. Validated like a loaded file."""
    data = preset.model_dump(exclude_none=False)
    for key, value in changes.items():
        check_key(key)
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return from_dict(data, f"{preset.name} (edited)")
