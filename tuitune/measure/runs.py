"""The runs table's model: benchmark runs, the baseline, its staleness, deltas with significance.

Inside the TUI a run is one benchmark against one launch, so its delta against the baseline is a
request-level comparison (a quick check); `tuitune ab`, with launches as the unit, is the
rigorous one. The baseline goes stale when its own conditions do not hold: the server it was
measured on did not have its preset's environment (the seeds' failure: NCCL variables lost after
a restart), or it is old. A candidate that differs from it is not a reason (that difference is
the comparison). A run with failed requests never becomes the baseline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from tuitune import preset as P
from tuitune.base import redact
from tuitune.measure import stats, workload


@dataclass
class Run:
    id: int
    label: str
    preset: P.Preset
    values: list[float]  # per-request decode tok/s
    summary: dict
    cycle_ms: float | None = None  # mean cycle time of the profile windows seen during the run
    started: float = field(default_factory=time.time)
    env_drift: list[str] | None = None  # env variables its server lacked vs its preset (None: unknown)
    gpu_note: str | None = None  # GPUs capped or a straggler during the run (telemetry.RunWatch)
    levels: list[dict] = field(default_factory=list)  # bench.level_row per concurrency, for a curve

    @property
    def concurrency(self) -> int:
        return self.summary.get("concurrency", 1)

    @property
    def concurrency_text(self) -> str:
        if len(self.levels) > 1:
            return f"{self.levels[0]['concurrency']}–{self.levels[-1]['concurrency']}"
        return str(self.concurrency)

    @property
    def median(self) -> float:
        tok = self.summary.get("tok_s") or {}
        return tok.get("median", math.nan)

    @property
    def ci(self) -> tuple[float, float]:
        tok = self.summary.get("tok_s") or {}
        lo, hi = tok.get("ci95", [math.nan, math.nan])
        return lo, hi

    @property
    def accept_len(self) -> float | None:
        return (self.summary.get("accept_len") or {}).get("mean")

    @property
    def failed(self) -> int:
        return self.summary.get("failed", 0)


class RunBook:
    def __init__(self, max_age_s: float = 1800.0, min_effect: float = 0.01):
        self.runs: list[Run] = []
        self.baseline_id: int | None = None
        self.max_age_s = max_age_s
        self.min_effect = min_effect

    def add(  # noqa: PLR0913
        self,
        label: str,
        preset: P.Preset,
        values: list[float],
        summary: dict,
        cycle_ms: float | None = None,
        started: float | None = None,
        env_drift: list[str] | None = None,
        gpu_note: str | None = None,
        levels: list[dict] | None = None,
    ) -> Run:
        run = Run(
            len(self.runs) + 1,
            label,
            preset,
            list(values),
            summary,
            cycle_ms,
            started if started is not None else time.time(),
            env_drift,
            gpu_note,
            list(levels or []),
        )
        self.runs.append(run)
        if self.baseline_id is None and not run.failed and values:
            self.baseline_id = run.id  # the first sound run is the baseline until one is marked
        return run

    def get(self, run_id: int) -> Run | None:
        return next((r for r in self.runs if r.id == run_id), None)

    @property
    def baseline(self) -> Run | None:
        return self.get(self.baseline_id) if self.baseline_id is not None else None

    def mark_baseline(self, run_id: int) -> None:
        """Raises KeyError for an unknown run, ValueError (one sentence) for a failed one."""
        run = self.get(run_id)
        if run is None:
            raise KeyError(run_id)
        if run.failed or not run.values:
            raise ValueError(f"run #{run_id} had failed requests and cannot be the baseline")
        self.baseline_id = run_id

    def stale_reason(self, now: float | None = None) -> str | None:
        """Why the baseline can no longer be trusted, or None."""
        base = self.baseline
        if base is None:
            return None
        now = time.time() if now is None else now
        if base.env_drift:
            return f"its server did not have its preset's environment ({', '.join(sorted(base.env_drift))})"
        age = now - base.started
        if age > self.max_age_s:
            return f"measured {age / 60:.0f} min ago (older than {self.max_age_s / 60:.0f} min)"
        return None

    def config_summary(self, run: Run) -> str:
        """What differs from the baseline's configuration, compactly; a run measured under a live hold
        (its label's "· live K n", docs/switch.md) says so."""
        live = run.label.partition(" · ")[2]
        text = self._config_summary(run)
        return f"{text} · {live}" if live and live not in text else text

    def _config_summary(self, run: Run) -> str:
        base = self.baseline
        if base is None or base.id == run.id:
            return "baseline" if base is not None and base.id == run.id else run.label
        changes = [c for c in P.diff(base.preset, run.preset, include_bench=False) if c[0] != "server.log"]
        parts = []
        env_on = [k.split(".", 1)[1] for k, a, b in changes if k.startswith("env.") and a is None]
        env_off = [k.split(".", 1)[1] for k, a, b in changes if k.startswith("env.") and b is None]
        for names, verb in ((env_on, "set"), (env_off, "unset")):
            if len(names) > 2:  # a whole group of variables: say so instead of listing them
                parts.append(f"{len(names)} env vars {verb}")
        for key, a, b in changes:
            short = key.split(".")[-1]
            if key.startswith("env.") and ((a is None and len(env_on) > 2) or (b is None and len(env_off) > 2)):
                continue
            if key == "speculative.num_draft_tokens" and any(k == "speculative.num_steps" for k, _, _ in changes):
                continue  # follows from the steps
            a, b, _ = redact.pair(key, a, b)
            parts.append(f"{short} {'unset' if a is None else a}→{'unset' if b is None else b}")
        return ", ".join(parts) if parts else "same config"

    def delta(self, run: Run) -> dict | None:
        """Ratio to the baseline with a significance verdict (None for the baseline itself)."""
        base = self.baseline
        if base is None or base.id == run.id:
            return None
        if base.failed or run.failed:
            return {"verdict": "not comparable", "ratio": math.nan}
        if base.concurrency != run.concurrency:  # per-request speed falls as the batch grows
            return {
                "verdict": "not comparable",
                "ratio": math.nan,
                "why": f"concurrency {run.concurrency} vs the baseline's {base.concurrency}",
            }
        other = workload.differ(run.summary.get("workload"), base.summary.get("workload"))
        if other:  # acceptance, and so speed, is the prompts': another workload is another question
            return {"verdict": "not comparable", "ratio": math.nan, "why": f"{other} (the baseline's)"}
        if (base.gpu_note is None) != (run.gpu_note is None):
            # one was measured with GPUs held back (capped clocks, a straggler), the other not
            return {
                "verdict": "not comparable",
                "ratio": math.nan,
                "why": f"GPUs during run #{(run if run.gpu_note else base).id}: {run.gpu_note or base.gpu_note}",
            }
        return stats.compare(base.values, run.values, self.min_effect)


def delta_mark(delta: dict | None) -> str:
    """A short text for the table: +5.9% ▲ (significant), +0.4% ≈ (not)."""
    if delta is None:
        return "—"
    if delta["verdict"] == "not comparable":
        return "n/c"
    pct = (delta["ratio"] - 1) * 100
    mark = {"faster": "▲", "slower": "▼"}.get(delta["verdict"], "≈")
    return f"{pct:+.1f}% {mark}"
