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
from tuitune.experiments.options import NcclBenchOptions
from tuitune.machine.transport import LocalTransport
from tuitune_support.paths import ROOT

torch = pytest.importorskip("torch")


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
    specs = ["env.NCCL_PROTO=LL,Simple", "env.GLOO_SOCKET_IFNAME=unset,bogus0"]
    o = NcclBenchOptions(
        preset=p.name, grid=specs, sizes="4096,16384", backend="gloo", iters=20, warmup=2, world_size=2, timeout=120
    )
    report = await NB.run(LocalTransport(), p, o)
    rows = {r.label: r for r in report.rows}
    ok = [r for r in report.rows if r.results is not None]
    assert len(ok) == 2 and len(report.ranking) == 2
    for r in ok:
        assert [x["bytes"] for x in r.results] == [4096, 16384]
        assert all(x["median_us"] > 0 and x["p99_us"] >= x["median_us"] and x["iters"] == 20 for x in r.results)
        assert r.info["world_size"] == 2
    assert rows["NCCL_PROTO=LL GLOO_SOCKET_IFNAME=unset"].current is True
    failed = [r for r in report.rows if r.error is not None]
    assert len(failed) == 2 and all("bogus0" in r.error for r in failed)
    table = NB.format_table(report)
    assert "*NCCL_PROTO=LL GLOO_SOCKET_IFNAME=unset" in table and "failed:" in table
    assert "NCCL variables are not exercised" in table and report.graph is False  # gloo: no graphs, no NCCL


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


