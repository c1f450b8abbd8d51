"""Issue 42: every byte from outside treated as hostile. Preset values the target cannot carry, a
benchmark server that replies badly, damaged captures and logs, a resumed log cut at any byte,
secrets by their shape, cancels that reach their task, impossible figures in the engine's lines.
The real pieces run: a real aiohttp server on loopback, real files, the simulator as a process."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from tuitune.measure.parse import parse_line
from tuitune_support.paths import ROOT

# ---- 8. the vLLM parsers refuse impossible values --------------------------------------------------------

SPEC = (
    "(APIServer pid=1) INFO 05-01 12:00:00 [metrics.py:1] SpecDecoding metrics: Mean acceptance length: {mal}, "
    "Accepted throughput: 41.20 tokens/s, Drafted throughput: 89.10 tokens/s, Accepted: {acc} tokens, "
    "Drafted: {dra} tokens, Per-position acceptance rate: {pos}, Avg Draft acceptance rate: {rate}%"
)
STATS = (
    "(APIServer pid=1) INFO 05-01 12:00:01 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
    "Avg generation throughput: {gen} tokens/s, Running: {run} reqs, Waiting: 0 reqs, GPU KV cache usage: 1.5%"
)
GOOD = {"mal": "2.31", "acc": "412", "dra": "891", "pos": "0.712, 0.455", "rate": "46.2"}


def spec(**kw) -> str:
    return SPEC.format(**{**GOOD, **kw})


def test_vllm_lines_with_impossible_values_are_malformed():
    assert parse_line(spec()).kind == "vllm_spec"
    bad = {
        "negative accepted": spec(acc="-5"),
        "negative drafted": spec(dra="-891", acc="0"),
        "accepted over drafted": spec(acc="900", dra="891"),
        "fullwidth digits": spec(acc="４１２"),
        "arabic-indic digits": spec(dra="٨٩١"),
        "negative length": spec(mal="-2.31"),
        "fullwidth length": spec(mal="２.31"),
        "rate over 100 %": spec(rate="146.2"),
        "negative rate": spec(rate="-46.2"),
        "per-position over 1": spec(pos="1.712, 0.455"),
        "per-position negative": spec(pos="-0.1, 0.455"),
    }
    for what, line in bad.items():
        ev = parse_line(line)
        assert ev.kind == "malformed" and ev.marker == "SpecDecoding metrics", what
        assert ev.ts == "05-01 12:00:00", what
    assert "more than Drafted" in parse_line(spec(acc="900", dra="891")).reason
    assert "negative" in parse_line(spec(acc="-5")).reason
    assert parse_line(STATS.format(gen="150.2", run="3")).kind == "decode"
    for gen, run in (("-150.2", "3"), ("150.2", "-3"), ("１５０", "3"), ("150.2", "３")):
        ev = parse_line(STATS.format(gen=gen, run=run))
        assert ev.kind == "malformed" and ev.marker == "Avg prompt throughput", (gen, run)
    # an interval without drafts: vLLM prints nan% for its rate; that is an unknown, not a damaged line
    assert parse_line(spec(acc="0", dra="0", rate="nan")).kind == "vllm_spec"


# ---- 4. a log cut at any byte resumes without losing a completed row -------------------------------------


def test_a_tune_log_cut_at_any_byte_keeps_every_completed_launch(tmp_path):
    """`tune --resume` (and `sweep`) after a row cut short wrote the next row onto the broken line, and
    lost it. Cut the log at every byte: the rows completed before the cut, and the row appended after
    it, all read back, and --resume rebuilds every completed launch."""
    from tuitune.experiments.tunelog import load_log, log_row, replay_prior
    from tuitune_support.cli import spent_search

    _, _, out = spent_search(tmp_path)
    log = out / "tune.jsonl"
    whole = log.read_bytes()
    ends = [i + 1 for i, b in enumerate(whole) if b == ord("\n")]  # where each completed row ends
    extra = {
        "kind": "launch",
        "round": 9,
        "config": {"steps": 3, "topk": 1, "draft_tokens": 4},
        "goodput": {"1": 5.0},
        "capture": str(out / "captures" / "launch-00.jsonl.gz"),
    }
    for cut in range(len(whole) + 1):
        log.write_bytes(whole[:cut])
        log_row(out, extra)
        rows = load_log(out)
        completed = sum(1 for e in ends if e <= cut) + (1 if cut + 1 in ends else 0)  # whole but for its newline
        assert [r["round"] for r in rows] == [*range(completed), 9], cut
        prior = replay_prior(rows)
        assert len(prior) == completed + 1, cut  # every completed launch, and the new one, rebuilt


def test_sweep_results_cut_short_get_the_next_row_on_a_line_of_its_own(tmp_path):
    from tuitune.experiments.sweep import _append, load_results

    row = {"trial": "t1", "label": "a", "kind": "config", "status": "ok", "tok_s_median": 10.0, "values": [10.0]}
    _append(tmp_path, row)
    for name in ("results.jsonl", "results.csv"):
        path = tmp_path / name
        path.write_bytes(path.read_bytes()[:-7])  # killed mid-row
    _append(tmp_path, {**row, "trial": "t2"})
    assert [r["trial"] for r in load_results(tmp_path)] == ["t2"]
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert csv_lines[-1].startswith("t2,") or ",t2," in csv_lines[-1] or csv_lines[-1].split(",")[0] == "t2", csv_lines


# ---- 5. a damaged log row is skipped with a warning naming its line ----------------------------------------


DAMAGED_ROWS = [
    b"\xff\xfe not utf-8 at all\n",
    b'{"kind": "launch", "round": 5, "config": null, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 0, "draft_tokens": 0}, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": -1}, "goodput": {"1": 3.0}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": {"1": "fast"}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": {"1": Infinity}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": true, "topk": 1, "draft_tokens": 3}, "goodput": {}}\n',
    b'{"kind": "launch", "round": 5, "config": {"colour": "red"}, "goodput": {}}\n',
    b'{"kind": "launch", "round": 5, "config": {"steps": 2, "topk": 1, "draft_tokens": 3}, "goodput": [1, 2]}\n',
    b'{"kind": "nccl", "changes": null}\n',
    b"[1, 2, 3]\n",
    b'"just a string"\n',
    b"{" * 100000 + b"\n",
]


def test_tune_resume_on_a_damaged_log_skips_each_bad_row_naming_its_line(tmp_path):
    """`tune --resume` on a damaged log ended in a traceback: invalid UTF-8 (UnicodeDecodeError), a
    row with "config": null (TypeError), hostile configuration values (ZeroDivisionError in the fit).
    Each damaged row is now skipped with a warning that names its line, and the search goes on from
    the rows that are whole."""
    from tuitune_support.cli import spent_search, tuitune

    _, path, out = spent_search(tmp_path)
    log = out / "tune.jsonl"
    good = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(good[0] + b"".join(DAMAGED_ROWS) + good[1])
    r = tuitune(
        "tune", str(path), "--budget", "0", "--concurrency", "1", "--out", str(out), "--resume", "--ab-rounds", "0",
        "--json", str(tmp_path / "r.json"), env={"HOME": str(tmp_path)},
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for n in range(2, 2 + len(DAMAGED_ROWS)):
        assert f"tune.jsonl line {n} skipped: " in r.stderr, (n, r.stderr[-3000:])
    assert "line 1 skipped" not in r.stderr and f"line {2 + len(DAMAGED_ROWS)} skipped" not in r.stderr
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["chosen"]["steps"] == 0, res  # the whole rows still decide: off measured twice as fast


# ---- 2. the bench client treats every byte from the server as hostile ------------------------------------


class HostileServer:
    """A real aiohttp server on loopback, on a thread of its own, whose /v1/completions and /generate
    stream what ``reply`` yields (bytes, or a float: sleep that long); ``reply`` is set per case."""

    def __init__(self) -> None:
        self.reply = lambda: iter([b"data: [DONE]\n\n"])
        self.headers_after_reply = False
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._main, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _main(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def stream(request: web.Request) -> web.StreamResponse:
            await request.read()
            parts = iter(self.reply())
            if self.headers_after_reply:  # stall before the headers
                for part in parts:
                    await asyncio.sleep(part)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            try:
                for part in parts:
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        await resp.write(part)
                await resp.write_eof()
            except (ConnectionError, asyncio.CancelledError):
                pass
            return resp

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/completions", stream)
            app.router.add_post("/generate", stream)
            self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]

        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def hostile():
    s = HostileServer()
    yield s
    s.close()


def sse(*events: object) -> list[bytes]:
    return [b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events]


CHOICE = {"choices": [{"text": "x"}]}
OPENAI_CASES = {
    "an event that is not an object": sse([1, 2]),
    "a token count as a string": sse(CHOICE, {"choices": [], "usage": {"completion_tokens": "5"}}),
    "a token count of 1e999": [b"data: " + json.dumps(CHOICE).encode() + b"\n\n",
                               b'data: {"choices": [], "usage": {"completion_tokens": 1e999}}\n\n'],
    "NaN": [b'data: {"choices": [], "usage": {"completion_tokens": NaN}}\n\n'],
    "a negative count": sse(CHOICE, {"choices": [], "usage": {"completion_tokens": -3}}),
    "a fractional count": sse(CHOICE, {"choices": [], "usage": {"completion_tokens": 2.5}}),
    "more tokens than asked for": sse(CHOICE, {"choices": [], "usage": {"completion_tokens": 10**9}}),
    "usage that is a list": sse(CHOICE, {"choices": [], "usage": [1]}),
    "an event that is not JSON": [b"data: {nope\n\n"],
    "an event nested deep": [b"data: " + b"[" * 100000 + b"\n\n"],
}  # fmt: skip
NATIVE_CASES = {
    "meta_info that is a string": sse({"x": {"completion_tokens": 3}, "meta_info": "oops", "finish_reason": "stop"}),
    "an event that is a list": [b'data: [{"completion_tokens": 3}, {"finish_reason": "stop"}]\n\n'],
    "a count as a string": sse({"meta_info": {"completion_tokens": "7"}, "finish_reason": "stop"}),
    "e2e_latency of Infinity": [b'data: {"meta_info": {"completion_tokens": 3, "e2e_latency": Infinity}, '
                                b'"finish_reason": "stop"}\n\n'],
    "verify count above the tokens": sse({"meta_info": {"completion_tokens": 3, "spec_verify_ct": 9}, "finish_reason": "stop"}),
    "a huge count": [b'data: {"meta_info": {"completion_tokens": ' + b"9" * 5000 + b'}, "finish_reason": "stop"}\n\n'],
}  # fmt: skip


def strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in --json")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("api", ["openai", "native"])
def test_bench_against_a_server_that_replies_badly_fails_each_request_with_its_reason(hostile, tmp_path, api):
    """`bench --url` against a bad server: an event that is not an object (AttributeError), a token
    count sent as a string (TypeError), 1e999 (rc 0 with "no successful request" and "2/2 ok", and
    Infinity in --json). Each request now fails with its reason, counted, and --json is strict JSON."""
    from tuitune_support.cli import tuitune

    cases = OPENAI_CASES if api == "openai" else NATIVE_CASES
    for what, events in cases.items():
        hostile.reply = lambda events=events: iter(events)
        out = tmp_path / "b.json"
        r = tuitune("bench", "--url", hostile.url, "--api", api, "--requests", "2", "--warmup", "0",
                    "--max-tokens", "8", "--json", str(out))  # fmt: skip
        assert "Traceback" not in r.stderr, (what, r.stderr[-2000:])
        assert r.returncode == 1 and "0/2 ok" in r.stdout and "no successful request" in r.stdout, (what, r.stdout)
        assert "error: bad response: " in r.stdout, (what, r.stdout)
        doc = strict_json(out.read_text())
        assert doc["summary"]["failed"] == 2 and all(not x["ok"] and x["error"] for x in doc["results"]), what


def test_a_stream_without_event_separators_is_bounded(hostile):
    """A stream that never sends an event separator grew the client to 331 MB within its 30 s
    timeout: the buffer is bounded, the request fails at the bound with its reason."""
    import resource

    from tuitune.measure.benchconfig import BenchConfig
    from tuitune.measure.request import MAX_EVENT, client_session, run_request

    hostile.reply = lambda: (b"data: " + b"x" * 65536 for _ in range(10**6))  # endless, no separator

    async def go():
        async with client_session() as session:
            return await run_request(session, BenchConfig(hostile.url, api="openai", max_tokens=8, timeout_s=30), "p")

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = asyncio.run(go())
    assert not r.ok and "without its end" in r.error, r.error
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert grown < 8 * MAX_EVENT / 1024, grown


def test_a_stream_that_never_ends_times_out_with_its_reason(hostile):
    from tuitune.measure.benchconfig import BenchConfig
    from tuitune.measure.request import client_session, run_request

    hostile.reply = lambda: (p for _ in range(10**6) for p in (*sse(CHOICE), 0.01))  # chunks forever

    async def go():
        async with client_session() as session:
            return await run_request(session, BenchConfig(hostile.url, api="openai", max_tokens=8, timeout_s=1.5), "p")

    r = asyncio.run(go())
    assert not r.ok and r.error == "timed out after 2 s", r.error


def test_an_output_sent_whole_gives_no_decode_rate_and_the_bench_says_so(hostile, tmp_path):
    """vLLM's CPU API server, on a busy machine, held some outputs back and sent them in one piece:
    the span from the first chunk to the last was milliseconds or nothing, and a block of `sweep
    --live` read a rate a thousand times the engine's. An output in fewer than three chunks gives no
    rate; the bench says how many, and its median is over the others (here a server that sends every
    other output whole, after the time streaming it would take)."""
    from tuitune_support.cli import tuitune

    tokens = 8
    served = []

    def reply():
        served.append(1)
        usage = {"choices": [], "usage": {"completion_tokens": tokens}}
        if len(served) % 2:  # whole: the time a stream of it takes, then every token in one event
            return iter([0.08, *sse({"choices": [{"text": "x" * tokens}]}, usage)])
        return iter([p for _ in range(tokens) for p in (0.01, *sse(CHOICE))] + sse(usage))

    hostile.reply = reply
    out = tmp_path / "b.json"
    r = tuitune("bench", "--url", hostile.url, "--api", "openai", "--requests", "4", "--warmup", "0",
                "--max-tokens", str(tokens), "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = strict_json(out.read_text())
    rates = {x["chunks"]: x["decode_tok_s"] for x in doc["results"]}
    assert set(rates) == {1, tokens} and rates[1] is None, rates
    assert 50 < rates[tokens] < 150, rates  # 7 tokens over ~70 ms
    assert doc["summary"]["tok_s"]["n"] == 2, doc["summary"]["tok_s"]
    said = "2 of 4 outputs arrived in fewer than 3 chunks"
    assert any(said in w for w in doc["summary"]["warnings"]) and said in r.stdout, r.stdout

    hostile.reply = lambda: iter([0.05, *sse({"choices": [{"text": "xxxx"}]}), 0.01, *sse(CHOICE)] + sse(
        {"choices": [], "usage": {"completion_tokens": 5}}))  # fmt: skip  # two pieces: no rate either
    r = tuitune("bench", "--url", hostile.url, "--api", "openai", "--requests", "2", "--warmup", "0",
                "--max-tokens", "5", "--json", str(out))  # fmt: skip
    doc = strict_json(out.read_text())
    assert all(x["chunks"] == 2 and x["decode_tok_s"] is None for x in doc["results"]), doc["results"]
    assert "tok_s" not in doc["summary"] and "so there is none" in r.stdout, r.stdout
    assert "no decode rate (see the warning below); goodput " in r.stdout, r.stdout  # not "no successful request"
    assert "no successful request" not in r.stdout and "2/2 ok" in r.stdout, r.stdout


def test_the_default_bound_of_a_request_grows_with_the_streams_sharing_the_server():
    """A slow server still streaming is not a hang: at four streams the CPU engine's EAGLE-3 K=5
    gave 2.4 tokens a second a stream, and half of its 96-token requests hit the old bound (48 s,
    tokens alone). A stall is the read timeout's to catch."""
    from dataclasses import replace

    from tuitune.measure.benchconfig import BenchConfig

    one = BenchConfig("http://127.0.0.1:9", max_tokens=96)
    assert one.request_timeout() == 48
    assert one.at_level(4).request_timeout() == 192  # each of 4 streams may be 4 times slower
    assert BenchConfig("http://127.0.0.1:9", max_tokens=8, concurrency=4).request_timeout() == 30
    assert replace(one.at_level(4), timeout_s=5.0).request_timeout() == 5.0  # the operator's own bound is kept


