"""tuitune's vLLM knowledge against the vLLM 0.33.0 release's own source (read with ast, nothing
imported here). The wheel is fetched from the package registry; the tests skip only when it is unreachable.
test_vllm_parser.py runs the rendered commands through the release's real command line."""

from __future__ import annotations

import ast
import json
import logging
import zipfile
from pathlib import Path

import pytest
from test_vllm import SPEC_FMT, STATS_FMT, vllm_page

from tuitune import preset as P
from tuitune.engines import vllm as V
from tuitune.measure import promscrape
from tuitune.measure.parse import parse_line
from tuitune.probe import check
from tuitune_support.registry import pip_download

RELEASE = "0.33.0"
FILES = (
    "vllm/logger.py",
    "vllm/v1/spec_decode/metrics.py",
    "vllm/v1/metrics/loggers.py",
    "vllm/engine/arg_utils.py",
    "vllm/entrypoints/common/cli_args.py",
    "vllm/entrypoints/cli/main.py",
    "vllm/entrypoints/cli/serve.py",
    "vllm/config/speculative.py",
    "vllm/v1/core/kv_cache_planning.py",
    "vllm/transformers_utils/config.py",
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/v1/spec_decode/eagle.py",
    "vllm/v1/spec_decode/llm_base_proposer.py",
    "vllm/v1/worker/gpu/model_runner.py",
    "vllm/v1/worker/gpu/spec_decode/eagle/speculator.py",
    "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
    "vllm/v1/spec_decode/ngram_proposer.py",
    "vllm/v1/spec_decode/ngram_proposer_gpu.py",
    "vllm/v1/spec_decode/suffix_decoding.py",
    "vllm/v1/worker/gpu/spec_decode/ngram/speculator.py",
    "vllm/v1/executor/multiproc_executor.py",
    "vllm/v1/engine/exceptions.py",
)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("vllm")
    wheel = pip_download(tmp, f"vllm=={RELEASE}")  # skips only when the registry is unreachable
    with zipfile.ZipFile(wheel) as z:
        z.extractall(
            tmp / "site", [n for n in z.namelist() if n in FILES or n.startswith(f"vllm-{RELEASE}.dist-info/")]
        )
    return tmp / "site"


def strings(path: Path) -> set[str]:
    """Every string constant of a module, f-strings' literal parts included (adjacent literals are
    one constant once parsed)."""
    return {
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def class_fields(path: Path, *names: str) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        a.target.id
        for c in ast.walk(tree)
        if isinstance(c, ast.ClassDef) and c.name in names
        for a in c.body
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)
    }


def test_log_formats_are_the_releases(src):
    v = src / "vllm"
    assert SPEC_FMT in strings(v / "v1/spec_decode/metrics.py")
    logger_parts = strings(v / "v1/metrics/loggers.py")
    for part in STATS_FMT.removeprefix("Engine 000: ").split(", "):
        assert part in logger_parts, part
    assert "Engine {:03d}: " in logger_parts
    # a line written by Python's logging with vLLM's own format and date format parses exactly
    tree = ast.parse((v / "logger.py").read_text())
    consts = {
        t.id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name) and t.id in ("_FORMAT", "_DATE_FORMAT")
    }
    fmt = "".join(x.value for x in consts["_FORMAT"].values if isinstance(x, ast.Constant))  # prefix env unset
    datefmt = consts["_DATE_FORMAT"].value
    rec = logging.LogRecord(
        "vllm.v1.metrics.loggers",
        logging.INFO,
        "loggers.py",
        257,
        SPEC_FMT,
        (2.31, 41.2, 89.1, 412, 891, "0.712, 0.455, 0.301", 46.2),
        None,
    )
    rec.vllm_process_name, rec.fileinfo = "Worker_TP3", "loggers.py"
    line = logging.Formatter(fmt, datefmt).format(rec)
    ev = parse_line(line)
    assert ev.kind == "vllm_spec" and ev.rank == "TP3" and ev.ts and len(ev.ts) == 14
    assert (ev.mean_accept_len, ev.accepted, ev.drafted, ev.per_position) == (2.31, 412, 891, (0.712, 0.455, 0.301))
    src_text = (v / "v1/worker/gpu_model_runner.py").read_text()
    for needle, _phase in V.VLLM.phases[:3]:
        assert needle in src_text, needle


def test_metric_names_and_a_page_built_from_them(src):
    v = src / "vllm"
    spec = strings(v / "v1/spec_decode/metrics.py")
    assert {V.NUM_DRAFTS, V.NUM_DRAFT_TOKENS, V.NUM_ACCEPTED, V.ACCEPTED_PER_POS, "position"} <= spec
    loggers = strings(v / "v1/metrics/loggers.py")
    assert {V.GENERATION_TOKENS, V.RUNNING, V.WAITING, "model_name", "engine"} <= loggers
    s = promscrape.Scraper()
    s.feed(vllm_page(10, 30, 12, [7, 4, 1], 100), 0.0)
    w = s.feed(vllm_page(110, 330, 192, [87, 74, 31], 600), 1.0)
    assert w.per_position == pytest.approx((0.8, 0.7, 0.3)) and w.accept_len == pytest.approx(2.8)