def on_gpus(p, **kw) -> NcclBenchOptions:
    """The GPU tests' nccl-bench: NCCL_PROTO LL against Simple at a 7168-wide model's sizes, 50 iterations."""
    return NcclBenchOptions(
        preset=p.name, grid=["env.NCCL_PROTO=LL,Simple"], hidden_size=7168, iters=50, warmup=5, **kw
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (CI never has one)")
def test_nccl_world_size_1_on_a_gpu(tmp_path):
    p = preset(tmp_path)
    report = asyncio.run(NB.run(LocalTransport(), p, on_gpus(p, world_size=1, timeout=300)))
    ok = [r for r in report.rows if r.results is not None]
    assert len(ok) == 2, report
    assert all(r.info["backend"] == "nccl" and r.info["device"] for r in ok)
    assert all(0 < x["median_us"] < 10_000 for r in ok for x in r.results)
    assert "world size 1: PyTorch creates no NCCL communicator" in NB.format_table(report)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_world_size_2_confirms_settings_in_eager_and_graph_mode(tmp_path):
    p = preset(tmp_path)
    for graph in (False, True):
        report = asyncio.run(NB.run(LocalTransport(), p, on_gpus(p, world_size=2, graph=graph, timeout=120)))
        ok = [r for r in report.rows if r.results is not None]
        assert len(ok) == 2, report
        for r in ok:
            assert r.confirmed == {"NCCL_PROTO": "applied"}  # NCCL echoed what it was given
            proto = r.changes["env.NCCL_PROTO"].upper()
            assert r.algos and all(v.endswith("/" + proto) for v in r.algos.values())


# ---- from all-reduce latencies to the decode step (issue 27) ---------------------------------------


def test_step_prediction_arithmetic():
    from tuitune.decide import ncclstep as NS

    shape = NS.LLAMA_8B
    assert shape.count() == 65 and shape.message_bytes(1) == 8192  # 2 a layer × 32 + the embedding's
    assert shape.allreduces(NS.step_tokens(4, 3)) == [(65, 12 * 4096 * 2)]  # 4 requests verifying 3 tokens
    pts = [(8192, 10.0), (16384, 12.0), (65536, 30.0)]
    assert NS.latency_us(pts, 8192) == 10.0 and NS.latency_us(pts, 8300) == 10.0  # within 2 %: the same size
    assert NS.latency_us(pts, 12288) == pytest.approx(11.0) and NS.latency_us(pts, 40960) == pytest.approx(21.0)
    assert NS.latency_us(pts, 4096) is None and NS.latency_us(pts, 131072) is None and NS.latency_us([], 1) is None
    assert NS.step_comm_us(pts, shape, 1) == pytest.approx(650.0)
    slow = [(8192, 22.0), (16384, 23.0)]
    preds = NS.predict({"LL": pts, "Simple": slow, "unmeasured": [(1, 1.0)]}, shape, 2, reference="Simple")
    assert [p.label for p in preds] == ["LL", "Simple", "unmeasured"]  # fastest first, no prediction last
    assert preds[0].comm_us == pytest.approx(65 * 12.0) and preds[0].saving_us == pytest.approx(65 * 11.0)
    assert preds[1].saving_us == 0.0 and preds[2].comm_us is None and preds[2].saving_us is None
    assert NS.predicted_gain(650.0, 3.25) == pytest.approx(0.25) and NS.predicted_gain(5000.0, 3.0) is None
    assert NS.points_of([{"bytes": 8192, "median_us": 10.5, "p99_us": 11}]) == [(8192, 10.5)]
    assert "65 all-reduces" in NS.basis(shape, 1, 2) and "8,192 B" in NS.basis(shape, 1, 2)


@pytest.mark.timeout(300)  # four worker runs (each starts torch thrice) on a shared CPU
def test_tune_nccl_screen_ranks_at_the_step_size_and_predicts_the_step_saving(tmp_path):
    """tune --nccl's screen (gloo: CPU, two ranks) measures the all-reduce of a decode step at the
    tune's concurrency and turns the winner's latency into a step saving with the model's layers.
    Its 2 x 2 grid has a known order: TORCH_DISTRIBUTED_DEBUG=DETAIL (a check of its own
    collectives around every all-reduce) ranks both of its rows last; gloo ignores NCCL_PROTO."""
    from types import SimpleNamespace

    from tuitune.experiments import tunenccl as T

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 3}))
    p = preset(tmp_path)  # NCCL_PROTO=LL now; EAGLE-3 2 steps: 3 tokens verified a request
    grid = ["env.NCCL_PROTO=LL,Simple", "env.TORCH_DISTRIBUTED_DEBUG=unset,DETAIL"]
    changes, report, pred = asyncio.run(
        T.nccl_screen(SimpleNamespace(transport=LocalTransport()), p, grid, "gloo", None, None, 4)
    )
    step = 4 * 3 * 64 * 2  # four requests × three tokens × hidden 64 × bf16
    assert report.sizes == [128, 384, step] and report.decode_bytes == step
    assert pred["tokens"] == 12 and pred["bytes"] == step and pred["allreduces"] == 7  # 2 × 3 layers + 1
    current = "NCCL_PROTO=LL TORCH_DISTRIBUTED_DEBUG=unset"
    assert pred["reference"] == current and pred["winner"] == report.ranking[0]
    rows = {r.label: r for r in report.rows}
    lat = {k: NB._at(r, step)["median_us"] for k, r in rows.items()}
    assert pred["allreduce_us"] == lat and report.ranking == sorted(lat, key=lat.get)  # ranked at the step
    assert {x.split()[1] for x in report.ranking[2:]} == {"TORCH_DISTRIBUTED_DEBUG=DETAIL"}, lat
    assert pred["step_saving_us"] == pytest.approx(7 * (lat[current] - lat[pred["winner"]]))
    assert changes == (
        {} if pred["winner"] == current else {"env.NCCL_PROTO": "Simple", "env.TORCH_DISTRIBUTED_DEBUG": None}
    )
    assert "7 all-reduces" in pred["basis"] and "draft model" in pred["basis"]
    # without the layer count: the saving per all-reduce only, and why
    (tmp_path / "model" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    bare = T.nccl_prediction(report, p, 64, None, 4)
    assert "step_saving_us" not in bare and "layer count is unknown" in bare["note"]
    assert bare["saving_per_allreduce_us"] == pytest.approx(lat[current] - lat[pred["winner"]])


@pytest.mark.timeout(600)  # eight sets of fresh processes (each imports torch) on a shared CPU
def test_decode_step_benchmark_on_gloo_runs_each_setting_and_checks_the_count(tmp_path):
    """benchmarks/nccl_decode_step.py's orchestration on CPUs (world size 2): every setting gets
    nccl-bench's worker and the step in fresh processes, twice (interleaved); the step makes
    exactly the all-reduces the prediction counts; savings are against the first setting; a
    failing setting is one line."""
    from tuitune.decide import ncclstep as NS

    out = tmp_path / "ds.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "nccl_decode_step.py"),
            "--backend",
            "gloo",
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--kv-heads",
            "2",
            "--head-dim",
            "16",
            "--intermediate",
            "128",
            "--vocab",
            "256",
            "--context",
            "16",
            "--batches",
            "1,3",
            "--tokens-per-req",
            "2",
            "--iters",
            "6",
            "--blocks",
            "2",
            "--warmup",
            "1",
            "--bench-iters",
            "10",
            "--repeats",
            "2",
            "--setting",
            "defaults",
            "--setting",
            "NCCL_PROTO=LL",
            "--setting",
            "GLOO_SOCKET_IFNAME=bogus0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    rows = {x["label"]: x for x in data["rows"]}
    assert list(rows) == ["defaults", "NCCL_PROTO=LL", "GLOO_SOCKET_IFNAME=bogus0"]
    assert "bogus0" in rows["GLOO_SOCKET_IFNAME=bogus0"]["error"] and "failed:" in r.stdout
    assert r.stdout.count("running NCCL_PROTO=LL (") == 2
    shape = NS.TPShape(layers=2, hidden=64, dtype_bytes=4)  # gloo: float32
    an = data["analysis"]
    assert an["reference"] == "defaults"
    for b in (1, 3):
        tokens = 2 * b
        for label in ("defaults", "NCCL_PROTO=LL"):
            m = rows[label]["step"]["batches"][str(b)]
            assert m["allreduces"] == [[5, tokens * 64 * 4]] == [list(x) for x in shape.allreduces(tokens)]
            assert m["replays"] == 12 and m["step_us"] > 0 and m["compute_us"] > 0 and len(m["run_us"]) == 2
            assert m["noise_us"] >= max(m["run_us"]) - min(m["run_us"])  # two fresh runs: their spread counts
        res = {x["label"]: x for x in an["batches"][str(b)]["rows"]}
        lat = {k: NS.latency_us(NS.points_of(rows[k]["nccl_bench"]), tokens * 256) for k in res}
        for label, x in res.items():
            assert x["allreduces_match"] and x["predicted_comm_us"] == pytest.approx(5 * lat[label])
            assert x["predicted_saving_us"] == pytest.approx(5 * (lat["defaults"] - lat[label]))
            assert x["measured_saving_us"] == pytest.approx(res["defaults"]["step_us"] - x["step_us"])
    assert "backend gloo: NCCL is not used" in r.stdout and "ranking:" in r.stdout


def test_decode_step_benchmark_refuses_nvlink_multicast():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "nccl_decode_step.py"), "--setting", "NCCL_NVLS_ENABLE=1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "NVLink multicast stays off" in r.stderr and "Traceback" not in r.stderr


def test_tune_result_shows_the_nccl_prediction_beside_the_measured_gain():
    from tuitune.experiments import tunereport as T
    from tuitune.experiments.tunenccl import nccl_summary
    from tuitune_support.results import tune_summary

    decided = {"predicted_gain": 0.136, "measured_gain": 0.121, "cycle_ms": 5.4}
    pred = {"winner": "NCCL_PROTO=LL", "reference": "NCCL_PROTO=Simple", "step_saving_us": 739.6, "basis": "65 x"}
    fields = {
        "concurrency": 2,
        "relaunches": 1,
        "verdict": {"verdict": "start is already best", "reason": "r"},
        "nccl_prediction": nccl_summary({"prediction": pred}, decided),
    }
    text = T.format_result(tune_summary(**fields))
    assert "NCCL: nccl-bench's winner NCCL_PROTO=LL predicted to save 739.6 µs a decode step" in text
    assert "(measured +12.1%, predicted +13.6%)" in text
    assert "the prediction rests on: 65 x" in text
    note = T.format_result(tune_summary(**{**fields, "nccl_prediction": {"winner": "A", "note": "why not"}}))
    assert "no step prediction (why not)" in note