# ---- 7. every cancel reaches its task ---------------------------------------------------------------------

# where a request's life stalls on the server's side: (events before the stall, seconds of the stall)
STALLS = {
    "before the headers": "headers",
    "after the headers": [0.0],
    "between two events": [*sse(CHOICE), 30.0],
    "after the last event": [*sse(CHOICE, {"choices": [], "usage": {"completion_tokens": 1}}), 30.0],
    "quickly, over and over": [*sse(CHOICE, {"choices": [], "usage": {"completion_tokens": 1}}), b"data: [DONE]\n\n"],
}


@pytest.mark.sim_clock  # a wall clock held to 2 s: never beside a serving real engine
@pytest.mark.parametrize("where", list(STALLS))
async def test_the_load_ends_when_told_wherever_its_requests_are(tmp_path, hostile, where):
    """A recording's load streams went on sending requests for minutes after its end: a cancel of the
    load was swallowed under run_request, and close() waited for a task that never ended. The load is
    stopped at many points of a request's life against a real server that stalls there; it ends
    within 2 s each time."""
    import time

    from tuitune.base.events import ServerState
    from tuitune.machine.session import Session
    from tuitune_support.presets import make_preset

    stall = STALLS[where]
    if stall == "headers":
        hostile.reply = lambda: iter([60.0])
        hostile.headers_after_reply = True
    else:
        hostile.reply = lambda: iter(stall)
    preset = make_preset(tmp_path, api="openai", max_tokens=8)
    session = Session(preset)
    session.url, session.state = hostile.url, ServerState("ready")
    for delay in (0.0, 0.001, 0.003, 0.008, 0.02, 0.05, 0.12, 0.3):
        await session.set_load(True, 2)
        await asyncio.sleep(delay)
        t0 = time.monotonic()
        stopping = asyncio.ensure_future(session.set_load(False))
        done, _ = await asyncio.wait({stopping}, timeout=2.0)
        assert done, f"the load did not end within 2 s of its stop ({where}, after {delay} s)"
        assert time.monotonic() - t0 < 2.0
    sent = session.load.requests
    await asyncio.sleep(0.3)
    assert session.load.requests == sent  # nothing goes on sending once stopped
    await session.control.close()
    await session.transport.close()


