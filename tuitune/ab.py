"""Interleaved A/B: relaunch and bench A, B, A, B … and decide with the launch as the unit.

Why the launch: NCCL variables and speculative settings are read once at process start, and a
launch brings its own placement, clocks and graph capture. Requests of one launch share all of
that, so they are not independent samples of the configuration; treating them as such makes tiny
launch-to-launch differences look significant. Each launch therefore contributes one number (its
median decode tok/s), and A and B alternate so that drift over time (thermal, other tenants)
hits both arms alike. GPU telemetry runs for the whole comparison: a launch measured while clocks
were capped or a GPU straggled, beside launches measured without, makes the verdict "not comparable".
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable

from . import stats, telemetry
from .bench import BenchConfig, run_bench
from .control import ServerControl
from .preset import Preset
from .transport import Transport


async def bench_launch(t: Transport, p: Preset, overrides: dict, timeout_s: float,
                       listeners: list | None = None) -> dict:
    """Relaunch ``p``, bench it, return one launch's row (``listeners``: where telemetry is handed)."""
    control = ServerControl(t, p)
    rec, ready = await control.relaunch(timeout_s)
    port = await t.forward_port(p.server.port)
    watch = telemetry.RunWatch()
    if listeners is not None:
        listeners.append(watch.feed)
    try:
        run = await run_bench(BenchConfig.for_preset(t.url(port), p, overrides))
    finally:
        if listeners is not None:
            listeners.remove(watch.feed)
    s = run.summary()
    tok = s.get("tok_s") or {}
    return {"preset": p.name, "hash": p.hash(), "pid": rec.pid, "ready_s": ready.elapsed_s,
            "median_tok_s": tok.get("median", math.nan), "ci95": tok.get("ci95"),
            "accept_len": (s.get("accept_len") or {}).get("mean"), "requests": s["requests"],
            "failed": s["failed"], "errors": s["errors"], "server": s.get("server"), "time": time.time(),
            "gpu_note": watch.note()}


def verdict(launches: list[dict], a: str, b: str, min_effect: float) -> dict:
    bad = [x for x in launches if x["failed"]]
    if bad:
        return {"verdict": "not comparable",
                "reason": f"{len(bad)} launch(es) had failed requests ({bad[0]['preset']}: "
                          f"{', '.join(bad[0]['errors'])})"}
    held = [x for x in launches if x.get("gpu_note")]
    if held and len(held) < len(launches):
        x = held[0]
        return {"verdict": "not comparable",
                "reason": f"GPUs were held back during {len(held)} of {len(launches)} launches "
                          f"({x['preset']}, round {x.get('round', '?')}: {x['gpu_note']})"}
    va = [x["median_tok_s"] for x in launches if x["preset"] == a]
    vb = [x["median_tok_s"] for x in launches if x["preset"] == b]
    return stats.compare(va, vb, min_effect)


async def run_ab(t: Transport, a: Preset, b: Preset, rounds: int, overrides: dict, min_effect: float = 0.01,
                 timeout_s: float = 900.0, progress: Callable[[str], None] | None = None,
                 stop_at_end: bool = True) -> dict:
    launches = []
    listeners: list = []
    gpus = (telemetry.Collector(t, telemetry.for_preset(a), lambda evs: [f(evs) for f in list(listeners)],
                                a.telemetry.period_ms) if a.telemetry.enabled else None)
    task = asyncio.ensure_future(gpus.run()) if gpus else None
    try:
        for r in range(1, rounds + 1):
            for p in (a, b):
                if progress:
                    progress(f"round {r}/{rounds}: launching {p.name}")
                row = await bench_launch(t, p, overrides, timeout_s, listeners)
                row["round"] = r
                launches.append(row)
                if progress:
                    progress(f"  {p.name}: {row['median_tok_s']:.2f} tok/s median"
                             + (f", {row['failed']} failed" if row["failed"] else "")
                             + (f", GPUs held back: {row['gpu_note']}" if row["gpu_note"] else ""))
    finally:
        await telemetry.stop(gpus, task)
    if stop_at_end:
        await ServerControl(t, b).stop()
    return {"a": a.name, "b": b.name, "rounds": rounds, "launches": launches,
            "verdict": verdict(launches, a.name, b.name, min_effect)}


def format_ab(result: dict) -> str:
    lines = [f"{'round':>5}  {'preset':<32} {'tok/s':>9} {'95% CI':>17} {'accept':>7} {'failed':>6}"]
    for x in result["launches"]:
        ci = x.get("ci95") or [math.nan, math.nan]
        acc = f"{x['accept_len']:.2f}" if x.get("accept_len") else "-"
        lines.append(f"{x['round']:>5}  {x['preset']:<32} {x['median_tok_s']:>9.2f} "
                     f"{ci[0]:>8.2f}-{ci[1]:<8.2f} {acc:>7} {x['failed']:>6}"
                     + (f"  ⚠ GPUs: {x['gpu_note']}" if x.get("gpu_note") else ""))
    v = result["verdict"]
    if v["verdict"] == "not comparable":
        lines.append(f"\nverdict: not comparable: {v['reason']}")
        return "\n".join(lines)
    lo, hi = v["ratio_ci"]
    lines.append(f"\nmedians of launch medians: {result['a']} {v['baseline_median']:.2f}, "
                 f"{result['b']} {v['candidate_median']:.2f} tok/s")
    lines.append(f"ratio {result['b']}/{result['a']} = {v['ratio']:.4f} (95% CI {lo:.4f}-{hi:.4f}), "
                 f"Mann-Whitney p = {v['p_value']:.3f} over {v['n_baseline']}+{v['n_candidate']} launches")
    lines.append(f"verdict: {result['b']} is {v['verdict']}" if v["verdict"] != "no significant difference"
                 else f"verdict: no significant difference (minimum effect {v['min_effect']:.0%})")
    return "\n".join(lines)
