"""vLLM as a second engine: presets, rendering, log lines, /metrics, and the whole loop on the
simulator's vLLM dialect (launch, relaunch, bench, stop of a process tree).

The log format strings and metric names below are vLLM 0.33.0's; test_vllm_release.py checks
them against the release's own source."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
import subprocess
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from tuitune import preset as P
from tuitune.engines import vllm as V
from tuitune.machine.control import ServerControl
from tuitune.machine.errors import ControlError
from tuitune.machine.transport import LocalTransport
from tuitune.measure import promscrape
from tuitune.measure.parse import parse_line
from tuitune_support.ports import free_port
from tuitune_support.presets import sim_vllm
from tuitune_support.procs import group_alive, tuitune_cli

JSON = {"Content-Type": "application/json"}

PREFIX = "(APIServer pid=4242) INFO 11-30 09:41:07 [loggers.py:257] "
# vllm/v1/spec_decode/metrics.py (SpecDecodingLogging.log) and vllm/v1/metrics/loggers.py
SPEC_FMT = (
    "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
    "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
    "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%"
)
STATS_FMT = (
    "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, Preemptions: %d, %s KV cache usage: %.1f%%, "
    "Prefix cache hit rate: %.1f%%"
)

VLLM_MIN = {"name": "v", "server": {"engine": "vllm", "log": "/tmp/v.log", "args": {"model": "/m"}}}


def vllm_preset(**spec) -> P.Preset:
    data = json.loads(json.dumps(VLLM_MIN))
    if spec:
        data["speculative"] = {"algorithm": "EAGLE3", "draft_model_path": "/d", **spec}
    return P.from_dict(data)


# ---- presets --------------------------------------------------------------------------------------


def test_vllm_preset_renders_serve_and_speculative_config():
    p = P.resolve("vllm-c4-eagle3-2tok-nccl")
    assert p.server.module == "vllm.entrypoints.cli.main" and p.bench.api == "openai"
    line = P.launch_command(p).splitlines()[1]
    words = shlex.split(line.replace('"$HOME"', "~"))
    argv = words[words.index("vllm.entrypoints.cli.main") + 1 : words.index("2>&1") if "2>&1" in words else None]
    assert argv[:2] == ["serve", "/shared/kimi-k2.5-int4"]
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {"method": "eagle3", "model": "/data/eagle3/output_100k_sglang/4", "num_speculative_tokens": 2}
    assert argv[argv.index("--port") + 1] == "8104" and "--tensor-parallel-size" in argv
    # the same chain as SGLang's 2 steps, topk 1, 3 draft tokens: the rest of tuitune sees that
    r = p.speculative.resolved()
    assert (r.num_steps, r.eagle_topk, r.num_draft_tokens) == (2, 1, 3)
    assert P.flatten(p)["speculative.num_speculative_tokens"] == 2 and "speculative.num_steps" not in P.flatten(p)
    # minimal save: the engine's defaults (module, port 8000, the OpenAI API) are left out
    q = P.from_dict({**VLLM_MIN, "server": {**VLLM_MIN["server"], "port": 8000}})
    assert P.to_dict(q)["server"] == {"engine": "vllm", "log": "/tmp/v.log", "args": {"model": "/m"}}
    assert "bench" not in P.to_dict(q) and P.loads(P.dumps(q)).hash() == q.hash()
    assert q.server.port == 8000 and q.flags()[:2] == ["serve", "/m"]


@pytest.mark.parametrize(
    "spec, server, message",
    [
        ({"num_speculative_tokens": 2, "eagle_topk": 1}, {}, "speculative.eagle_topk: vLLM's EAGLE drafts a chain"),
        (
            {"num_speculative_tokens": 2, "num_steps": 2},
            {},
            "speculative.num_steps is SGLang's; vLLM spells it num_speculative_tokens",
        ),
        ({}, {}, "speculative.num_speculative_tokens is required on vLLM"),
        (
            {"num_speculative_tokens": 2, "algorithm": "STANDALONE"},
            {},
            "speculative.algorithm: STANDALONE is not driven",
        ),
        (
            {"num_speculative_tokens": 2, "draft_tensor_parallel_size": 4},
            {"tensor-parallel-size": 8},
            "speculative.draft_tensor_parallel_size: vLLM allows 1 or the target's tensor parallel size (8), not 4",
        ),
        (
            {"num_speculative_tokens": 2},
            {"speculative-config": "{}"},
            "flag 'speculative-config' is set by speculative",
        ),
        ({"num_speculative_tokens": 2}, {"model": None}, "server.args.model: vLLM needs the model to serve"),
    ],
)
def test_vllm_validation_is_one_sentence_per_engine(spec, server, message):
    data = json.loads(json.dumps(VLLM_MIN))
    data["server"]["args"].update(server)
    data["server"]["args"] = {k: v for k, v in data["server"]["args"].items() if v is not None}
    data["speculative"] = {"algorithm": "EAGLE3", "draft_model_path": "/d", **spec}
    with pytest.raises(P.PresetError) as e:
        P.from_dict(data, "v.yaml")
    assert str(e.value).startswith("v.yaml: ") and message in str(e.value)


def test_engine_specific_keys_and_apis_are_refused_on_the_other_engine():
    with pytest.raises(
        P.PresetError, match="num_speculative_tokens is a vLLM setting .*SGLang spells it speculative.num_steps"
    ):
        P.loads(
            "name: x\nserver:\n  log: /l\nspeculative:\n  algorithm: EAGLE3\n  draft_model_path: /d\n"
            "  num_speculative_tokens: 2\n"
        )
    with pytest.raises(P.PresetError, match="bench.api: vLLM serves only the OpenAI API"):
        P.from_dict({**VLLM_MIN, "bench": {"api": "native"}})
    with pytest.raises(P.PresetError, match="server.engine"):
        P.from_dict({**VLLM_MIN, "server": {**VLLM_MIN["server"], "engine": "trt"}})
    p = vllm_preset(algorithm="eagle", num_speculative_tokens=4)  # vLLM's own spelling reads too
    assert json.loads(p.flags()[p.flags().index("--speculative-config") + 1])["method"] == "eagle"
    assert "server.args.model-path is SGLang's flag; vLLM spells it model" in P.lint(
        P.from_dict({**VLLM_MIN, "server": {**VLLM_MIN["server"], "args": {"model": "/m", "model-path": "/m"}}})
    )
    schema = P.json_schema()
    assert "num_speculative_tokens" in json.dumps(schema) and '"vllm"' in json.dumps(schema)


def test_diff_across_engines_and_sim_dialect_flags():
    d = {k: (a, b) for k, a, b in P.diff(P.resolve("c4-eagle3-2step-nccl"), P.resolve("vllm-c4-eagle3-2tok-nccl"))}
    assert d["server.engine"] == ("sglang", "vllm") and d["speculative.num_speculative_tokens"] == (None, 2)
    assert d["speculative.num_steps"] == (2, None) and d["bench.api"] == ("native", "openai")
    sim = P.resolve("sim-vllm-eagle3")
    assert sim.flags()[:4] == ["--sim-engine", "vllm", "serve", "/shared/kimi-k2.5-int4"]
    from tuitune.sim.vllm import build_parser

    ns = build_parser().parse_args(sim.flags())  # the dialect's parser takes what tuitune renders
    assert ns.speculative_config["num_speculative_tokens"] == 2 and ns.tensor_parallel_size == 8


# ---- log lines ------------------------------------------------------------------------------------


def test_vllm_log_lines_parse_exactly():
    spec = parse_line(PREFIX + SPEC_FMT % (2.31, 41.2, 89.1, 412, 891, "0.712, 0.455, 0.301", 46.2))
    assert spec.kind == "vllm_spec" and spec.ts == "11-30 09:41:07" and spec.rank is None
    assert (spec.mean_accept_len, spec.accepted_tok_s, spec.drafted_tok_s) == (2.31, 41.2, 89.1)
    assert (spec.accepted, spec.drafted, spec.per_position) == (412, 891, (0.712, 0.455, 0.301))
    assert spec.draft_acceptance_rate == pytest.approx(0.462)
    one = parse_line(PREFIX + SPEC_FMT % (1.5, 1, 2, 1, 2, "0.500", 50.0))
    assert one.per_position == (0.5,)
    stats = parse_line(PREFIX + STATS_FMT % (12.5, 812.4, 8, 2, 1, "GPU", 3.4, 0.0))
    assert stats.kind == "decode" and stats.gen_throughput == 812.4 and (stats.running_req, stats.queue_req) == (8, 2)
    assert stats.token_usage == pytest.approx(0.034) and stats.accept_len is None
    assert stats.extra == {"avg_prompt_throughput": 12.5, "preemptions": 1.0, "prefix_cache_hit_rate": 0.0}
    fetch = parse_line(
        PREFIX + "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
        "5.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, KV fetch: 1 waiting to start, 0 in progress, "
        "0 completed waiting, GPU KV cache usage: 1.0%"
    )
    assert (
        fetch.gen_throughput == 5.0
        and fetch.extra["kv_fetch"] == "1 waiting to start, 0 in progress, 0 completed waiting"
    )
    worker = parse_line(
        "(Worker_TP1 pid=77) INFO 11-30 09:41:07 [gpu_model_runner.py:1] EAGLE3_PROFILE v=1 "
        "draft_ms=0.4 verify_ms=20.1 extend_ms=0 accept_len=1.9"
    )
    assert worker.kind == "profile" and worker.rank == "TP1" and worker.ts == "11-30 09:41:07"
    old = parse_line(
        "INFO 05-06 12:00:00 metrics.py:345] Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 41.2 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs"
    )
    assert old.gen_throughput == 41.2 and old.ts == "05-06 12:00:00"
    bad = parse_line(PREFIX + "SpecDecoding metrics: Accepted: many tokens")
    assert bad.kind == "malformed" and "not a number" in bad.reason


def test_vllm_failures_are_classified():
    cases = {
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.": "oom",
        "ValueError: To serve at least one request with the model's max seq len (262144), (32.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (9.1 GiB).": "oom",
        "OSError: Invalid repository ID or local directory specified: '/nope'.": "model_not_found",
        "OSError: /nope is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'": "model_not_found",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig": "bad_argument",
        "vllm serve: error: unrecognized arguments: --speculative-num-steps 2": "bad_argument",
        "(APIServer pid=1) ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
        "address already in use": "port_in_use",
    }
    for line, cause in cases.items():
        ev = parse_line(line)
        assert ev is not None and ev.kind == "error" and ev.category == cause, line


# ---- /metrics -------------------------------------------------------------------------------------


def vllm_page(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], gen: int) -> str:
    """A /metrics page as vLLM writes it: prometheus_client counters with vLLM's names and labels."""
    import prometheus_client as pc

    reg = pc.CollectorRegistry()
    lv = ["/m", "0"]
    for name, value in (
        (V.NUM_DRAFTS, drafts),
        (V.NUM_DRAFT_TOKENS, draft_tokens),
        (V.NUM_ACCEPTED, accepted),
        (V.GENERATION_TOKENS, gen),
    ):
        pc.Counter(name, "doc", ["model_name", "engine"], registry=reg).labels(*lv).inc(value)
    c = pc.Counter(V.ACCEPTED_PER_POS, "doc", ["model_name", "engine", "position"], registry=reg)
    for i, v in enumerate(per_pos):
        c.labels(*lv, str(i)).inc(v)
    pc.Gauge(V.RUNNING, "doc", ["model_name", "engine"], registry=reg).labels(*lv).set(3)
    return pc.generate_latest(reg).decode()


