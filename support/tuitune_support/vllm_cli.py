"""A virtual environment holding the real vLLM release, enough of it to run its command line
(``vllm serve``: argument parser, ``--help=all``, the serve subcommand's validation) on a machine
with no GPU. tests/engines/test_vllm_parser.py runs tuitune's rendered commands through it.

vLLM's wheel is installed without its dependencies (they pin a CUDA torch and GPU kernels, several
GB); torch is the CPU build, and of vLLM's own requirements only those its command line imports are
installed, at the versions vLLM asks for. ``VLLM_TARGET_DEVICE=cpu`` lets vLLM pick its CPU
platform, so the parser's defaults (which ask the platform for a device) can be computed.

Run ``python -m tuitune_support.vllm_cli`` to build it ahead (CI does, before the suite); the test builds it
itself otherwise. It lives in ``.cache/`` beside the repository (git-ignored) and is reused while
its marker names the same release."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tuitune_support import registry
from tuitune_support.paths import ROOT

RELEASE = "0.33.0"
TORCH = "torch==2.13.0"  # the CPU build (a file this machine kind keeps on disk; PyPI's otherwise)
HOME = ROOT / ".cache" / f"vllm-cli-{RELEASE}"
PYTHON = HOME / "bin" / "python"
ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_NO_USAGE_STATS": "1"}

# what ``vllm serve`` imports before it serves (found by importing it in an empty environment)
NEEDED = (
    "packaging",
    "uvloop",
    "pydantic",
    "regex",
    "numpy",
    "psutil",
    "cbor2",
    "pyzmq",
    "transformers",
    "aiohttp",
    "requests",
    "openai-harmony",
    "openai",
    "msgspec",
    "cloudpickle",
    "pillow",
    "pybase64",
    "cachetools",
    "py-cpuinfo",
    "fastapi",
    "uvicorn",
    "prometheus-client",
    "partial-json-parser",
    "xgrammar",
    "llguidance",
    "watchfiles",
    "orjson",
    "einops",
)


Unreachable = registry.Unreachable  # the registry could not be reached: the only reason a test may skip


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(wheel: Path) -> list[str]:
    """NEEDED, each with the version range vLLM's own metadata gives it (markers kept)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"vllm-{RELEASE}.dist-info/METADATA").decode()
    pinned = {}
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: ") and "extra ==" not in line:
            req = line.removeprefix("Requires-Dist: ")
            name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
            pinned.setdefault(_norm(name), req)
    return [pinned.get(_norm(n), n) for n in NEEDED]


def _pip(command: str, *args: str) -> None:
    """pip in the environment (registry.py): Unreachable when the registry's index does not
    answer, RuntimeError with pip's last words for any other failure."""
    registry.pip(PYTHON, command, "-q", *args, timeout=900)


def build() -> Path:
    """The environment's python, built if missing. Raises Unreachable without a registry, and
    RuntimeError (with pip's last words) when an install fails for another reason."""
    marker = HOME / ".built"
    if marker.is_file() and marker.read_text().strip() == RELEASE and PYTHON.exists():
        return PYTHON
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(HOME)], check=True, timeout=300)
    wheels = HOME / "wheels"
    _pip("download", "--no-deps", "--only-binary=:all:", "-d", str(wheels), f"vllm=={RELEASE}")
    wheel = next(wheels.glob(f"vllm-{RELEASE}-*.whl"))
    _pip("install", TORCH)
    _pip("install", "--no-deps", str(wheel))
    _pip("install", *requirements(wheel))
    wheel.unlink()  # 336 MB, installed now
    marker.write_text(RELEASE + "\n")
    return PYTHON


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        prog="python -m tuitune_support.vllm_cli", description=__doc__.split("\n\n")[0]
    ).parse_args()
    try:
        print(build())
    except Unreachable as e:
        print(f"vLLM's command line was not installed: the package registry is unreachable ({e})")
