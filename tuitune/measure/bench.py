"""Benchmark client: streamed requests against SGLang's native or OpenAI API, per-request timing.

Figures per request (FACTS.md §5): TTFT, end-to-end latency, decode tok/s =
(completion_tokens - 1) / (e2e - ttft), inter-token latency with a multi-token chunk's gap divided
by its token count, accept length = completion_tokens / spec_verify_ct. Token counts come from the
server (meta_info / usage), never from counting chunks. Every wait is bounded.

Chunks are read as raw SSE bytes; intermediate chunks only need two integers, so they are read with
a byte search instead of a full JSON decode (cumulative text makes native chunks grow to kilobytes);
the last chunk is decoded fully.

Where the clock starts and stops: a request's clock starts when its last byte has been handed to
the socket (aiohttp's request-sent trace signal, in the sessions ``client_session`` makes), not
when the client begins building it, so the client's own work before sending stays out of TTFT
and end-to-end latency. A chunk is timestamped as soon as its bytes are read, before any parsing.

Why one module of this size: the request loop, its clock, the SSE byte reader and the summary are
one measurement; split, the rules of what a request's clock includes would live in several places.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace

from tuitune.base.aio import cancelled_since, cancelling
from tuitune.base.errors import TuituneError
from tuitune.measure import stats
from tuitune.measure.metrics import quantile, summarize
from tuitune.measure.workload import Workload
from tuitune.measure.workload import builtin as builtin_workload
from tuitune.measure.workload import describe as describe_workload
from tuitune.measure.workload import for_preset as workload_for

SIM_LATE_LIMIT = 0.10  # above this share of late cycles a simulator's figures are not its model's
# above this share of its busy wall time spent behind its own clock, a simulator's figures are that much
# slower than its model's (1 - model_busy/wall_busy over the run): a slip that a tuned choice can rest on
SIM_LAG_LIMIT = 0.10
_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d{1,15})(?![\d.eE])')
MAX_EVENT = 4 << 20  # bytes of one stream event (a native chunk's cumulative text at 32k tokens is ~200 KB)
_MAX_COUNT = 1 << 40  # a token count above this is no server's


class BadStream(ValueError):
    """What a server sent that no server sends (one sentence): the request fails with it."""


def _no_constant(name: str):
    raise BadStream(f"{name} is not a number")


def _finite(text: str) -> float:
    f = float(text)
    if not math.isfinite(f):
        raise BadStream(f"{text[:20]} is out of range")
    return f


def _event(payload: bytes) -> dict:
    """A stream event's JSON, which must be an object of finite numbers; BadStream otherwise."""
    try:
        d = json.loads(payload, parse_constant=_no_constant, parse_float=_finite)
    except BadStream as e:
        raise BadStream(f"a stream event holds a number that is not finite ({e})") from None
    except RecursionError:
        raise BadStream("a stream event is nested too deep") from None
    except ValueError:
        raise BadStream(f"a stream event is not JSON ({bytes(payload[:60])!r})") from None
    if not isinstance(d, dict):
        raise BadStream(f"a stream event is a JSON {type(d).__name__}, not an object")
    return d