def test_ngram_and_suffix_settings_are_the_releases(src):
    fields = class_fields(src / "vllm/config/speculative.py", "SpeculativeConfig")
    assert {"prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens", "method"} <= fields
    text = (src / "vllm/config/speculative.py").read_text()
    assert '"ngram"' in text and '"suffix"' in text
    for method in ("ngram", "suffix"):
        p = P.from_dict(
            {
                "name": "x",
                "server": {"engine": "vllm", "log": "/l", "args": {"model": "/m"}},
                "speculative": {"algorithm": method, "num_speculative_tokens": 3},
            }
        )
        cfg = json.loads(p.flags()[p.flags().index("--speculative-config") + 1])
        assert set(cfg) <= fields and cfg["method"] == method
    assert f"self.prompt_lookup_min = {V.NGRAM_DEFAULT_LOOKUP}" in text  # the default tuitune's lint names


def test_rendered_commands_use_flags_the_release_has(src):
    """Cheap and early (no install): the flags are among those the parser is built from."""
    v = src / "vllm"
    literal = {x for x in strings(v / "engine/arg_utils.py") if x.startswith("--")}
    frontend = {
        "--" + f.replace("_", "-")
        for f in class_fields(v / "entrypoints/common/cli_args.py", "FrontendArgs", "BaseFrontendArgs")
    }
    known = literal | frontend
    assert {"--port", "--host", "--speculative-config"} <= known
    for name in ("vllm-c4-eagle3-2tok-nccl", "sim-vllm-eagle3"):
        p = P.resolve(name)
        flags = [f for f in p.flag_names() if not f.startswith("--sim-")]
        assert set(flags) <= known, set(flags) - known
        cfg = json.loads(p.flags()[p.flags().index("--speculative-config") + 1])
        assert set(cfg) <= class_fields(v / "config/speculative.py", "SpeculativeConfig")
    assert '"eagle3"' in (v / "config/speculative.py").read_text()
    assert "model_tag" in strings(v / "entrypoints/common/cli_args.py")
    serve = (v / "entrypoints/cli/serve.py").read_text()
    assert 'name = "serve"' in serve and "--help=all" in serve
    assert 'if __name__ == "__main__":' in (v / "entrypoints/cli/main.py").read_text()


def test_failure_texts_are_the_releases(src):
    v = src / "vllm"
    texts = (
        strings(v / "v1/core/kv_cache_planning.py")
        | strings(v / "transformers_utils/config.py")
        | strings(v / "config/speculative.py")
        | strings(v / "v1/executor/multiproc_executor.py")  # a worker process that died
        # the exception the API server logs once its engine core is gone: a class name, not a string
        | {
            n.name
            for n in ast.walk(ast.parse((v / "v1/engine/exceptions.py").read_text()))
            if isinstance(n, ast.ClassDef)
        }
    )
    for needle, _cause in V.ERRORS:
        if "SpeculativeConfig" not in needle:  # pydantic's wording, around vLLM's class name
            assert any(needle in t for t in texts), needle
    assert "class SpeculativeConfig" in (v / "config/speculative.py").read_text()


def test_probe_check_on_the_release(src):
    report = check(str(src / "vllm"), engine="vllm")
    assert report["version"] == RELEASE and report["ok"], report
    assert "vllm.v1.worker.gpu_model_runner" in report["usable"]
    assert report["modules"]["vllm.v1.spec_decode.llm_base_proposer"]["SpecDecodeBaseProposer.propose"]["found"]
    # the look-up drafters the probe times, as this release names them
    for module, method in (
        ("vllm.v1.spec_decode.ngram_proposer", "NgramProposer.propose"),
        ("vllm.v1.spec_decode.ngram_proposer_gpu", "NgramProposerGPU.propose"),
        ("vllm.v1.spec_decode.suffix_decoding", "SuffixDecodingProposer.propose"),
        ("vllm.v1.worker.gpu.spec_decode.ngram.speculator", "NgramGPUSpeculator.propose"),
    ):
        assert report["modules"][module][method] == {"phase": "draft", "found": True}, module
    # and the runner calls them where the probe expects: ngram inside sample_tokens, after bookkeeping
    runner = (src / "vllm/v1/worker/gpu_model_runner.py").read_text()
    assert 'spec_config.method == "ngram"' in runner and "self.drafter.propose(" in runner
