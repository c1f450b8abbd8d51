"""tuitune against the real SGLang: PyPI ``sglang==0.5.18`` on this machine's CPU (tuitune_support.real_sglang:
the CPU kernels built from ../shared/sglang-cpu/'s source, the three upstream fixes), serving a tiny
random Llama with real EAGLE-3 chains and trees (a random draft: real costs, acceptance 1.00) and real
NGRAM (a random model repeats itself: real acceptance), locally and over the real sshd on loopback.

Nothing is mocked: the engine is SGLang's own code, started by tuitune's `launch`, measured by its
`bench`, profiled by its probe inside SGLang's scheduler process; what checks it is independent of
tuitune (a plain HTTP client written here, SGLang's own log lines, `meta_info` and /metrics, the process
table). A launch takes about 20 s here, so the tests share them (module-scoped, in order), and run on
the real engines' one pytest worker. The only skips: the kernel source is not on this machine (outside
this workplace), or the package registry cannot be reached.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_real_vllm import Term, group_procs, needs_tmux, port_free, tt, watch_drop, write_preset

from tuitune import preset as P
from tuitune.base.events import DecodeStats, ProfileWindow, ServerError
from tuitune_support import real_sglang
from tuitune_support.clients import PROMPTS, generate, log_events
from tuitune_support.paths import ROOT
from tuitune_support.ports import free_port
from tuitune_support.procs import HandServer, wait_for

pytestmark = [
    # one worker for SGLang's tests, vLLM's on the other (tests/conftest.py): each engine's launches never
    # overlap, and the two engines' tests run side by side
    pytest.mark.xdist_group("real-sglang"),
    pytest.mark.timeout(1800),
]

# setproctitle names SGLang's processes; the HTTP server keeps its python command line
ROLES = ("launch_server", "sglang::scheduler", "sglang::detokenizer")


@pytest.fixture(scope="session")
def engine() -> tuple[Path, dict[str, Path]]:
    try:
        return real_sglang.build()
    except (real_sglang.NoSource, real_sglang.UnfitCpu, real_sglang.Unreachable) as e:
        pytest.skip(f"the real SGLang engine cannot be built here: {e}")


def roles(pgid: int) -> dict[str, int]:
    out = {}
    for pid, cmd in group_procs(pgid).items():
        for role in ROLES:
            if role in cmd and role not in out:
                out[role] = pid
    return out


def server_pid(home: Path, preset: Path) -> int:
    st = json.loads(tt(home, "status", str(preset), "--json", "--any", timeout=60).stdout)
    assert st["running"], st
    return int(st["record"]["pid"])


# ---- an independent client (no tuitune code): SGLang's native /generate --------------------------


def decode_clock(port: int) -> tuple[float, float]:
    """SGLang's own clock of what it decoded, read with prometheus_client (not tuitune's scraper): its
    inter-token latency histogram, which the tokenizer manager feeds at each output it receives of a
    request after the first, the interval since the last (``_sum``: each request's seconds from its
    first output to its last) and the tokens it brought (``_count``); summed over every label set."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    got = {"sglang:inter_token_latency_seconds_count": 0.0, "sglang:inter_token_latency_seconds_sum": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in got:
                got[sample.name] += sample.value
    return got["sglang:inter_token_latency_seconds_count"], got["sglang:inter_token_latency_seconds_sum"]


class Load:
    """Single-stream /generate requests from the independent client in a thread, until stopped."""

    def __init__(self, port: int, max_tokens: int = 96, prompts: list[str] | None = None):
        import threading

        self.port, self.max_tokens, self.prompts = port, max_tokens, prompts or PROMPTS
        self.metas: list[dict] = []
        self.error = ""
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                self.metas.append(generate(self.port, self.prompts[i % len(self.prompts)], self.max_tokens)["meta"])
            except (OSError, RuntimeError, http.client.HTTPException, ValueError, KeyError) as e:
                self.error = f"{type(e).__name__}: {e}"
                time.sleep(0.5)
            i += 1

    @property
    def done(self) -> int:
        return len(self.metas)

    def __enter__(self) -> Load:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(200)


# ---- the shared local server -----------------------------------------------------------------------


