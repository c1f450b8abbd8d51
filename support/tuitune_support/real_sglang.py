"""The real SGLang engine as a test fixture: PyPI ``sglang==0.5.18`` on this machine's CPU (Intel AMX
backend) in its own virtual environment, with the CPU kernels built here from the source that
``../shared/sglang-cpu/`` holds, and tiny models generated here (../shared/sglang-cpu/README.md is the
recipe this follows; ../shared/TESTING.md, "A real SGLang on these machines").

What is built, once, under ``.cache/`` beside the repository (git-ignored; reused while its marker names
the same release, source and recipe):

- ``.cache/sglang-kernel-cpu-<hash>/``: the kernel wheel (``sglang_kernel_cpu``, imported as
  ``sgl_kernel``), built from the tarball in ``../shared/sglang-cpu/`` (3-4 minutes on two cores);
  ``<hash>`` is the tarball's and the build recipe's, so a changed source builds a new wheel.
- ``.cache/sglang-cpu-0.5.18/``: a venv with the CPU torch, SGLang's CPU dependencies (held to the
  constraints file beside the source), ``sglang==0.5.18`` and that wheel; then the torchvision guard and
  the three upstream fixes, each checked: a fix that no longer applies is an error naming its file.
- ``.cache/sglang-cpu-models-v1/``: a random-weight Llama whose shapes the AMX kernels take (hidden
  384, output features multiples of 16, input features multiples of 32) with its byte-level BPE
  tokenizer, a random EAGLE-3 draft for it, and a second draft whose hidden size does not fit the
  target (for the failure tests). The generator is real_vllm.py's, with this shape.

Where ``../shared/sglang-cpu/`` is absent (a machine outside this workplace) the kernel source cannot be
had: :class:`NoSource` says where it comes from and the SGLang tests skip with that reason; a CPU without
AVX-512 (the kernels' instructions) is :class:`UnfitCpu`, checked before the build (skips too); the package
registry out of reach is :class:`real_vllm.Unreachable` (skips too). Any other failure raises.
Run ``python -m tuitune_support.real_sglang`` to build it all ahead (``make test`` does).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import time
import tomllib
from pathlib import Path

from tuitune_support import real_vllm  # the shared build helpers: lock, pip, atomic install, the model generator
from tuitune_support.paths import ROOT
from tuitune_support.real_vllm import (
    CACHE,
    Unreachable,
    _built,
    _fresh_tmp,
    _install_into_place,
    _locked,
    _relocate,
)

RELEASE = "0.5.18"
KERNEL_COMMIT = "7f8f030"
SOURCE_DIR = Path(os.environ.get("TUITUNE_SGLANG_CPU_SOURCE", ROOT.parent / "shared" / "sglang-cpu"))
TARBALL = SOURCE_DIR / f"sglang-kernels-aot-{KERNEL_COMMIT}.tar.gz"
PYPROJECT = SOURCE_DIR / f"pyproject_cpu-{KERNEL_COMMIT}.toml"
CONSTRAINTS = SOURCE_DIR / f"constraints-sglang-{RELEASE}-cpu.txt"
FIXES = SOURCE_DIR / f"fixes-{RELEASE}.patch"
TORCH = "torch==2.13.0+cpu"
TVM_FFI = "apache-tvm-ffi==0.1.11"
KERNEL_RECIPE = "1"  # bump when the kernel build's recipe changes (rebuilds the wheel: minutes)
RECIPE = "2"  # bump when the environment's recipe changes (forces a rebuild of the venv)

HOME = CACHE / f"sglang-cpu-{RELEASE}"
PYTHON = HOME / "bin" / "python"
MODELS = CACHE / "sglang-cpu-models-v1"
TARGET = MODELS / "llama-tiny"
EAGLE3 = MODELS / "eagle3-tiny"
EAGLE3_MISFIT = MODELS / "eagle3-misfit"

# shapes the AMX kernels pack (../shared/sglang-cpu/README.md: output features a multiple of 16, input a
# multiple of 32; the recipe's own runs used hidden 384 and 10 layers); intermediate 4 x 384 = 1536
SHAPE = {"hidden": 384, "layers": 10, "heads": 6, "vocab": 4096, "max_pos": 2048, "seed": 4321}

# what the CPU engine needs to serve on this machine (../shared/sglang-cpu/README.md)
ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "OMP_NUM_THREADS": "1",
    # NGRAM JIT-compiles its corpus on first use (32 s the first time): one cache for every launch
    "SGLANG_JIT_CACHE_DIR": str(CACHE / f"sglang-cpu-{RELEASE}-jit"),
    # SGLang's compile caches (Inductor's, ...) live under ~/.cache/sglang, each test's own HOME:
    # one cache for every launch instead (a launch's warm-up request takes about 3 s either way on a
    # quiet machine; the cache keeps the test homes small)
    "SGLANG_CACHE_DIR": str(CACHE / f"sglang-cpu-{RELEASE}-cache"),
    "TOKENIZERS_PARALLELISM": "false",
}
# --max-total-tokens: the KV cache is otherwise sized from free host memory (GBs)
ARGS = {"device": "cpu", "disable-overlap-schedule": True, "max-total-tokens": 16384, "sleep-on-idle": True}


class NoSource(Exception):
    """The kernel source is not on this machine (outside this workplace): the SGLang tests skip."""


class UnfitCpu(Exception):
    """This CPU cannot run SGLang's CPU kernels (no AVX-512): the SGLang tests skip, saying so."""


