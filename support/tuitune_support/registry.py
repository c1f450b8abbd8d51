"""pip for the test fixtures that fetch real releases (SGLang's and vLLM's wheels, vLLM's command
line): a failure skips a test only when the package registry's index does not answer, and any
other pip failure raises and fails the test.

pip itself runs through real_vllm.py's runner (its ``Unreachable`` is the one exception a
test may skip on). Its reading of pip's words is not enough alone: with ``PIP_RETRIES=0`` an
unreachable index prints only "No matching distribution", and an unreachable extra index or
find-links location prints connection errors while the real failure is elsewhere. So when pip
fails, the index URL pip asks is probed, and that decides."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tuitune_support import real_vllm

Unreachable = real_vllm.Unreachable


def index_url() -> str:
    """The index pip asks: PIP_INDEX_URL, else pip's configuration, else pip's own default."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"].split()[0]
    r = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True, timeout=60
    )
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip().split()[0]
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def unreachable(url: str, timeout: float = 15.0) -> str | None:
    """Why ``url`` does not answer, or None when it answers (any HTTP status is an answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as e:
        return f"{url} does not answer ({getattr(e, 'reason', e)})"


def pip(python: Path, *args: str, timeout: float = 1800) -> str:
    """``python -m pip ARGS``; raises Unreachable when it failed and the index does not answer,
    RuntimeError (with pip's last words) for any other failure."""
    try:
        return real_vllm._pip(python, *args, timeout=timeout)
    except (real_vllm.Unreachable, RuntimeError) as e:
        url = index_url()
        why = unreachable(url)
        if why is not None:
            raise Unreachable(f"{why}; pip: {str(e)[-200:]}") from None
        if isinstance(e, real_vllm.Unreachable):
            raise RuntimeError(
                f"pip {args[0]} failed on a connection error, yet its index {url} answers: {e}"
            ) from None
        raise


def pip_download(dest: Path, requirement: str) -> Path:
    """One release's wheel from the package registry into ``dest`` (no dependencies, for Python
    3.11). The test skips only when the registry's index does not answer (this module); any
    other pip failure (no such release, a bad wheel, a full disk) raises and fails the test."""
    import pytest

    try:
        pip(
            Path(sys.executable),
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "-d",
            str(dest),
            requirement,
            timeout=600,
        )
    except Unreachable as e:
        pytest.skip(f"the package registry is not reachable here: {e}")
    name = requirement.split("=")[0].replace("-", "_")
    wheels = sorted(dest.glob(f"{name}-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {requirement} succeeded but left no wheel in {dest}")
    return wheels[0]
