"""What broke when tuitune first met a real engine (issue 24, vLLM's CPU build), fixed for every
engine: each test here fails on the code before the fix. Real processes throughout: the simulator
in both dialects, real HTTP, the real sshd where a target is remote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.simproc import Sim


def tuitune(*args, env=None, cwd=ROOT, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "tuitune", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


class VllmSim(Sim):
    """The simulator's vLLM dialect as a real process (``--sim-engine vllm serve MODEL …``)."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None):
        port = free_port()
        super().__init__(tmp, [], env)  # placeholder process, replaced below
        self.stop()
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log = tmp / f"vllm-sim-{port}.log"
        argv = ["--sim-engine", "vllm", "serve", "/m/tiny", "--port", str(port), *args]
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tuitune.sim", *argv],
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )


@pytest.fixture
def vllm_sim(tmp_path):
    sims: list[VllmSim] = []

    def make(*args: str, env: dict[str, str] | None = None) -> VllmSim:
        s = VllmSim(tmp_path, list(args), env)
        sims.append(s)
        return s

    yield make
    for s in sims:
        s.stop()


# ---- bench --url: which API the server speaks ------------------------------------------------------


def _bench_url(url: str, *extra: str):
    return tuitune(
        "bench", "--url", url, "--requests", "2", "--warmup", "0", "--max-tokens", "30", "--json", "-", *extra
    )


def test_bench_url_finds_the_api_the_server_speaks(sim_factory, vllm_sim, tmp_path):
    vllm = vllm_sim("--sim-load-seconds", "0.2", "--sim-speedup", "10")
    sglang = sim_factory("--sim-load-seconds", "0.2", "--sim-speedup", "10")
    vllm.wait_ready()
    sglang.wait_ready()
    # vLLM has no /generate: before, every request was "HTTP 404 {"detail":"Not Found"}"
    r = _bench_url(vllm.url)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["config"]["api"] == "openai" and data["summary"]["failed"] == 0 and data["summary"]["requests"] == 2
    r = _bench_url(sglang.url)  # SGLang serves both: its native API, as before
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["api"] == "native"
    r = _bench_url(sglang.url, "--api", "openai")  # an explicit --api is kept
    assert r.returncode == 0 and json.loads(r.stdout)["config"]["api"] == "openai", r.stderr


