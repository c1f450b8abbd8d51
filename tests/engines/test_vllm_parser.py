"""tuitune against the real vLLM release, installed in its own environment by tuitune_support.vllm_cli
(vLLM 0.33.0, CPU platform, no GPU needed): its command line parses what tuitune renders, and its
own statistics code writes the log lines and /metrics pages tuitune reads.

What is real here: vLLM's ``vllm serve`` parser (every flag group, its JSON type for
``--speculative-config``), its ``validate`` step, its ``--help=all`` text, and tuitune's own launch
command run by a shell. What is not: the serve subcommand's last step (starting the engine), which
is replaced by printing the parsed arguments, because serving needs a GPU and the weights. The
tests skip only when the package registry cannot be reached to install vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.machine.control import ServerControl
from tuitune.machine.transport import LocalTransport
from tuitune.measure import promscrape
from tuitune.measure.parse import parse_line
from tuitune_support import vllm_cli
from tuitune_support.ports import free_port

# Everything up to serving is vLLM's own: `vllm` main, the serve subparser, validate(). The serve
# step prints what the parser produced instead of starting an engine.
SHIM = r"""
import json, sys
import vllm.entrypoints.cli.serve as _serve

def _parsed(args):
    out = {k: v for k, v in vars(args).items() if k != "dispatch_function"}
    print("TUITUNE-PARSED " + json.dumps(out, default=repr), flush=True)

_serve.ServeSubcommand.cmd = staticmethod(_parsed)
"""

# several argument lists in one interpreter (importing vLLM takes seconds); errors are captured per list
BATCH = (
    SHIM
    + r"""