def test_metrics_counter_deltas_become_windows():
    s = promscrape.Scraper()
    assert s.feed(vllm_page(100, 300, 150, [80, 50, 20], 1000), t=10.0) is None
    w = s.feed(vllm_page(300, 900, 390, [200, 130, 60], 2000), t=12.0)
    assert w.engine == "vllm" and w.seconds == 2.0 and (w.drafts, w.draft_tokens, w.accepted) == (200, 600, 240)
    assert w.accept_len == pytest.approx(2.2) and w.accept_rate == pytest.approx(0.4)
    assert w.per_position == pytest.approx((0.6, 0.4, 0.2)) and w.gen_tok_s == 500.0 and w.running_req == 3
    assert s.feed(vllm_page(5, 15, 7, [4, 2, 1], 10), t=13.0) is None  # counters went back: a restart
    idle = s.feed(vllm_page(5, 15, 7, [4, 2, 1], 10), t=14.0)
    assert idle.drafts is None and idle.per_position is None and idle.gen_tok_s == 0.0
    sglang = promscrape.Scraper()
    page = (
        '# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name="m"} 2.5\n'
        '# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput{model_name="m"} 90.0\n'
    )
    sglang.feed(page, 0.0)
    w = sglang.feed(page, 1.0)
    assert (w.engine, w.accept_len, w.gen_tok_s) == ("sglang", 2.5, 90.0)
    with pytest.raises(promscrape.MetricsError, match="not Prometheus text"):
        promscrape.parse(f"{V.NUM_DRAFTS}_total{{ 1 2 3\n")
    html = promscrape.Scraper()  # a page without any of these metrics (a proxy's error page) says nothing
    assert html.feed("<html>502</html>", 0.0) is None and html.feed("<html>502</html>", 1.0) is None