def _part(d: dict, key: str) -> dict:
    """``d[key]`` as an object ({} when absent or null); BadStream for any other type."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadStream(f"{key} is a {type(v).__name__}, not an object")
    return v


def _count(d: dict, key: str) -> int | None:
    """``d[key]`` as a token count (None when absent or null); BadStream for a string, a fraction,
    a negative or an impossible count."""
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX_COUNT:
        raise BadStream(f"{key} is {str(v)[:40]!r}, not a token count")
    return v


def _seconds(d: dict, key: str) -> float | None:
    """``d[key]`` as a finite, non-negative time (None when absent or null); BadStream otherwise."""
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise BadStream(f"{key} is {str(v)[:40]!r}, not a time")
    return float(v)


# the OpenAI-compatible APIs: completions (the prompt as text) and chat (the prompt as the user's turn,
# through the model's chat template: what a chat product sends); their streams read alike
OPENAI_APIS = ("openai", "chat")


def _role_only(event: dict) -> bool:
    """A chat stream's chunk that only opens the assistant's turn (its role, no text, not the end):
    it carries no token, so it neither starts the clock of the first token nor counts as one."""
    choice = event["choices"][0] if isinstance(event["choices"], list) else None
    if not isinstance(choice, dict) or choice.get("finish_reason"):
        return False
    delta = choice.get("delta")
    return isinstance(delta, dict) and "role" in delta and not delta.get("content")


@dataclass(slots=True)
class RequestResult:
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    itl_ms_median: float | None = None
    server_e2e_s: float | None = None  # the server's own e2e_latency, when it reports one
    client_lag_ms: float | None = None  # request on the wire -> handler + last chunk written -> stamped (sim only)
    send_ms: float | None = None  # the client's work before the request was on the wire (outside the figures)
    t0: float = field(default=0.0, repr=False)  # perf_counter() when the clock started (this process only)
    itls: list[float] = field(default_factory=list, repr=False)  # every inter-token gap (ms), for pooled ITL
    chunks: int = 0
    client_cpu_s: float = 0.0

    @property
    def decode_tok_s(self) -> float | None:
        if not self.ok or not self.completion_tokens or self.completion_tokens < 2:
            return None
        span = (self.e2e_s or 0) - (self.ttft_s or 0)
        return (self.completion_tokens - 1) / span if span > 0 else None

    @property
    def accept_len(self) -> float | None:
        if self.spec_verify_ct and self.completion_tokens:
            return self.completion_tokens / self.spec_verify_ct
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["t0"], d["itls"]
        d["decode_tok_s"] = self.decode_tok_s
        d["accept_len"] = self.accept_len
        return d


@dataclass
class BenchConfig:
    url: str
    requests: int = 10
    warmup: int = 2
    max_tokens: int = 500
    concurrency: int = 1
    api: str = "native"  # native | openai | auto (asked of the server: detect_api)
    timeout_s: float | None = None  # per request; default from max_tokens
    connect_timeout_s: float = 10.0
    label: str = ""
    model: str | None = None  # OpenAI API model name; None: the first of /v1/models
    workload: Workload | None = None  # the prompts (None: tuitune's built-in twelve)

    @property
    def prompts(self) -> Workload:
        return self.workload or builtin_workload()

    def for_item(self, i: int) -> tuple[BenchConfig, str]:
        """(this config for the workload's ``i``-th request, its prompt): the output length the
        data gives, where it gives one."""
        it = self.prompts.item(i)
        return (self if it.max_tokens is None else replace(self, max_tokens=it.max_tokens)), it.prompt

    def request_timeout(self) -> float:
        """The whole request's bound: ``timeout_s``, else one a slow server that is still streaming
        does not reach: half a second a token for one stream, times the streams (``concurrency``
        requests share the server, so each may be that many times slower), 30 s at least. A stream
        that stalls is caught sooner, by the read timeout (no byte for 60 s). (Before, the bound
        ignored the streams: on the CPU engine, EAGLE-3 K=5 at four streams decoded 2.4 tokens a
        second a stream and half its 96-token requests "timed out after 48 s" while streaming.)"""
        return self.timeout_s or max(30.0, self.max_tokens * 0.5 * max(1, self.concurrency))

    @classmethod
    def for_preset(cls, url: str, preset, overrides: dict | None = None, label: str = "") -> BenchConfig:
        """The preset's bench settings, with command-line overrides (requests, warmup, …) on top."""
        b = {**preset.bench.model_dump(), **(overrides or {})}
        return cls(
            url,
            requests=b["requests"],
            warmup=b["warmup"],
            max_tokens=b["max_tokens"],
            concurrency=b["concurrency"],
            api=b["api"],
            label=label or preset.name,
            model=preset.engine.served_model(preset),
            workload=workload_for(preset, b),
        ).at_level(b["concurrency"])

    def at_level(self, concurrency: int) -> BenchConfig:
        """This config at another concurrency: at least two requests per stream, so that every
        stream is measured in the steady state and not only while the batch fills."""
        if concurrency <= 1:
            return replace(self, concurrency=1)
        return replace(self, concurrency=concurrency, requests=max(self.requests, 2 * concurrency))


def stream_goodput(pairs, concurrency: int) -> float:
    """Goodput from (tokens, latency) pairs: each of ``concurrency`` streams sends its requests
    back to back, so a stream produces Σ tokens / Σ latency and the streams together that many
    times over. Unlike tokens ÷ wall time, the tail where the last requests run alone (a smaller
    batch) does not count."""
    return concurrency * sum(t for t, _ in pairs) / sum(e for _, e in pairs)


@dataclass
class BenchRun:
    config: BenchConfig
    results: list[RequestResult] = field(default_factory=list)
    server: dict = field(default_factory=dict)  # cross-check figures from /server_info
    started: float = 0.0
    wall_s: float = 0.0
    measured_s: float = 0.0  # wall time of the measured requests alone (warm-up excluded)
    cycle_ms: float | None = None  # mean cycle of the profile windows the server logged meanwhile
    batch_sizes: list[int] = field(default_factory=list)  # #running-req of the server's decode lines meanwhile
    sim_late_share: float | None = None  # simulator only: share of its cycles that started late meanwhile
    sim_lag_share: float | None = None  # simulator only: share of its busy wall time it spent behind its clock
    env_drift: list[str] | None = None  # variables the server's real environment lacked vs its preset (None: unknown)
    gpu_note: str | None = None  # GPUs capped or a straggler meanwhile (telemetry.RunWatch)

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if not r.ok)

    def tok_s(self) -> list[float]:
        return [r.decode_tok_s for r in self.ok if r.decode_tok_s is not None]

    def goodput_pairs(self) -> list[tuple[int, float]]:
        """(completion tokens, latency) of every successful request: what goodput is made of."""
        return [(r.completion_tokens, r.e2e_s) for r in self.ok if r.completion_tokens and r.e2e_s]

    def goodput(self) -> dict | None:
        """Output tok/s of all streams together, with a 95 % bootstrap CI over requests."""
        pairs = self.goodput_pairs()
        if not pairs:
            return None
        c = min(self.config.concurrency, len(self.results))
        lo, hi = stats.bootstrap_ci(pairs, lambda sample: stream_goodput(sample, c))
        tokens = sum(t for t, _ in pairs)
        return {
            "tok_s": stream_goodput(pairs, c),
            "ci95": [lo, hi],
            "tokens": tokens,
            "wall_tok_s": tokens / self.measured_s if self.measured_s > 0 else None,
        }

    def summary(self) -> dict:
        vals = self.tok_s()
        s = summarize(vals)
        out: dict = {
            "label": self.config.label,
            "concurrency": self.config.concurrency,
            "requests": len(self.results),
            "failed": self.failed,
            "errors": sorted({r.error for r in self.results if r.error}),
        }
        if s:
            lo, hi = stats.bootstrap_median_ci(vals)
            srt = sorted(vals)
            out["tok_s"] = {**s.as_dict(), "p99": quantile(srt, 0.99), "ci95": [lo, hi]}
        gp = self.goodput()
        if gp:
            out["goodput"] = gp
        for name, vs in (
            ("ttft_ms", [r.ttft_s * 1000 for r in self.ok if r.ttft_s is not None]),
            ("e2e_s", [r.e2e_s for r in self.ok if r.e2e_s is not None]),
            ("itl_ms", [g for r in self.ok for g in r.itls]),  # every gap, pooled
            ("accept_len", [r.accept_len for r in self.ok if r.accept_len is not None]),
            ("batch_size", self.batch_sizes),
        ):
            ss = summarize(vs)
            if ss:
                out[name] = {**ss.as_dict(), "p99": quantile(sorted(vs), 0.99)}
        out["workload"] = self.config.prompts.as_dict()
        out["server"] = self.server
        out["warnings"] = self.cross_check()
        if self.gpu_note:
            out["gpu_note"] = self.gpu_note
            out["warnings"].append(f"measured while GPUs were held back: {self.gpu_note}")
        return out

    def sim_behind(self) -> str | None:
        """How far a simulator fell behind its clock during the run, when too far to read its figures as
        its model's (None: it kept up, or no simulator). The share of its busy wall time that was lag
        says how much slower the figures came out; where the simulator does not report its busy time,
        the share of cycles that started late says only that it slipped."""
        if self.sim_lag_share is not None:
            if self.sim_lag_share > SIM_LAG_LIMIT:
                return f"its figures {self.sim_lag_share:.0%} below its model's: that share of its busy time was lag"
            return None
        if self.sim_late_share is not None and self.sim_late_share > SIM_LATE_LIMIT:
            return f"{self.sim_late_share:.0%} of its cycles started late"
        return None

    def median_tok_s(self) -> float:
        vals = self.tok_s()
        return quantile(sorted(vals), 0.5) if vals else math.nan

    def cross_check(self) -> list[str]:
        """Client figures against the server's own, when they measure the same thing (>10 % apart =
        warning). Throughput is not compared: the server's last_gen_throughput is its last log
        interval, which on a short run also counts idle time and other clients' requests, so the
        two disagree without anything being wrong (the "server says" line still shows it)."""
        out = []
        if behind := self.sim_behind():
            out.append(
                f"the simulator fell behind its clock ({behind}): this machine cannot serve "
                f"{self.config.concurrency} streams at this --sim-speedup, so the figures are too slow; "
                "lower --sim-speedup"
            )
        acc = [r.accept_len for r in self.ok if r.accept_len]
        srv_acc = self.server.get("avg_spec_accept_length")
        if acc and srv_acc:
            mine = sum(acc) / len(acc)
            if abs(srv_acc - mine) / mine > 0.10:
                out.append(
                    f"client accept length {mine:.2f} and server avg_spec_accept_length "
                    f"{srv_acc:.2f} differ by {abs(srv_acc - mine) / mine:.0%}"
                )
        return out

    def to_dict(self) -> dict:
        return {
            "config": asdict(self.config),
            "summary": self.summary(),
            "results": [r.to_dict() for r in self.results],
            "started": self.started,
            "wall_s": self.wall_s,
            "measured_s": self.measured_s,
        }


