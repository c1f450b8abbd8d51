"""pip for the test fixtures that fetch real releases (SGLang's and vLLM's wheels, vLLM's command
line): a failure skips a test only when the package registry's index does not answer, and any
other pip failure raises and fails the test.

pip itself runs through tests/real_vllm.py's runner (its ``Unreachable`` is the one exception a
test may skip on). Its reading of pip's words is not enough alone: with ``PIP_RETRIES=0`` an
unreachable index prints only "No matching distribution", and an unreachable extra index or
find-links location prints connection errors while the real failure is elsewhere. So when pip
fails, the index URL pip asks is probed, and that decides."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path


def _tests_real_vllm():
    """tests/real_vllm.py itself: a plain ``import real_vllm`` finds benchmarks/real_vllm.py
    instead once a test module has put benchmarks/ first on the path (test_advise.py does)."""
    here = Path(__file__).with_name("real_vllm.py").resolve()
    mod = sys.modules.get("real_vllm")
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve() == here:
        return mod
    spec = importlib.util.spec_from_file_location("real_vllm", here)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules.setdefault("real_vllm", mod)
    return mod


real_vllm = _tests_real_vllm()
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