async def test_a_task_that_swallows_its_cancel_is_cancelled_again():
    """close() waited forever for a load task whose cancel was swallowed under it (a library turning the
    cancel into a timeout that its caller caught). A task still running after its cancel is cancelled
    again until it ends."""
    from tuitune.base.aio import cancel_and_wait

    swallowed = []

    async def stubborn() -> None:  # what a swallowed cancel looks like from above: the task goes on
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)

    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(cancel_and_wait(task))
    done, _ = await asyncio.wait({closing}, timeout=2.0)
    assert done and task.cancelled() and swallowed


@pytest.mark.sim_clock  # a wall clock held to 2 s: never beside a serving real engine
def test_record_with_load_ends_within_2_s_of_its_duration_and_of_a_sigterm(tmp_path):
    """`--record --load 2 --duration D` went on loading the server for minutes after D, and SIGTERM did
    not end it. Against the simulator as a process: ended by its duration at several lengths, and by a
    SIGTERM at several moments of its load's requests, it exits within 2 s each time."""
    import os
    import signal
    import subprocess
    import time

    from tuitune import preset as P
    from tuitune_support.presets import make_preset
    from tuitune_support.procs import tuitune_cli, tuitune_cmd, wait_or_dump

    p = make_preset(tmp_path, "rec", max_tokens=400)
    path = P.save(p, tmp_path / "rec.yaml")
    env = {"HOME": str(tmp_path)}
    assert tuitune_cli("launch", str(path), env=env).returncode == 0
    out = tmp_path / "o.jsonl"

    def start(*extra: str) -> tuple[subprocess.Popen, float]:
        """A recording under load, and when its load was seen on (the capture's marker, flushed
        within 0.5 s of it: the times below are if anything generous)."""
        out.unlink(missing_ok=True)
        argv, full = tuitune_cmd("--record", str(out), str(path), "--load", "2", *extra, env=env)
        proc = subprocess.Popen(argv, env=full, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while b"load on" not in _capture_bytes(out):
            assert time.monotonic() < deadline and proc.poll() is None, "the load never started"
            time.sleep(0.01)
        return proc, time.monotonic()

    try:
        for d in (0.3, 0.8, 1.3):
            proc, t0 = start("--duration", str(d))
            wait_or_dump(proc, 30, "--record --duration")
            assert proc.returncode == 0 and time.monotonic() - t0 < d + 2.0, (d, time.monotonic() - t0)
        for after in (0.0, 0.05, 0.2, 0.35, 0.6):
            proc, _ = start()
            time.sleep(after)  # the load's requests are somewhere in their lives
            os.kill(proc.pid, signal.SIGTERM)
            t0 = time.monotonic()
            wait_or_dump(proc, 30, "--record after SIGTERM")
            assert time.monotonic() - t0 < 2.0, after
            assert proc.returncode == 0, proc.stderr.read()[-500:]
    finally:
        tuitune_cli("stop", str(path), env=env)


def _capture_bytes(path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# ---- 3. captures read with their integrity checked ----------------------------------------------------------

DEMO = ROOT / "tests" / "data" / "demo-capture.jsonl"


def gz_capture(tmp_path, name="c.jsonl.gz") -> tuple:
    import gzip

    data = DEMO.read_bytes()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data))
    return path, data.count(b"\n") - 1  # the records after the metadata