class _Sent:
    """Filled by the trace signal: when the request's last byte was handed to the socket."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0


def client_session(**kw):
    """An aiohttp session whose requests report when they are on the wire (see the module doc)."""
    import aiohttp

    async def sent(_session, ctx, _params) -> None:
        if isinstance(ctx.trace_request_ctx, _Sent):
            ctx.trace_request_ctx.t = time.perf_counter()

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(sent)
    trace.on_request_chunk_sent.append(sent)  # the body follows the headers: the last one wins
    return aiohttp.ClientSession(trace_configs=[trace], **kw)


_JSON_HEADERS = {"Content-Type": "application/json"}
# the endpoint each API streams from (both POST only)
API_PATHS = {"native": "/generate", "openai": "/v1/completions"}


class BenchError(TuituneError, ValueError):
    """A benchmark that cannot start as asked; the message is one sentence."""

    code = 2


async def detect_api(session, url: str, timeout: float = 5.0) -> str | None:
    """Which API the server at ``url`` speaks, asked without generating anything: a GET on a
    POST-only route answers 405 where the route exists and 404 where it does not (FastAPI, as
    SGLang and vLLM serve, and aiohttp alike). SGLang serves both and is benchmarked through its
    native API (its per-request speculative counts); vLLM has no ``/generate``. None when the
    server cannot be reached (the requests then say why); BenchError when neither route is there."""
    import aiohttp

    seen: dict[str, int] = {}
    for api, path in API_PATHS.items():
        try:
            async with session.get(url.rstrip("/") + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                seen[api] = resp.status
        except (TimeoutError, aiohttp.ClientError):
            return None
    for api in API_PATHS:
        if seen[api] in (200, 405, 422):  # 422: a framework that validates a GET's missing body
            return api
    raise BenchError(
        f"{url} serves neither /generate (HTTP {seen['native']}) nor /v1/completions (HTTP {seen['openai']}): "
        "pass --api native for SGLang's native API or --api openai for an OpenAI-compatible server"
    )


def _payload(api: str, prompt: str, max_tokens: int, model: str | None = None) -> tuple[str, dict]:
    if api in OPENAI_APIS:
        sampling = {
            "model": model or "default",
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        if api == "chat":  # the prompt as the user's turn, through the model's chat template
            return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **sampling}
        return "/v1/completions", {"prompt": prompt, **sampling}
    return "/generate", {
        "text": prompt,
        "stream": True,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    }


async def run_request(session, cfg: BenchConfig, prompt: str) -> RequestResult:  # noqa: C901, PLR0915
    import aiohttp

    path, body = _payload(cfg.api, prompt, cfg.max_tokens, cfg.model)
    data = json.dumps(body).encode()
    res = RequestResult(ok=False)
    sent = _Sent()
    start = time.perf_counter()
    start_wall = time.time()
    cpu0 = time.process_time()
    last_t = None
    last_tokens = 0
    itls: list[float] = []
    final: dict | None = None
    final_recv_wall = 0.0
    cancels = cancelling()
    try:
        timeout = aiohttp.ClientTimeout(
            total=cfg.request_timeout(), sock_connect=cfg.connect_timeout_s, sock_read=min(60.0, cfg.request_timeout())
        )
        async with session.post(
            cfg.url.rstrip("/") + path, data=data, headers=_JSON_HEADERS, timeout=timeout, trace_request_ctx=sent
        ) as resp:
            if sent.t:  # the clock starts when the request is on the wire
                res.send_ms = (sent.t - start) * 1000
                start_wall += sent.t - start
                start = sent.t
            res.t0 = start
            if resp.status != 200:
                text = (await resp.content.read(200)).decode("utf-8", "replace").strip()  # no more: it may not end
                res.error = f"HTTP {resp.status}" + (f": {text}" if text else "")
                return res
            most = 4 * cfg.max_tokens + 64  # a server that counts more tokens than this was not asked for them
            buf = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()  # every event completed by these bytes arrived now
                buf += chunk
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        if len(buf) > MAX_EVENT:  # a stream that never separates its events: bounded
                            raise BadStream(f"a stream event runs past {MAX_EVENT >> 20} MiB without its end")
                        break
                    event, buf = buf[:cut], buf[cut + 2 :]
                    if not event.startswith(b"data:"):
                        continue
                    payload = event[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    if cfg.api in OPENAI_APIS:
                        # Every chunk with a choice carries tokens, an empty text included (the detokenizer
                        # holds back bytes of a character that is not whole yet); the usage block comes in a
                        # chunk of its own without one (vLLM), or with the last (others). Leaving out the
                        # empty ones ended the decode span early: 3 % above vLLM's own request_decode_time
                        # on the real CPU engine (docs/real-engine.md).
                        event_json = _event(payload)
                        if event_json.get("usage"):
                            final = event_json
                            if (_count(_part(final, "usage"), "completion_tokens") or 0) > most:
                                raise BadStream(f"usage.completion_tokens is over {most}, more than asked for")
                        if not event_json.get("choices") or _role_only(event_json):
                            continue
                        if last_t is None:
                            res.ttft_s = now - start
                        last_t = now
                        res.chunks += 1
                        continue
                    m = _COMPLETION.search(payload)
                    last = b'"finish_reason": null' not in payload and b'"finish_reason":null' not in payload
                    if last and (m is not None or b'"finish_reason"' in payload):
                        final = _event(payload)  # read whole: its counts are checked below
                        final_recv_wall = time.time() - (time.perf_counter() - now)
                    if m is None:
                        continue
                    tokens = int(m.group(1))
                    if tokens > most:
                        raise BadStream(f"completion_tokens is over {most}, more than asked for")
                    n = tokens - last_tokens
                    if n <= 0:
                        continue
                    res.chunks += 1
                    if last_t is None:
                        res.ttft_s = now - start
                    else:
                        itls.append((now - last_t) * 1000 / n)
                    last_t = now
                    last_tokens = tokens
        res.e2e_s = (last_t or time.perf_counter()) - start
        if cfg.api in OPENAI_APIS:
            res.completion_tokens = _count(_part(final or {}, "usage"), "completion_tokens")
            if res.completion_tokens is None:
                res.error = "stream ended without usage (completion tokens unknown)"
                return res
            if res.completion_tokens > 1 and res.ttft_s is not None:
                # chunk sizes are unknown here: spread the decode span evenly over the tokens
                itls = [(res.e2e_s - res.ttft_s) * 1000 / (res.completion_tokens - 1)]
        else:
            meta = _part(final or {}, "meta_info")
            res.completion_tokens = (
                _count(meta, "completion_tokens") if "completion_tokens" in meta else last_tokens or None
            )
            if (res.completion_tokens or 0) > most:
                raise BadStream(f"completion_tokens is over {most}, more than asked for")
            res.spec_verify_ct = _count(meta, "spec_verify_ct") or None
            if res.spec_verify_ct and res.spec_verify_ct > (res.completion_tokens or 0):
                raise BadStream(f"spec_verify_ct {res.spec_verify_ct} is more than the tokens it verified")
            res.server_e2e_s = _seconds(meta, "e2e_latency")
            received, sent_wall = _seconds(meta, "sim_received_wall"), _seconds(meta, "sim_sent_wall")
            if received and sent_wall:
                # request: client start -> handler; last chunk: written -> timestamped by the client
                res.client_lag_ms = ((received - start_wall) + (final_recv_wall - sent_wall)) * 1000
            if final is None:
                res.error = "stream ended before the last chunk (connection dropped?)"
                return res
        if itls:
            itls.sort()
            res.itl_ms_median = quantile(itls, 0.5)
            res.itls = itls
        res.ok = bool(res.completion_tokens)
        if not res.ok:
            res.error = "no tokens generated"
    except TimeoutError:
        res.error = f"timed out after {cfg.request_timeout():.0f} s"
    except aiohttp.ClientConnectorError as e:
        res.error = f"cannot connect: {e.os_error.strerror if e.os_error else e}"
    except aiohttp.ServerDisconnectedError:
        res.error = "server disconnected (not ready yet, or it went away)"
    except aiohttp.ClientPayloadError:
        res.error = "connection dropped mid-stream"
    except aiohttp.ClientError as e:
        res.error = f"{type(e).__name__}: {e}"
    except ValueError as e:  # BadStream and what else the server's bytes made of a value
        res.error = f"bad response: {e}"
    finally:
        res.client_cpu_s = time.process_time() - cpu0
    if cancelled_since(cancels):  # a cancel that became one of the errors above is still a cancel
        raise asyncio.CancelledError
    return res


async def fetch_server_info(session, url: str, timeout: float = 5.0) -> dict:
    """last_gen_throughput, avg_spec_accept_length, step_time_dict, version; {} if unavailable."""
    import aiohttp

    from tuitune import engines

    for path in engines.INFO_PATHS:  # SGLang's /server_info (older: /get_server_info), vLLM's /version
        try:
            async with session.get(url.rstrip("/") + path, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    continue
                info = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            continue
        if not isinstance(info, dict):
            continue
        return _server_info(info)
    return {}


def limit_confound(limits: dict[str, list], concurrency: int) -> tuple[bool, str] | None:
    """Arms that ran with different concurrency limits (label -> the ``max_running_requests`` each of
    its runs' servers reported, None where unknown): None when they ran with one limit (or none is
    known); else (confounded, one sentence). Confounded when the benchmark's ``concurrency`` is above
    the lowest limit: that arm could not run every stream at once, so a difference is partly the
    limit's (SGLang resets it to 48 whenever speculation is on, GPU or CPU)."""
    known = {arm: sorted({v for v in vals if isinstance(v, int)}) for arm, vals in limits.items()}
    seen = {v for vs in known.values() for v in vs}
    if len(seen) < 2:
        return None
    named = ", ".join(f"{arm} {'/'.join(map(str, vs)) or '?'}" for arm, vs in known.items())
    low = min(seen)
    if concurrency > low:
        return True, (
            f"the arms ran with different max_running_requests ({named}) and concurrency {concurrency} is above "
            f"{low}: the arm held to {low} could not run every stream at once; pin server.args."
            f"max-running-requests to one value in both"
        )
    return (
        False,
        f"the arms ran with different max_running_requests ({named}), not reached at concurrency {concurrency}",
    )


