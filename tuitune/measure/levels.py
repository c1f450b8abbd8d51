"""Benchmarking a server at several load levels (concurrencies) in turn: the goodput curve.

One routine for every caller: `tuitune bench --concurrency 1,4,16`, crossover (each launch of an
arm), tune (each configuration's launch) and the TUI's B key. What a caller benchmarks through is
a ``Bencher``: a session (the preset's server, its log followed) or a bare URL (``UrlBencher``).
Each level runs the bencher's own configuration at that concurrency, with at least two requests
per stream (``BenchConfig.at_level``); ``plan_levels`` says beforehand what each level will run
(the request counts a progress display needs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from tuitune.measure.bench import run_bench
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.benchrun import BenchRun
from tuitune.measure.request import RequestResult
from tuitune.measure.workload import load as load_workload

MAX_LEVEL = 1024  # the most concurrent request streams a level (and bench.concurrency) may ask for

OnResult = Callable[[int, RequestResult], Awaitable[None] | None]


def is_level(c: object) -> bool:
    """A concurrency level: an integer from 1 to MAX_LEVEL."""
    return isinstance(c, int) and 1 <= c <= MAX_LEVEL


def parse_levels(text: str) -> list[int]:
    """``1,4,16,64`` -> [1, 4, 16, 64]: distinct levels, in the order given (ValueError if not)."""
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or not all(map(is_level, levels)) or len(set(levels)) != len(levels):
        raise ValueError(text)
    return levels


class Bencher(Protocol):
    """What benchmarks one level: ``Session`` (tuitune.machine.session) and ``UrlBencher``."""

    def bench_config(self, overrides: dict | None = None, label: str = "") -> BenchConfig: ...

    async def bench(self, label: str = "", on_result: OnResult | None = None, **overrides) -> BenchRun: ...


class UrlBencher:
    """A server known only by its URL: the benchmark's defaults, with the caller's overrides on top."""

    def __init__(self, url: str):
        self.url = url
        self.api = "auto"  # without --api: asked of the server once, then kept for every level

    def bench_config(self, overrides: dict | None = None, label: str = "") -> BenchConfig:
        ov = {"api": self.api, **(overrides or {})}
        path = ov.pop("prompts", None)
        cfg = BenchConfig(self.url, label=label, workload=load_workload(path) if path else None, **ov)
        return cfg.at_level(cfg.concurrency)

    async def bench(self, label: str = "", on_result: OnResult | None = None, **overrides) -> BenchRun:
        cfg = self.bench_config(overrides, label)
        run = await run_bench(cfg, on_result)
        self.api = cfg.api  # what the server answered to (run_bench settles "auto")
        return run


def _level_overrides(overrides: dict | None, level: int | None) -> dict:
    return {**(overrides or {}), **({"concurrency": level} if level is not None else {})}


def plan_levels(
    bencher: Bencher,
    levels: Sequence[int | None],
    overrides: dict | None = None,
    label: str | Callable[[int | None], str] = "",
) -> list[BenchConfig]:
    """The configuration each level will run (None: the bencher's own concurrency)."""
    return [
        bencher.bench_config(_level_overrides(overrides, c), label(c) if callable(label) else label) for c in levels
    ]


async def bench_levels(
    bencher: Bencher,
    levels: Sequence[int | None],
    overrides: dict | None = None,
    label: str | Callable[[int | None], str] = "",
    on_level: Callable[[BenchConfig], OnResult | None] | None = None,
    on_run: Callable[[BenchConfig, BenchRun], None] | None = None,
) -> list[BenchRun]:
    """Benchmark each level in turn, one run each, in the order given. ``overrides`` (requests,
    warmup, max_tokens, api) apply to every level; ``label`` names each run (or is called with
    its level). ``on_level`` is told what a level is about to run and may return that level's
    per-request callback; ``on_run`` gets each level's run as soon as it is done."""
    runs = []
    for c, cfg in zip(levels, plan_levels(bencher, levels, overrides, label), strict=True):
        on_result = on_level(cfg) if on_level is not None else None
        run = await bencher.bench(cfg.label, on_result, **_level_overrides(overrides, c))
        runs.append(run)
        if on_run is not None:
            on_run(cfg, run)
    return runs