# ---- the whole loop on the simulator's vLLM dialect ---------------------------------------------


async def test_launch_bench_relaunch_and_stop_on_vllm(tmp_path):
    from tuitune.measure.bench import run_bench
    from tuitune.measure.benchconfig import BenchConfig

    t = LocalTransport()
    p = sim_vllm(tmp_path)
    c = ServerControl(t, p, state_dir=str(tmp_path / "state"))
    phases: list[str] = []
    rec, res = await c.relaunch(30, on_phase=lambda ph, el: phases.append(ph))
    assert res.ok and {"loading weights", "loading draft model", "capturing graphs"} <= set(phases)
    assert phases[-1] == "ready" and res.ready_line_at is None  # ready from /health alone
    st = await c.status()
    assert st.running and st.drift == [] and st.same_hash
    smi = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuitune.sim.nvidia_smi",
            "--sim-port",
            str(p.server.port),
            "--query-gpu=index,memory.used",
            "--format=csv,noheader,nounits",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    used = [float(x.split(",")[1]) for x in smi.stdout.splitlines()]
    assert used[0] > 10_000 and used[1] > 10_000 and used[2] < 10_000, smi.stdout  # TP 2 holds memory
    url = t.url(await t.forward_port(p.server.port))
    run = await run_bench(BenchConfig.for_preset(url, p))
    assert run.failed == 0 and run.config.model == "/shared/m" and all(r.completion_tokens == 60 for r in run.ok)
    text = Path(p.server.log).read_text()
    events = [parse_line(x) for x in text.splitlines()]
    spec = [e for e in events if e is not None and e.kind == "vllm_spec"]
    assert spec and all(len(e.per_position) == 2 for e in spec)
    assert any(e is not None and e.kind == "profile" and e.steps == 2 for e in events)
    # relaunch with a changed num_speculative_tokens: a new server, the new chain in its lines
    p3 = P.with_changes(p, {"speculative.num_speculative_tokens": 3})
    c3 = ServerControl(t, p3, state_dir=str(tmp_path / "state"))
    children = [
        int(x) for x in subprocess.run(["pgrep", "-P", str(rec.pid)], capture_output=True, text=True).stdout.split()
    ]
    assert children and all(os.getpgid(x) != rec.pid for x in children)  # the engine core left the group
    rec3, _ = await c3.relaunch(30)
    assert rec3.pid != rec.pid and not group_alive(rec.pid)
    assert all(not Path(f"/proc/{x}").exists() for x in children)  # the whole tree was stopped
    run = await run_bench(BenchConfig.for_preset(url, p3, {"max_tokens": 200}))
    assert run.failed == 0
    await asyncio.sleep(0.3)
    spec3 = [parse_line(x) for x in Path(p3.server.log).read_text().splitlines() if "SpecDecoding" in x]
    assert spec3 and len(spec3[-1].per_position) == 3
    st = await c3.status()
    assert st.same_hash and st.drift == []
    stale = await ServerControl(t, p, state_dir=str(tmp_path / "state")).status()
    assert any(d.key == "flag --speculative-config" for d in stale.drift)  # the old preset sees the change
    other = await ServerControl(
        t, P.with_changes(p3, {"server.args.model": "/shared/other"}), state_dir=str(tmp_path / "state")
    ).status()
    assert [(d.running, d.preset) for d in other.drift if d.key == "arguments"] == [
        ("serve /shared/m", "serve /shared/other")
    ]  # vLLM's model is positional
    await c3.stop()
    assert not await c3.port_busy()