def _server_info(info: dict) -> dict:
    """What a server's own figures say, each kept only when it is of the type and range it must be
    (a hostile or broken server's wrong types and non-finite numbers are left out, never shown)."""
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    out: dict = {k: float(state[k]) for k in ("last_gen_throughput", "avg_spec_accept_length") if _figure(state.get(k))}
    steps_by = state.get("step_time_dict")
    if isinstance(steps_by, dict):
        steps = [x for v in steps_by.values() if isinstance(v, list) for x in v if _figure(x)]
        if steps:
            out["step_time_ms_median"] = quantile(sorted(steps), 0.5) * 1000
    if isinstance(info.get("version"), str) and info["version"]:
        out["version"] = info["version"][:200]
    # the requests the scheduler runs at once: SGLang resets it to 48 when speculating (GPU or CPU), a
    # confound for any comparison with speculation off at higher concurrency (experiments check it)
    limit = state.get("effective_max_running_requests_per_dp", info.get("max_running_requests"))
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < 10**9:
        out["max_running_requests"] = limit
    sim = info.get("sim")
    if isinstance(sim, dict) and all(_figure(sim.get(k, 1)) or sim.get(k) == 0 for k in ("cycles", "cycles_late")):
        out["sim"] = sim
    return out


def _figure(v: object) -> bool:
    """A finite, positive number (not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


async def served_model(session, url: str, timeout: float = 5.0) -> str | None:
    """The first model id of /v1/models (vLLM refuses requests for any other name); None if unknown."""
    import aiohttp

    try:
        async with session.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else {}
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    models = data.get("data") if isinstance(data, dict) else None
    first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
    return first.get("id") if isinstance(first.get("id"), str) else None


async def run_bench(
    cfg: BenchConfig,
    on_result: Callable[[int, RequestResult], Awaitable[None] | None] | None = None,
    stop: asyncio.Event | None = None,
) -> BenchRun:
    """Warm-up requests (discarded), then ``requests`` measured ones at ``concurrency``.

    Above concurrency 1 the warm-up is one wave of ``concurrency`` short requests, so that the
    server has run this batch size (its CUDA graph, its KV blocks) before the clock starts.

    The requests run on their own thread and event loop (the clock's loop), so that nothing else
    of the calling program stamps their chunks late: a session's loop also tails the log, scrapes
    /metrics and spawns its liveness checks, and a fork waits for its child to exec; on a loaded
    machine (2 cores, other work) that loop stalled 0.3-2.9 s at a time, a whole 128-token stream
    then arrived in one read, first and last token at the same instant, and the request had no
    decode rate. ``on_result`` runs on the caller's loop; ``stop`` is read at each request; a
    cancelled caller cancels the requests."""
    loop = asyncio.get_running_loop()
    delivered: list[concurrent.futures.Future] = []  # appended on the clock's thread, read after it ended

    def deliver(i: int, r: RequestResult) -> None:  # on the clock's thread
        if on_result is None:
            return

        async def call() -> None:
            maybe = on_result(i, r)
            if asyncio.iscoroutine(maybe):
                await maybe

        delivered.append(asyncio.run_coroutine_threadsafe(call(), loop))

    clock = _ClockThread(_run_bench(cfg, deliver, stop))
    try:
        run = await asyncio.shield(clock.future)
    except asyncio.CancelledError:
        clock.cancel()
        await asyncio.wait([clock.future], timeout=10)
        raise
    finally:
        done = await asyncio.gather(*(asyncio.wrap_future(f) for f in delivered), return_exceptions=True)
    for e in done:
        if isinstance(e, BaseException):
            raise e  # on_result's own error, as when it ran inline
    return run


class _ClockThread:
    """One coroutine run to completion on a thread of its own with its own event loop; its result
    (or exception) in ``future``, awaitable from the caller's loop."""

    def __init__(self, coro) -> None:
        import threading

        self.loop = asyncio.new_event_loop()
        self.task: asyncio.Task | None = None
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        caller = asyncio.get_running_loop()
        started = threading.Event()

        def settle(result=None, error: BaseException | None = None) -> None:
            if self.future.done():
                return
            if isinstance(error, asyncio.CancelledError):
                self.future.cancel()
            elif error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(coro)
            started.set()
            outcome: tuple = (None, None)
            try:
                outcome = (self.loop.run_until_complete(self.task), None)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's loop as it is
                outcome = (None, e if not isinstance(e, asyncio.CancelledError) else asyncio.CancelledError())
            finally:
                try:
                    caller.call_soon_threadsafe(settle, *outcome)
                except RuntimeError:  # the caller's loop is gone (its program is exiting): nobody waits
                    pass
                try:
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                finally:
                    self.loop.close()

        self.thread = threading.Thread(target=main, name="tuitune-bench-clock", daemon=True)
        self.thread.start()
        started.wait()

    def cancel(self) -> None:
        if self.task is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:  # the loop closed meanwhile: nothing left to cancel
                pass


async def _run_bench(
    cfg: BenchConfig,
    on_result: Callable[[int, RequestResult], None],
    stop: asyncio.Event | None,
) -> BenchRun:
    """run_bench's requests, on the clock's loop."""
    import aiohttp

    run = BenchRun(cfg, started=time.time())
    t0 = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=max(4, cfg.concurrency * 2), force_close=False)
    async with client_session(connector=connector) as session:
        if cfg.api == "auto":
            cfg.api = await detect_api(session, cfg.url) or "native"  # unreachable: the requests say so
        if cfg.api in OPENAI_APIS and cfg.model is None:
            cfg.model = await served_model(session, cfg.url)
        if cfg.warmup and cfg.concurrency > 1:
            wave = replace(cfg, max_tokens=min(cfg.max_tokens, 64))
            warm = await asyncio.gather(
                *(
                    run_request(session, wave, cfg.prompts.item(i).prompt)
                    for i in range(max(cfg.warmup, cfg.concurrency))
                )
            )
        else:
            warm = []
            for i in range(cfg.warmup):
                warm.append(await run_request(session, *cfg.for_item(i)))
                last = warm[-1]
                if not last.ok and last.error and last.error.startswith(("cannot connect", "server disconnected")):
                    break
        down = [
            r for r in warm if not r.ok and r.error and r.error.startswith(("cannot connect", "server disconnected"))
        ]
        if down:
            run.results.append(down[0])  # server not up: fail fast instead of timing out each request
            run.wall_s = time.perf_counter() - t0
            return run
        # the simulator's own counters before the measured requests (a real server has none)
        before = ((await fetch_server_info(session, cfg.url)).get("sim") or {}) if cfg.concurrency > 1 else {}
        t_measured = time.perf_counter()
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(cfg.requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty() and not (stop and stop.is_set()):
                i = queue.get_nowait()
                r = await run_request(session, *cfg.for_item(cfg.warmup + i))
                run.results.append(r)
                on_result(i, r)

        await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, cfg.requests))))
        run.measured_s = time.perf_counter() - t_measured
        run.server = await fetch_server_info(session, cfg.url)
        after = run.server.get("sim") or {}
        if (
            all(k in d for d in (before, after) for k in ("cycles", "cycles_late"))
            and after["cycles"] > before["cycles"]
        ):
            run.sim_late_share = (after["cycles_late"] - before["cycles_late"]) / (after["cycles"] - before["cycles"])
        if all(_figure(d.get(k)) or d.get(k) == 0 for d in (before, after) for k in BUSY):
            model_s, wall_s = (after[k] - before[k] for k in BUSY)
            if wall_s > 0 and model_s >= 0:
                run.sim_lag_share = max(0.0, 1.0 - model_s / wall_s)
    run.wall_s = time.perf_counter() - t0
    return run


