"""ngram (prompt lookup) and suffix decoding: presets for both engines, their rendering checked
against the engines' own code (vLLM 0.33's command line and SpeculativeConfig, SGLang 0.5.23's
speculative arguments), the probe timing look-up drafting, the simulator serving it, and advise,
sweep and tune searching its K."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.measure.parse import parse_line
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.procs import tuitune_cli

PROBE_DIR = ROOT / "tuitune" / "probe"


def vllm_ngram(tmp: Path | None = None, name: str = "ng", tokens: int = 3, sim: bool = False, **spec) -> P.Preset:
    server: dict = {"engine": "vllm", "log": str((tmp or Path("/tmp")) / f"{name}.log"), "args": {"model": "/m"}}
    if sim:
        server.update(
            python=sys.executable,
            module="tuitune.sim",
            port=free_port(),
            args={"model": "/m/tiny", "sim-load-seconds": 0.3, "sim-speedup": 10, "tensor-parallel-size": 2},
        )
    data = {
        "name": name,
        "server": server,
        "speculative": {"algorithm": "ngram", "num_speculative_tokens": tokens, **spec},
        "env": {"VLLM_LOG_STATS_INTERVAL": "1"},
        "profile": True,
        "bench": {"requests": 3, "warmup": 0, "max_tokens": 80},
    }
    return P.from_dict(data)


def sglang_ngram(tmp: Path, name: str = "sng", sim: bool = True, **spec) -> P.Preset:
    return P.from_dict(
        {
            "name": name,
            "server": {
                "python": sys.executable,
                "module": "tuitune.sim" if sim else "sglang.launch_server",
                "log": str(tmp / f"{name}.log"),
                "port": free_port(),
                "args": {"sim-load-seconds": 0.3, "sim-speedup": 10, "decode-log-interval": 10, "tp-size": 2}
                if sim
                else {"model-path": "/m"},
            },
            "speculative": {"algorithm": "NGRAM", **spec},
            "profile": True,
            "bench": {"requests": 3, "warmup": 0, "max_tokens": 80},
        }
    )


def spec_config(p: P.Preset) -> dict:
    f = p.flags()
    return json.loads(f[f.index("--speculative-config") + 1])


# ---- presets: what each engine takes, and how it is rendered ---------------------------------------


def test_vllm_ngram_renders_method_ngram_and_is_a_chain_of_k():
    p = vllm_ngram(prompt_lookup_min=1, prompt_lookup_max=3)
    assert spec_config(p) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    assert p.engine.static_config(p) == (3, 1, 4) and p.engine.search_topks(p) == (1,)
    view = p.engine.speculative_view(p)
    assert view == {
        "speculative.algorithm": "NGRAM",
        "speculative.num_speculative_tokens": 3,
        "speculative.prompt_lookup_min": 1,
        "speculative.prompt_lookup_max": 3,
    }
    # one size given: vLLM copies it to the other; none: 5 and 5, which tuitune's lint points out
    one = vllm_ngram(prompt_lookup_max=2)
    assert spec_config(one) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    assert one.engine.speculative_view(one)["speculative.prompt_lookup_min"] == 2
    assert any("matches 5-grams only" in w for w in P.lint(vllm_ngram()))
    assert not any("5-grams" in w for w in P.lint(one))
    # tune's move to another K keeps the n-gram sizes
    from tuitune.decide.launch import Config
    from tuitune.experiments.tuneloop import preset_for

    moved = preset_for(one, Config.chain(5), one.speculative.model_dump(exclude_none=True))
    assert spec_config(moved) == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 2}


def test_suffix_decoding_on_vllm():
    p = P.from_dict(
        {
            "name": "sfx",
            "server": {"engine": "vllm", "log": "/l", "args": {"model": "/m"}},
            "speculative": {"algorithm": "suffix"},
        }
    )
    assert spec_config(p) == {"method": "suffix"} and p.engine.static_config(p) is None
    assert any("arctic_inference" in w for w in P.lint(p))
    q = P.with_changes(p, {"speculative.num_speculative_tokens": 8})
    assert spec_config(q) == {"method": "suffix", "num_speculative_tokens": 8}
    with pytest.raises(P.PresetError, match="SUFFIX is vLLM's suffix decoding"):
        P.from_dict({"name": "x", "server": {"log": "/l"}, "speculative": {"algorithm": "SUFFIX"}})


@pytest.mark.parametrize(
    "engine, spec, message",
    [
        (
            "vllm",
            {"algorithm": "ngram", "num_speculative_tokens": 2, "draft_model_path": "/d"},
            "NGRAM drafts from the request's own tokens",
        ),
        ("vllm", {"algorithm": "ngram"}, "num_speculative_tokens is required on vLLM"),
        (
            "vllm",
            {"algorithm": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min 4 is more than prompt_lookup_max 2",
        ),
        (
            "vllm",
            {"algorithm": "ngram", "num_speculative_tokens": 2, "ngram_max_bfs_breadth": 2},
            "is SGLang's NGRAM tree; vLLM's ngram drafts a chain",
        ),
        (
            "vllm",
            {"algorithm": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1},
            "NGRAM runs no draft model",
        ),
        (
            "vllm",
            {"algorithm": "eagle3", "draft_model_path": "/d", "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "prompt_lookup_max is an NGRAM setting",
        ),
        ("sglang", {"algorithm": "NGRAM", "num_steps": 3}, "num_steps: SGLang's NGRAM derives it"),
        (
            "sglang",
            {"algorithm": "NGRAM", "eagle_topk": 2},
            "eagle_topk: SGLang's NGRAM sets it from ngram_max_bfs_breadth",
        ),
        ("sglang", {"algorithm": "NGRAM", "prompt_lookup_max": 3}, "prompt_lookup_max is a vLLM setting"),
        (
            "sglang",
            {"algorithm": "NGRAM", "ngram_min_bfs_breadth": 4, "ngram_max_bfs_breadth": 2},
            "ngram_min_bfs_breadth 4 is more than",
        ),
    ],
)
def test_ngram_settings_each_engine_refuses_in_one_sentence(engine, spec, message):
    server = {"engine": "vllm", "log": "/l", "args": {"model": "/m"}} if engine == "vllm" else {"log": "/l"}
    with pytest.raises(P.PresetError) as e:
        P.from_dict({"name": "x", "server": server, "speculative": spec}, "x.yaml")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_sglang_ngram_renders_its_own_flags_and_is_searched_as_chains(tmp_path):
    p = sglang_ngram(tmp_path, sim=False, num_draft_tokens=6, ngram_max_bfs_breadth=1)
    spec = p.flags()[p.flags().index("--speculative-algorithm") :]
    assert spec == [
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        "6",
        "--speculative-ngram-max-bfs-breadth",
        "1",
    ]
    assert p.engine.static_config(p) == (5, 1, 6) and p.engine.search_topks(p) == (1,)
    # SGLang's defaults when unset: 12 tokens, breadth up to 10 (tuitune says so, and renders nothing)
    d = sglang_ngram(tmp_path, sim=False)
    assert d.flags()[-2:] == ["--speculative-algorithm", "NGRAM"] and d.engine.static_config(d) == (11, 10, 12)
    assert any("num_draft_tokens unset" in w for w in P.lint(d))
    from tuitune.decide.launch import Config

    assert p.engine.config_changes(Config.chain(3), p) == {
        "num_draft_tokens": 4,
        "ngram_max_bfs_breadth": 1,
        "ngram_min_bfs_breadth": None,
    }
    with pytest.raises(ValueError, match="draft tokens and breadth, not steps"):
        p.engine.config_changes(Config(2, 4, 8), p)
    with pytest.raises(P.PresetError, match="set by speculative.ngram_max_bfs_breadth"):
        P.with_changes(p, {"server.args.speculative-ngram-max-bfs-breadth": 3})


# ---- against the engines' own code ----------------------------------------------------------------

# vLLM's real `vllm serve` parser, then its real SpeculativeConfig built from what the parser read
# (serving itself needs an engine: the serve step only hands the parsed arguments over)
VLLM_CHECK = r"""
import json, sys
import vllm.entrypoints.cli.serve as _serve
from vllm.entrypoints.cli.main import main
from vllm.config.speculative import SpeculativeConfig