def test_a_truncated_or_corrupt_gzip_capture_is_said_to_be_read_in_part(tmp_path):
    """A truncated .gz capture was read as if complete (report and advise gave numbers from part of it,
    rc 0, no word), and a gzip with a bad checksum read silently. Each is now named in one sentence
    with how much was read, by report (human and --json), advise and the reader itself."""
    from tuitune.measure.capture import read_capture
    from tuitune_support.cli import tuitune

    path, records = gz_capture(tmp_path)
    whole = path.read_bytes()
    assert read_capture(path).damage is None and len(read_capture(path).records) == records
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    cap = read_capture(cut)
    assert 0 < len(cap.records) < records and "cut short" in cap.damage
    r = tuitune("report", str(cut), "--no-chart")
    assert r.returncode == 0 and "read in part: its gzip stream is cut short" in r.stdout, r.stdout
    assert f"{len(cap.records)} record(s) read" in r.stdout
    j = tuitune("report", str(cut), "--json")
    assert json.loads(j.stdout)[0]["partial"] and "read in part" in j.stderr
    adv = tuitune("advise", str(cut), "--concurrency", "1")
    assert "Traceback" not in adv.stderr and "read in part" in adv.stderr, adv.stderr
    bad = tmp_path / "crc.jsonl.gz"
    bad.write_bytes(whole[:-8] + bytes(b ^ 0xFF for b in whole[-8:-4]) + whole[-4:])  # the CRC-32 flipped
    r = tuitune("report", str(bad), "--no-chart")
    assert "read in part: its gzip data is corrupt" in r.stdout and "CRC" in r.stdout, r.stdout