def unfit_cpu_reason(cpuinfo: str | None = None) -> str | None:
    """Why this CPU cannot run the kernels, or None. They are built for AVX-512 with AMX or with
    AVX-512 bf16 (``_AMX_FIX``); on a CPU without AVX-512 (an AMD EPYC of this machine kind offers
    AVX2 only) importing them dies on an illegal instruction (exit 132), after a 7-minute build."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None  # not Linux: the build says what fails
    flags = set(next((ln.split(":", 1)[1].split() for ln in cpuinfo.splitlines() if ln.startswith("flags")), []))
    model = next((ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")), "")
    if "avx512f" in flags and ({"amx_tile", "avx512_bf16"} & flags):
        return None
    lacks = "AVX-512" if "avx512f" not in flags else "AMX and AVX-512 bf16"
    return (
        f"this CPU ({model or 'unknown'}) lacks {lacks}, which SGLang's CPU kernels need (a Xeon with AMX, or "
        "AVX-512 with bf16): they die on an illegal instruction here"
    )


def say(msg: str) -> None:
    print(f"real-sglang: {msg}", file=sys.stderr, flush=True)


def _pip(python: Path, *args: str, **kw) -> str:
    return real_vllm._pip(python, *args, tell=say, **kw)


def no_source_reason() -> str | None:
    missing = [p.name for p in (TARBALL, PYPROJECT, CONSTRAINTS, FIXES) if not p.is_file()]
    if not missing:
        return None
    return (
        f"the SGLang CPU kernel source is not on this machine ({SOURCE_DIR} lacks {', '.join(missing)}): "
        "it is python/sglang/kernels/aot of the SGLang repository at commit 7f8f030 "
        "(set TUITUNE_SGLANG_CPU_SOURCE to a folder holding it, the dependency list and the fixes)"
    )


def _digest(*paths: Path, extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def missing_build_tools() -> list[str]:
    """The Debian packages the kernel build needs and this machine lacks (.ci/run installs them)."""
    need = [pkg for tool, pkg in (("g++", "g++"), ("patch", "patch")) if shutil.which(tool) is None]
    if not Path("/usr/include/numa.h").is_file():
        need.append("libnuma-dev")
    return need


def kernel_wheel() -> Path:
    """The kernel wheel, built once from the tarball (cached by the source's and recipe's hash)."""
    reason = no_source_reason()
    if reason:
        raise NoSource(reason)
    reason = unfit_cpu_reason()
    if reason:
        raise UnfitCpu(reason)
    stamp = _digest(TARBALL, PYPROJECT, extra=f"{TORCH} {KERNEL_RECIPE}")
    home = CACHE / f"sglang-kernel-cpu-{stamp}"
    found = sorted(home.glob("sglang_kernel_cpu-*.whl")) if _built(home, stamp) else []
    if found:
        return found[0]
    if need := missing_build_tools():
        raise RuntimeError(
            f"building the SGLang CPU kernels needs {', '.join(need)}: `apt-get install {' '.join(need)}` (as .ci/run does)"
        )
    python = _build_venv_base()
    with _locked(home.name):
        found = sorted(home.glob("sglang_kernel_cpu-*.whl")) if _built(home, stamp) else []
        if found:
            return found[0]
        tmp = _fresh_tmp(home)
        src = tmp / "src"
        src.mkdir(parents=True)
        with tarfile.open(TARBALL) as t:
            t.extractall(src, filter="data")
        aot = next(p.parent for p in src.rglob("pyproject_cpu.toml"))
        text = (aot / "pyproject_cpu.toml").read_text()
        if '"torch==2.12.0"' not in text:
            raise RuntimeError(
                f"{aot / 'pyproject_cpu.toml'} no longer pins torch==2.12.0: the build recipe needs a look"
            )
        (aot / "pyproject.toml").write_text(text.replace('"torch==2.12.0"', '"torch"'))
        t0 = time.monotonic()
        say(f"building the CPU kernels from {TARBALL.name} (3-4 minutes on two cores; once)")
        env = {**os.environ, "MAX_JOBS": str(os.cpu_count() or 2), "PATH": f"{python.parent}:{os.environ['PATH']}"}
        proc = subprocess.Popen(
            [
                "nice",
                "-n",
                "19",
                str(python),
                "-m",
                "pip",
                "wheel",
                ".",
                "--no-build-isolation",
                "--no-deps",
                "-w",
                str(tmp),
                "-v",
            ],
            cwd=aot,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        out: list[str] = []
        last = 0.0
        for line in proc.stdout:
            out.append(line)
            m = re.search(r"\[(\d+)/(\d+)\]", line)
            if m and time.monotonic() - last > 20:
                last = time.monotonic()
                say(f"kernels: step {m.group(1)} of {m.group(2)} ({time.monotonic() - t0:.0f} s)")
        if proc.wait() != 0:
            raise RuntimeError(f"building the SGLang CPU kernels failed: {''.join(out)[-1500:]}")
        shutil.rmtree(src)
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, home)
        say(f"kernels built in {time.monotonic() - t0:.0f} s")
    return sorted(home.glob("sglang_kernel_cpu-*.whl"))[0]


BASE = CACHE / f"sglang-cpu-{RELEASE}-base"  # torch and the build tools, for the kernel build


def _build_venv_base() -> Path:
    stamp = f"{TORCH} {KERNEL_RECIPE}"
    py = BASE / "bin" / "python"
    if _built(BASE, stamp) and py.exists():
        return py
    with _locked(BASE.name):
        if _built(BASE, stamp) and py.exists():
            return py
        tmp = _fresh_tmp(BASE)
        say(f"a build environment for the kernels in {BASE} ({TORCH})")
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, timeout=300)
        tpy = tmp / "bin" / "python"
        _pip(tpy, "install", "-q", "--upgrade", "pip")
        _pip(tpy, "install", "-q", TORCH, "scikit-build-core", "wheel", "ninja", "cmake>=3.18")
        _relocate(tmp, BASE)
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, BASE)
    return py


def _requirements() -> list[str]:
    """SGLang's CPU dependencies from its own list, less torch and the vision/audio packages."""
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    skip = {"torch", "torchvision", "torchaudio"}
    return [d for d in deps if re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower() not in skip]


