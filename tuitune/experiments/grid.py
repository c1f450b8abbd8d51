"""``KEY=V1,V2,...`` grids over preset paths (for `sweep` and `nccl-bench`).

KEY is a dotted preset path (``speculative.num_steps``, ``env.NCCL_PROTO``,
``server.args.num-continuous-decode-steps``); values are read as YAML scalars (``2`` is a number,
``true`` a boolean) except under ``env.``, where they stay text; ``unset`` removes the key.
``env=@PRESET,@PRESET`` swaps the whole environment block for another preset's (e.g. the seeds'
tuned and untuned NCCL sets).
"""

from __future__ import annotations

import itertools
from typing import Any

import yaml

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.errors import TuituneError

UNSET = "unset"


class EnvOf(dict):
    """The environment block of another preset, remembered by its name for labels."""

    def __init__(self, name: str, env: dict[str, str]):
        super().__init__(env)
        self.name = name


class GridError(TuituneError, ValueError):
    code = 2


def parse_axis(spec: str) -> tuple[str, list[Any]]:
    key, eq, values = spec.partition("=")
    key = key.strip()
    if not eq or not key or not values.strip():
        raise GridError(f"--grid {spec!r}: expected KEY=V1,V2,... (e.g. speculative.num_steps=1,2,3)")
    if key == "env":
        out_env: list = []
        for raw in values.split(","):
            raw = raw.strip()
            if not raw.startswith("@"):
                raise GridError(f"--grid {spec!r}: env takes @PRESET values (another preset's environment)")
            try:
                other = P.resolve(raw[1:])
                out_env.append(EnvOf(other.name, other.env))
            except P.PresetError as e:
                raise GridError(f"--grid {spec!r}: {e}") from None
        return key, out_env
    if key.split(".")[0] not in ("server", "speculative", "env", "profile", "bench"):
        raise GridError(f"--grid {spec!r}: {key} is not a preset path (server.…, speculative.…, env.…)")
    try:
        P.check_key(key)
    except P.PresetError as e:
        raise GridError(f"--grid {spec!r}: {str(e).split(': ', 1)[-1]}") from None
    out: list[Any] = []
    for raw in values.split(","):
        raw = raw.strip()
        if raw == UNSET:
            out.append(None)
        elif key.startswith("env."):
            out.append(raw)
        else:
            try:
                out.append(yaml.safe_load(raw))
            except yaml.YAMLError:
                out.append(raw)
            except RecursionError:
                raise GridError(f"--grid {key}: a value is nested too deeply to be a setting") from None
    if len(set(map(repr, out))) != len(out):
        raise GridError(f"--grid {spec!r}: a value is repeated")
    return key, out


def parse(specs: list[str]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        key, values = parse_axis(spec)
        if key in grid:
            raise GridError(f"--grid: {key} is given twice")
        grid[key] = values
    return grid


def combinations(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=False)) for combo in itertools.product(*(grid[k] for k in keys))]


def show(v: Any, key: str = "", grid: dict[str, list[Any]] | None = None) -> str:
    """A grid value as text: @PRESET for a swapped environment, unset for None. A secret
    (``env.HF_TOKEN``, ``server.args.api-key``) is masked, numbered by its place on the axis
    when the grid is known, so that two tokens still give two labels."""
    if isinstance(v, EnvOf):
        return f"@{v.name}"
    if v is None:
        return UNSET
    if redact.secret_key(key):
        values = (grid or {}).get(key) or []
        return redact.MASK + (f"#{values.index(v) + 1}" if v in values else "")
    return str(v)


def label(changes: dict[str, Any], grid: dict[str, list[Any]] | None = None) -> str:
    return " ".join(f"{k.split('.')[-1]}={show(v, k, grid)}" for k, v in changes.items()) or "preset"


def masked(changes: dict[str, Any]) -> dict[str, Any]:
    """Changes as they may be written (results files): secret values masked."""
    return {k: redact.env(v) if isinstance(v, EnvOf) else redact.shown(k, v) for k, v in changes.items()}


def apply(base: P.Preset, changes: dict[str, Any]) -> tuple[P.Preset | None, str | None]:
    """The preset with ``changes``, or (None, reason) for a combination the rules refuse."""
    try:
        return P.with_changes(base, changes), None
    except P.PresetError as e:
        return None, str(e).split(": ", 1)[-1]