def test_a_mislabelled_capture_is_read_by_its_content_and_said(tmp_path):
    """A plain JSONL capture named .gz was called "empty file"."""
    from tuitune.measure.capture import read_capture
    from tuitune_support.cli import tuitune

    plain = tmp_path / "plain.jsonl.gz"
    plain.write_bytes(DEMO.read_bytes())
    cap = read_capture(plain)
    assert len(cap.records) == DEMO.read_bytes().count(b"\n") - 1 and "not gzip-compressed" in cap.note
    r = tuitune("report", str(plain), "--no-chart")
    assert r.returncode == 0 and "is not gzip-compressed though its name ends in .gz" in r.stdout, r.stdout
    gz, _ = gz_capture(tmp_path, "packed.jsonl")
    assert "is gzip-compressed though its name does not" in read_capture(gz).note


def test_a_huge_record_is_passed_over_without_holding_it(tmp_path):
    """One 300 MB line in a capture cost 650 MB. A record over the cap is passed over a block at a time,
    counted and said; the reader's memory does not grow with it."""
    import subprocess
    import sys

    lines = DEMO.read_bytes().splitlines(keepends=True)
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write(lines[0] + lines[1])
        f.write(b'{"kind": "log", "line": "' + b"x" * (48 << 20) + b'", "t": 1, "m": 1}\n')
        f.writelines(lines[2:])
    probe = (
        "import resource, sys; from tuitune.measure.capture import read_capture, partial, capture_stats; "
        "c = read_capture(sys.argv[1]); print(len(c.records), c.oversized, partial(sys.argv[1], capture_stats(c))); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(big)], capture_output=True, text=True, timeout=60)
    small = subprocess.run([sys.executable, "-c", probe, str(DEMO)], capture_output=True, text=True, timeout=60)
    said, rss = out.stdout.splitlines()
    assert said.startswith(f"{len(lines) - 1} 1 ") and "1 record(s) over 4 MiB passed over" in said, out.stdout
    assert int(rss) - int(small.stdout.splitlines()[1]) < 24 * 1024, (rss, small.stdout)  # KiB: far below 48 MiB


# ---- 6. secrets by their shape, and the operator's own --------------------------------------------------

SHAPED = {  # (text, the secret inside it)
    "redis://:hunter2pass@cache:6379/0": "hunter2pass",
    "https://files.example/x.bin?pwd=opensesame42&lang=en": "opensesame42",
    "s3://AKIDEXAMPLEKEYID:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/path": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "key nvapi-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 set": "nvapi-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "google AIzaSyA1234567890abcdefghijklmnopqrstuv here": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "glpat-AbCdEfGhIjKlMnOpQrSt12 pushed": "glpat-AbCdEfGhIjKlMnOpQrSt12",
    "stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc ok": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "groq gsk_AbCdEfGhIjKlMnOpQrStUvWx0123 ok": "gsk_AbCdEfGhIjKlMnOpQrStUvWx0123",
    "replicate r8_AbCdEfGhIjKlMnOpQrStUvWx0123 ok": "r8_AbCdEfGhIjKlMnOpQrStUvWx0123",
    "perplexity pplx-AbCdEfGhIjKlMnOpQrStUvWx0123 ok": "pplx-AbCdEfGhIjKlMnOpQrStUvWx0123",
}


def test_credentials_are_masked_by_their_shape_in_any_scheme_and_query():
    """`redis://:password@host` and `?pwd=` were shown in clear, the secret half of an S3 URL with
    slashes stayed visible, and seven kinds of API key were not recognised."""
    from tuitune.base import redact

    for line, secret in SHAPED.items():
        shown = redact.text(line)
        assert secret not in shown and "••••" in shown, (line, shown)
        assert redact.found(line), line  # what the state file seals
        assert redact.sealed_env({"X": line})["X"].startswith("sha256:"), line
    assert redact.text("redis://:hunter2pass@cache:6379/0") == "redis://:••••@cache:6379/0"
    assert redact.text("?pwd=opensesame42&lang=en") == "?pwd=••••&lang=en"
    for harmless in ("https://host:8000/v1/models", "lang=en&page=2", "gsk_short", "hf_transfer enabled"):
        assert redact.text(harmless) == harmless


def test_the_operators_own_secret_patterns_mask_everywhere(tmp_path, monkeypatch):
    """A way for the operator to add patterns: one regular expression a line of
    ~/.config/tuitune/secret-patterns; a bad one is left out with a warning naming its line."""
    from tuitune.base import redact

    conf = tmp_path / "tuitune"
    conf.mkdir()
    (conf / "secret-patterns").write_text("# ours\nacme-[0-9a-f]{12}\ndbconn=(\\S+)\n(unclosed\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("TUITUNE_SECRET_PATTERNS", raising=False)
    redact.reload_user_patterns()
    try:
        assert redact.text("id acme-0123456789ab in use") == "id •••• in use"
        assert redact.text("conn dbconn=s3cr3t ok") == "conn dbconn=•••• ok"
        assert redact.found("conn dbconn=s3cr3t ok") == ["s3cr3t"]
        assert redact.argv(["--db", "dbconn=s3cr3t"]) == ["--db", "dbconn=••••"]
        assert redact.sealed_argv(["--db", "dbconn=s3cr3t"])[1].startswith("sha256:")
    finally:
        redact.reload_user_patterns()
        monkeypatch.delenv("XDG_CONFIG_HOME")


def test_no_shaped_credential_in_status_json_nor_the_state_file_and_the_log_is_private(tmp_path):
    """`status --json` and the state file held `redis://:password@host` and `?pwd=` in clear; the
    server log tuitune creates is mode 0600 (the engine may print its api-key there)."""
    import os
    from pathlib import Path

    from tuitune import preset as P
    from tuitune_support.presets import make_preset
    from tuitune_support.procs import tuitune_cli

    env = {"CACHE_URL": "redis://:hunter2pass@cache:6379/0", "NCCL_PROTO": "LL"}
    args = {"model-path": "https://files.example/m?pwd=opensesame42&rev=main"}
    p = make_preset(tmp_path, "shaped", env=env, args=args)
    path = P.save(p, tmp_path / "shaped.yaml")
    home = {"HOME": str(tmp_path)}
    Path(p.server.log).write_text("an old log\n")
    os.chmod(p.server.log, 0o644)
    r = tuitune_cli("launch", str(path), env=home)
    assert r.returncode == 0, r.stderr
    try:
        state = (tmp_path / ".cache" / "tuitune" / "servers" / f"{p.server.port}.json").read_text()
        status = tuitune_cli("status", str(path), "--json", env=home).stdout
        for secret in ("hunter2pass", "opensesame42"):
            assert secret not in state and secret not in status, secret
        assert oct(os.stat(p.server.log).st_mode & 0o777) == "0o600"
    finally:
        tuitune_cli("stop", str(path), env=home)


# ---- 1. preset values the target cannot carry ----------------------------------------------------------------


@pytest.mark.parametrize(
    "where, value, key",
    [
        ("env", {"BIG": "x" * (128 * 1024 + 10)}, "env.BIG"),
        ("args", {"served-model-name": "m" * (128 * 1024 + 10)}, "server.args.served-model-name"),
        ("env", {f"PART{i}": "y" * 20000 for i in range(7)}, "the launch command"),  # each fits, not all together
    ],
)
def test_a_value_the_target_cannot_carry_is_refused_where_the_preset_is_read(tmp_path, where, value, key):
    """A value over 128 KiB (Linux's MAX_ARG_STRLEN) passed `preset validate`, then `launch` ended in a
    traceback ("Argument list too long: 'bash'", from check_python). validate and launch now refuse it
    in one sentence naming the key and the limit, before anything reaches a shell."""
    import yaml

    from tuitune import preset as P
    from tuitune_support.presets import make_preset
    from tuitune_support.procs import tuitune_cli

    p = make_preset(tmp_path, "big")
    data = P.to_dict(p)
    if where == "env":
        data["env"] = {**data.get("env", {}), **value}
    else:
        data["server"]["args"] = {**data["server"]["args"], **value}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    for args in (("preset", "validate", str(path)), ("launch", str(path))):
        r = tuitune_cli(*args, env={"HOME": str(tmp_path)})
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr[-1500:])
        said = r.stderr.strip().splitlines()
        assert len(said) == 1 and key in said[0] and "MAX_ARG_STRLEN" in said[0], said
    assert not __import__("pathlib").Path(p.server.log).exists()  # nothing was started


# ---- fuzz: each reader against generated hostile input (hypothesis; a few seconds each) -------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
_KEYS = ["usage", "completion_tokens", "choices", "meta_info", "finish_reason", "spec_verify_ct", "e2e_latency", "text"]
_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(_KEYS), c, max_size=4),
    max_leaves=12,
)
_CHUNK = st.one_of(
    _JSONISH.map(lambda v: b"data: " + json.dumps(v).encode() + b"\n\n"),
    st.binary(max_size=40),
    st.sampled_from([b"data: [DONE]\n\n", b"\n\n", b"data:", b'"finish_reason": "stop"', b'"completion_tokens": 3']),
)