async def test_vllm_start_failures_name_their_cause(tmp_path):
    t = LocalTransport()
    for preset, cause in ((sim_vllm(tmp_path, "oom", **{"gpu-memory-utilization": 0.1}), "out of memory"),):
        c = ServerControl(t, preset, state_dir=str(tmp_path / "state"))
        with pytest.raises(ControlError, match=f"server exited during start \\({cause}\\)"):
            await c.relaunch(30)
    bad = P.from_dict({**sim_vllm(tmp_path, "bad").model_dump(), "name": "bad"})
    bad = P.with_changes(bad, {"server.args.speculative-num-steps": 2})
    with pytest.raises(ControlError, match="flag --speculative-num-steps is not accepted"):
        await ServerControl(t, bad, state_dir=str(tmp_path / "state")).relaunch(30)


def cli(*args, timeout=240, env=None):
    return tuitune_cli(*args, env=env, timeout=timeout)


async def test_cli_commands_on_a_vllm_preset(tmp_path):
    port = free_port()
    p = sim_vllm(tmp_path, "cli-v", port=port)
    path = P.save(p, tmp_path / "v.yaml")
    home = {"HOME": str(tmp_path)}
    assert cli("preset", "validate", str(path)).returncode == 0
    assert "serve /shared/m" in cli("preset", "show", "--command", str(path)).stdout
    r = cli("launch", str(path), env=home)
    assert r.returncode == 0, r.stderr
    r = cli("status", str(path), "--json", env=home)
    assert json.loads(r.stdout)["running"] is True, r.stdout
    r = cli("bench", str(path), "--json", str(tmp_path / "b.json"), env=home)
    assert r.returncode == 0 and "3/3 ok" in r.stdout, r.stdout + r.stderr
    cap = tmp_path / "cap.jsonl"
    r = cli("--record", str(cap), str(path), "--load", "--duration", "7", env=home)  # 3 scrapes, 2 s apart
    assert r.returncode == 0, r.stderr
    from tuitune.measure.capture import read_capture

    kinds = {rec.event.kind for rec in read_capture(cap).records}
    assert {"vllm_spec", "decode", "profile", "metrics"} <= kinds, kinds
    windows = [rec.event for rec in read_capture(cap).records if rec.event.kind == "metrics"]
    assert any(w.per_position and len(w.per_position) == 2 for w in windows)
    r = cli("report", str(cap), "--json")
    rep = json.loads(r.stdout)[0]
    assert rep["stats"]["accept_len"]["mean"] > 1 and rep["stats"]["gen_throughput"]["n"] >= 1, rep
    r = cli("logs", str(path), "-n", "400", env=home)
    assert r.returncode == 0 and "SpecDecoding metrics: Mean acceptance length" in r.stdout
    r = cli("parse", p.server.log, "--json")
    kinds = [json.loads(x)["kind"] for x in r.stdout.splitlines()]
    assert r.returncode == 0 and "vllm_spec" in kinds and "decode" in kinds and "error" not in kinds
    r = cli("stop", str(path), env=home)
    assert r.returncode == 0 and "stopped" in r.stdout
    # the capture replays in the TUI: engine in the header, the per-position row in the cycle panel
    from tuitune.measure.capture import Replay
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.settings import UserConfig
    from tuitune_support.pilot import until
    from tuitune_support.scenes import SIZE

    replay = Replay(read_capture(cap), speed=50.0)
    app = TuituneApp(replay, user_config=UserConfig())
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: replay.position == len(replay.capture.records), 30, "the replay to finish")
        await pilot.pause(0.3)
        assert "· vLLM" in str(app.header.render())
        assert "accept by position  1" in str(app.cycle.query_one("#bars").render())


