"""One streamed request against SGLang's native or OpenAI API, and its timing.

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

The request loop, its clock and the SSE byte reader are one measurement and stay in this one module,
so that the rules of what a request's clock includes live in one place (the load driver that runs
many of them is ``measure/bench.py``; a run's summary is ``measure/benchrun.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import asdict, dataclass, field

from tuitune.base.aio import cancelled_since, cancelling
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.metrics import quantile

_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d{1,15})(?![\d.eE])')
MAX_EVENT = 4 << 20  # bytes of one stream event (a native chunk's cumulative text at 32k tokens is ~200 KB)
_MAX_COUNT = 1 << 40  # a token count above this is no server's
# fewer chunks than this and a stream's span is not its decode time: the first chunk's arrival to the
# last's, where the server held the output back and sent it whole (or in two pieces), is milliseconds or
# nothing; vLLM's CPU API server did so for some outputs on a busy machine (docs/benchmarks.md)
MIN_RATE_CHUNKS = 3


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
    chunks: int | None = None  # stream events that carried tokens (None: not read from a stream)
    client_cpu_s: float = 0.0

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the span from the first chunk to the last, or None where that span
        says nothing: an output the server delivered in fewer than ``MIN_RATE_CHUNKS`` chunks (buffered,
        then sent whole or nearly) has a span of milliseconds, or none, whatever the engine's speed."""
        if not self.ok or not self.completion_tokens or self.completion_tokens < 2 or self.sent_whole:
            return None
        span = (self.e2e_s or 0) - (self.ttft_s or 0)
        return (self.completion_tokens - 1) / span if span > 0 else None

    @property
    def sent_whole(self) -> bool:
        """An output of several tokens that arrived in fewer than ``MIN_RATE_CHUNKS`` chunks (no decode rate)."""
        return self.chunks is not None and self.chunks < MIN_RATE_CHUNKS and (self.completion_tokens or 0) > 1

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
    chunks = 0  # events that carried tokens: res.chunks once the stream ends
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
                        chunks += 1
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
                    chunks += 1
                    if last_t is None:
                        res.ttft_s = now - start
                    else:
                        itls.append((now - last_t) * 1000 / n)
                    last_t = now
                    last_tokens = tokens
        res.e2e_s = (last_t or time.perf_counter()) - start
        res.chunks = chunks
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
