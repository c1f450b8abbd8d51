"""A benchmark's run: its requests' results, the figures derived from them (per-request decode rate,
goodput with its interval, latency percentiles) and the checks of those figures against the server's
own and the simulator's clock."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from tuitune.measure import stats
from tuitune.measure.benchconfig import BenchConfig
from tuitune.measure.metrics import quantile, summarize
from tuitune.measure.request import MIN_RATE_CHUNKS, RequestResult

SIM_LATE_LIMIT = 0.10  # above this share of late cycles a simulator's figures are not its model's
# above this share of its busy wall time spent behind its own clock, a simulator's figures are that much
# slower than its model's (1 - model_busy/wall_busy over the run): a slip that a tuned choice can rest on
SIM_LAG_LIMIT = 0.10


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
        whole = [r for r in self.ok if r.sent_whole]
        if whole:
            out.append(
                f"{len(whole)} of {len(self.ok)} outputs arrived in fewer than {MIN_RATE_CHUNKS} chunks (the server "
                "held them back, then sent them in one or two pieces): they give no decode rate, "
                + ("so there is none" if len(whole) == len(self.ok) else "the median is over the others")
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
