"""A benchmark's summary as text: one run's lines, and the goodput curve over concurrency levels."""

from __future__ import annotations

from tuitune.measure.workload import describe as describe_workload


def level_row(s: dict) -> dict:
    """One concurrency level of a summary, flattened for the curve table and JSON."""

    def pick(key: str, stat: str):
        return (s.get(key) or {}).get(stat)

    gp = s.get("goodput") or {}
    return {
        "concurrency": s.get("concurrency", 1),
        "goodput": gp.get("tok_s"),
        "goodput_ci95": gp.get("ci95"),
        "decode_tok_s": pick("tok_s", "median"),
        "ttft_ms_p50": pick("ttft_ms", "median"),
        "ttft_ms_p99": pick("ttft_ms", "p99"),
        "itl_ms_p50": pick("itl_ms", "median"),
        "itl_ms_p99": pick("itl_ms", "p99"),
        "accept_len": pick("accept_len", "mean"),
        "batch_size": pick("batch_size", "mean"),
        "requests": s["requests"],
        "failed": s["failed"],
    }


def _num(v, spec: str) -> str:
    """``format(v, spec)``, or a dash as wide and aligned as the number would be."""
    if v is not None:
        return format(v, spec)
    width = int("".join(ch for ch in spec.split(".")[0] if ch.isdigit()) or 0)
    return format("—", ("<" if spec.startswith("<") else ">") + str(width))


def format_levels(summaries: list[dict]) -> str:
    """The goodput curve: one line per concurrency level."""
    head = (
        f"{'conc':>5} {'goodput tok/s':>14} {'95% CI':>17} {'per-req tok/s':>13} {'TTFT p50/p99 ms':>16} "
        f"{'ITL p50/p99 ms':>15} {'accept':>6} {'batch':>6} {'ok':>8}"
    )
    lines = [head]
    for s in summaries:
        r = level_row(s)
        ci = r["goodput_ci95"] or [None, None]
        lines.append(
            f"{r['concurrency']:>5} {_num(r['goodput'], '14.1f')} "
            f"{_num(ci[0], '8.1f')}-{_num(ci[1], '<8.1f')} {_num(r['decode_tok_s'], '13.1f')} "
            f"{_num(r['ttft_ms_p50'], '7.0f')}/{_num(r['ttft_ms_p99'], '<8.0f')} "
            f"{_num(r['itl_ms_p50'], '7.2f')}/{_num(r['itl_ms_p99'], '<7.2f')} "
            f"{_num(r['accept_len'], '6.2f')} {_num(r['batch_size'], '6.1f')} "
            f"{r['requests'] - r['failed']:>4}/{r['requests']:<3}"
        )
    for s in summaries:
        for e in s.get("errors", []):
            lines.append(f"  concurrency {s.get('concurrency', 1)}: error: {e}")
    lines.append(
        "goodput: output tok/s of all streams together; batch: mean #running-req in the server's log (— without one)"
    )
    if summaries and summaries[0].get("workload"):
        lines.append(f"workload: {describe_workload(summaries[0]['workload'])}")
    return "\n".join(lines)


def format_summary(s: dict) -> str:
    lines = []
    tok = s.get("tok_s")
    label = f"{s['label']}: " if s.get("label") else ""
    if tok:
        lo, hi = tok["ci95"]
        lines.append(
            f"{label}decode {tok['median']:.1f} tok/s median (95% CI {lo:.1f}-{hi:.1f}), "
            f"mean {tok['mean']:.1f}, p90 {tok['p90']:.1f}, min {tok['min']:.1f}, max {tok['max']:.1f}"
        )
    elif s.get("goodput") and s["requests"] > s["failed"]:  # outputs that came whole: no chunk times
        gp = s["goodput"]
        lines.append(
            f"{label}no decode rate (see the warning below); goodput {gp['tok_s']:.1f} tok/s "
            f"(95% CI {gp['ci95'][0]:.1f}-{gp['ci95'][1]:.1f})"
        )
    else:
        lines.append(f"{label}no successful request")
    extra = []
    gp = s.get("goodput")
    if gp and s.get("concurrency", 1) > 1 and tok:
        extra.append(
            f"goodput {gp['tok_s']:.1f} tok/s at concurrency {s['concurrency']} "
            f"(95% CI {gp['ci95'][0]:.1f}-{gp['ci95'][1]:.1f})"
        )
    if s.get("batch_size"):
        extra.append(f"batch {s['batch_size']['mean']:.1f}")
    if s.get("ttft_ms"):
        extra.append(f"TTFT {s['ttft_ms']['median']:.0f} ms")
    if s.get("itl_ms"):
        extra.append(f"ITL {s['itl_ms']['median']:.2f} ms")
    if s.get("accept_len"):
        extra.append(f"accept length {s['accept_len']['mean']:.2f}")
    extra.append(f"{s['requests'] - s['failed']}/{s['requests']} ok")
    lines.append("  " + ", ".join(extra))
    srv = s.get("server") or {}
    if srv.get("last_gen_throughput") or srv.get("avg_spec_accept_length"):
        bits = []
        if srv.get("last_gen_throughput"):
            bits.append(f"gen throughput {srv['last_gen_throughput']:.1f} tok/s")
        if srv.get("avg_spec_accept_length"):
            bits.append(f"accept length {srv['avg_spec_accept_length']:.2f}")
        if srv.get("step_time_ms_median"):
            bits.append(f"step {srv['step_time_ms_median']:.2f} ms")
        lines.append("  server says: " + ", ".join(bits))
    if s.get("workload"):
        lines.append(f"  workload: {describe_workload(s['workload'])}")
    for e in s.get("errors", []):
        lines.append(f"  error: {e}")
    for w in s.get("warnings", []):
        lines.append(f"  warning: {w}")
    return "\n".join(lines)
