"""What a benchmark is asked to run: the server, the API, the prompts, how many requests at which
concurrency, and each request's bound."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuitune.measure.workload import Workload
from tuitune.measure.workload import builtin as builtin_workload
from tuitune.measure.workload import for_preset as workload_for


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