seen = {}
_serve.ServeSubcommand.cmd = staticmethod(lambda args: seen.update(vars(args)))
for argv in json.load(sys.stdin):
    seen.clear()
    sys.argv = ["vllm", *argv]
    out = {}
    try:
        main()
    except SystemExit as e:
        out["exit"] = e.code
    if "speculative_config" in seen:
        cfg = seen["speculative_config"]
        out["parsed"] = cfg
        try:
            c = SpeculativeConfig(**cfg)
            out["resolved"] = {k: getattr(c, k) for k in ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")}
        except Exception as e:
            lines = [x.strip() for x in str(e).splitlines() if x.strip()]
            out["error"] = [type(e).__name__, next((x for x in lines if "error" in x.lower() and x != lines[0]), lines[-1])]
    print("TUITUNE " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    from tuitune_support import vllm_cli

    try:
        return vllm_cli.build()
    except vllm_cli.Unreachable as e:
        pytest.skip(f"vLLM cannot be installed: the package registry is unreachable ({e})")


def test_vllms_own_command_line_and_speculative_config_take_what_tuitune_renders(vllm_python):
    from tuitune_support import vllm_cli

    presets = [
        vllm_ngram(tokens=3, prompt_lookup_min=1, prompt_lookup_max=3),
        vllm_ngram(tokens=4, prompt_lookup_max=2),
        vllm_ngram(tokens=2, prompt_lookup_min=3),
        vllm_ngram(tokens=5),
        P.from_dict(
            {
                "name": "s",
                "server": {"engine": "vllm", "log": "/l", "args": {"model": "/m"}},
                "speculative": {"algorithm": "suffix", "num_speculative_tokens": 8},
            }
        ),
    ]
    argvs = [p.flags() for p in presets]
    r = subprocess.run(
        [str(vllm_python), "-c", VLLM_CHECK],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        env={**os.environ, **vllm_cli.ENV},
        timeout=400,
    )
    rows = [json.loads(x.split(" ", 1)[1]) for x in r.stdout.splitlines() if x.startswith("TUITUNE ")]
    assert len(rows) == len(presets), (r.stdout[-500:], r.stderr[-1500:])
    for p, row in zip(presets[:4], rows[:4], strict=True):
        assert "exit" not in row and row["parsed"] == spec_config(p), row
        view = p.engine.speculative_view(p)  # tuitune's reading of the preset is vLLM's own
        assert row["resolved"] == {
            "method": "ngram",
            "num_speculative_tokens": view["speculative.num_speculative_tokens"],
            "prompt_lookup_min": view["speculative.prompt_lookup_min"],
            "prompt_lookup_max": view["speculative.prompt_lookup_max"],
        }, row
    # suffix decoding: the flags parse; without Arctic Inference vLLM refuses, in words tuitune reads
    assert rows[4]["parsed"] == {"method": "suffix", "num_speculative_tokens": 8}
    kind, text = rows[4]["error"]
    assert kind == "ImportError" and "Arctic Inference is required for suffix decoding" in text
    ev = parse_line(f"(APIServer pid=7) ImportError: {text}")
    assert ev.kind == "error" and ev.category == "init_failed"


# SGLang 0.5.23's own speculative arguments: its argparse built from its `Spec` fields by its own
# `add_cli_args_from_dataclass` (arg_groups/), the rest of SGLang (and its imports) left out
SGLANG_CHECK = r"""
import argparse, json, sys, types
site = sys.argv[1]
for name in ("sglang", "sglang.srt", "sglang.srt.arg_groups", "sglang.srt.arg_groups.fields"):
    m = types.ModuleType(name)
    m.__path__ = [site + "/" + name.replace(".", "/")]
    sys.modules[name] = m
from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
from sglang.srt.arg_groups.fields.spec import Spec
parser = argparse.ArgumentParser(exit_on_error=False)
add_cli_args_from_dataclass(parser, Spec)
print("TUITUNE-DEFAULTS " + json.dumps(vars(parser.parse_args([]))), flush=True)
for argv in json.load(sys.stdin):
    try:
        ns, rest = parser.parse_known_args(argv)
        print("TUITUNE " + json.dumps({"ns": vars(ns), "rest": rest}), flush=True)
    except (argparse.ArgumentError, SystemExit) as e:
        print("TUITUNE " + json.dumps({"error": str(e)}), flush=True)
"""


def test_sglangs_own_speculative_arguments_take_what_tuitune_renders(sglang_release, tmp_path):
    from tuitune.engines import sglang as S

    presets = [
        sglang_ngram(tmp_path, sim=False, num_draft_tokens=6, ngram_max_bfs_breadth=1),
        sglang_ngram(
            tmp_path,
            sim=False,
            num_draft_tokens=16,
            ngram_min_bfs_breadth=2,
            ngram_max_bfs_breadth=4,
            ngram_max_trie_depth=12,
        ),
        sglang_ngram(tmp_path, sim=False),
        P.resolve("c4-eagle3-2step-nccl"),  # and the EAGLE flags, as before
        P.resolve("sim-h200-llama8b-eagle3-tree"),
    ]
    argvs = [p.flags()[p.flags().index("--speculative-algorithm") :] for p in presets]
    r = subprocess.run(
        [sys.executable, "-c", SGLANG_CHECK, str(sglang_release.parent)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [x for x in r.stdout.splitlines() if x.startswith("TUITUNE")]
    assert len(lines) == len(presets) + 1, (r.stdout[-500:], r.stderr[-1500:])
    defaults = json.loads(lines[0].split(" ", 1)[1])
    # the defaults tuitune fills in for an unset NGRAM are SGLang's
    assert defaults["speculative_ngram_max_bfs_breadth"] == S.NGRAM_MAX_BFS_BREADTH
    assert defaults["speculative_ngram_min_bfs_breadth"] == S.NGRAM_MIN_BFS_BREADTH
    hook = (sglang_release / "srt" / "arg_groups" / "speculative_hook.py").read_text()
    assert f"speculative_num_draft_tokens={S.NGRAM_DRAFT_TOKENS}," in hook.replace(" ", "").replace("\n", "")
    assert "speculative_eagle_topk=cfg.speculative_ngram_max_bfs_breadth" in hook.replace(" ", "").replace("\n", "")
    for p, line in zip(presets, lines[1:], strict=True):
        row = json.loads(line.split(" ", 1)[1])
        assert "error" not in row and row["rest"] == [], (p.name, row)
        ns, s, r_ = row["ns"], p.speculative, p.speculative.resolved()
        assert ns["speculative_algorithm"] == s.algorithm
        if s.algorithm == "NGRAM":
            assert ns["speculative_num_draft_tokens"] == s.num_draft_tokens  # None: SGLang's 12
            assert ns["speculative_ngram_max_bfs_breadth"] == r_.eagle_topk
            assert ns["speculative_ngram_min_bfs_breadth"] == (s.ngram_min_bfs_breadth or 1)
            assert ns["speculative_ngram_max_trie_depth"] == (
                s.ngram_max_trie_depth or defaults["speculative_ngram_max_trie_depth"]
            )
            assert ns["speculative_num_steps"] is None and ns["speculative_eagle_topk"] is None
        else:
            assert (ns["speculative_num_steps"], ns["speculative_eagle_topk"], ns["speculative_num_draft_tokens"]) == (
                r_.num_steps,
                r_.eagle_topk,
                r_.num_draft_tokens,
            )
            assert ns["speculative_draft_model_path"] == s.draft_model_path


# ---- the probe: look-up drafting timed like a draft model's ---------------------------------------
# Stand-in trees with the releases' module paths, class and method names (checked against the real
# sources: test_probe.py for SGLang 0.5.23, test_vllm_release.py for vLLM 0.33); phases sleep.

VLLM_NGRAM_RUNNER = """
import time
from vllm.v1.spec_decode.ngram_proposer import NgramProposer
ACCEPTED = [0, 2, 1, 3]  # drafts accepted a step: lengths 1, 3, 2, 4 with the bonus token, mean 2.5
class SpecConfig:
    num_speculative_tokens = 3
class Output:
    def __init__(self, ids):
        self.sampled_token_ids = ids
class SchedulerOutput:
    num_scheduled_tokens = {"req-0": 4}
class GPUModelRunner:
    def __init__(self):
        self.speculative_config = SpecConfig()
        self.drafter = NgramProposer(3)
        self.n = 0
    def execute_model(self, scheduler_output, intermediate_tensors=None):
        time.sleep(0.004)  # the target forward over the drafted tokens
    def sample_tokens(self, grammar_output):
        time.sleep(0.0005)
        out = Output([[7] * (ACCEPTED[self.n % 4] + 1)])
        self.drafter.propose(3, out.sampled_token_ids, None, None)  # after bookkeeping, as for ngram
        self.n += 1
        return out
"""
VLLM_NGRAM_PROPOSER = """
import time
class NgramProposer:
    def __init__(self, k):
        self.k = k
        self.propose(k, [[]] * 4, None, None)  # the numba warm-up: outside any step
    def propose(self, num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        time.sleep(0.0015)
        return [[1] * self.k]
"""
VLLM_NGRAM_DRIVER = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, datefmt="%m-%d %H:%M:%S",
                    format="(EngineCore_DP0 pid=%(process)d) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s")
from vllm.v1.worker.gpu_model_runner import GPUModelRunner, SchedulerOutput
r = GPUModelRunner()
for _ in range(int(sys.argv[1])):
    r.execute_model(SchedulerOutput())
    r.sample_tokens(None)
"""
SGLANG_NGRAM_WORKER = """
import time
ACCEPT = [1, 3, 2, 4]
class Result:
    def __init__(self, accept_lens):
        self.accept_lens = accept_lens
class NGRAMWorker:
    def __init__(self):
        self.tp_rank = 0
        self.topk = 1  # SGLang: speculative_eagle_topk, overwritten with the max BFS breadth
        self.speculative_num_draft_tokens = 4
        self.draft_token_num = 4
        self.speculative_num_steps = 4  # SGLang's own: tokens // breadth
        self.n = 0
    def _prepare_for_speculative_decoding(self, batch):
        if not batch.forward_mode.is_decode():
            return
        time.sleep(0.001)  # the trie look-up on the host
    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None):
        self._prepare_for_speculative_decoding(batch)
        time.sleep(0.005)  # the target's verify forward over the tree, sampling
        if not batch.forward_mode.is_decode():
            return Result([1] * len(batch.reqs))
        self.n += 1
        return Result([ACCEPT[self.n % 4]] * len(batch.reqs))
"""
SGLANG_NGRAM_DRIVER = """
import logging, sys
logging.basicConfig(level=logging.INFO, format="[%(asctime)s TP0] %(message)s", stream=sys.stdout)
from sglang.srt.speculative.ngram_worker import NGRAMWorker
class Mode:
    def __init__(self, decode): self.decode = decode
    def is_decode(self): return self.decode
class Batch:
    def __init__(self, decode, bs=2):
        self.forward_mode, self.reqs = Mode(decode), [object()] * bs
w = NGRAMWorker()
for i in range(int(sys.argv[1])):
    if i % 5 == 0:
        w.forward_batch_generation(Batch(False))  # a prefill: no speculative cycle
    w.forward_batch_generation(Batch(True))
"""


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if str(parent) != ".":
                (root / parent / "__init__.py").touch()
        path.write_text(text)


def _run_probe(tmp: Path, driver: str, cycles: int, window: int) -> subprocess.CompletedProcess:
    from tuitune.probe import FILES

    probe = tmp / "probe"
    probe.mkdir(exist_ok=True)
    for name in FILES:
        (probe / name).write_bytes((PROBE_DIR / name).read_bytes())
    (tmp / "driver.py").write_text(driver)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(probe), str(tmp / "fake")]),
        EAGLE3_PROFILE="1",
        EAGLE3_PROFILE_WINDOW=str(window),
    )
    return subprocess.run(
        [sys.executable, str(tmp / "driver.py"), str(cycles)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp,
    )


def test_probe_times_vllms_ngram_drafting_on_the_host_clock(tmp_path):
    _tree(
        tmp_path / "fake",
        {
            "vllm/v1/spec_decode/ngram_proposer.py": VLLM_NGRAM_PROPOSER,
            "vllm/v1/worker/gpu_model_runner.py": VLLM_NGRAM_RUNNER,
        },
    )
    r = _run_probe(tmp_path, VLLM_NGRAM_DRIVER, 16, 4)
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert len(events) == 4, r.stdout + r.stderr
    for ev in events:
        assert ev.kind == "profile" and ev.cycles == 4 and ev.bs == 1 and ev.rank == "DP0"
        assert (ev.steps, ev.topk, ev.draft_tokens, ev.drafter) == (3, 1, 4, "ngram")
        assert ev.sync == "cpu" and ev.extra == {}  # no CUDA: the host clock, said in a known key
        assert 1.3 < ev.draft_ms < 5  # the look-up (1.5 ms); the warm-up outside a step is no cycle
        assert 4.0 < ev.verify_ms < 12 and ev.extend_ms == 0.0
        assert ev.accept_len == pytest.approx(2.5) and ev.accept_counts == (1, 1, 1, 1)
        assert ev.cycle_ms == pytest.approx(ev.draft_ms + ev.verify_ms, abs=0.01)


def test_probe_times_sglangs_ngram_cycle_and_skips_prefills(tmp_path):
    _tree(tmp_path / "fake", {"sglang/srt/speculative/ngram_worker.py": SGLANG_NGRAM_WORKER})
    r = _run_probe(tmp_path, SGLANG_NGRAM_DRIVER, 10, 5)
    assert r.returncode == 0, r.stderr
    events = [parse_line(x) for x in r.stdout.splitlines() if "EAGLE3_PROFILE" in x]
    assert len(events) == 2, r.stdout + r.stderr
    # cycles 1-5 accept 3, 2, 4, 1, 3, cycles 6-10 2, 4, 1, 3, 2 (the prefills are none of them)
    assert [ev.accept_len for ev in events] == [pytest.approx(2.6), pytest.approx(2.4)]
    for ev in events:
        assert ev.kind == "profile" and ev.cycles == 5 and ev.bs == 2 and ev.rank == "TP0"
        # the tree's depth bound (tokens − 1), not SGLang's derived num_steps (tokens // breadth)
        assert (ev.steps, ev.topk, ev.draft_tokens, ev.drafter, ev.sync) == (3, 1, 4, "ngram", "cpu")
        assert 0.8 < ev.draft_ms < 4 and 4.5 < ev.verify_ms < 12 and ev.extend_ms == 0.0
        assert ev.verify_tokens == 8 and sum(ev.accept_counts) == 10


# ---- the simulator serves it; launch, sweep, tune and advise walk ngram's K -----------------------


def cli(*args, env=None, timeout=300):
    return tuitune_cli(*args, env=env, timeout=timeout)


async def test_ngram_launches_on_both_dialects_and_profiles_as_lookups(tmp_path):
    from tuitune.machine.control import ServerControl
    from tuitune.machine.errors import ControlError
    from tuitune.machine.transport import LocalTransport
    from tuitune.measure.bench import run_bench
    from tuitune.measure.benchconfig import BenchConfig

    t = LocalTransport()
    v = vllm_ngram(tmp_path, "vng", tokens=3, sim=True, prompt_lookup_min=1, prompt_lookup_max=3)
    s = sglang_ngram(tmp_path, "sng", num_draft_tokens=5, ngram_max_bfs_breadth=1)
    for p, api in ((v, "openai"), (s, "native")):
        c = ServerControl(t, p, state_dir=str(tmp_path / "state"))
        try:
            _, ready = await c.relaunch(60)
            assert ready.ok, ready.message
            run = await run_bench(BenchConfig.for_preset(f"http://127.0.0.1:{p.server.port}", p))
            assert run.ok and not run.failed and run.config.api == api
            assert (await c.status()).drift == []
            await __import__("asyncio").sleep(1.5)  # a stats interval (vLLM) / a decode window (SGLang)
        finally:
            await c.stop()
        log = Path(p.server.log).read_text()
        events = [parse_line(x) for x in log.splitlines()]
        profiles = [e for e in events if e is not None and e.kind == "profile"]
        assert profiles and all(e.drafter == "ngram" for e in profiles), log[-1500:]
        want = (3, 1, 4) if p is v else (4, 1, 5)  # SGLang: the tree's depth bound, draft tokens − 1
        assert all((e.steps, e.topk, e.draft_tokens) == want for e in profiles)
        assert all(e.extend_ms == 0.0 and e.draft_ms < 0.05 * e.verify_ms for e in profiles)  # a look-up
        assert "Capture draft cuda graph" not in log  # SGLang: no draft model, no draft graphs
        # vLLM "loads the drafter" for ngram too, and turns async scheduling off (both seen on 0.32's CPU build)
        assert ("Loading drafter model" in log) == (p is v)
        assert ("Async scheduling not supported with ngram-based speculative decoding" in log) == (p is v)
    sg_log = Path(s.server.log).read_text()
    assert "The mixed chunked prefill are disabled because of using ngram speculative decoding." in sg_log
    spec = [
        e for e in (parse_line(x) for x in Path(v.server.log).read_text().splitlines()) if e and e.kind == "vllm_spec"
    ]
    assert spec and all(len(e.per_position) == 3 for e in spec)
    # suffix decoding on a machine without Arctic Inference: a classified start failure, at once
    sfx = P.with_changes(v, {"name": "sfx", "speculative": {"algorithm": "suffix"}})
    with pytest.raises(ControlError) as e:
        await ServerControl(t, sfx, state_dir=str(tmp_path / "state")).relaunch(60)
    assert "initialization failed" in str(e.value) and "Arctic Inference is required" in str(e.value), str(e.value)


@pytest.mark.sim_clock  # tune's answer within 2 % of the simulated truth, off its clock (CI beside an engine: 0.956)
def test_sweep_tune_and_advise_walk_vllm_ngrams_k(tmp_path):
    p = P.with_changes(
        vllm_ngram(tmp_path, "tng", tokens=2, sim=True, prompt_lookup_min=1, prompt_lookup_max=3),
        {
            "server.args.sim-speedup": 20,
            "server.args.sim-load-seconds": 0.2,
            "bench.requests": 4,
            "bench.max_tokens": 120,
        },
    )
    path = P.save(p, tmp_path / "tng.yaml")
    home = {"HOME": str(tmp_path)}
    sweep = tmp_path / "sweep"
    r = cli(
        "sweep",
        str(path),
        "--grid",
        "speculative.num_speculative_tokens=1,4",
        "--out",
        str(sweep),
        "--no-plot",
        env=home,
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (sweep / "results.jsonl").read_text().splitlines()]
    assert {x["changes"].get("speculative.num_speculative_tokens") for x in rows if x.get("changes")} == {1, 4}
    out = tmp_path / "tune"
    r = cli(
        "tune", str(path), "--budget", "2", "--concurrency", "2", "--levels", "1,2", "--out", str(out),
        "--json", str(tmp_path / "r.json"), env=home, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert "launch 0: 2 spec tokens (verify 3) (the starting configuration)" in r.stdout, r.stdout
    launched = [x for x in map(json.loads, (out / "tune.jsonl").read_text().splitlines()) if x["kind"] == "launch"]
    assert len(launched) == 3 and all(x["failure"] is None and x["config"]["topk"] == 1 for x in launched), launched
    result = json.loads((tmp_path / "r.json").read_text())
    from tuitune.sim import model as S

    def truth(k: int) -> float:  # the simulator's own goodput at two streams: K lookups, or off
        cfg = {"algorithm": "NGRAM", "num_speculative_tokens": k} if k else {"algorithm": None}
        return S.expected_goodput(None, {**cfg, "tp_size": 2}, 2)

    # its world: K=3 +3.7 % over the start, K=4 +1.1 %, off -3 %, K=1 -15 %: never a choice slower than the start
    assert truth(result["chosen"]["steps"]) >= 0.98 * truth(2), result
    assert result["verdict"]["verdict"] in ("faster", "start is already best", "no significant difference"), result
    if result["verdict"]["verdict"] not in ("start is already best",):
        # the default A/B: a verdict that can be significant, sequential from 4 up to 8 rounds
        assert (
            4 <= result["verdict"]["n_baseline"] <= 8
            and result["verdict"]["n_candidate"] == result["verdict"]["n_baseline"]
        )
    if (out / "best.yaml").exists():  # the tuned preset is still ngram, its n-gram sizes kept
        best = P.load(out / "best.yaml")
        assert not best.is_speculative or (
            best.speculative.algorithm == "NGRAM"
            and (best.speculative.prompt_lookup_min, best.speculative.prompt_lookup_max) == (1, 3)
        )
    adv = cli("advise", *[x["capture"] for x in launched], "--concurrency", "2")
    assert adv.returncode == 0 and "spec tokens (verify" in adv.stdout and "topk" not in adv.stdout, adv.stdout


def test_tune_walks_sglang_ngram_as_chains_of_draft_tokens(tmp_path):
    p = P.with_changes(
        sglang_ngram(tmp_path, "tsg", num_draft_tokens=3, ngram_max_bfs_breadth=1),
        {
            "server.args.sim-speedup": 20,
            "server.args.sim-load-seconds": 0.2,
            "bench.requests": 4,
            "bench.max_tokens": 120,
        },
    )
    path = P.save(p, tmp_path / "tsg.yaml")
    out = tmp_path / "tune"
    r = cli(
        "tune", str(path), "--budget", "1", "--levels", "1", "--out", str(out), "--ab-rounds", "1",
        "--no-verdict", env={"HOME": str(tmp_path)}, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    launched = [x for x in map(json.loads, (out / "tune.jsonl").read_text().splitlines()) if x["kind"] == "launch"]
    assert len(launched) == 2 and all(x["failure"] is None for x in launched), launched
    assert launched[0]["config"] == {"steps": 2, "topk": 1, "draft_tokens": 3}
    assert all(
        x["config"]["topk"] == 1 and x["config"]["draft_tokens"] in (0, x["config"]["steps"] + 1) for x in launched
    )
    # advise on its captures: the windows say drafter=ngram, so SGLang's space is chains here too
    adv = cli("advise", *[x["capture"] for x in launched], "--json")
    assert adv.returncode == 0, adv.stderr
    ranked = json.loads(adv.stdout)["advice"][0]["all"]
    assert ranked and all(row["config"]["topk"] == 1 for row in ranked), ranked[:3]


async def test_tui_shows_the_lookup_drafter_and_its_advisor_walks_k(tmp_path):
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.settings import UserConfig
    from tuitune_support.pilot import SIZE_LIVE, until, wait_ready

    p = vllm_ngram(tmp_path, "tui-ng", tokens=2, sim=True, prompt_lookup_min=1, prompt_lookup_max=3)
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        assert app.config.query_one("#spec-algorithm").value == "NGRAM"
        await s.set_load(True)
        await until(pilot, lambda: s.store.last_profile is not None, 20, "a profile window")
        assert s.store.last_profile.drafter == "ngram"
        app.tabs.active = "tab-advisor"
        await until(pilot, lambda: app.advisor.rows, 20, "the advisor's first fit")
        assert app.advisor.topks == (1,) and all(r.config.topk == 1 for r in app.advisor.rows)
        best = app.advisor.top()
        await pilot.press("a")
        if best.speculative:
            # (20 s: under CI's load, both cores busy with the real engines, 5 s ran out once)
            await until(pilot, lambda: app.config.query_one("#spec-num-steps").value == str(best.steps), 20, "the edit")
            d = app.draft.speculative
            assert (d.algorithm, d.num_speculative_tokens, d.prompt_lookup_max) == ("NGRAM", best.steps, 3)
            assert not app.draft_errors
        await s.close(stop_server=True)


async def test_preflight_refuses_suffix_decoding_without_arctic_inference(tmp_path, vllm_python):
    """The real vLLM 0.33 environment has no arctic-inference: refused before anything starts."""
    from tuitune.machine.control import ServerControl
    from tuitune.machine.errors import ControlError
    from tuitune.machine.transport import LocalTransport
    from tuitune_support import vllm_cli

    model = tmp_path / "model"
    model.mkdir()
    p = P.from_dict(
        {
            "name": "sfx",
            "server": {
                "engine": "vllm",
                "python": str(vllm_python),
                "log": str(tmp_path / "sfx.log"),
                "port": free_port(),
                "args": {"model": str(model)},
            },
            "speculative": {"algorithm": "suffix"},
            "env": dict(vllm_cli.ENV),
        }
    )
    with pytest.raises(ControlError) as e:
        await ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state")).relaunch(60)
    assert e.value.code == 2 and "needs the arctic_inference module, not installed for" in str(e.value)
    assert not Path(p.server.log).exists()
