"""Where presets are found: a path, the user's directory, or the shipped ones."""

from __future__ import annotations

import os
from pathlib import Path

from tuitune.preset.io import load
from tuitune.preset.model import Preset, PresetError


def shipped_dir() -> Path:
    """An installed package holds the presets as tuitune/presets; a source checkout at the top level
    (tuitune/presets links there: the path shown is the real one, presets/)."""
    here = Path(__file__).resolve().parent.parent  # the tuitune package
    installed = here / "presets"
    return (installed if installed.is_dir() else here.parent / "presets").resolve()


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuitune" / "presets"


def find(name_or_path: str) -> Path:
    """A preset file from a path or a name in the user's or the shipped directory."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") and p.exists() or p.is_file():
        return p
    for d in (user_dir(), shipped_dir()):
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.is_file():
                return cand
    raise PresetError(
        f"{name_or_path}: no such preset file, and no preset of that name in "
        f"{user_dir()} or {shipped_dir()} (see `tuitune preset list`)"
    )


def resolve(name_or_path: str) -> Preset:
    return load(find(name_or_path))


def listing() -> list[tuple[str, Path, str, str]]:
    """(origin, path, name, description or error) of every preset in the user's and the shipped directory."""
    out = []
    for origin, d in (("user", user_dir()), ("shipped", shipped_dir())):
        if not d.is_dir():
            continue
        for path in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
            try:
                p = load(path)
                out.append((origin, path, p.name, p.description or ""))
            except PresetError as e:
                out.append((origin, path, "(invalid)", str(e)))
    return out


def json_schema() -> dict:
    schema = Preset.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tuitune preset"
    return schema
