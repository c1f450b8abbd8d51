"""The operator's settings: ``$XDG_CONFIG_HOME/tuitune/config.yaml`` (``~/.config/tuitune/config.yaml``).

Every key is optional: a missing file is the defaults. A file that cannot be read, or one key with a
wrong value, becomes one notice each (a sentence that names the file) and the default for it; the
app says them as warnings at start. A theme chosen in the UI is written back (``remember_theme``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tuitune.measure.levels import is_level


@dataclass
class UserConfig:
    keymap: dict[str, str] = field(default_factory=dict)
    baseline_max_age_min: float = 30.0
    bench_levels: list[int] = field(default_factory=lambda: [1, 4, 16, 64])  # what B measures
    theme: str | None = None
    errors: list[str] = field(default_factory=list)
    path: Path | None = None  # where a theme chosen in the UI is remembered (None: not remembered)


CONFIG_KEYS = ("keymap", "baseline_max_age_min", "bench_levels", "theme")


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuitune" / "config.yaml"


def load_user_config(path: Path | None = None) -> UserConfig:
    """``keymap: {binding id: keys}``, ``baseline_max_age_min``, ``bench_levels`` and ``theme``;
    problems become one notice each."""
    path = path or config_path()
    cfg = UserConfig(path=path)
    if not path.exists():
        return cfg
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError, RecursionError) as e:  # ValueError: not UTF-8
        cfg.errors.append(f"{path}: cannot read it ({str(e).splitlines()[0]}); using defaults")
        return cfg
    if not isinstance(data, dict):
        cfg.errors.append(f"{path}: expected a mapping; using defaults")
        return cfg
    km = data.get("keymap", {})
    if isinstance(km, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in km.items()):
        cfg.keymap = km
    elif km:
        cfg.errors.append(f"{path}: keymap must map binding ids to keys, e.g. tuitune.relaunch: ctrl+r")
    age = data.get("baseline_max_age_min", cfg.baseline_max_age_min)
    if isinstance(age, (int, float)) and age > 0:
        cfg.baseline_max_age_min = float(age)
    else:
        cfg.errors.append(f"{path}: baseline_max_age_min must be a positive number of minutes")
    levels = data.get("bench_levels", cfg.bench_levels)
    if isinstance(levels, list) and levels and all(map(is_level, levels)):
        cfg.bench_levels = sorted(set(levels))
    else:
        cfg.errors.append(f"{path}: bench_levels must be a list of concurrency levels, e.g. [1, 4, 16, 64]")
    theme = data.get("theme")
    if theme is not None:
        if isinstance(theme, str) and theme:
            cfg.theme = theme  # checked against the app's themes once it runs
        else:
            cfg.errors.append(f"{path}: theme must be a theme name, e.g. theme: nord")
    for key in sorted(set(map(str, data)) - set(CONFIG_KEYS)):
        cfg.errors.append(f"{path}: unknown key {key!r}{did_you_mean(key, CONFIG_KEYS)}; it is ignored")
    return cfg


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def remember_theme(path: Path, theme: str) -> None:
    """Set ``theme:`` in the config file, keeping the user's other lines and comments as they are."""
    text = path.read_text() if path.exists() else ""
    line = f"theme: {theme}"
    new, n = re.subn(r"(?m)^theme:.*$", line, text)
    if not n:
        new = text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)
