"""A server's Prometheus ``/metrics`` page -> windows of what changed between two scrapes.

The text format is read by prometheus_client's parser. vLLM exposes counters (FACTS.md §3):
a window turns their deltas into acceptance (per draft position too) and rates; a counter that
went down means the server restarted, and that window is skipped rather than reported negative.
SGLang (``--enable-metrics``) exposes gauges: a window reports their last values. Counters are
summed over label sets (data-parallel engines), gauges averaged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuitune import engines
from tuitune.base.errors import TuituneError
from tuitune.base.events import MetricsWindow

# the metric names and what a window makes of them are the engines' (Engine.metric_families,
# read_metric, on_page, metrics_window). A real page is mostly histograms tuitune does not read;
# prometheus_client's parser is pure Python, so only the lines of the families read here are
# handed to it (a startswith test with C-level speed)
_NAMES = tuple(n for e in engines.ENGINES.values() for n in e.metric_families())
_WANTED = tuple(p + n for n in _NAMES for p in ("", "# HELP ", "# TYPE "))
# a page is told apart by its names; one holding several engines' (no server serves such a page)
# is read as the last registered engine's that it holds
_READERS = tuple(reversed(engines.ENGINES.values()))


class MetricsError(TuituneError, ValueError):
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
            for e in _READERS:
                if e.read_metric(snap, name, fam.samples):
                    break
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsError(f"the /metrics page is not Prometheus text ({e})"[:300]) from None
    return snap


def window(prev: Snapshot, cur: Snapshot) -> MetricsWindow | None:
    """The window between two snapshots of one server; None when nothing known changed or the
    counters went backwards (a restart between the scrapes)."""
    seconds = cur.t - prev.t
    if seconds <= 0:
        return None
    for e in _READERS:
        if e.on_page(cur):
            return e.metrics_window(prev, cur, seconds)
    return None


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