class _Elsewhere(BaseHTTPRequestHandler):
    """An HTTP server that is no inference server: 404 for everything."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *a):
        pass


def test_bench_url_says_which_api_to_pass_when_it_cannot_tell(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = _bench_url(f"http://127.0.0.1:{srv.server_port}")
    finally:
        srv.shutdown()
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "serves neither /generate (HTTP 404) nor /v1/completions (HTTP 404)" in last
    assert "--api native" in last and "--api openai" in last and "Traceback" not in r.stderr


# ---- ab and tune: rounds that cannot reach significance are refused before any relaunch -----------


def _sim_pair(tmp_path: Path):
    from tuitune import preset as P
    from tuitune_support.presets import make_preset

    port = free_port()
    a = make_preset(tmp_path, "a", port=port, profile=False)
    b = P.with_changes(a, {"name": "b", "server.args.sim-scale": 0.5})
    return P.save(a, tmp_path / "a.yaml"), P.save(b, tmp_path / "b.yaml"), a


@pytest.mark.sim_clock  # a ratio off the simulator's clock
def test_ab_refuses_rounds_that_cannot_reach_significance_before_relaunching(tmp_path):
    from tuitune.experiments.ab import MIN_ROUNDS, min_p

    assert MIN_ROUNDS == 4 and round(min_p(2, 2), 3) == 0.333 and min_p(4, 4) < 0.05 <= min_p(3, 3)
    fa, fb, a = _sim_pair(tmp_path)
    home = {"HOME": str(tmp_path)}
    r = tuitune("ab", str(fa), str(fb), "--rounds", "2", env=home)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "--rounds 2 cannot reach significance" in last and "never below 0.33" in last
    assert "--rounds 4 is the smallest that can" in last and "--no-verdict" in last
    assert not Path(a.server.log).exists() and "launching" not in r.stdout  # nothing was launched
    # asked for on purpose: a measurement, medians and ratio, no verdict
    r = tuitune("ab", str(fa), str(fb), "--rounds", "2", "--no-verdict", "--json", str(tmp_path / "ab.json"), env=home)
    assert r.returncode == 0, r.stderr
    v = json.loads((tmp_path / "ab.json").read_text())["verdict"]
    assert v["verdict"] == "measurement only" and v["n_baseline"] == v["n_candidate"] == 2
    assert "no verdict: 2 + 2 launches cannot reach significance" in r.stdout and "verdict: B" not in r.stdout
    assert v["ratio"] > 1.5  # B's costs are halved: the measurement itself is real


def test_tune_refuses_ab_rounds_that_cannot_decide_before_relaunching(tmp_path):
    from tuitune import preset as P
    from tuitune_support.presets import make_preset

    p = P.save(make_preset(tmp_path, "t"), tmp_path / "t.yaml")
    out = tmp_path / "out"
    r = tuitune("tune", str(p), "--budget", "1", "--ab-rounds", "2", "--out", str(out), env={"HOME": str(tmp_path)})
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "--ab-rounds 2 cannot reach significance" in last and "--ab-rounds 4 is the smallest that can" in last
    assert not out.exists() and not (tmp_path / "t.log").exists()  # no relaunch, no log


# ---- the preset's environment kept whole; model paths checked before a launch ----------------------


async def test_the_presets_pythonpath_reaches_preflight_the_server_and_status(tmp_path, monkeypatch):
    """An engine whose own code is on the preset's PYTHONPATH, profiled: before, the preflight said
    the module was not installed, the launch dropped the preset's path for the caller's, and
    status reported drift on the probe directory tuitune had prepended itself."""
    from tuitune import preset as P
    from tuitune.machine.control import ServerControl
    from tuitune.machine.transport import LocalTransport
    from tuitune_support.presets import make_preset

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "the callers"))  # never the server's
    code = tmp_path / "custom code"
    (code / "simwrap").mkdir(parents=True)
    (code / "simwrap" / "__init__.py").write_text("")
    (code / "simwrap" / "__main__.py").write_text(
        "import runpy\nrunpy.run_module('tuitune.sim', run_name='__main__')\n"
    )
    draft = tmp_path / "draft"
    draft.mkdir()
    p = P.with_changes(
        make_preset(tmp_path, "wrapped", env={"PYTHONPATH": str(code)}),
        {"server.module": "simwrap", "speculative.draft_model_path": str(draft)},
    )
    assert p.uses_probe  # not the simulator's module: tuitune's probe goes first on the path
    c = ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state"))
    try:
        rec, ready = await c.relaunch(60)
        assert ready.ok, ready.message
        environ = dict(x.split("=", 1) for x in Path(f"/proc/{rec.pid}/environ").read_text().split("\0") if "=" in x)
        assert environ["PYTHONPATH"] == f"{tmp_path}/.cache/tuitune/probe:{code}"
        st = await c.status()
        assert st.running and st.drift == [], st.drift
        # a real difference in the preset's own value is still drift
        c2 = ServerControl(
            LocalTransport(), P.with_changes(p, {"env.PYTHONPATH": "/elsewhere"}), str(tmp_path / "state")
        )
        drift = (await c2.status()).drift
        assert [(d.key, d.running, d.preset) for d in drift] == [("env.PYTHONPATH", str(code), "/elsewhere")]
    finally:
        await c.stop()


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    from tuitune_support import vllm_cli

    try:
        return vllm_cli.build()
    except vllm_cli.Unreachable as e:
        pytest.skip(f"vLLM cannot be installed: the package registry is unreachable ({e})")


def _vllm_on_this_machine(tmp_path: Path, python: Path, **changes):
    """The shipped vLLM preset on this machine, through the real vLLM 0.33 command line; the
    environment vLLM's parser needs (its CPU platform) is the preset's own, not the caller's."""
    from tuitune import preset as P
    from tuitune_support import vllm_cli

    return P.with_changes(
        P.resolve("vllm-c4-eagle3-2tok-nccl"),
        {
            "target": "local",
            "server.python": str(python),
            "server.port": free_port(),
            "server.log": str(tmp_path / "v.log"),
            "env": {**vllm_cli.ENV},
            **changes,
        },
    )