def test_fuzz_the_bench_stream_never_raises_nor_gives_an_impossible_figure():
    import math

    from tuitune.measure.benchconfig import BenchConfig
    from tuitune.measure.request import client_session, run_request

    server = HostileServer()
    try:

        @FUZZ
        @given(chunks=st.lists(_CHUNK, max_size=8), api=st.sampled_from(["openai", "native"]))
        def one(chunks, api):
            server.reply = lambda: iter(chunks)

            async def go():
                async with client_session() as session:
                    cfg = BenchConfig(server.url, api=api, max_tokens=8, timeout_s=5)
                    return await run_request(session, cfg, "p")

            r = asyncio.run(go())
            assert r.ok == (r.error is None) or not r.ok
            if r.ok:
                assert isinstance(r.completion_tokens, int) and 1 <= r.completion_tokens <= 4 * 8 + 64
                for v in (r.decode_tok_s, r.accept_len, r.ttft_s, r.e2e_s):
                    assert v is None or (math.isfinite(v) and v >= 0), r
            else:
                assert isinstance(r.error, str) and "\n" not in r.error.strip()

        one()
    finally:
        server.close()


def test_fuzz_a_damaged_capture_reads_in_part_or_is_refused_in_one_sentence(tmp_path):
    import gzip
    import math

    from tuitune.measure.capture import CaptureError, capture_stats, partial, read_capture
    from tuitune.measure.report import format_report, summarize_capture

    plain = DEMO.read_bytes()[:20000]
    packed = gzip.compress(plain)

    @FUZZ
    @given(
        gz=st.booleans(),
        cut=st.floats(0, 1),
        flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=4),
        extra=st.lists(st.binary(max_size=60), max_size=3),
        name=st.sampled_from(["c.jsonl", "c.jsonl.gz"]),
    )
    def one(gz, cut, flips, extra, name):
        data = bytearray(packed if gz else plain)
        for at, x in flips:
            data[int(at * (len(data) - 1))] ^= x
        data = bytes(data[: int(cut * len(data))]) + b"".join(extra)
        path = tmp_path / name
        path.write_bytes(data)
        try:
            cap = read_capture(path)
        except CaptureError as e:
            assert "\n" not in str(e) and str(e).startswith(str(path))
            return
        assert all(math.isfinite(r.t) and math.isfinite(r.m) for r in cap.records)
        said = partial(path, capture_stats(cap))
        assert said is None or ("read in part" in said and "\n" not in said)
        format_report([summarize_capture(path, keep_series=False)])

    one()


