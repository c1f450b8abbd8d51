"""Metrics store: bounded time series per metric, summaries, memory flat however long it runs.

A ``Series`` keeps at most ``capacity`` points (count window) and, when ``max_age_s`` is set,
drops points older than that (time window). Appends are O(1) amortised: a ``deque`` with
``maxlen`` for the count bound, popleft for the time bound. Summaries sort a copy on demand
(windows are small: hundreds to a few thousand points).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tuitune.base.events import DecodeStats, Event, GpuSample, MetricsWindow, ProfileWindow, VllmSpec
from tuitune.measure.sources import SecondSource


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    mean: float
    median: float
    p90: float
    min: float
    max: float
    last: float

    def as_dict(self) -> dict:
        return {
            "n": self.n,
            "mean": self.mean,
            "median": self.median,
            "p90": self.p90,
            "min": self.min,
            "max": self.max,
            "last": self.last,
        }


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted list (q in [0, 1])."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Iterable[float]) -> Summary | None:
    vals = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not vals:
        return None
    s = sorted(vals)
    return Summary(len(s), sum(s) / len(s), quantile(s, 0.5), quantile(s, 0.9), s[0], s[-1], vals[-1])


class Series:
    __slots__ = ("name", "unit", "capacity", "max_age_s", "_t", "_v", "lo", "hi", "appended")

    def __init__(
        self,
        name: str,
        unit: str = "",
        capacity: int = 600,
        max_age_s: float | None = None,
        lo: float | None = None,
        hi: float | None = None,
    ):
        self.name = name
        self.unit = unit
        self.capacity = capacity
        self.max_age_s = max_age_s
        self._t: deque[float] = deque(maxlen=capacity)
        self._v: deque[float] = deque(maxlen=capacity)
        self.lo, self.hi = lo, hi  # fixed display range (None = from the data)
        self.appended = 0  # values ever appended (``since``: those of an interval, by count not clock)

    def append(self, value: float, t: float | None = None) -> None:
        if not math.isfinite(value):
            return
        t = time.monotonic() if t is None else t
        self._t.append(t)
        self._v.append(value)
        self.appended += 1
        if self.max_age_s is not None:
            cutoff = t - self.max_age_s
            while self._t and self._t[0] < cutoff:
                self._t.popleft()
                self._v.popleft()

    def __len__(self) -> int:
        return len(self._v)

    def values(self) -> list[float]:
        return list(self._v)

    def last(self) -> float | None:
        return self._v[-1] if self._v else None

    def since(self, appended: int) -> list[float]:
        """The values appended after ``appended`` (an earlier ``self.appended``) still held."""
        n = min(len(self._v), self.appended - appended)
        return list(self._v)[-n:] if n > 0 else []

    def summary(self, last_n: int | None = None) -> Summary | None:
        vals = self.values()
        return summarize(vals[-last_n:] if last_n else vals)

    def display_range(self) -> tuple[float, float]:
        """Fixed y-range when configured, else the data's, never empty."""
        vals = self._v
        lo = self.lo if self.lo is not None else (min(vals) if vals else 0.0)
        hi = self.hi if self.hi is not None else (max(vals) if vals else 1.0)
        if hi <= lo:
            hi = lo + 1.0
        return lo, hi

    def clear(self) -> None:
        self._t.clear()
        self._v.clear()


SERIES = {  # name: (unit, fixed display range)
    "draft_ms": ("ms", None),
    "verify_ms": ("ms", None),
    "extend_ms": ("ms", None),
    "cycle_ms": ("ms", None),
    "accept_len": ("tok/cycle", (1.0, None)),
    "tok_s": ("tok/s", (0.0, None)),
    "gen_throughput": ("tok/s", (0.0, None)),
    "decode_accept_len": ("tok/cycle", (1.0, None)),
}


GPU_SERIES = {
    "util": (0.0, 100.0),
    "power": (0.0, None),
    "mem_used": (0.0, None),
    "sm_clock": (0.0, None),
    "temp": (None, None),
}


