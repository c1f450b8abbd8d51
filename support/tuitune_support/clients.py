"""Independent clients of the real engines (no tuitune code in what they send or count): the
prompts they send, a single-stream load in a thread (vLLM's /v1/completions through
stream_client), SGLang's native /generate streamed, and a server log's events as tuitune reads them.
The real-engine tests and benchmarks share them."""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

from tuitune.measure.parse import parse_line
from tuitune_support.paths import ROOT
from tuitune_support.stream_client import independent_request

PROMPTS = json.loads((ROOT / "tuitune" / "data" / "prompts.json").read_text())


def log_events(log: Path, start: int = 0) -> list:
    text = log.read_bytes()[start:].decode("utf-8", "replace")
    return [e for e in (parse_line(line) for line in text.splitlines()) if e is not None]


class Load:
    """Single-stream requests from the independent client in a thread, until stopped (greedy, or
    sampled at ``temperature``)."""

    def __init__(self, port: int, model: str, max_tokens: int = 96, temperature: float = 0.0):
        self.port, self.model, self.max_tokens, self.temperature = port, model, max_tokens, temperature
        self.done = 0
        self.error = ""
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                prompt = PROMPTS[i % len(PROMPTS)]
                independent_request(self.port, self.model, prompt, self.max_tokens, self.temperature)
                self.done += 1
            except (OSError, RuntimeError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
                self.error = f"{type(e).__name__}: {e}"  # said when a test's wait for requests times out
                time.sleep(0.5)  # the server went away (a test killed it): keep trying until stopped
            i += 1

    def __enter__(self) -> Load:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(150)


def generate(port: int, prompt: str, max_tokens: int) -> dict:
    """One streamed /generate request: decode tok/s from the chunks' arrival, and the last chunk's
    ``meta_info`` (SGLang's own count of tokens and, speculating, its acceptance)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    c.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    times: list[float] = []
    meta: dict = {}
    while line := r.readline():
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        times.append(time.perf_counter())
        meta = json.loads(line[5:]).get("meta_info") or meta
    c.close()
    n = int(meta["completion_tokens"])
    # streamed by SGLang's stream interval: the rate over the whole span, first chunk to last, of the
    # tokens after the first chunk's
    rate = span = None
    if len(times) > 1 and times[-1] > times[0]:
        span = times[-1] - times[0]
        rate = (n - 1) / span
    return {"rate": rate, "span": span, "tokens": n, "meta": meta}