# the torchvision guard (../shared/sglang-cpu/README.md, step 5): the index's torchvision is a CUDA
# build whose two fake registrations die beside the CPU torch; SGLang imports it at start-up
_TV_LINE = re.compile(r'^@torch\.library\.register_fake\(("torchvision::q?nms")\)$', re.M)


def _guard_torchvision(sp: Path) -> None:
    f = sp / "torchvision" / "_meta_registrations.py"
    if not f.is_file():
        raise RuntimeError(f"{f} is missing: the torchvision guard cannot be applied")
    text = f.read_text()
    if "if torchvision.extension._has_ops() else (lambda f: f))" in text:
        return  # guarded already
    new, n = _TV_LINE.subn(
        r"@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda f: f))", text
    )
    if n != 2:
        raise RuntimeError(f"{f}: the torchvision guard expected 2 fake registrations to guard, found {n}")
    f.write_text(new)


# SGLang chooses its CPU attention backend by AMX tiles alone (srt/utils/common.py, is_amx_tile_supported;
# srt/arg_groups/overrides.py falls back to torch_native without them), and torch_native runs no
# speculative decoding at all. The kernels built here also run on AVX-512 with bf16 (oneDNN's brgemm): on
# the AMD EPYC machines of this workplace (AVX-512, bf16, no AMX) an EAGLE-3 chain served at ~90 tok/s
# with the intel_amx backend once this guard let it. A no-op where the CPU has AMX.
_AMX_LINE = "    is_amx_tile_supported = torch.cpu._is_amx_tile_supported()\n"
_AMX_FIX = (
    "    is_amx_tile_supported = torch.cpu._is_amx_tile_supported() or (  # tuitune's test fixture: AVX-512 bf16\n"
    '        "avx512_bf16" in open("/proc/cpuinfo").read())\n'
)