async def test_a_missing_model_directory_is_refused_at_once_and_the_real_help_runs_with_the_presets_env(
    tmp_path, vllm_python, monkeypatch
):
    import time

    from tuitune.machine.control import ServerControl
    from tuitune.machine.errors import ControlError
    from tuitune.machine.transport import LocalTransport

    for k in ("VLLM_TARGET_DEVICE", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(k, raising=False)
    draft = tmp_path / "draft"
    draft.mkdir()
    missing = tmp_path / "no such model"
    p = _vllm_on_this_machine(
        tmp_path, vllm_python, **{"server.args.model": str(missing), "speculative.draft_model_path": str(draft)}
    )
    c = ServerControl(LocalTransport(), p, state_dir=str(tmp_path / "state"))
    t0 = time.monotonic()
    with pytest.raises(ControlError) as e:
        await c.relaunch(60)
    assert e.value.code == 2 and time.monotonic() - t0 < 20  # before: 19 s of start-up, then HFValidationError
    assert str(e.value).startswith(f"server.args.model {missing} does not exist on local"), str(e.value)
    assert not Path(p.server.log).exists()  # nothing was started
    p2 = _vllm_on_this_machine(tmp_path, vllm_python, **{"server.args.model": "org/model"})  # an id: the engine's
    with pytest.raises(ControlError, match="speculative.draft_model_path /data/eagle3/output_100k_sglang/4 does not"):
        await ServerControl(LocalTransport(), p2, state_dir=str(tmp_path / "state")).preflight(None)
    # both exist: the real `serve --help=all` runs with the preset's VLLM_TARGET_DEVICE (before, it
    # ran without it and vLLM failed to infer a device: "failed (exit 1)")
    model = tmp_path / "model"
    model.mkdir()
    ok = ServerControl(
        LocalTransport(),
        _vllm_on_this_machine(
            tmp_path, vllm_python, **{"server.args.model": str(model), "speculative.draft_model_path": str(draft)}
        ),
        state_dir=str(tmp_path / "state"),
    )
    await ok.preflight(None)
    assert "--speculative-config" in await ok.server_flags()


def test_the_classifier_knows_huggingfaces_wording_for_a_missing_model(vllm_python, tmp_path):
    """The wording comes from the real transformers / huggingface_hub that vLLM loads through."""
    from tuitune.engines import CAUSE_TEXT
    from tuitune.machine.readiness import classify
    from tuitune.measure.parse import parse_line

    r = subprocess.run(
        [
            str(vllm_python),
            "-c",
            f"from transformers import AutoConfig; AutoConfig.from_pretrained({str(tmp_path / 'nope')!r})",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and "Repo id must be in the form" in last, r.stderr[-600:]
    ev = parse_line(f"(APIServer pid=7) {last}")
    assert ev.kind == "error" and ev.category == "model_not_found"
    assert classify([parse_line("Traceback (most recent call last):"), ev])[0] == "model_not_found"
    assert CAUSE_TEXT["model_not_found"] == "model not found"


# ---- the TUI's log pane: tuitune's own requests hidden by default, one key shows them --------------


def test_own_requests_are_told_apart_from_everything_else():
    from tuitune.tui.logpane import own_request

    vllm = '(APIServer pid=9) INFO:     127.0.0.1:50312 - "GET /metrics HTTP/1.1" 200 OK'
    sglang = '[2026-12-01 10:00:00] INFO:     127.0.0.1:46520 - "POST /generate HTTP/1.1" 200 OK'
    assert own_request(vllm) and own_request(sglang)
    assert own_request('INFO:     10.0.0.2:1 - "GET /health HTTP/1.1" 503 Service Unavailable')
    assert not own_request('(APIServer pid=9) INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    assert not own_request("(APIServer pid=9) INFO 12-01 10:00:00 [loggers.py:257] Engine 000: Avg prompt ...")
    assert not own_request("the word /metrics in a message")


def test_a_repeated_line_is_shown_once_with_a_count_that_grows():
    """SGLang logs "Received output for rid=… but the state was deleted" once a decode step after a
    client left (seen in CI: it pushed every EAGLE3_PROFILE line off the pane)."""
    from tuitune.tui.logpane import Fold, fold_marker, repeat_key

    flood = [
        f"[2026-12-04 23:09:{s:02d}] Received output for rid='c07b' but the state was deleted in TokenizerManager."
        for s in range(6)
    ]
    f = Fold()
    assert f.feed(["a", *flood[:3]]) == (None, ["a", flood[0], fold_marker(2)])
    assert f.feed(flood[3:5]) == (fold_marker(4), [])  # the marker written before is updated, no new line
    prof = "EAGLE3_PROFILE v=2 cycle=9 draft_ms=1.0"
    assert f.feed([prof, flood[5], prof]) == (None, [prof, flood[5], prof])  # only consecutive repeats fold
    assert f.feed([prof]) == (None, [fold_marker(1)])
    # vLLM's timestamp, and lines that differ in more than their time are kept apart
    v = "(APIServer pid=9) INFO 12-04 23:09:{} [loggers.py:257] Engine 000: Avg generation throughput: {} tokens/s"
    assert repeat_key(v.format("58", "9.1")) == repeat_key(v.format("59", "9.1"))
    assert repeat_key(v.format("58", "9.1")) != repeat_key(v.format("58", "9.2"))


async def test_the_log_pane_folds_a_flood_and_keeps_every_line_in_its_buffer():
    from textual.app import App

    from tuitune.tui.logpane import LogPane, fold_marker

    class One(App):
        def compose(self):
            yield LogPane()

    flood = [f"[2026-12-04 23:10:{s:02d}] Received output for rid='c07b' but the state was deleted." for s in range(50)]
    async with One().run_test(size=(100, 20)) as pilot:
        pane = pilot.app.query_one(LogPane)
        log = pane.query_one("#log")
        pane.add(["server up"])
        for i in range(0, 50, 10):
            pane.add(flood[i : i + 10])
            await pilot.pause()
        assert list(log.lines) == ["server up", flood[0], fold_marker(49)]
        pane.add(["EAGLE3_PROFILE v=2 cycle=1"])
        assert list(log.lines)[-2:] == [fold_marker(49), "EAGLE3_PROFILE v=2 cycle=1"]
        assert len(pane.lines) == 52  # the buffer keeps them all
        pane.set_filter("rid")  # a rebuilt view folds the same way
        assert list(log.lines) == [flood[0], fold_marker(49)]


async def test_log_pane_hides_tuitunes_own_requests_and_v_shows_them(tmp_path):
    from tuitune import preset as P
    from tuitune.machine.session import Session
    from tuitune.tui.app import TuituneApp
    from tuitune.tui.logpane import own_request
    from tuitune.tui.settings import UserConfig
    from tuitune_support.pilot import SIZE_LIVE, until, wait_ready

    p = P.from_dict(
        {
            "name": "tui-own",
            "server": {
                "engine": "vllm",
                "python": sys.executable,
                "module": "tuitune.sim",
                "log": str(tmp_path / "tui-own.log"),
                "port": free_port(),
                "args": {"model": "/m/tiny", "sim-load-seconds": 0.3, "sim-speedup": 10},
            },
            "env": {"VLLM_LOG_STATS_INTERVAL": "1"},
            "bench": {"requests": 2, "warmup": 0, "max_tokens": 40},
        }
    )
    s = Session(p, state_dir=str(tmp_path / "state"))
    app = TuituneApp(s, autostart="launch", user_config=UserConfig())
    async with app.run_test(size=SIZE_LIVE) as pilot:
        await wait_ready(app, pilot, s)
        pane = app.logpane
        log = pane.query_one("#log")
        # the session's own /metrics scrapes and /health checks reach the buffer (the server logs them) ...
        await until(pilot, lambda: sum(map(own_request, pane.lines)) >= 3, 20, "access-log lines of tuitune's requests")
        # ... and stay out of the pane, which still shows the server's other lines
        assert not any(own_request(x) for x in log.lines) and any("Engine 000" in x or "vLLM" in x for x in log.lines)
        assert "of tuitune's own requests hidden (v shows)" in pane.status
        await pilot.press("v")
        await pilot.pause()
        assert any(own_request(x) for x in log.lines) and pane.show_own
        assert "own requests shown" in app.messages[-1]
        await pilot.press("v")
        await pilot.pause()
        assert not any(own_request(x) for x in log.lines)
        assert "tuitune.own_requests" in app._binding_ids()
        await s.close(stop_server=True)


def test_over_ssh_the_presets_pythonpath_is_kept_and_a_missing_draft_is_refused(sshd, tmp_path):
    """The same two fixes through the real sshd on loopback: the target is another login."""
    from tuitune import preset as P
    from tuitune_support.presets import make_preset

    code = tmp_path / "code"
    (code / "simwrap").mkdir(parents=True)
    (code / "simwrap" / "__init__.py").write_text("")
    (code / "simwrap" / "__main__.py").write_text(
        "import runpy\nrunpy.run_module('tuitune.sim', run_name='__main__')\n"
    )
    missing = tmp_path / "no-draft"
    p = P.with_changes(
        make_preset(tmp_path, "sshwrap", target=sshd.target(), env={"PYTHONPATH": str(code)}),
        {"server.module": "simwrap", "speculative.draft_model_path": str(missing)},
    )
    path = P.save(p, tmp_path / "w.yaml")
    r = tuitune("launch", str(path), "--timeout", "30")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"speculative.draft_model_path {missing} does not exist on root@127.0.0.1:{sshd.port}" in r.stderr
    missing.mkdir()
    try:
        r = tuitune("launch", str(path), "--timeout", "30")
        assert r.returncode == 0 and "ready in" in r.stdout, r.stdout + r.stderr
        r = tuitune("status", str(path))
        assert r.returncode == 0 and "no drift" in r.stdout, r.stdout + r.stderr
    finally:
        assert tuitune("stop", str(path)).returncode == 0