class Served:
    """One real SGLang server started by `tuitune launch` (relaunched by the tests about relaunches)."""

    def __init__(self, home: Path, engine, target="local", name="rs"):
        self.home = home
        self.python, self.models = engine
        self.port = free_port()
        self.log = home / f"{name}.log"
        self.name = name
        self.target = target
        self.chain = self.preset("chain.yaml", steps=2)
        self.current = self.chain
        self.launch_out: subprocess.CompletedProcess | None = None
        self.launch_s = 0.0
        self.hand: HandServer | None = None  # a server started by hand on the port (not tuitune's)

    def preset(self, file: str, **kw) -> Path:
        args = {"enable-metrics": True, **kw.pop("args", {})}
        data = real_sglang.preset(
            self.name,
            self.log,
            self.port,
            python=self.python,
            draft=self.models["eagle3"],
            target=self.target,
            args=args,
            **kw,
        )
        return write_preset(self.home / file, data)

    def start_by_hand(self, preset: Path) -> HandServer:
        """The preset's server started as a person starts SGLang, not by tuitune: `tuitune probe
        install`, then `EAGLE3_PROFILE=1 PYTHONPATH=~/.cache/tuitune/probe nohup python -m
        sglang.launch_server … >> LOG 2>&1 &` (the flags and variables the preset would give it)."""
        tt(self.home, "stop", str(self.current), "--any", timeout=120)
        wait_for(lambda: port_free(self.port), 60, 0.5, f"port {self.port} free")
        r = tt(self.home, "probe", "install", str(preset), timeout=120)
        assert "probe copied to" in r.stdout, r.stdout + r.stderr
        p = P.load(preset)
        env = {**os.environ, **p.launch_env(), "HOME": str(self.home)}
        env["PYTHONPATH"] = str(self.home / ".cache" / "tuitune" / "probe")
        argv = [p.python(), "-m", p.server.module, *p.flags()]
        self.hand = HandServer(argv, self.port, env, self.log, cwd=self.home, timeout=300, group=True)
        return self.hand

    def stop_hand(self) -> None:
        if self.hand is not None:
            self.hand.stop()
            self.hand = None

    def launch(self, preset: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        self.stop_hand()  # a test that adopts and stops it has done so already; one that failed has not
        t0 = time.monotonic()
        r = tt(self.home, "launch", str(preset or self.chain), timeout=timeout)
        self.launch_s = time.monotonic() - t0
        self.current = preset or self.chain
        assert r.returncode == 0, f"launch failed ({r.returncode}):\n{r.stdout}\n{r.stderr}\n{self.tail()}"
        return r

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def cleanup(self) -> None:
        self.stop_hand()
        r = tt(self.home, "status", str(self.current), "--json", "--any", timeout=60)
        try:
            rec = json.loads(r.stdout).get("record") or {}
        except ValueError:
            rec = {}
        tt(self.home, "stop", str(self.current), "--any", timeout=120)
        if rec.get("pid"):
            try:
                os.killpg(int(rec["pid"]), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="module")
def served(engine, tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("real-sglang-local"), engine)
    try:
        s.launch_out = s.launch()
    except BaseException:
        s.cleanup()
        raise
    yield s
    s.cleanup()


def windows_under_load(served, n: int = 3, max_tokens: int = 96, **kw) -> tuple[list, list]:
    start = served.log.stat().st_size
    with Load(served.port, max_tokens, **kw) as load:
        wait_for(lambda: load.done >= n, 180, 0.5, f"{n} requests ({load.error or 'no error'})")
    time.sleep(0.5)
    events = log_events(served.log, start)
    return [e for e in events if isinstance(e, ProfileWindow)], events


# ---- local: one launch shared, in order -------------------------------------------------------------


def test_launch_tracks_sglangs_real_phases(served):
    out = served.launch_out.stdout
    for phase in ("starting", "loading weights", "http up", "ready"):
        assert re.search(rf"^\s+\d+\.\ds\s+{phase}$", out, re.M), out
    ready = float(re.search(r"ready in ([\d.]+)s", out).group(1))
    assert 3 < ready < served.launch_s, out
    found = roles(server_pid(served.home, served.chain))
    assert set(found) == set(ROLES), found  # the HTTP server, its scheduler and detokenizer: one group


def test_status_sees_no_drift_and_drift_on_other_steps(served):
    r = tt(served.home, "status", str(served.chain), timeout=60)
    assert r.returncode == 0 and "no drift" in r.stdout, r.stdout + r.stderr
    r = tt(served.home, "status", str(served.preset("steps3.yaml", steps=3)), timeout=60)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "num_steps" in r.stdout or "speculative-num-steps" in r.stdout, r.stdout


def test_probe_inside_the_real_eagle3_worker(served):
    """EAGLE3_PROFILE lines from SGLang's scheduler process: draft, verify and extend timed inside
    the real EAGLE worker, phases that add up to the cycle; the random draft accepts nothing, and
    SGLang's own decode line says the same."""
    windows, events = windows_under_load(served)
    assert len(windows) >= 2, served.tail()
    for w in windows:
        assert w.v == 2 and w.steps == 2 and w.topk == 1 and w.bs == 1, w
        assert w.draft_ms > 0 and w.verify_ms > 0 and w.extend_ms > 0, w
        parts = w.draft_ms + w.verify_ms + w.extend_ms + (w.other_ms or 0)
        assert parts == pytest.approx(w.cycle_ms, abs=0.01), w
        assert w.accept_len == pytest.approx(1.0), w
        assert w.sync == "cpu", w
    decode = [e for e in events if isinstance(e, DecodeStats)]
    assert decode and all(e.accept_len == pytest.approx(1.0) for e in decode if e.accept_len is not None)
    assert all(e.cuda_graph is False for e in decode), decode[:3]  # "cpu graph: False": eager on CPU


@pytest.mark.quiet  # two clocks compared: nothing beside it
def test_bench_native_and_openai_agree_with_an_independent_client(served):
    """`tuitune bench` through SGLang's native /generate and through its OpenAI API, and a plain
    http.client loop over /generate written here, in turn (A B C, then C B A, then A B C) on the same
    server and prompts, each batch held against the server's own clock over the same requests (its
    inter-token histogram: seconds from each request's first output to its last, and the tokens after
    it; ``decode_clock``). A client's decode rate over a batch divided by the server's is free of the
    machine's drift: pooled rates compared batch against batch once read 112, 118 and 123 tok/s for
    the three (a 9 % gap) while each batch's samples spread from 105 to 132. Each client within 5 % of
    the server (the median of its three batches), and each of tuitune's within 5 % of the plain one."""
    n, max_tokens = 4, 128
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]  # bench's list, from its start (no warm-up)
    against: dict[str, list[float]] = {"native": [], "openai": [], "independent": []}
    generate(served.port, prompts[0], 16)  # warm
    for rnd in range(3):
        order = ["native", "openai", "independent"]
        for who in order if rnd % 2 == 0 else order[::-1]:
            before = decode_clock(served.port)
            if who == "independent":
                got = [generate(served.port, p, max_tokens) for p in prompts]
                assert all(g["tokens"] == max_tokens and g["span"] for g in got), got
                spans = [g["span"] for g in got]
            else:
                out = served.home / f"bench-{who}-{rnd}.json"
                args = ["bench", str(served.chain), "--api", who, "--requests", str(n), "--warmup", "0"]
                r = tt(served.home, *args, "--max-tokens", str(max_tokens), "--json", str(out), timeout=300)
                assert r.returncode == 0, r.stdout + r.stderr
                res = json.loads(out.read_text())["results"]
                assert all(x["ok"] and x["completion_tokens"] == max_tokens for x in res), res
                spans = [x["e2e_s"] - x["ttft_s"] for x in res]
            after = decode_clock(served.port)
            tokens, seconds = after[0] - before[0], after[1] - before[1]
            assert 0 < tokens <= n * max_tokens and seconds > 0, (who, before, after)  # these requests only
            against[who].append((n * (max_tokens - 1) / sum(spans)) / (tokens / seconds))
    med = {who: statistics.median(v) for who, v in against.items()}
    assert all(abs(m - 1) < 0.05 for m in med.values()), against
    for who in ("native", "openai"):
        assert abs(med[who] / med["independent"] - 1) < 0.05, against