class GpuHistory:
    """One GPU: its last sample and bounded series of the figures the panel and the flags read."""

    def __init__(self, index: int, capacity: int):
        self.index = index
        self.last: GpuSample | None = None
        self.series = {k: Series(k, "", capacity, None, lo, hi) for k, (lo, hi) in GPU_SERIES.items()}

    def feed(self, ev: GpuSample, t: float | None) -> None:
        self.last = ev
        for k, s in self.series.items():
            v = getattr(ev, k)
            if v is not None:
                s.append(float(v), t)


class GpuStore:
    """Telemetry per GPU, keyed by index; ``seq`` is the last tick seen (a GPU absent from it is stale)."""

    def __init__(self, capacity: int = 240):
        self.capacity = capacity
        self.gpus: dict[int, GpuHistory] = {}
        self.seq = -1
        self.samples = 0

    def feed(self, ev: GpuSample, t: float | None = None) -> None:
        g = self.gpus.get(ev.index)
        if g is None:
            g = self.gpus[ev.index] = GpuHistory(ev.index, self.capacity)
            self.gpus = dict(sorted(self.gpus.items()))
        g.feed(ev, t)
        self.seq = max(self.seq, ev.seq)
        self.samples += 1

    def current(self) -> list[GpuHistory]:
        """GPUs that answered in the last tick, by index."""
        return [g for g in self.gpus.values() if g.last is not None and g.last.seq == self.seq]

    def clear(self) -> None:
        self.gpus.clear()
        self.seq = -1


class MetricsStore:
    """One bounded series per metric, fed by events."""

    def __init__(self, capacity: int = 600, max_age_s: float | None = None):
        self.series: dict[str, Series] = {
            name: Series(name, unit, capacity, max_age_s, *(rng or (None, None)))
            for name, (unit, rng) in SERIES.items()
        }
        self.profile_windows = 0
        self.decode_lines = 0
        self.malformed = 0
        self.last_profile: ProfileWindow | None = None
        self.last_decode: DecodeStats | None = None
        self.last_per_position: tuple[float, ...] | None = None  # acceptance by draft position (vLLM)
        self.spec_lines = 0  # vLLM SpecDecoding lines seen
        self.gpus = GpuStore()
        # the probe's windows against SGLang's own counters over the last minutes (tuitune.measure.sources)
        self.sources = SecondSource(keep=240)

    def __getitem__(self, name: str) -> Series:
        return self.series[name]

    def feed(self, ev: Event, t: float | None = None) -> None:
        if isinstance(ev, ProfileWindow | MetricsWindow):
            self.sources.feed(ev, time.monotonic() if t is None else t)
        if isinstance(ev, ProfileWindow):
            self.profile_windows += 1
            self.last_profile = ev
            s = self.series
            s["draft_ms"].append(ev.draft_ms, t)
            s["verify_ms"].append(ev.verify_ms, t)
            s["extend_ms"].append(ev.extend_ms, t)
            s["cycle_ms"].append(ev.cycle_ms, t)
            s["accept_len"].append(ev.accept_len, t)
            s["tok_s"].append(ev.tok_s, t)
        elif isinstance(ev, DecodeStats):
            self.decode_lines += 1
            self.last_decode = ev
            self.series["gen_throughput"].append(ev.gen_throughput, t)
            if ev.accept_len is not None:
                self.series["decode_accept_len"].append(ev.accept_len, t)
        elif isinstance(ev, (VllmSpec, MetricsWindow)):
            # vLLM's acceptance: from its log lines, or from /metrics when it logs none
            # (--disable-log-stats); SGLang's gauges only repeat its decode lines
            if isinstance(ev, VllmSpec):
                self.spec_lines += 1
                accept = ev.mean_accept_len
            else:
                accept = ev.accept_len if ev.engine == "vllm" and not self.spec_lines else None
            if accept is not None:
                self.series["decode_accept_len"].append(accept, t)
            if ev.per_position:
                self.last_per_position = ev.per_position
        elif isinstance(ev, GpuSample):
            self.gpus.feed(ev, t)
        elif ev.kind == "malformed":
            self.malformed += 1

    def clear(self) -> None:
        for s in self.series.values():
            s.clear()
        self.gpus.clear()
        self.last_profile = None
        self.last_decode = None
        self.last_per_position = None
        self.spec_lines = 0