import contextlib, io
from vllm.entrypoints.cli.main import main
for argv in json.load(sys.stdin):
    sys.argv = ["vllm", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            main()
    except SystemExit as e:
        print("TUITUNE-EXIT " + json.dumps([e.code, err.getvalue().strip().splitlines()[-1:]]), flush=True)
"""
)


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return vllm_cli.build()
    except vllm_cli.Unreachable as e:
        pytest.skip(f"vLLM cannot be installed: the package registry is unreachable ({e})")


def env() -> dict[str, str]:
    return {**os.environ, **vllm_cli.ENV}


def c4(tmp_path: Path, python: Path, **changes) -> P.Preset:
    """The shipped vLLM twin of seed C4 on this machine: vLLM's python, a local log, a free port."""
    base = P.resolve("vllm-c4-eagle3-2tok-nccl")
    return P.with_changes(
        base,
        {
            "target": "local",
            "server.python": str(python),
            "server.port": free_port(),
            "server.log": str(tmp_path / f"{base.name}.log"),
            **changes,
        },
    )


def parse_all(python: Path, argvs: list[list[str]]) -> list[tuple[str, object]]:
    """("parsed", namespace dict) or ("exit", [code, last stderr line]) for each argument list."""
    r = subprocess.run(
        [str(python), "-c", BATCH], input=json.dumps(argvs), capture_output=True, text=True, env=env(), timeout=300
    )
    out = [
        (line.split(" ", 1)[0].removeprefix("TUITUNE-").lower(), json.loads(line.split(" ", 1)[1]))
        for line in r.stdout.splitlines()
        if line.startswith(("TUITUNE-PARSED ", "TUITUNE-EXIT "))
    ]
    assert len(out) == len(argvs), (r.returncode, r.stdout[-800:], r.stderr[-1500:])
    return out


def test_rendered_commands_pass_vllms_parser(tmp_path, vllm_python):
    shipped = c4(tmp_path, vllm_python)
    variants = [
        shipped,
        # what the config panel's edit and `advise`'s alternatives produce: other chain lengths, EAGLE-1
        P.with_changes(
            shipped,
            {
                "speculative.num_speculative_tokens": 5,
                "speculative.algorithm": "EAGLE",
                "speculative.draft_tensor_parallel_size": 1,
            },
        ),
        P.with_changes(shipped, {"speculative.num_speculative_tokens": 1, "speculative.draft_tensor_parallel_size": 8}),
        # a baseline (no speculation) and the flags operators add most often
        P.with_changes(
            shipped,
            {
                "speculative": None,
                "server.args.served-model-name": "kimi",
                "server.args.max-model-len": 32768,
                "server.args.max-num-seqs": 64,
                "server.args.enforce-eager": True,
                "server.args.trust-remote-code": False,
            },
        ),
    ]
    results = parse_all(
        vllm_python,
        [p.flags() for p in variants]
        + [
            ["serve", "/m", "--no-such-flag"],  # the controls: the parser does refuse what it does not know
            ["serve", "/m", "--speculative-config", "{not json"],
        ],
    )
    for p, (kind, ns) in zip(variants, results, strict=False):
        assert kind == "parsed", (p.flags(), ns)
        assert ns["subparser"] == "serve" and ns["model_tag"] == p.server.args["model"]
        assert ns["port"] == p.server.port and ns["host"] == "0.0.0.0"
        assert ns["tensor_parallel_size"] == 8 and ns["gpu_memory_utilization"] == 0.88
        assert ns["disable_custom_all_reduce"] is True
        assert ns["speculative_config"] == (p.engine.speculative_config(p) if p.is_speculative else None)
        assert ns["trust_remote_code"] is bool(p.server.args.get("trust-remote-code"))
    assert results[1][1]["speculative_config"] == {
        "method": "eagle",
        "model": "/data/eagle3/output_100k_sglang/4",
        "num_speculative_tokens": 5,
        "draft_tensor_parallel_size": 1,
    }
    extra = results[3][1]
    assert (extra["served_model_name"], extra["max_model_len"], extra["max_num_seqs"], extra["enforce_eager"]) == (
        ["kimi"],
        32768,
        64,
        True,
    )
    (k1, (code1, why1)), (k2, (code2, why2)) = results[-2:]
    assert (k1, code1, k2, code2) == ("exit", 2, "exit", 2)
    assert "--no-such-flag" in why1[0] and "--speculative-config" in why2[0], (why1, why2)


async def test_preflight_reads_the_real_help_and_the_launch_line_parses(tmp_path, vllm_python, monkeypatch):
    """The product's own path on a local target whose python has vLLM: preflight (module found,
    `serve --help=all` decides the flags), then the rendered launch line run by the shell."""
    for k, v in vllm_cli.ENV.items():
        monkeypatch.setenv(k, v)
    model, draft = tmp_path / "kimi-k2.5-int4", tmp_path / "eagle3"  # the preflight checks that they exist
    model.mkdir()
    draft.mkdir()
    p = c4(tmp_path, vllm_python, **{"server.args.model": str(model), "speculative.draft_model_path": str(draft)})
    c = ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state"))
    await c.preflight(None)  # raises on any rendered flag vLLM's help does not list
    known = await c.server_flags()
    assert set(p.flag_names()) <= known and {"--speculative-config", "--port", "--host"} <= known
    assert "--speculative-num-steps" not in known  # SGLang's spelling is not vLLM's
    # the launch line as tuitune renders it (env, quoting, redirection), vLLM's parser at the end of it;
    # profile off so that PYTHONPATH carries the serve shim instead of the probe
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(SHIM)
    monkeypatch.setenv("PYTHONPATH", str(shim))
    p = P.with_changes(p, {"profile": False})
    rec = await ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state")).start()
    deadline = time.monotonic() + 120
    while Path(f"/proc/{rec.pid}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    log = Path(p.server.log).read_text()
    lines = [x for x in log.splitlines() if x.startswith("TUITUNE-PARSED ")]
    assert lines, log[-1500:]
    ns = json.loads(lines[-1].split(" ", 1)[1])
    assert ns["model_tag"] == str(model) and ns["port"] == p.server.port
    assert ns["speculative_config"] == {
        "method": "eagle3",
        "model": str(draft),
        "num_speculative_tokens": 2,
    }


# vLLM's own spec-decode statistics: the scheduler's per-step stats, the logger's line (through
# vLLM's logger and format), and the Prometheus counters rendered by prometheus_client as the
# server's /metrics does. Two logging intervals of 4 and 5 drafts of 3 tokens each.
STATS = r"""
import json, types, prometheus_client
from vllm.logger import configure_logging_from_args
from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm, SpecDecodingStats
configure_logging_from_args(types.SimpleNamespace())  # what `vllm serve` does: vLLM's handler and format
log = SpecDecodingLogging()
prom = SpecDecodingProm(types.SimpleNamespace(num_speculative_tokens=3), ["model_name", "engine"],
                        {0: ["kimi", "0"]})
pages = []
for accepted in ([3, 1, 0, 2], [3, 3, 2, 0, 1]):
    stats = SpecDecodingStats.new(3)
    for a in accepted:
        stats.observe_draft(3, a)
    log.observe(stats)
    prom.observe(stats)
    log.log()
    pages.append(prometheus_client.generate_latest().decode())
print("TUITUNE-PAGES " + json.dumps(pages), flush=True)
"""


def test_vllms_own_stat_code_writes_what_tuitune_reads(vllm_python):
    r = subprocess.run(
        [str(vllm_python), "-c", STATS],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env(), "VLLM_LOGGING_LEVEL": "INFO"},
    )
    out = r.stdout + r.stderr
    lines = [x for x in out.splitlines() if "SpecDecoding metrics: " in x]
    assert r.returncode == 0 and len(lines) == 2, out[-2000:]
    first, second = (parse_line(x) for x in lines)
    assert first.kind == second.kind == "vllm_spec", lines
    assert first.ts is not None  # vLLM's own prefix gave the time
    assert (first.mean_accept_len, first.accepted, first.drafted, first.per_position) == (2.5, 6, 12, (0.75, 0.5, 0.25))
    assert (second.mean_accept_len, second.accepted, second.drafted, second.per_position) == (
        2.8,
        9,
        15,
        (0.8, 0.6, 0.4),
    )
    pages = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("TUITUNE-PAGES "))[14:])
    s = promscrape.Scraper()
    assert s.feed(pages[0], 0.0) is None  # the first page is the reference
    w = s.feed(pages[1], 1.0)  # the counters' deltas: the second interval
    assert (w.drafts, w.accepted, w.accept_len) == (5, 9, 2.8) and w.per_position == pytest.approx((0.8, 0.6, 0.4))