def test_metrics_beside_the_probe(served):
    """SGLang's own /metrics (``--enable-metrics``) read by tuitune's scraper: its acceptance gauge
    beside the probe's (both 1.00 with the random draft), its steps the preset's."""
    from tuitune.measure import promscrape

    with urllib.request.urlopen(f"http://127.0.0.1:{served.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    snap = promscrape.parse(text)
    assert snap.gauges.get("sglang:spec_accept_length") == pytest.approx(1.0, abs=0.01), snap
    assert "sglang:spec_num_steps" in text or "sglang:spec_accept_rate" in text


@needs_tmux
def test_record_report_replay_of_a_real_sglang_session(served):
    cap = served.home / "real.jsonl"
    r = tt(served.home, "--record", str(cap), str(served.chain), "--load", "1", "--duration", "10", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = [json.loads(line).get("kind") for line in cap.read_text().splitlines() if line.strip()]
    assert kinds.count("profile") >= 2 and "decode" in kinds, sorted(set(kinds))
    (summary,) = json.loads(tt(served.home, "report", str(cap), "--json", timeout=60, check=True).stdout)
    assert "cycle" in json.dumps(summary), summary
    # the second source: SGLang's own counters (--enable-metrics) beside the probe, and they agree
    figs = {f["figure"]: f for f in summary["second_source"]}
    assert {"accept length", "steps"} <= set(figs) and not summary["disagreements"], summary["second_source"]
    assert figs["steps"]["probe"] == figs["steps"]["server"] == 2
    # tokens over verifies: 1.00 with the random draft, and a little over it, since each request's first
    # token (from its prefill) counts in SGLang's tokens but no verify made it
    assert 1.0 <= figs["accept length"]["server"] < 1.03, figs
    t = Term(served.home, f"{sys.executable} -m tuitune replay {cap} --speed 4")
    try:
        t.wait(lambda s: re.search(r"accept len \d", s) and "verify" in s, 60)
        t.keys("q")
        t.wait(lambda s: "EXITED=0" in s, 30)
    finally:
        t.close()


@needs_tmux
def test_tui_in_tmux_shows_the_real_sglang_numbers(served):
    t = Term(served.home, f"{sys.executable} -m tuitune {served.chain}")
    try:
        t.wait(lambda s: "ready" in s, 60)
        t.keys("l")
        # the bars and the profile's own lines in the log (a flood of one repeated line is folded:
        # SGLang logs one a step for a request whose client left, as a slow machine's load timing out)
        t.wait(
            lambda s: (
                re.search(r"accept len 1\.00", s)
                and re.search(r"verify\s+█", s)
                and re.search(r"draft\s+█", s)
                and "EAGLE3_PROFILE v=2" in s
            ),
            120,
        )
        t.keys("l", "q")
        s = t.wait(lambda s: "EXITED=" in s or "Leave it running [y]" in s, 30)
        if "EXITED=" not in s:
            t.keys("y")
            t.wait(lambda s: "EXITED=" in s, 30)
    finally:
        t.close()
    assert tt(served.home, "status", str(served.chain), timeout=60).returncode == 0


def test_relaunch_as_a_tree_drift_before_none_after(served):
    """An EAGLE-3 tree (steps 3, topk 4, 8 draft tokens): drift against the running chain, none once
    relaunched, and the probe's windows from inside the tree's worker say topk 4."""
    tree = served.preset("tree.yaml", steps=3, topk=4, draft_tokens=8)
    assert tt(served.home, "status", str(tree), timeout=60).returncode == 4
    served.launch(tree)
    r = tt(served.home, "status", str(tree), timeout=60)
    assert r.returncode == 0 and "no drift" in r.stdout, r.stdout + r.stderr
    windows, _ = windows_under_load(served, n=2)
    assert windows and {(w.steps, w.topk) for w in windows} == {(3, 4)}, windows
    assert all(w.draft_ms > 0 and w.verify_ms > 0 for w in windows)


def test_ngram_probe_accept_length_matches_sglangs_own(served):
    """NGRAM: SGLang's corpus learns from earlier outputs, and a random model repeats itself, so the
    same prompts again accept for real. The probe's accept length (tokens a request-cycle, weighted by
    cycles) against SGLang's own over the same requests: the requests' ``meta_info``
    (completion tokens / verify calls) and its decode lines' ``accept len``; each within 5 %.
    The server is started by hand, not by tuitune (as most servers are), and `tuitune preset discover`
    reads its preset off the process: NGRAM with 8 draft tokens, the probe on, no drift from it."""
    ngram = served.preset("ngram.yaml", method="NGRAM", draft_tokens=8)
    hand = served.start_by_hand(ngram)
    tt(served.home, "preset", "discover", "--port", str(served.port), "--name", "ngram-hand", "--save", check=True)
    found = P.load(served.home / ".config" / "tuitune" / "presets" / "ngram-hand.yaml")
    assert found.speculative.algorithm == "NGRAM" and found.speculative.num_draft_tokens == 8, found
    want = P.load(ngram).env
    assert found.profile and found.server.log == str(served.log), found
    assert {k: found.env.get(k) for k in want} == want, found.env
    r = tt(served.home, "status", "ngram-hand", timeout=60)
    assert r.returncode == 5 and f"pid {hand.proc.pid}" in r.stdout and "no drift" in r.stdout, r.stdout + r.stderr
    probe, theirs, logged = ngram_accept_lengths(served)
    assert abs(probe / theirs - 1) < 0.05, (probe, theirs, logged)
    assert abs(logged / theirs - 1) < 0.10, (probe, theirs, logged)


def ngram_accept_lengths(served, timeout: float = 240) -> tuple[float, float, float]:
    """An NGRAM server's accept length three ways over the same six requests (two prompts, sent one at a
    time after four requests of warm-up from which SGLang's corpus learns their outputs): the probe's
    (tokens a request-cycle, weighted by cycles), the requests' own ``meta_info`` (completion tokens /
    verify calls, SGLang's ``spec_accept_length``) and the mean of SGLang's decode lines' ``accept len``.
    The probe's windows cover exactly those requests where it logs every cycle (EAGLE3_PROFILE_WINDOW=1);
    with its default of 40 a window may hold a few warm-up cycles and the last is not yet written."""
    prompts = PROMPTS[:2]
    with Load(served.port, 128, prompts=prompts) as load:  # the corpus learns these outputs
        wait_for(lambda: load.done >= 4, timeout, 0.5, f"warm-up ({load.error})")
    start = served.log.stat().st_size
    metas = [generate(served.port, prompts[i % 2], 128)["meta"] for i in range(6)]
    time.sleep(0.5)
    events = log_events(served.log, start)
    windows = [e for e in events if isinstance(e, ProfileWindow)]
    assert windows and all(w.draft_ms >= 0 and w.verify_ms > 0 for w in windows), served.tail()
    probe = sum(w.accept_len * w.cycles for w in windows) / sum(w.cycles for w in windows)
    tokens = sum(m["completion_tokens"] for m in metas)
    verifies = sum(m["spec_verify_ct"] for m in metas)
    theirs = tokens / verifies
    assert theirs > 1.3, theirs  # real acceptance, not the random draft's nothing
    decode = [e.accept_len for e in events if isinstance(e, DecodeStats) and e.accept_len]
    assert decode
    return probe, theirs, statistics.mean(decode)


def test_watch_says_when_real_ngram_acceptance_collapses_with_the_workload(served):
    """NGRAM's acceptance is real here, and it is the workload's: prompts the server has answered
    before draw their drafts from its earlier answers (an accept length about 6 of 9), new prompts do
    not (about 2.5). A capture of the repeated workload is the baseline (`--against`); when the
    traffic turns to new prompts, `tuitune watch` says so and exits 1 (the server is NGRAM, 8 draft
    tokens, started by hand in the test above: recorded by its port, watched through the preset
    `preset discover` wrote, never relaunched)."""
    import random

    assert served.hand is not None, "the hand-started NGRAM server of the test above"
    cap = served.home / "repeated.jsonl"
    with Load(served.port, 48, prompts=PROMPTS[:4]):
        r = tt(served.home, "--record", str(cap), "--port", str(served.port), "--duration", "8", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rng = random.Random(11)
    words = "alpha beta gamma delta river stone cloud paper lamp orbit maple cedar tiger violet amber quartz".split()
    novel = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(400)]
    novel_load = Load(served.port, 48, prompts=novel)
    drop = watch_drop(served.home, "ngram-hand", cap, novel_load, "--window", "80", "--duration", "25", timeout=120)
    assert re.search(r"is [3-9]\d % below the baseline's [4-9]\.\d\d \(capture repeated\.jsonl", drop), drop
    assert served.hand.proc.poll() is None  # watched, never relaunched


def test_adopt_makes_the_hand_started_real_server_tuitunes_to_stop(served):
    """`tuitune adopt` records the hand-started SGLang (the two tests above) as tuitune's, with no drift
    from the preset read off it; `tuitune stop` then ends its whole process group (the HTTP server,
    scheduler and detokenizer SGLang started)."""
    assert served.hand is not None, "the hand-started NGRAM server of the tests above"
    pid = served.hand.proc.pid
    r = tt(served.home, "stop", "ngram-hand", timeout=60)
    assert r.returncode == 2 and "tuitune did not start" in r.stderr and served.hand.proc.poll() is None, r.stderr
    r = tt(served.home, "adopt", "ngram-hand", timeout=60)
    assert r.returncode == 0 and f"adopted server {pid}" in r.stdout and "difference(s)" not in r.stdout, r.stdout
    assert set(roles(pid)) == set(ROLES)
    r = tt(served.home, "stop", "ngram-hand", timeout=120)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    served.hand.proc.wait(30)
    wait_for(lambda: not roles(pid), 30, 0.5, "SGLang's processes gone")
    served.hand = None


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct, the real model (tuitune_support.real_vllm builds it once, for both engines)."""
    from tuitune_support import real_vllm

    try:
        return real_vllm.build_smollm2()
    except real_vllm.Unreachable as e:
        pytest.skip(f"the real model cannot be built here: {e}")


def test_ngram_probe_accept_length_matches_sglangs_own_on_a_real_model(served, smollm2):
    """NGRAM on a real model, SmolLM2-135M-Instruct (issue 40: the probe within 3 % of the engine's own,
    with real acceptance, on both engines): the probe's accept length against the requests' own
    ``meta_info`` within 3 %; SGLang's decode lines (a mean of per-interval figures, weighted otherwise)
    within 10 %. Launched by tuitune on the port the hand-started server above left free (whatever runs
    there stopped first, when the test runs alone), stopped after."""
    before = served.current
    tt(served.home, "stop", str(before), "--any", timeout=120)
    smol = served.preset(
        "smol-ngram.yaml", method="NGRAM", draft_tokens=8, model=smollm2, env={"EAGLE3_PROFILE_WINDOW": "1"}
    )
    served.launch(smol, timeout=420)
    try:
        probe, theirs, logged = ngram_accept_lengths(served, timeout=420)
        assert abs(probe / theirs - 1) < 0.03, (probe, theirs, logged)
        assert abs(logged / theirs - 1) < 0.10, (probe, theirs, logged)
    finally:
        r = tt(served.home, "stop", str(smol), timeout=120)
        served.current = before
    assert r.returncode == 0, r.stdout + r.stderr


def test_emitted_adaptive_schedule_runs_and_the_probe_follows_sglangs_switches(served):
    """`advise --emit sglang-adaptive` from a real capture: no 0-step candidate (SGLang 0.5.18 crashes
    at one on a CPU), a file SGLang's own loader takes (launched with it, `--disable-cuda-graph` as the
    CPU needs, it serves); a num_steps the file does not list is refused before launching (SGLang would
    refuse it only after loading the model). Launched with the emitted file, each bucket given one longer
    chain to start from, SGLang's policy switches down (the random draft accepts nothing) and the probe's
    windows follow, each naming the steps SGLang's last switch line set."""
    cap = served.home / "real.jsonl"
    if not cap.exists():  # test_record_report_replay_of_a_real_sglang_session makes it (when it ran)
        r = tt(
            served.home,
            "--record",
            str(cap),
            str(served.chain),
            "--relaunch",
            "--load",
            "2",
            "--duration",
            "10",
            timeout=180,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    emitted = served.home / "adaptive.json"
    r = tt(served.home, "advise", str(cap), "--emit", "sglang-adaptive", str(emitted), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 steps not offered" in r.stdout, r.stdout
    cfg = json.loads(emitted.read_text())
    union = sorted({s for v in cfg.values() for s in v["candidate_steps"]})
    assert union and 0 not in union, cfg
    bad = served.preset("adaptive-bad.yaml", steps=max(union) + 1, adaptive=emitted)
    r = tt(served.home, "launch", str(bad), timeout=120)
    assert r.returncode == 2 and "not one of its candidate steps" in r.stderr, r.stdout + r.stderr
    # one launch: the emitted file, each bucket given one longer chain to start from, so that SGLang's
    # policy has somewhere to switch from (the random draft accepts nothing: it moves down to the file's)
    top = max(union) + 2
    two = served.home / "two.json"
    two.write_text(json.dumps({k: {"candidate_steps": sorted({*v["candidate_steps"], top})} for k, v in cfg.items()}))
    low = min(union)
    prepared = served.preset("adaptive-two.yaml", steps=top, adaptive=two, switch=[low, top])
    served.launch(prepared)
    start = served.log.stat().st_size
    windows, _ = windows_under_load(served, n=4)
    lines = served.log.read_bytes()[start:].decode("utf-8", "replace").splitlines()
    switches = [re.search(r"Switch adaptive runtime state: steps (\d+) -> (\d+)", ln) for ln in lines]
    assert any(switches), served.tail()  # SGLang's policy moved down (nothing is accepted)
    allowed = {*union, top}
    current = top
    checked = 0
    for ln, sw in zip(lines, switches, strict=True):
        if sw:
            current = int(sw.group(2))
        elif "EAGLE3_PROFILE" in ln and "cycles=40" in ln:  # a whole window, all of it after the switch
            w = next(e for e in log_events_of([ln]) if isinstance(e, ProfileWindow))
            assert w.steps in allowed, w
            checked += w.steps == current
    assert checked >= 1 and {w.steps for w in windows} <= allowed, windows
    # the same launch was prepared to switch (speculative.switch, inert until told): `tuitune hold` keeps the
    # longer chain in force through SGLang's own runtime states, its policy frozen (the random draft accepts
    # nothing, yet it stays), then `--release` hands the choice back and the policy moves down again
    r = tt(served.home, "hold", str(prepared), str(top), timeout=120)
    assert r.returncode == 0 and f"holds steps {top}" in r.stdout, r.stdout + r.stderr
    time.sleep(0.5)
    start = served.log.stat().st_size
    held, _ = windows_under_load(served, n=3)
    assert held and all(w.held == top and w.steps == top for w in held), [(w.steps, w.held) for w in held]
    assert f"hold={top} applied=1" in served.log.read_text(errors="replace")
    r = tt(served.home, "status", str(prepared), timeout=60)
    assert r.returncode == 0 and f"holds steps {top}" in r.stdout, r.stdout + r.stderr
    r = tt(served.home, "hold", str(prepared), "--release", timeout=120)
    assert r.returncode == 0 and "released; the engine's own adaptive policy chooses" in r.stdout, r.stdout + r.stderr
    after, _ = windows_under_load(served, n=4)
    assert after and all(w.held is None for w in after) and min(w.steps for w in after) < top, [
        (w.steps, w.held) for w in after
    ]


def log_events_of(lines: list[str]) -> list:
    from tuitune.measure.parse import parse_line

    return [e for e in map(parse_line, lines) if e is not None]


def test_stop_leaves_none_of_sglangs_processes(served):
    pid = server_pid(served.home, served.current)
    found = roles(pid)
    assert set(found) == set(ROLES), found
    r = tt(served.home, "stop", str(served.current), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: not group_procs(pid), 30, 0.2, "SGLang's processes to be gone")
    assert port_free(served.port)
    assert tt(served.home, "status", str(served.current), timeout=60).returncode == 3


# ---- experiments: each relaunches the real engine itself -------------------------------------------------


def test_ab_over_steps(served, tmp_path):
    steps1 = served.preset("steps1.yaml", steps=1)
    out = tmp_path / "ab.json"
    r = tt(
        served.home,
        "ab",
        str(served.chain),
        str(steps1),
        "--rounds",
        "1",
        "--requests",
        "3",
        "--warmup",
        "1",
        "--max-tokens",
        "64",
        "--no-verdict",
        "--json",
        str(out),
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    rows = res["launches"]
    assert [x["arm"] for x in rows] == ["A", "B"] and all(x["median_tok_s"] > 0 for x in rows), rows
    assert all(x["server"]["max_running_requests"] == 48 for x in rows), rows  # both speculate: one limit
    assert tt(served.home, "status", str(steps1), timeout=60).returncode == 3  # ab stops the last server it ran
    assert port_free(served.port)


def test_sweep_over_ngram_draft_tokens(served, tmp_path):
    ngram = served.preset("ngram4.yaml", method="NGRAM", draft_tokens=4)
    out = tmp_path / "sweep"
    r = tt(
        served.home,
        "sweep",
        str(ngram),
        "--grid",
        "speculative.num_draft_tokens=8",
        "--requests",
        "3",
        "--warmup",
        "1",
        "--max-tokens",
        "64",
        "--out",
        str(out),
        "--no-plot",
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    base = [row for row in rows if row["kind"] == "baseline"]
    (cfg,) = [row for row in rows if row["kind"] == "config"]
    assert len(base) == 2 and cfg["changes"] == {"speculative.num_draft_tokens": 8}, rows
    for row in rows:
        assert row["status"] == "ok" and row["failed"] == 0 and row["tok_s_median"] > 0, row
        assert row["cycle_ms"] > 0 and row["max_running_requests"] == 48, row  # profiled, SGLang's reset limit


def test_tune_over_steps_on_the_real_engine(served, tmp_path):
    """`tune` from an EAGLE-3 chain of 1 at one stream, one relaunch, no final A/B: it measures the start
    and speculation off, and chooses the faster of the two. Which one that is, is not asserted: the random
    draft accepts nothing, but on this CPU build a chain of 1 costs little more than off, and in CI,
    beside the other worker's engine, steps 1 read faster than off by noise (the test's old assertion,
    off, failed there and passed on its rerun). Whether tune's answer is the best is judged on the
    simulator and the real vLLM's grids."""
    steps1 = served.preset("steps1.yaml", steps=1)
    out = tmp_path / "tune"
    r = tt(
        served.home,
        "tune",
        str(steps1),
        "--budget",
        "1",
        "--ab-rounds",
        "0",
        "--levels",
        "1",  # the level tuned at only (its default adds 4: a second bench per launch)
        "--requests",
        "3",
        "--warmup",
        "1",
        "--max-tokens",
        "64",
        "--out",
        str(out),
        "--json",
        str(tmp_path / "tune.json"),
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "tune.json").read_text())
    measured = res["measured"]
    assert len(measured) == 2 and res["relaunches"] >= 1, res
    assert {res["chosen"]["steps"], res["start"]["steps"]} <= {0, 1}, res  # the start, or off
    assert res["chosen_label"].split(" with ")[0] == max(measured, key=measured.get), res  # the faster measured
    assert tt(served.home, "status", str(steps1), timeout=60).returncode == 3


# ---- failures: a classified one-sentence cause, within seconds, nothing left running -------------------


def _fails(home: Path, preset: Path, port: int, limit_s: float) -> str:
    t0 = time.monotonic()
    r = tt(home, "launch", str(preset), timeout=limit_s + 60)
    took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout + r.stderr
    err = r.stderr.strip()
    assert "Traceback" not in r.stdout + r.stderr, err
    cause = [ln for ln in err.splitlines() if ln.startswith("tuitune:")]
    assert cause, err
    assert took < limit_s, f"{took:.0f} s: {err}"
    assert not subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True).stdout, "something left running"
    return cause[0]


def _write(tmp_path: Path, engine, name: str, port: int, **kw) -> Path:
    python, models = engine
    kw.setdefault("draft", models["eagle3"])
    return write_preset(
        tmp_path / f"{name}.yaml", real_sglang.preset(name, tmp_path / f"{name}.log", port, python=python, **kw)
    )


def test_unknown_flag_is_refused_before_launch(engine, tmp_path):
    port = free_port()
    cause = _fails(tmp_path, _write(tmp_path, engine, "flag", port, args={"no-such-flag": True}), port, 90)
    assert "--no-such-flag" in cause and "not accepted" in cause, cause


def test_port_in_use_is_refused_before_launch(engine, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cause = _fails(tmp_path, _write(tmp_path, engine, "port", port), port, 90)
    assert str(port) in cause and re.search(r"in use|busy|listening", cause), cause


def test_missing_model_directory_is_named(engine, tmp_path):
    port = free_port()
    missing = tmp_path / "no" / "such" / "model"
    cause = _fails(tmp_path, _write(tmp_path, engine, "nomodel", port, model=missing), port, 60)
    assert str(missing) in cause and re.search(r"does not exist|not found|no such", cause, re.I), cause


def test_draft_that_does_not_fit_the_target(engine, tmp_path):
    port = free_port()
    cause = _fails(tmp_path, _write(tmp_path, engine, "misfit", port, draft=engine[1]["eagle3_misfit"]), port, 90)
    assert "hidden" in cause and "192" in cause and "384" in cause, cause


# every process of the server refuses SIGTERM, as a wedged engine does: the signal ignored from the
# start (inherited by the processes SGLang spawns) and any handler for it, uvicorn's included, refused
_DEAF = """import signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
_set = signal.signal


def _refuse_term(sig, handler):
    return signal.SIG_IGN if sig == signal.SIGTERM else _set(sig, handler)


signal.signal = _refuse_term
"""


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(engine, tmp_path):
    hook = tmp_path / "deaf"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_DEAF)
    port = free_port()
    p = _write(tmp_path, engine, "deaf", port, method=None, profile=False, env={"PYTHONPATH": str(hook)})
    r = tt(tmp_path, "launch", str(p), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    pid = server_pid(tmp_path, p)
    found = roles(pid)
    assert set(found) == set(ROLES), found
    os.killpg(pid, signal.SIGTERM)  # it does ignore it
    time.sleep(1.0)
    assert set(roles(pid)) == set(ROLES)
    t0 = time.monotonic()
    r = tt(tmp_path, "stop", str(p), "--grace", "3", timeout=120)
    assert r.returncode == 0 and "killed after the grace period" in r.stdout, r.stdout + r.stderr
    assert time.monotonic() - t0 < 30
    wait_for(lambda: not group_procs(pid) and not any(_alive(x) for x in found.values()), 30, 0.2, "none left")
    assert port_free(port)
    assert tt(tmp_path, "status", str(p), timeout=60).returncode == 3


def _alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False


# ---- over SSH: the real sshd on loopback ---------------------------------------------------------------


@pytest.fixture(scope="module")
def remote(engine, sshd, tmp_path_factory):
    s = Served(tmp_path_factory.mktemp("real-sglang-ssh"), engine, target=sshd.target(), name="rs-ssh")
    try:
        s.launch_out = s.launch()
    except BaseException:
        s.cleanup()
        raise
    yield s
    s.cleanup()


def test_over_ssh_launch_status_bench_probe(remote):
    assert "ready in" in remote.launch_out.stdout, remote.launch_out.stdout
    r = tt(remote.home, "status", str(remote.chain), timeout=60)
    assert r.returncode == 0 and "no drift" in r.stdout, r.stdout + r.stderr
    start = remote.log.stat().st_size
    js = remote.home / "bench.json"
    r = tt(
        remote.home, "bench", str(remote.chain), "--requests", "3", "--max-tokens", "96", "--json", str(js), timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(js.read_text())
    assert all(x["ok"] and x["completion_tokens"] == 96 for x in res["results"]), res["results"]
    # the limit SGLang really runs with: reset to 48 when speculating (what ab/sweep/crossover compare)
    assert res["summary"]["server"]["max_running_requests"] == 48, res["summary"]["server"]
    windows = [e for e in log_events(remote.log, start) if isinstance(e, ProfileWindow)]
    assert windows and all(w.draft_ms > 0 and w.verify_ms > 0 for w in windows), remote.tail()
    assert set(roles(server_pid(remote.home, remote.chain))) == set(ROLES)


def test_scheduler_killed_while_decoding(remote):
    """kill -9 of SGLang's scheduler mid-decode (over SSH): a live --record says in one sentence that
    the server exited, within seconds, and none of its processes is left."""
    pid = server_pid(remote.home, remote.current)
    found = roles(pid)
    cap = remote.home / "killed.jsonl"
    rec = subprocess.Popen(
        [sys.executable, "-m", "tuitune", "--record", str(cap), str(remote.current), "--load", "1", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HOME": str(remote.home)},
    )
    try:
        wait_for(
            lambda: cap.exists() and re.search(r'"kind":\s*"profile"', cap.read_text()), 120, 0.5, "decoding under load"
        )
        os.kill(found["sglang::scheduler"], signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: "exited" in cap.read_text(), 45, 0.5, "the exit captured")
        rec.send_signal(signal.SIGINT)
        out, err = rec.communicate(timeout=60)
    finally:
        if rec.poll() is None:
            rec.kill()
    events = [json.loads(line) for line in cap.read_text().splitlines() if line.strip()]
    exited = [e for e in events if e.get("kind") == "marker" and "exited" in e.get("text", "")]
    assert exited, (out, err)
    cause = exited[0]["text"]
    assert "\n" not in cause and len(cause) < 400, cause
    assert "an engine process died" in cause and "scheduler" in cause and "-9" in cause, cause  # SGLang's words
    assert exited[0]["t"] - killed_at < 20, exited[0]
    wait_for(lambda: not group_procs(pid), 30, 0.5, "SGLang's processes to be gone")
    assert port_free(remote.port)
    assert not [e for e in log_events(remote.log) if isinstance(e, ServerError) and e.category == "traceback"] or cause


def test_a_cpu_without_avx512_is_said_before_the_build():
    """The kernels die on an illegal instruction where AVX-512 is missing (an AMD EPYC of this machine
    kind offered AVX2 only: exit 132 at import, after a 7-minute build): said first, and the SGLang
    tests skip with the sentence; AVX-512 with AMX, or with bf16 (``_AMX_FIX``), builds."""
    info = "model name\t: {}\nflags\t\t: fpu sse2 avx2 {}\n"
    assert real_sglang.unfit_cpu_reason(info.format("Intel Xeon", "avx512f amx_tile amx_bf16")) is None
    assert real_sglang.unfit_cpu_reason(info.format("AMD EPYC", "avx512f avx512_bf16")) is None
    said = real_sglang.unfit_cpu_reason(info.format("AMD EPYC", ""))
    assert said and "this CPU (AMD EPYC) lacks AVX-512" in said and "\n" not in said
    said = real_sglang.unfit_cpu_reason(info.format("Intel Xeon", "avx512f"))
    assert said and "lacks AMX and AVX-512 bf16" in said
