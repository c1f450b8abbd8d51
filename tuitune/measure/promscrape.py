"""A server's Prometheus ``/metrics`` page -> windows of what changed between two scrapes.

The text format is read by prometheus_client's parser. vLLM exposes counters (FACTS.md §3):
a window turns their deltas into acceptance (per draft position too) and rates; a counter that
went down means the server restarted, and that window is skipped rather than reported negative.
SGLang (``--enable-metrics``) exposes gauges: a window reports their last values. Counters are
summed over label sets (data-parallel engines), gauges averaged.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuitune.base.events import MetricsWindow
from tuitune.engines import sglang as S
from tuitune.engines import vllm as V

# the metric names are the engines' (Engine.counters, gauges, per_position_metric)
SGLANG_GAUGES = S.SGLang.gauges
VLLM_COUNTERS = tuple(V.VLLM.counters)
VLLM_GAUGES = V.VLLM.gauges
# A real page is mostly histograms tuitune does not read; prometheus_client's parser is pure Python,
# so only the lines of the families read here are handed to it (a startswith test with C-level speed)
SGLANG_COUNTERS = S.COUNTERS
_NAMES = (
    *SGLANG_GAUGES,
    *S.STEP_GAUGES,
    *S.COUNTERS,
    S.FORWARD_SECONDS,
    *VLLM_COUNTERS,
    *VLLM_GAUGES,
    V.ACCEPTED_PER_POS,
)
_WANTED = tuple(p + n for n in _NAMES for p in ("", "# HELP ", "# TYPE "))


class MetricsError(ValueError):
    """A page that is not Prometheus text; the message is one sentence."""


@dataclass
class Snapshot:
    t: float
    counters: dict[str, float] = field(default_factory=dict)  # family name -> sum
    gauges: dict[str, float] = field(default_factory=dict)  # family name -> mean
    per_pos: dict[int, float] = field(default_factory=dict)  # position -> accepted tokens


def parse(text: str, t: float | None = None) -> Snapshot:
    from prometheus_client.parser import text_string_to_metric_families

    snap = Snapshot(time.monotonic() if t is None else t)
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_WANTED)) + "\n"
    try:
        for fam in text_string_to_metric_families(wanted):
            # without a TYPE line a counter's family keeps the sample's "_total" name
            name = fam.name.removesuffix("_total")
            totals = [s for s in fam.samples if s.name == name + "_total"]
            if name == V.ACCEPTED_PER_POS:
                for s in totals:
                    if s.labels.get("position", "").isdigit():
                        pos = int(s.labels["position"])
                        snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + s.value
            elif name in VLLM_COUNTERS or name + "_total" in SGLANG_COUNTERS:
                snap.counters[name + "_total" if name + "_total" in SGLANG_COUNTERS else name] = sum(
                    s.value for s in totals if math.isfinite(s.value)
                )
            elif name + "_total" == S.FORWARD_SECONDS:
                for s in totals:
                    key = S.FORWARD_CATEGORIES.get(s.labels.get("category", ""))
                    if key and math.isfinite(s.value):
                        snap.counters[key] = snap.counters.get(key, 0.0) + s.value
            elif name in VLLM_GAUGES or name in SGLANG_GAUGES or name in S.STEP_GAUGES:
                values = [s.value for s in fam.samples if math.isfinite(s.value)]
                if values:
                    snap.gauges[name] = sum(values) / len(values)
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsError(f"the /metrics page is not Prometheus text ({e})"[:300]) from None
    return snap


def window(prev: Snapshot, cur: Snapshot) -> MetricsWindow | None:
    """The window between two snapshots of one server; None when nothing known changed or the
    counters went backwards (a restart between the scrapes)."""
    seconds = cur.t - prev.t
    if seconds <= 0:
        return None
    if any(k in cur.counters for k in VLLM_COUNTERS) or VLLM_GAUGES.keys() & cur.gauges.keys():
        delta = {k: cur.counters.get(k, 0.0) - prev.counters.get(k, 0.0) for k in VLLM_COUNTERS}
        pos = {i: v - prev.per_pos.get(i, 0.0) for i, v in cur.per_pos.items()}
        if any(v < 0 for v in (*delta.values(), *pos.values())):
            return None
        kw: dict = {VLLM_GAUGES[k]: int(v) for k, v in cur.gauges.items() if k in VLLM_GAUGES}
        if V.GENERATION_TOKENS in cur.counters:
            kw["gen_tok_s"] = delta[V.GENERATION_TOKENS] / seconds
        drafts = delta[V.NUM_DRAFTS]
        if drafts > 0:
            kw.update(
                drafts=int(drafts),
                draft_tokens=int(delta[V.NUM_DRAFT_TOKENS]),
                accepted=int(delta[V.NUM_ACCEPTED]),
                accept_len=1 + delta[V.NUM_ACCEPTED] / drafts,
            )
            if delta[V.NUM_DRAFT_TOKENS] > 0:
                kw["accept_rate"] = delta[V.NUM_ACCEPTED] / delta[V.NUM_DRAFT_TOKENS]
            if pos:
                kw["per_position"] = tuple(pos[i] / drafts for i in sorted(pos))
        return MetricsWindow("vllm", seconds, **kw)
    kw = {}
    for name, key in (*SGLANG_GAUGES.items(), *S.STEP_GAUGES.items()):
        if name in cur.gauges:
            v = cur.gauges[name]
            kw[key] = int(v) if key.endswith("_req") else v
    delta = {k: cur.counters[k] - prev.counters[k] for k in cur.counters if k in prev.counters}
    if any(v < 0 for v in delta.values()):
        return None  # a restart between the scrapes
    for name, key in SGLANG_COUNTERS.items():
        if name in delta:
            kw[key] = int(delta[name])
    for key in S.FORWARD_CATEGORIES.values():
        if key in delta:
            kw[key] = delta[key]
    if kw.get("verify_calls") and kw.get("gen_tokens"):
        kw["accept_len"] = kw["gen_tokens"] / kw["verify_calls"]  # SGLang's own definition (meta_info's)
    return MetricsWindow("sglang", seconds, **kw) if kw else None


class Scraper:
    """Windows of one server's successive pages."""

    def __init__(self):
        self.prev: Snapshot | None = None

    def feed(self, text: str, t: float | None = None) -> MetricsWindow | None:
        cur = parse(text, t)
        prev, self.prev = self.prev, cur
        return window(prev, cur) if prev is not None else None


async def fetch(session, url: str, timeout: float = 5.0) -> str | None:
    """The /metrics page, or None when the server serves none (SGLang without --enable-metrics)."""
    import aiohttp

    async with session.get(url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        if r.status == 404:
            return None
        r.raise_for_status()
        return await r.text()


async def watch(url: Callable[[], str | None], publish: Callable[[list], None], interval: float = 2.0) -> None:
    """Scrape every ``interval`` seconds while ``url()`` names a ready server; publish each window.
    A server without /metrics is asked again only after it changed (a relaunch gives a new URL)."""
    import aiohttp

    scraper, no_metrics_at = Scraper(), None
    async with aiohttp.ClientSession() as session:
        while True:
            await asyncio.sleep(interval)
            u = url()
            if u is None or u == no_metrics_at:
                scraper.prev = None
                continue
            try:
                text = await fetch(session, u)
                if text is None:
                    no_metrics_at = u
                    continue
                w = scraper.feed(text)
            except (TimeoutError, aiohttp.ClientError, MetricsError, OSError):
                scraper.prev = None  # a gap: the next window starts afresh
                continue
            if w is not None:
                publish([w])
