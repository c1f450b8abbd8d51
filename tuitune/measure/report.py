"""`tuitune report`: summary tables and terminal charts of captures, side by side with deltas.

Captures are streamed (never loaded whole): one pass collects the series that the summary needs.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from tuitune.base.events import (
    BenchSummary,
    DecodeStats,
    GpuSample,
    Marker,
    MetricsWindow,
    ProfileWindow,
    ServerError,
    ServerState,
)
from tuitune.measure.capture import iter_capture, partial
from tuitune.measure.metrics import summarize
from tuitune.measure.smi import capping
from tuitune.measure.sources import SecondSource
from tuitune.measure.workload import describe as describe_workload
from tuitune.measure.workload import differ as workload_differ

PHASES = ("draft_ms", "verify_ms", "extend_ms", "cycle_ms")
ROWS = (*PHASES, "accept_len", "tok_s", "gen_throughput")
GPU_MEANS = ("util", "power", "sm_clock", "temp", "mem_used")


class GpuMeans:
    """Per-GPU sums over a capture's telemetry: means, and the share of samples with capped clocks."""

    def __init__(self) -> None:
        self.gpus: dict[int, dict] = {}

    def feed(self, ev: GpuSample) -> None:
        g = self.gpus.setdefault(ev.index, {"n": 0, "capped": 0, "kinds": set(), **{k: [0.0, 0] for k in GPU_MEANS}})
        g["n"] += 1
        for k in GPU_MEANS:
            v = getattr(ev, k)
            if v is not None:
                g[k][0] += v
                g[k][1] += 1
        kind = capping(ev.reasons)
        if kind:
            g["capped"] += 1
            g["kinds"].add(kind)

    def result(self) -> dict[str, dict]:
        return {
            str(i): {
                "samples": g["n"],
                **{k: (g[k][0] / g[k][1] if g[k][1] else None) for k in GPU_MEANS},
                "capped_share": g["capped"] / g["n"],
                "capping": sorted(g["kinds"]),
            }
            for i, g in sorted(self.gpus.items())
        }


def _name(preset) -> str | None:
    name = preset.get("name") if isinstance(preset, dict) else None
    return name if isinstance(name, str) else None


def summarize_capture(path: str | Path, keep_series: bool = True) -> dict:
    meta, records, stats = iter_capture(path)
    series: dict[str, list[float]] = {k: [] for k in ROWS}
    times: list[float] = []
    errors: list[str] = []
    relaunches = 0
    events = 0
    gpus = GpuMeans()
    runs: list[dict] = []
    first_m = last_m = None
    second = SecondSource()
    for rec in records:
        events += 1
        ev = rec.event
        first_m = rec.m if first_m is None else first_m
        last_m = rec.m
        if isinstance(ev, ProfileWindow | MetricsWindow):
            second.feed(ev, rec.m)
        if isinstance(ev, ProfileWindow):
            for k in PHASES:
                series[k].append(getattr(ev, k))
            series["accept_len"].append(ev.accept_len)
            series["tok_s"].append(ev.tok_s)
            times.append(rec.m)
        elif isinstance(ev, DecodeStats):
            series["gen_throughput"].append(ev.gen_throughput)
        elif isinstance(ev, GpuSample):
            gpus.feed(ev)
        elif isinstance(ev, BenchSummary):
            runs.append(
                {
                    "label": ev.label,
                    "tok_s_median": ev.tok_s_median,
                    "requests": ev.requests,
                    "failed": ev.failed,
                    "gpu_note": ev.gpu_note,
                }
            )
        elif isinstance(ev, ServerError):
            errors.append(f"{ev.category}: {ev.message}")
        elif isinstance(ev, Marker) and ev.text.startswith("relaunch"):
            relaunches += 1
        elif isinstance(ev, ServerState) and ev.state == "failed":
            errors.append(f"server failed: {ev.detail or ev.phase}")
    out = {
        "path": str(path),
        "preset": _name(meta.get("preset")),
        "preset_hash": meta.get("preset_hash"),
        "target": meta.get("target"),
        "server_version": meta.get("server_version"),
        "schema": meta.get("schema"),
        # the prompts tuitune sent meanwhile (--load, --bench); None: only the server's own traffic
        "workload": meta.get("workload") if isinstance(meta.get("workload"), dict) else None,
        "events": events,
        "duration_s": (last_m - first_m) if first_m is not None and last_m is not None else 0.0,
        "truncated": stats["truncated"],
        "skipped": stats["skipped"],
        "partial": partial(path, stats),  # a sentence when only part of it was read
        "note": stats["note"],
        "relaunches": relaunches,
        "errors": errors[:20],
        "error_count": len(errors),
        "stats": {k: (s.as_dict() if (s := summarize(v)) else None) for k, v in series.items()},
        "gpus": gpus.result(),
        "runs": runs,
        # the probe's figures against the engine's own counters (SGLang's /metrics), 10 % apart flagged
        "second_source": [f.to_dict() for f in second.figures()],
        "disagreements": second.disagreements(),
    }
    if keep_series:
        out["_series"] = {"m": times, "tok_s": series["tok_s"], "verify_ms": series["verify_ms"]}
    return out


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{digits}f}"


