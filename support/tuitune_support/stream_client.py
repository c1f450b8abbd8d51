"""An independent streaming client for the real-engine tests: plain http.client, nothing of tuitune.

    python -m tuitune_support.stream_client [--no-warmup] PORT MODEL MAX_TOKENS PROMPT [PROMPT ...]

sends the prompts one after the other (the first one a warm-up, not reported, unless --no-warmup) and
prints a JSON list of [decode tok/s, completion tokens, decode span in s], one a measured request. The tests run it as a process of its
own, as `tuitune bench` is, so that neither client shares its interpreter (threads, GIL) with the
test's fixtures. ``server_decode_clock`` reads vLLM's own decode clock from /metrics, the reference
both clients are held to (tests/real/test_real_vllm.py, benchmarks/bench_vs_server.py)."""

from __future__ import annotations

import http.client
import json
import sys
import time
import urllib.request


def independent_request(
    port: int, model: str, prompt: str, max_tokens: int, temperature: float = 0.0
) -> tuple[float | None, int, float]:
    """One streamed /v1/completions request: (decode tok/s, completion tokens, the span from the first
    token chunk to the last in seconds). Same formula as any
    decode rate: (completion_tokens - 1) / (last token chunk - first token chunk), the count from the
    server's usage block (the chunk that carries it has no choice)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    first = last = None
    usage = None
    while line := r.readline():
        now = time.perf_counter()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        d = json.loads(line[5:])
        usage = d.get("usage") or usage
        # every chunk with a choice carries tokens, an empty text included: the detokenizer holds
        # back text that is not yet whole (bytes of one character, spaces), and a stream that ends
        # in such tokens ended on chunks with no text (one prompt of six here: its rate read 25 %
        # high when those were left out)
        if d.get("choices"):
            first = first or now
            last = now
    c.close()
    n = usage["completion_tokens"]
    # a stream that arrived in one read has no decode rate (the server sent it at once)
    return ((n - 1) / (last - first) if last > first else None), n, last - first


def server_decode_clock(port: int) -> tuple[float, float]:
    """vLLM's own clock of what it decoded, read with prometheus_client (not tuitune's scraper): the
    tokens after each finished request's first (its generated tokens less one a request) and the
    seconds from each one's first token to its last (request_decode_time's sum), over all of them."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    tokens, requests, decode = (
        f"vllm:request_{x}" for x in ("generation_tokens_sum", "generation_tokens_count", "decode_time_seconds_sum")
    )
    got = dict.fromkeys((tokens, requests, decode), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in got:
                got[sample.name] += sample.value
    return got[tokens] - got[requests], got[decode]


def server_counters(port: int, prefix: str = "vllm:") -> dict[str, float]:
    """The server's own Prometheus counters (``*_total``), read with prometheus_client (not tuitune's
    scraper): each summed over its label sets, keyed without ``_total``; a counter labelled by draft
    position also per position, as ``name@position``."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not (sample.name.startswith(prefix) and sample.name.endswith("_total")):
                continue
            name = sample.name.removesuffix("_total")
            out[name] = out.get(name, 0.0) + sample.value
            if "position" in sample.labels:
                key = f"{name}@{sample.labels['position']}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


def main(argv: list[str]) -> None:
    warmup = argv[:1] != ["--no-warmup"]
    port, model, max_tokens, prompts = (
        int(argv[1 - warmup]),
        argv[2 - warmup],
        int(argv[3 - warmup]),
        argv[4 - warmup :],
    )
    if warmup:
        independent_request(port, model, prompts.pop(0), max_tokens)
    print(json.dumps([independent_request(port, model, p, max_tokens) for p in prompts]))


if __name__ == "__main__":
    main(sys.argv[1:])