def test_ab_and_sweep_on_vllm_presets(tmp_path):
    port = free_port()
    one = P.save(
        P.with_changes(sim_vllm(tmp_path, "one", tokens=1, port=port), {"profile": False}), tmp_path / "1.yaml"
    )
    two = P.save(
        P.with_changes(sim_vllm(tmp_path, "two", tokens=2, port=port), {"profile": False}), tmp_path / "2.yaml"
    )
    home = {"HOME": str(tmp_path)}
    r = cli("ab", str(one), str(two), "--rounds", "2", "--no-verdict", "--json", str(tmp_path / "ab.json"), env=home)
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "ab.json").read_text())
    assert [x["preset"] for x in result["launches"]] == ["one", "two", "one", "two"]
    assert all(x["failed"] == 0 for x in result["launches"]) and "verdict:" in r.stdout
    # across engines on one box: refused while the two sides are measured through different APIs
    sglang = P.with_changes(
        P.resolve("sim-c4-eagle3-2step-nccl"),
        {
            "server.log": str(tmp_path / "s.log"),
            "server.port": port,
            "profile": False,
            "server.args.sim-speedup": 10,
            "server.args.sim-load-seconds": 0.3,
            "bench.requests": 3,
            "bench.warmup": 0,
            "bench.max_tokens": 60,
        },
    )
    native = P.save(sglang, tmp_path / "s.yaml")
    r = cli("ab", str(native), str(two), "--rounds", "1", "--no-verdict", env=home)
    assert r.returncode == 2 and "not comparable; set bench.api: openai in both" in r.stderr
    openai = P.save(P.with_changes(sglang, {"bench.api": "openai"}), tmp_path / "s.yaml")
    r = cli("ab", str(openai), str(two), "--rounds", "1", "--no-verdict", "--json", str(tmp_path / "x.json"), env=home)
    assert r.returncode == 0, r.stderr
    assert [x["failed"] for x in json.loads((tmp_path / "x.json").read_text())["launches"]] == [0, 0]
    out = tmp_path / "sweep"
    r = cli(
        "sweep", str(two), "--grid", "speculative.num_speculative_tokens=1,3", "--out", str(out), "--no-plot", env=home
    )
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    tokens = {x["changes"].get("speculative.num_speculative_tokens") for x in rows if x.get("changes")}
    assert tokens == {1, 3} and all(math.isfinite(x["tok_s"]) for x in rows if x.get("tok_s") is not None)
    best = out / "best.yaml"  # written only for a configuration significantly faster than the baseline
    assert (best.exists() and P.load(best).server.engine == "vllm") or "baseline stays best" in r.stdout, r.stdout


