"""Two sources for one server's speculative figures: the probe's ``EAGLE3_PROFILE`` windows (timed inside
the worker) and the engine's own counters on ``/metrics`` (SGLang with ``--enable-metrics``), side by
side, each disagreement over 10 % flagged.

What SGLang counts (0.5.18, seen on its CPU build): request-verifies (``spec_verify_calls_total``) and
generated tokens, whose ratio is the accept length its requests' ``meta_info`` reports; the steps and
draft tokens it runs (gauges; NGRAM's steps read draft tokens // breadth there, so NGRAM is compared by
its draft tokens); and, with ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`` on a GPU, forward seconds by
category, whose verify share is compared with the probe's (the probe's verify also holds sampling and
acceptance, so the two need not be equal to the last percent).

Figures that do not depend on where two sources' windows start and end are compared (a ratio, a
share, a setting); the counts themselves (the probe's request-cycles against SGLang's verify calls) are
shown beside each other but not flagged, since the probe logs a window only every 40 cycles and the
scraper only every few seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tuitune.base.events import MetricsWindow, ProfileWindow

TOLERANCE = 0.10


@dataclass
class Figure:
    name: str
    probe: float
    server: float
    compared: bool = True  # False: shown only (counts over unaligned windows)

    @property
    def ratio(self) -> float | None:
        return self.probe / self.server if self.server else None

    @property
    def disagrees(self) -> bool:
        r = self.ratio
        return self.compared and r is not None and abs(r - 1) > TOLERANCE

    def to_dict(self) -> dict:
        return {
            "figure": self.name,
            "probe": round(self.probe, 4),
            "server": round(self.server, 4),
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "compared": self.compared,
            "disagrees": self.disagrees,
        }


class SecondSource:
    """Fed a server's events (profile windows and SGLang metrics windows) with the monotonic time each
    arrived; compares the probe's windows that lie within the span the metrics windows cover."""

    def __init__(self, keep: int | None = None) -> None:
        # ``keep``: the most recent windows of each kind (the TUI's: the last minutes); None keeps all
        self.windows: deque[tuple[float, ProfileWindow]] = deque(maxlen=keep)
        self.metrics: deque[tuple[float, MetricsWindow]] = deque(maxlen=keep and max(1, keep // 8))

    def feed(self, ev, at: float) -> None:
        if isinstance(ev, ProfileWindow):
            self.windows.append((at, ev))
        elif isinstance(ev, MetricsWindow) and ev.engine == "sglang":
            self.metrics.append((at, ev))

    def figures(self) -> list[Figure]:
        if not self.metrics:
            return []
        start = min(at - m.seconds for at, m in self.metrics)  # deques: the span they cover now
        end = max(at for at, _ in self.metrics)
        # a window's cycles ran in the cycles x cycle_ms before it arrived
        inside = [w for at, w in self.windows if at - w.cycles * w.cycle_ms / 1000 >= start and at <= end]
        request_cycles = accepted = 0.0
        phase = {"draft": 0.0, "verify": 0.0, "extend": 0.0}
        for w in inside:
            counts = w.accept_counts
            rc = sum(counts) if counts else w.cycles * max(1, w.bs or 1)
            request_cycles += rc
            accepted += w.accept_len * rc
            for k in phase:
                phase[k] += getattr(w, f"{k}_ms") * w.cycles
        verify_calls = sum(m.verify_calls or 0 for _, m in self.metrics)
        gen_tokens = sum(m.gen_tokens or 0 for _, m in self.metrics)
        forward = {k: sum(getattr(m, f"{k}_s") or 0.0 for _, m in self.metrics) for k in phase}
        out: list[Figure] = []
        if not request_cycles or not verify_calls:
            return out
        out.append(Figure("request-cycles / verifies", request_cycles, verify_calls, compared=False))
        if gen_tokens:
            out.append(Figure("accept length", accepted / request_cycles, gen_tokens / verify_calls))
        w = inside[-1]
        m = next((m for _, m in reversed(self.metrics) if m.num_steps is not None or m.num_draft_tokens), None)
        if m is not None:
            if w.drafter is None and w.steps is not None and m.num_steps:
                out.append(Figure("steps", w.steps, m.num_steps))
            elif w.draft_tokens is not None and m.num_draft_tokens:
                out.append(Figure("draft tokens", w.draft_tokens, m.num_draft_tokens))
        busy, probe_busy = sum(forward.values()), sum(phase.values())
        if busy > 0 and probe_busy > 0:
            out.append(Figure("verify share of forward", phase["verify"] / probe_busy, forward["verify"] / busy))
        return out

    def disagreements(self) -> list[str]:
        """One clause per disagreement over the tolerance."""
        return [
            f"{f.name}: the probe reads {f.probe:.3g}, the server {f.server:.3g} ({f.ratio - 1:+.0%})"
            for f in self.figures()
            if f.disagrees and f.ratio is not None
        ]