def format_report(reports: list[dict]) -> str:
    lines = []
    for i, r in enumerate(reports):
        lines.append(
            f"[{i + 1}] {r['path']}: {r['preset'] or '?'} on {r['target'] or '?'}"
            + (f", server {r['server_version']}" if r.get("server_version") else "")
            + f", {r['events']} events over {r['duration_s']:.0f} s, {r['relaunches']} relaunch(es), "
            f"{r['error_count']} error(s)"
            + (", last record truncated" if r["truncated"] else "")
            + (f", {r['skipped']} record(s) skipped (unknown kind or unreadable)" if r["skipped"] else "")
        )
        w = r.get("workload")
        lines.append(
            f"    workload: {describe_workload(w)}"
            if w
            else "    workload: the server's own traffic (tuitune sent none)"
        )
        for said in (r.get("partial"), r.get("note")):
            if said:
                lines.append(f"    warning: {said}")
        for e in r["errors"][:3]:
            lines.append(f"    error: {e}")
    sent = [r.get("workload") for r in reports]
    if len(reports) > 1 and (
        other := next((why for w in sent[1:] if (why := workload_differ(w, sent[0], traffic=True))), None)
    ):
        lines.append(f"warning: the captures ran different workloads ({other}): acceptance and speed are the prompts'")
    lines.append("")
    head = f"{'metric':<16}" + "".join(
        f" {f'[{i + 1}] mean':>11} {'median':>8} {'p90':>8}" for i in range(len(reports))
    )
    if len(reports) > 1:
        head += "".join(f" {f'Δ[{i + 1}]':>8}" for i in range(1, len(reports)))
    lines.append(head)
    for key in ROWS:
        stats = [r["stats"].get(key) for r in reports]
        if not any(stats):
            continue
        row = f"{key:<16}"
        for s in stats:
            row += (
                f" {_fmt(s['mean']):>11} {_fmt(s['median']):>8} {_fmt(s['p90']):>8}"
                if s
                else f" {'—':>11} {'—':>8} {'—':>8}"
            )
        base = stats[0]
        for s in stats[1:]:
            if base and s and base["median"]:
                row += f" {(s['median'] - base['median']) / base['median']:>+8.1%}"
            else:
                row += f" {'—':>8}"
        lines.append(row)
    for i, r in enumerate(reports):
        lines += format_runs(i + 1, r.get("runs") or []) + format_gpus(i + 1, r.get("gpus") or {})
        lines += format_second_source(i + 1, r.get("second_source") or [])
    return "\n".join(lines)


def format_second_source(n: int, figures: list[dict]) -> list[str]:
    """The probe's figures beside the server's own (tuitune.measure.sources)."""
    if not figures:
        return []
    out = ["", f"[{n}] the probe against the server's own counters (/metrics; over 10 % apart: DISAGREE)"]
    for f in figures:
        r = f["ratio"]
        rel = f" ({r - 1:+.1%})" if r is not None and f["compared"] else " (counts: windows not aligned)"
        mark = "  DISAGREE" if f["disagrees"] else ""
        out.append(f"    {f['figure']:<26} probe {f['probe']:>10.3f}   server {f['server']:>10.3f}{rel}{mark}")
    return out


def format_runs(n: int, runs: list[dict]) -> list[str]:
    """Benchmarks recorded in the capture; a run measured while GPUs were held back is marked."""
    if not runs:
        return []
    out = ["", f"[{n}] benchmark runs"]
    for r in runs:
        ok = f"{r['requests'] - r['failed']}/{r['requests']} ok"
        mark = f"  ⚠ GPUs: {r['gpu_note']}" if r.get("gpu_note") else ""
        out.append(f"    {r['label']:<28} {_fmt(r['tok_s_median'], 1):>8} tok/s  {ok}{mark}")
    return out


def format_gpus(n: int, gpus: dict) -> list[str]:
    """Per-GPU means of the recorded telemetry."""
    if not gpus:
        return []
    out = [
        "",
        f"[{n}] GPU means ({sum(g['samples'] for g in gpus.values())} samples)",
        f"    {'gpu':>3} {'util %':>7} {'power W':>8} {'SM MHz':>7} {'temp C':>7} {'mem GiB':>8}  capped",
    ]
    for i, g in gpus.items():
        mem = g["mem_used"] / 1024 if g["mem_used"] is not None else None
        cap = f"{g['capped_share']:.0%} ({', '.join(g['capping'])})" if g["capped_share"] else "—"
        out.append(
            f"    {i:>3} {_fmt(g['util'], 1):>7} {_fmt(g['power'], 0):>8} {_fmt(g['sm_clock'], 0):>7} "
            f"{_fmt(g['temp'], 0):>7} {_fmt(mem, 1):>8}  {cap}"
        )
    return out


def colour_wanted(stream=None) -> bool:
    """ANSI colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    stream = stream or sys.stdout
    return not os.environ.get("NO_COLOR") and hasattr(stream, "isatty") and stream.isatty()


def finish_chart(text: str, colour: bool) -> str:
    """A built plotext chart, its ANSI codes removed unless colour is wanted."""
    if colour:
        return text
    import plotext as plt

    return "\n".join(line.rstrip() for line in plt.uncolorize(text).splitlines())


def chart(reports: list[dict], width: int = 100, height: int = 18, colour: bool = True) -> str:
    """tok/s per profile window over the capture's time, one line per capture."""
    import plotext as plt

    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    drawn = False
    for i, r in enumerate(reports):
        s = r.get("_series") or {}
        if s.get("tok_s"):
            plt.plot(s["m"], s["tok_s"], label=f"[{i + 1}] {r['preset'] or ''}")
            drawn = True
    if not drawn:
        return "(no profile windows to chart)"
    plt.title("tok/s per profile window")
    plt.xlabel("seconds since the capture started")
    return finish_chart(plt.build(), colour)