# ---- advise and tune: vLLM's space is chains ------------------------------------------------------


def test_vllm_configurations_are_chains_in_its_own_words():
    from tuitune.decide import advise as A
    from tuitune.decide.launch import OFF, Config
    from tuitune.experiments.tuneloop import config_of, preset_for

    p = vllm_preset(num_speculative_tokens=2)
    eng = p.engine
    assert A.space(topks=eng.topks) == [OFF] + [Config.chain(n) for n in range(1, A.MAX_STEPS + 1)]
    assert config_of(p) == Config.chain(2) and eng.config_label(Config.chain(2)) == "2 spec tokens (verify 3)"
    assert eng.config_label(Config.chain(1)) == "1 spec token (verify 2)" and eng.config_label(OFF) == "off"
    assert A.neighbours(Config.chain(2), eng.topks) == [Config.chain(2), Config.chain(1), Config.chain(3), OFF]
    five = preset_for(p, Config.chain(5), p.speculative.model_dump())
    assert five.speculative.num_speculative_tokens == 5 and five.speculative.num_steps is None
    assert json.loads(five.flags()[five.flags().index("--speculative-config") + 1])["num_speculative_tokens"] == 5
    assert not preset_for(p, OFF, p.speculative.model_dump()).is_speculative
    with pytest.raises(ValueError, match="drafts a chain"):
        preset_for(p, Config(3, 2, 6), p.speculative.model_dump())
    sg = P.resolve("demo")  # SGLang keeps its trees
    assert config_of(sg) == Config(2, 1, 3) and Config(3, 4, 8) in A.space(topks=sg.engine.topks)