BUSY = ("model_busy_s", "wall_busy_s")  # the simulator's modelled and wall-clock busy time (/server_info)


def level_row(s: dict) -> dict:
    """One concurrency level of a summary, flattened for the curve table and JSON."""

    def pick(key: str, stat: str):
        return (s.get(key) or {}).get(stat)

    gp = s.get("goodput") or {}
    return {
        "concurrency": s.get("concurrency", 1),
        "goodput": gp.get("tok_s"),
        "goodput_ci95": gp.get("ci95"),
        "decode_tok_s": pick("tok_s", "median"),
        "ttft_ms_p50": pick("ttft_ms", "median"),
        "ttft_ms_p99": pick("ttft_ms", "p99"),
        "itl_ms_p50": pick("itl_ms", "median"),
        "itl_ms_p99": pick("itl_ms", "p99"),
        "accept_len": pick("accept_len", "mean"),
        "batch_size": pick("batch_size", "mean"),
        "requests": s["requests"],
        "failed": s["failed"],
    }


def _num(v, spec: str) -> str:
    """``format(v, spec)``, or a dash as wide and aligned as the number would be."""
    if v is not None:
        return format(v, spec)
    width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
    return format("—", ("<" if spec.startswith("<") else ">") + str(width))


def format_levels(summaries: list[dict]) -> str:
    """The goodput curve: one line per concurrency level."""
    head = (
        f"{'conc':>5} {'goodput tok/s':>14} {'95% CI':>17} {'per-req tok/s':>13} {'TTFT p50/p99 ms':>16} "
        f"{'ITL p50/p99 ms':>15} {'accept':>6} {'batch':>6} {'ok':>8}"
    )
    lines = [head]
    for s in summaries:
        r = level_row(s)
        ci = r["goodput_ci95"] or [None, None]
        lines.append(
            f"{r['concurrency']:>5} {_num(r['goodput'], '14.1f')} "
            f"{_num(ci[0], '8.1f')}-{_num(ci[1], '<8.1f')} {_num(r['decode_tok_s'], '13.1f')} "
            f"{_num(r['ttft_ms_p50'], '7.0f')}/{_num(r['ttft_ms_p99'], '<8.0f')} "
            f"{_num(r['itl_ms_p50'], '7.2f')}/{_num(r['itl_ms_p99'], '<7.2f')} "
            f"{_num(r['accept_len'], '6.2f')} {_num(r['batch_size'], '6.1f')} "
            f"{r['requests'] - r['failed']:>4}/{r['requests']:<3}"
        )
    for s in summaries:
        for e in s.get("errors", []):
            lines.append(f"  concurrency {s.get('concurrency', 1)}: error: {e}")
    lines.append(
        "goodput: output tok/s of all streams together; batch: mean #running-req in the server's log (— without one)"
    )
    if summaries and summaries[0].get("workload"):
        lines.append(f"workload: {describe_workload(summaries[0]['workload'])}")
    return "\n".join(lines)