_ROW = st.fixed_dictionaries(
    {"kind": st.sampled_from(["launch", "nccl", "nccl_decision", "result", "x"])},
    optional={
        "round": _JSONISH,
        "config": st.one_of(_JSONISH, st.dictionaries(st.sampled_from(["steps", "topk", "draft_tokens"]), _JSONISH)),
        "goodput": st.one_of(_JSONISH, st.dictionaries(st.text(max_size=3), _JSONISH)),
        "capture": _JSONISH,
        "changes": _JSONISH,
        "env": _JSONISH,
        "predicted": _JSONISH,
    },
)


def test_fuzz_a_damaged_tune_log_is_read_row_by_row_and_resumes(tmp_path):
    from tuitune.base import jsonl
    from tuitune.decide.launch import Config
    from tuitune.experiments.tunelog import load_log, replay_prior, row_problem

    @FUZZ
    @given(
        lines=st.lists(
            st.one_of(_ROW.map(lambda r: json.dumps(r).encode() + b"\n"), st.binary(max_size=80)), max_size=8
        )
    )
    def one(lines):
        out = tmp_path / "fuzz"
        out.mkdir(exist_ok=True)
        (out / "tune.jsonl").write_bytes(b"".join(lines))
        said: list[str] = []
        rows = jsonl.read_rows(out / "tune.jsonl", check=row_problem, warn=said.append)
        assert all(isinstance(r, dict) and row_problem(r) is None for r in rows)
        assert all(" line " in w and " skipped: " in w and "\n" not in w for w in said)
        for r in rows:
            if r.get("kind") == "launch":
                Config(**r["config"])  # what --resume builds of it
        replay_prior(load_log(out))

    one()


def test_fuzz_preset_values_are_refused_in_one_sentence_or_carried(tmp_path):
    from tuitune import preset as P
    from tuitune.preset.render import MAX_ARG_STRLEN
    from tuitune_support.presets import make_preset

    value = st.one_of(st.text(max_size=30), st.integers(0, 3).map(lambda k: "v" * (k * 50_000)))

    @FUZZ
    @given(env=st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), value, max_size=4),
           name=value)  # fmt: skip
    def one(env, name):
        try:
            p = make_preset(tmp_path, "fz", env=env, args={"served-model-name": name})
        except P.PresetError as e:
            assert "\n" not in str(e)
            return
        assert P.carry_problem(p) is None
        assert len(P.launch_command(p).encode("utf-8", "surrogateescape")) < MAX_ARG_STRLEN

    one()
