"""nccl-bench: the orchestration on CPU (gloo, world size 2), failures, grids; a GPU run when present."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.experiments import grid as G
from tuitune.experiments import ncclbench as NB
from tuitune.target.transport import LocalTransport

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent


def preset(tmp: Path, **env) -> P.Preset:
    return P.from_dict(
        {
            "name": "nb",
            "target": "local",
            "server": {
                "module": "tuitune.sim",
                "log": str(tmp / "nb.log"),
                "python": sys.executable,
                "args": {"tp-size": 2, "model-path": str(tmp / "model")},
            },
            "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 2, "eagle_topk": 1},
            "env": {"NCCL_PROTO": "LL", **env},
        }
    )


def test_grid_parsing_and_combinations():
    g = G.parse(["env.NCCL_PROTO=LL,Simple,unset", "speculative.num_steps=1,2"])
    assert g == {"env.NCCL_PROTO": ["LL", "Simple", None], "speculative.num_steps": [1, 2]}
    assert len(G.combinations(g)) == 6 and G.label({"env.NCCL_PROTO": None}) == "NCCL_PROTO=unset"
    for bad in ("nope", "x.y=1", "env.A=1,1", "speculative.num_steps="):
        with pytest.raises(G.GridError):
            G.parse([bad])
    with pytest.raises(NB.NcclBenchError, match="'LLL' is not one of"):
        NB.validate_grid(G.parse(["env.NCCL_PROTO=LL,LLL"]))


async def test_hidden_size_from_the_models_config(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 1024}}))
    p = preset(tmp_path)
    assert await NB.model_hidden_size(LocalTransport(), p) == 1024
    assert NB.decode_sizes(p, 1024) == [2048, 6144]  # 1 token, then 3 draft tokens, bf16


async def test_gloo_world_size_2_ranks_and_reports_failures(tmp_path):
    p = preset(tmp_path)
    grid = G.parse(["env.NCCL_PROTO=LL,Simple", "env.GLOO_SOCKET_IFNAME=unset,bogus0"])
    report = await NB.run(
        LocalTransport(), p, grid, sizes=[4096, 16384], backend="gloo", iters=20, warmup=2, world_size=2, timeout_s=120
    )
    rows = {r["label"]: r for r in report["rows"]}
    ok = [r for r in report["rows"] if "results" in r]
    assert len(ok) == 2 and len(report["ranking"]) == 2
    for r in ok:
        assert [x["bytes"] for x in r["results"]] == [4096, 16384]
        assert all(x["median_us"] > 0 and x["p99_us"] >= x["median_us"] and x["iters"] == 20 for x in r["results"])
        assert r["info"]["world_size"] == 2
    assert rows["NCCL_PROTO=LL GLOO_SOCKET_IFNAME=unset"]["current"] is True
    failed = [r for r in report["rows"] if "error" in r]
    assert len(failed) == 2 and all("bogus0" in r["error"] for r in failed)
    table = NB.format_table(report)
    assert "*NCCL_PROTO=LL GLOO_SOCKET_IFNAME=unset" in table and "failed:" in table
    assert "NCCL variables are not exercised" in table and report["graph"] is False  # gloo: no graphs, no NCCL


def test_cli_refuses_a_bad_nccl_value_and_bad_grids(tmp_path):
    path = P.save(preset(tmp_path), tmp_path / "nb.yaml")
    for args, needle in (
        (["--grid", "env.NCCL_PROTO=LLL"], "'LLL' is not one of"),
        (["--grid", "speculative.num_steps=1,2"], "environment variables only"),
        (["--sizes", "abc"], "expected bytes"),
    ):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "tuitune",
                "nccl-bench",
                str(path),
                "--backend",
                "gloo",
                "--hidden-size",
                "64",
                *args,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (CI never has one)")
def test_nccl_world_size_1_on_a_gpu(tmp_path):
    p = preset(tmp_path)
    report = asyncio.run(
        NB.run(
            LocalTransport(),
            p,
            G.parse(["env.NCCL_PROTO=LL,Simple"]),
            hidden_size=7168,
            world_size=1,
            iters=50,
            warmup=5,
            timeout_s=300,
        )
    )
    ok = [r for r in report["rows"] if "results" in r]
    assert len(ok) == 2, report
    assert all(r["info"]["backend"] == "nccl" and r["info"]["device"] for r in ok)
    assert all(0 < x["median_us"] < 10_000 for r in ok for x in r["results"])
    assert "world size 1: PyTorch creates no NCCL communicator" in NB.format_table(report)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_world_size_2_confirms_settings_in_eager_and_graph_mode(tmp_path):
    p = preset(tmp_path)
    for graph in (False, True):
        report = asyncio.run(
            NB.run(
                LocalTransport(),
                p,
                G.parse(["env.NCCL_PROTO=LL,Simple"]),
                hidden_size=7168,
                world_size=2,
                iters=50,
                warmup=5,
                graph=graph,
                timeout_s=120,
            )
        )
        ok = [r for r in report["rows"] if "results" in r]
        assert len(ok) == 2, report
        for r in ok:
            assert r["confirmed"] == {"NCCL_PROTO": "applied"}  # NCCL echoed what it was given
            proto = r["changes"]["env.NCCL_PROTO"].upper()
            assert r["algos"] and all(v.endswith("/" + proto) for v in r["algos"].values())