def _allow_avx512(sp: Path) -> None:
    f = sp / "sglang" / "srt" / "utils" / "common.py"
    text = f.read_text()
    if _AMX_FIX in text:
        return
    if text.count(_AMX_LINE) != 1:
        raise RuntimeError(f"the SGLang fix in {f} (AVX-512 without AMX) no longer applies to sglang {RELEASE}")
    f.write_text(text.replace(_AMX_LINE, _AMX_FIX))


def _apply_fixes(sp: Path) -> None:
    """The three upstream fixes; each hunk must apply (a fix that no longer applies names its file)."""
    dry = subprocess.run(
        ["patch", "-p2", "--dry-run", "--forward", "-d", str(sp), "-i", str(FIXES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if dry.returncode != 0:
        bad = re.findall(r"patching file (\S+)\n(?:.*\n)*?.*(?:FAILED|Reversed|ignored)", dry.stdout)
        files = ", ".join(sorted(set(bad))) or dry.stdout.strip()[-400:]
        raise RuntimeError(f"the SGLang fix in {files} no longer applies to sglang {RELEASE} ({FIXES.name})")
    subprocess.run(["patch", "-p2", "--forward", "-s", "-d", str(sp), "-i", str(FIXES)], check=True, timeout=60)


def check(python: Path = PYTHON) -> None:
    code = textwrap.dedent(
        """
        import json, sglang, sgl_kernel, torch, torchvision
        from sglang.version import __version__
        print(json.dumps([__version__, torch.__version__]))
        """
    )
    r = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    if r.returncode != 0:
        raise RuntimeError(f"the SGLang environment does not import: {r.stderr.strip()[-800:]}")
    version, torch_version = json.loads(r.stdout.strip().splitlines()[-1])
    if version != RELEASE or not torch_version.endswith("+cpu"):
        raise RuntimeError(
            f"the SGLang environment is sglang {version} on torch {torch_version}, not {RELEASE} on a CPU torch"
        )


def build_env() -> Path:
    """The environment's python, built if missing (NoSource / Unreachable / RuntimeError)."""
    reason = no_source_reason()
    if reason:
        raise NoSource(reason)
    wheel = kernel_wheel()
    stamp = f"{RELEASE} {RECIPE} {wheel.parent.name} {_digest(CONSTRAINTS, FIXES)}"
    if _built(HOME, stamp) and PYTHON.exists():
        return PYTHON
    with _locked(HOME.name):
        if _built(HOME, stamp) and PYTHON.exists():
            return PYTHON
        tmp = _fresh_tmp(HOME)
        t0 = time.monotonic()
        say(f"building {HOME} (sglang=={RELEASE} on {TORCH}, about 2 minutes)")
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, timeout=300)
        tpy = tmp / "bin" / "python"
        _pip(tpy, "install", "-q", "--upgrade", "pip")
        _pip(tpy, "install", TORCH, progress=True)
        req = tmp / "requirements-sglang-cpu.txt"
        req.write_text("\n".join(_requirements()) + "\n")
        _pip(tpy, "install", "-r", str(req), "-c", str(CONSTRAINTS), progress=True)
        _pip(tpy, "install", "-q", "--no-deps", f"sglang=={RELEASE}", TVM_FFI, str(wheel))
        sp = Path(
            subprocess.check_output(
                [str(tpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
            ).strip()
        )
        _guard_torchvision(sp)
        _apply_fixes(sp)
        _allow_avx512(sp)
        say(f"installed in {time.monotonic() - t0:.0f} s; checking it imports")
        check(tpy)
        _relocate(tmp, HOME)
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, HOME)
        say(f"ready: {PYTHON} ({time.monotonic() - t0:.0f} s)")
    return PYTHON


def build_models(python: Path | None = None) -> dict[str, Path]:
    """The tiny models (target, EAGLE-3 draft, misfit draft): real_vllm.py's generator, this shape."""
    stamp = json.dumps(SHAPE, sort_keys=True)
    paths = {"target": TARGET, "eagle3": EAGLE3, "eagle3_misfit": EAGLE3_MISFIT}
    if _built(MODELS, stamp):
        return paths
    python = python or build_env()
    with _locked(MODELS.name):
        if _built(MODELS, stamp):
            return paths
        tmp = _fresh_tmp(MODELS)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        say(f"generating tiny models in {MODELS}")
        r = subprocess.run(
            [str(python), "-c", real_vllm.MAKE_MODELS, str(tmp), json.dumps(SHAPE)],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, **ENV},
        )
        if r.returncode != 0 or "ok" not in r.stdout:
            raise RuntimeError(f"generating the tiny models failed: {r.stderr.strip()[-1500:]}")
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, MODELS)
        say(f"models ready ({time.monotonic() - t0:.0f} s)")
    return paths


def build() -> tuple[Path, dict[str, Path]]:
    python = build_env()
    return python, build_models(python)


def preset(
    name: str,
    log: str | Path,
    port: int,
    *,
    python: str | Path = PYTHON,
    method: str | None = "EAGLE3",
    steps: int = 2,
    topk: int = 1,
    draft_tokens: int | None = None,
    draft: str | Path | None = None,
    model: str | Path = TARGET,
    target: dict | str = "local",
    args: dict | None = None,
    env: dict | None = None,
    profile: bool = True,
    adaptive: str | None = None,
    switch: list[int] | None = None,
    **bench,
) -> dict:
    """A tuitune preset (as a dict) that serves the tiny Llama on the real SGLang CPU engine.

    ``method``: EAGLE3 (the random draft: real costs, acceptance 1.00; ``topk`` > 1 a tree), NGRAM
    (``draft_tokens`` a cycle; real acceptance) or None. ``adaptive``: an adaptive config file (EAGLE3,
    topk 1; SGLang needs ``--disable-cuda-graph`` for it on a CPU, added here); ``switch``: the steps a
    launch is prepared to hold (``speculative.switch``: with an adaptive config that lists them)."""
    spec: dict | None = None
    if method == "EAGLE3":
        spec = {
            "algorithm": "EAGLE3",
            "draft_model_path": str(draft or EAGLE3),
            "num_steps": steps,
            "eagle_topk": topk,
            "num_draft_tokens": draft_tokens or (steps + 1 if topk == 1 else 2 * steps + 2),
        }
        if adaptive:
            spec["adaptive_config"] = str(adaptive)
        if switch:
            spec["switch"] = list(switch)
    elif method == "NGRAM":
        spec = {"algorithm": "NGRAM", "num_draft_tokens": draft_tokens or 4}
    elif method is not None:
        raise ValueError(f"method {method!r}: EAGLE3, NGRAM or None")
    extra = {"disable-cuda-graph": True} if adaptive else {}
    data: dict = {
        "name": name,
        "description": f"the real SGLang {RELEASE} CPU engine, tiny random Llama" + (f", {method}" if spec else ""),
        "target": target,
        "server": {
            "engine": "sglang",
            "python": str(python),
            "log": str(log),
            "port": port,
            "args": {"model-path": str(model), **ARGS, **extra, **(args or {})},
        },
        "env": {**ENV, **(env or {})},
        "profile": profile,
        "bench": {"requests": 6, "warmup": 1, "max_tokens": 128, **bench},
        "telemetry": {"enabled": False},  # no nvidia-smi on a CPU
    }
    if spec:
        data["speculative"] = spec
    return data


DEMO = Path("~/.cache/tuitune/sglang-cpu-demo")  # presets/sglang-cpu-demo.yaml's workdir


def link_demo(home: Path = DEMO) -> Path:
    """What presets/sglang-cpu-demo.yaml runs: ``venv`` and ``models`` under ``home``, linked."""
    return real_vllm.link_demo(home, HOME, MODELS)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tuitune_support.real_sglang", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--demo", action="store_true", help="also link what presets/sglang-cpu-demo.yaml runs (make demo-sglang)"
    )
    demo = ap.parse_args().demo
    try:
        py, models = build()
    except (NoSource, UnfitCpu, Unreachable) as e:
        print(f"the real SGLang engine was not installed: {e}")
        sys.exit(1 if demo else 0)  # the suite runs without it (its tests skip); the demo cannot
    except RuntimeError as e:  # anywhere else a failure is a failure, said in a sentence
        print(f"the real SGLang engine was not installed: {e}", file=sys.stderr)
        sys.exit(1)
    print(py)
    for k, v in models.items():
        print(f"{k}: {v}")
    if demo:
        print(f"demo: {link_demo()} (presets/sglang-cpu-demo.yaml)")
