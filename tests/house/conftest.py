"""Whole-project checks: the layers and style (import-linter, ruff, mypy, the ceilings), the docs site,
what `pip install .` ships, the fixtures that fetch real releases, `make bench`'s runner."""