def format_summary(s: dict) -> str:
    lines = []
    tok = s.get("tok_s")
    label = f"{s['label']}: " if s.get("label") else ""
    if tok:
        lo, hi = tok["ci95"]
        lines.append(
            f"{label}decode {tok['median']:.1f} tok/s median (95% CI {lo:.1f}-{hi:.1f}), "
            f"mean {tok['mean']:.1f}, p90 {tok['p90']:.1f}, min {tok['min']:.1f}, max {tok['max']:.1f}"
        )
    else:
        lines.append(f"{label}no successful request")
    extra = []
    gp = s.get("goodput")
    if gp and s.get("concurrency", 1) > 1:
        extra.append(
            f"goodput {gp['tok_s']:.1f} tok/s at concurrency {s['concurrency']} "
            f"(95% CI {gp['ci95'][0]:.1f}-{gp['ci95'][1]:.1f})"
        )
    if s.get("batch_size"):
        extra.append(f"batch {s['batch_size']['mean']:.1f}")
    if s.get("ttft_ms"):
        extra.append(f"TTFT {s['ttft_ms']['median']:.0f} ms")
    if s.get("itl_ms"):
        extra.append(f"ITL {s['itl_ms']['median']:.2f} ms")
    if s.get("accept_len"):
        extra.append(f"accept length {s['accept_len']['mean']:.2f}")
    extra.append(f"{s['requests'] - s['failed']}/{s['requests']} ok")
    lines.append("  " + ", ".join(extra))
    srv = s.get("server") or {}
    if srv.get("last_gen_throughput") or srv.get("avg_spec_accept_length"):
        bits = []
        if srv.get("last_gen_throughput"):
            bits.append(f"gen throughput {srv['last_gen_throughput']:.1f} tok/s")
        if srv.get("avg_spec_accept_length"):
            bits.append(f"accept length {srv['avg_spec_accept_length']:.2f}")
        if srv.get("step_time_ms_median"):
            bits.append(f"step {srv['step_time_ms_median']:.2f} ms")
        lines.append("  server says: " + ", ".join(bits))
    if s.get("workload"):
        lines.append(f"  workload: {describe_workload(s['workload'])}")
    for e in s.get("errors", []):
        lines.append(f"  error: {e}")
    for w in s.get("warnings", []):
        lines.append(f"  warning: {w}")
    return "\n".join(lines)
