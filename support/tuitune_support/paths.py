"""The checkout this support code serves: its root (tests/, benchmarks/, presets/) and its .cache/,
where the real engines are built once and every test and benchmark finds them.

The root is TUITUNE_ROOT when set, else support/'s parent when this package runs from a checkout
(`pip install -e ./support`, as the Makefile installs it), else the current directory when it is
one; anything else is an error that says so."""

from __future__ import annotations

import os
from pathlib import Path


def _is_checkout(path: Path) -> bool:
    return (path / "pyproject.toml").is_file() and (path / "tuitune").is_dir() and (path / "tests").is_dir()


def repo_root() -> Path:
    env = os.environ.get("TUITUNE_ROOT")
    if env:
        root = Path(env).resolve()
        if not _is_checkout(root):
            raise RuntimeError(f"TUITUNE_ROOT={env} is not a tuitune checkout (no pyproject.toml, tuitune/, tests/)")
        return root
    for root in (Path(__file__).resolve().parent.parent.parent, Path.cwd().resolve()):
        if _is_checkout(root):
            return root
    raise RuntimeError(
        "tuitune_support cannot find the tuitune checkout it serves: install it editable from the "
        "checkout (pip install -e ./support), run from the checkout's root, or set TUITUNE_ROOT"
    )


ROOT = repo_root()
CACHE = (ROOT / ".cache").resolve()  # in a worktree, a link to the main checkout's (shared)