def test_tune_and_advise_on_vllm_walk_chains(tmp_path):
    """`tune` on the simulator's vLLM dialect relaunches only configurations vLLM can run, names
    them as vLLM does, and its captures feed `advise` (which refuses to mix engines)."""
    p = P.with_changes(
        sim_vllm(tmp_path, "tv", **{"sim-speedup": 20, "sim-load-seconds": 0.2}),
        {"bench.requests": 4, "bench.max_tokens": 120},
    )
    path = P.save(p, tmp_path / "tv.yaml")
    out = tmp_path / "out"
    r = cli(
        "tune",
        str(path),
        "--budget",
        "2",
        "--concurrency",
        "4",
        "--levels",
        "1,4",
        "--out",
        str(out),
        "--ab-rounds",
        "1",
        "--no-verdict",
        "--json",
        str(tmp_path / "r.json"),
        env={"HOME": str(tmp_path)},
        timeout=400,
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "launch 0: 2 spec tokens (verify 3) (the starting configuration)" in r.stdout, r.stdout
    rows = [json.loads(x) for x in (out / "tune.jsonl").read_text().splitlines()]
    launched = [x for x in rows if x["kind"] == "launch"]
    assert len(launched) >= 2 and all(x["config"]["topk"] == 1 for x in launched), launched
    assert all(x["failure"] is None for x in launched), launched  # every relaunch was a valid vLLM preset
    result = json.loads((tmp_path / "r.json").read_text())
    assert all("spec token" in k or k == "off" for k in result["measured"]), result["measured"]
    if (out / "best.yaml").exists():
        best = P.load(out / "best.yaml")
        assert best.server.engine == "vllm" and (not best.is_speculative or best.speculative.num_steps is None)
    caps = [x["capture"] for x in launched]
    adv = cli("advise", *caps, "--concurrency", "4")
    assert adv.returncode == 0 and "spec tokens (verify" in adv.stdout and "topk" not in adv.stdout, adv.stdout
    assert ", histograms)" in adv.stdout, adv.stdout  # the per-position acceptance came from accept_hist
    emit = cli("advise", *caps, "--emit", "sglang-adaptive", str(tmp_path / "s.json"))
    assert emit.returncode == 2 and "SGLang's schedule; vLLM has no adaptive speculation" in emit.stderr
    from tuitune.measure.capture import CaptureWriter

    sg = tmp_path / "sglang.jsonl"
    CaptureWriter(sg, {"preset": P.to_dict(P.resolve("demo"))}).close()
    mixed = cli("advise", caps[0], str(sg))
    assert mixed.returncode == 2 and "different engines (sglang and vllm)" in mixed.stderr, mixed.stderr


# ---- TUI ------------------------------------------------------------------------------------------


async def test_tui_engine_header_spec_tokens_edit_and_position_row(tmp_path):
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.screens import ConfirmScreen, RelaunchScreen
    from tuitune.tui.settings import UserConfig
    from tuitune_support.pilot import SIZE_LIVE, until, wait_ready

    s = Session(sim_vllm(tmp_path, "tui-v"), state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        assert "· vLLM" in str(app.header.render())
        cfg = app.config
        assert str(cfg.query_one("#label-num-steps").render()) == "spec tokens"
        assert cfg.query_one("#spec-num-steps").value == "2" and cfg.query_one("#spec-eagle-topk").disabled
        await s.set_load(True)
        bars = lambda: str(app.cycle.query_one("#bars").render())  # noqa: E731
        await until(
            pilot,
            lambda: "accept by position  1" in bars() and " 3 " not in bars().split("position")[-1],
            20,
            "a two-position acceptance row",
        )
        # the advisor fits vLLM's windows and offers only what vLLM runs (chains), in its words
        app.tabs.active = "tab-advisor"
        await until(pilot, lambda: app.advisor.rows, 20, "the advisor's first fit")
        assert all(p.config.topk == 1 for p in app.advisor.rows) and len(app.advisor.rows) == 4  # ±1, off
        assert "2 spec tokens (verify 3)" in str(app.advisor.render()) and "topk" not in str(app.advisor.render())
        sug = app.advisor.suggestion()
        best = sug.config
        await pilot.press("a")
        if best is not None and sug.kind != "gain":  # not a sure gain, or a measurement: `a` asks first
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
            await pilot.press("y")
        if best is None:
            assert "predicted best: nothing to apply" in app.messages[-1]
        elif best.speculative:
            await until(pilot, lambda: cfg.query_one("#spec-num-steps").value == str(best.steps), 5, "the edit")
            assert app.draft.speculative.num_speculative_tokens == best.steps and not app.draft_errors
        else:
            await until(pilot, lambda: not app.draft.is_speculative, 5, "speculation off in the panel")
        if best is not None:
            assert "config panel set to " + app.advisor.engine.config_label(best) in app.messages[-1]
        app.action_revert()  # back to the preset; the edit below is the operator's
        cfg.query_one("#spec-num-steps").value = "3"
        await pilot.pause()
        assert app.draft.speculative.num_speculative_tokens == 3 and app.modified
        assert "speculative.num_speculative_tokens: 2 → 3" in str(cfg.query_one("#diff").render())
        cfg.query_one("#spec-num-steps").value = "0"
        await pilot.pause()
        assert "num_speculative_tokens" in str(cfg.query_one("#spec-error").render())
        cfg.query_one("#spec-num-steps").value = "3"
        await pilot.pause()
        before = app.relaunch_screen
        await pilot.press("r")
        await until(
            pilot,
            lambda: isinstance(app.relaunch_screen, RelaunchScreen) and app.relaunch_screen is not before,
            5,
            "the relaunch view",
        )
        await wait_ready(app, pilot, s)
        assert s.running_preset.speculative.num_speculative_tokens == 3
        await until(pilot, lambda: " 3 " in bars().split("accept by position")[-1], 20, "a three-position row")
        await s.close(stop_server=True)


async def test_bench_counts_every_chunk_with_a_choice_as_vllms_stream_sends_them(tmp_path):
    """vLLM's stream (seen on the real 0.32 CPU engine): no "usage" key in a text chunk, the usage block
    in a chunk of its own, and a stream that ends in tokens the detokenizer holds back ends on chunks
    with an empty text. The simulator's vLLM streams so (one request of four ends on three); bench counts
    each of those chunks, so that a request's decode span ends at its last token, not before (leaving
    them out read 3 % above vLLM's own decode time on the real engine)."""
    from tuitune.measure.bench import run_bench
    from tuitune.measure.benchconfig import BenchConfig

    t = LocalTransport()
    p = sim_vllm(tmp_path, "chunks", tokens=None, **{"tensor-parallel-size": 1})
    c = ServerControl(t, p, state_dir=str(tmp_path / "state"))
    rec, res = await c.relaunch(30)
    assert res.ok, res
    try:
        url = t.url(await t.forward_port(p.server.port))
        body = {"model": "/shared/m", "prompt": "hi", "max_tokens": 12, "stream": True}
        body["stream_options"] = {"include_usage": True}
        texts, usage_chunks = [], []
        for _ in range(4):  # one request of four holds its last three tokens back
            req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), JSON)
            with urllib.request.urlopen(req, timeout=30) as r:
                events = [json.loads(x[5:]) for x in r.read().split(b"\n\n") if x.startswith(b"data: {")]
            assert all("usage" not in e for e in events if e["choices"])
            usage_chunks += [e for e in events if not e["choices"]]
            texts.append([e["choices"][0]["text"] for e in events if e["choices"]])
        assert [len(x) for x in texts] == [12] * 4 and len(usage_chunks) == 4  # one token a chunk, usage apart
        held = [x for x in texts if x[-3:] == ["", "", ""]]
        assert len(held) == 1 and all(held[0][:-3]), texts
        run = await run_bench(replace(BenchConfig.for_preset(url, p), requests=8, max_tokens=40, api="openai"))
        assert run.failed == 0 and len(run.ok) == 8
        assert all(r.completion_tokens == 40 and r.chunks == 40 for r in run.ok), [r.chunks for r in run.ok]
    finally:
        await c.stop()
