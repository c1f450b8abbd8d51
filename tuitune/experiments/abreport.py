"""What `tuitune ab` prints: the launches' table, the verdict with why it is what it is, and what the
minimum practical effect says of it (``format_ab``); the A/B itself is ``experiments.ab``."""

from __future__ import annotations

import math

from tuitune.experiments.ab import ALPHA, MIN_EFFECT, NO_VERDICT, cell, ci_cell
from tuitune.experiments.results import AbResult
from tuitune.measure import workload


def verdict_why(v: dict) -> str:
    """Why the A/B's verdict is what it is: the test, the look's boundary, the interval, in a clause."""
    lo, hi = v["ratio_ci"]
    level = v.get("interval_level", 0.95)
    ci = f"the ratio's {level:.1%} CI {lo:.3f}-{hi:.3f}"
    p = v["p_value"]
    n = v.get("n_baseline")
    bound = (
        f"p = {p:.4f} ≤ {v['nominal_level']:.4f}, the boundary of the look after {n} rounds "
        f"({v['alpha']:.0%} overall over the looks after {v['design_rounds'][0]} to {v['design_rounds'][1]} rounds)"
        if v.get("sequential")
        else f"p = {p:.3f} < {v.get('alpha', ALPHA)}"
    )
    if v.get("critical_u") is None:
        return f"{n} + {n} launches cannot decide at this look (p = {p:.3f})"
    if v["verdict"] == "faster":
        return f"{bound}: {ci} lies above 1 ({v['u']:.0f} of {v['pairs']} launch pairs favour B)"
    if v["verdict"] == "slower":
        return f"{bound}: {ci} lies below 1 ({v['pairs'] - v['u']:.0f} of {v['pairs']} launch pairs favour A)"
    if v.get("sequential"):
        return f"p = {p:.3f} is above {v['nominal_level']:.4f}, the boundary of the look after {n} rounds: {ci} holds 1"
    return f"p = {p:.3f} is not below {v.get('alpha', ALPHA)}: {ci} holds 1"


def practical_line(v: dict, default: bool) -> str:
    """What the minimum practical effect says about a verdict (it never discards one)."""
    m = v["min_effect"]
    if m <= 0:
        return "no minimum practical effect (--min-effect 0): any decided difference counts"
    said = f"minimum practical effect {m:.1%} (--min-effect{', the default' if default else ''})"
    if v["verdict"] in ("faster", "slower"):
        if v.get("practical"):
            return f"{said}: met, the {'gain' if v['verdict'] == 'faster' else 'loss'} is at least {v['at_least']:.1%}"
        return (
            f"{said}: not shown, the {'gain' if v['verdict'] == 'faster' else 'loss'} is real but may be as small "
            f"as {v['at_least']:.1%}"
        )
    if v.get("equivalent"):
        return f"{said}: the interval lies within 1 ± {m:.1%}, so any difference is smaller than it"
    return f"{said}: the interval reaches beyond it, so a difference that large is not ruled out"


def format_ab(result: AbResult) -> str:
    lines = [
        f"{'round':>5}  {'arm':<3} {'preset':<28} {'tok/s':>9} {'95% CI':>17} {'goodput':>9} {'accept':>7} {'failed':>6}"
    ]
    for x in result.launches:
        ci = x.get("ci95") or [math.nan, math.nan]
        acc = f"{x['accept_len']:.2f}" if x.get("accept_len") else "-"
        lines.append(
            f"{x['round']:>5}  {x['arm']:<3} {x['preset']:<28} {cell(x['median_tok_s'], 9, 2)} "
            f"{ci_cell(ci)} {x.get('goodput', math.nan):>9.1f} {acc:>7} {x['failed']:>6}"
            + (f"  ⚠ GPUs: {x['gpu_note']}" if x.get("gpu_note") else "")
        )
    w = next((x["workload"] for x in result.launches if x.get("workload")), None)
    if w:
        lines.append(f"workload: {workload.describe(w)}")
    v = result.verdict
    if v["verdict"] == "not comparable":
        lines.append(f"\nverdict: not comparable: {v['reason']}")
        return "\n".join(lines)
    lo, hi = v["ratio_ci"]
    a, b = f"A ({result.a})", f"B ({result.b})"
    what = (
        "goodputs at concurrency " + str(result.launches[0].get("concurrency"))
        if v.get("metric") == "goodput"
        else "launch medians"
    )
    lines.append(f"\nmedians of {what}: {a} {v['baseline_median']:.2f}, {b} {v['candidate_median']:.2f} tok/s")
    if v.get("metric_why"):
        lines.append(f"compared by goodput: {v['metric_why']}")
    if v["verdict"] == NO_VERDICT:
        lines.append(
            f"ratio B/A = {v['ratio']:.4f} (95% CI {lo:.4f}-{hi:.4f}, bootstrap), "
            f"Mann-Whitney p = {v['p_value']:.3f} over {v['n_baseline']}+{v['n_candidate']} launches"
        )
        lines.append(f"no verdict: {v['reason']}")
    else:
        lines.append(
            f"ratio B/A = {v['ratio']:.4f} (medians), {v['shift']:.4f} (Hodges-Lehmann) with {v['interval_level']:.1%} "
            f"CI {lo:.4f}-{hi:.4f} (the test inverted), Mann-Whitney p = {v['p_value']:.3f} over "
            f"{v['n_baseline']}+{v['n_candidate']} launches"
        )
        if v["verdict"] in ("faster", "slower"):
            lines.append(f"verdict: {b} is {v['verdict']}, by at least {v['at_least']:.1%}")
        else:
            lines.append("verdict: no significant difference")
        lines.append(f"why: {verdict_why(v)}")
        lines.append(practical_line(v, v["min_effect"] == MIN_EFFECT))
        lines.append(f"method: {v['method']}" + (f"; {result.stopped}" if v.get("sequential") else ""))
    if result.power.after is not None:
        lines.append(f"power: {result.power.after.sentence}")
    if result.aa:
        lines.append("this was an A/A run (the same configuration in both arms): a difference here is noise")
    return "\n".join(lines)
