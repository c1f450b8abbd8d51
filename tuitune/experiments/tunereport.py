"""What `tuitune tune` says: before its first launch, what it is about to spend (``plan_line``); at
its end, what it measured, chose and proved (``format_result``, from the result row). The run itself
is ``experiments.tune``."""

from __future__ import annotations

from tuitune import preset as P
from tuitune.experiments.results import TuneSummary
from tuitune.experiments.tunenccl import nccl_gains


def plan_line(
    base: P.Preset,
    budget: int,
    ab_last: int,
    rows: list[dict],
    running=None,
    live_proof: bool = False,
    baseline_first: bool = False,
) -> str:
    """What tune is about to spend, said before its first launch: how many launches at the most (the
    search's, those of an earlier run of this log counted, and the final A/B's maximum) and roughly
    how long, from the last launch of this preset it knows of (this log's, or the running server's
    record); else that it does not know. ``live_proof``: the A/B's blocks in the prepared launch
    (at most one launch, where the search's last one was another configuration's). ``baseline_first``:
    speculation off measured before the prepared start, besides the budget."""
    done = [r for r in rows if r.get("kind") == "launch"]
    search = max(0, 1 + budget + baseline_first - len(done))
    ab_launches = 1 if live_proof and ab_last else 2 * ab_last
    total = search + ab_launches
    first = "speculation off, " if baseline_first else ""
    parts = [f"up to {search} for the search ({first}the start and up to {budget} relaunch(es)"]
    parts[0] += f"; {len(done)} done before)" if done else ")"
    if baseline_first:
        parts[0] += " (2 where every configuration after the start is a chain the launch holds)"
    if live_proof and ab_last:
        parts.append(
            f"up to 1 for the final A/B in one launch ({ab_last} round(s) of 3 blocks at most; 2 x {ab_last} "
            "launches instead where the choice cannot be held)"
        )
    else:
        parts.append(
            f"up to {2 * ab_last} for the final A/B ({ab_last} round(s) per arm at most)" if ab_last else "no A/B"
        )
    readies = [r["ready_s"] for r in done if isinstance(r.get("ready_s"), (int, float))]
    if readies:
        ready, whence = readies[-1], "its last launch in this log"
    elif running is not None and running.ready_s and running.preset == base.name:
        ready, whence = running.ready_s, f"the running server of {base.name}"
    else:
        ready = None
    if ready is None:
        took = f"how long each takes is unknown (no launch of {base.name} recorded yet)"
    else:
        took = (
            f"each takes about {_duration(ready)} to become ready ({whence}) plus its benchmarks: "
            f"{_duration(total * ready)} of start-up alone"
        )
    return f"tune: up to {total} launch(es): {', '.join(parts)}; {took}"


def _duration(s: float) -> str:
    if s >= 5400:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.0f} min" if s >= 90 else (f"{s:.0f} s" if s >= 10 else f"{s:.1f} s")


def format_result(r: TuneSummary) -> str:
    live = f", {r.held_live} measurement(s) held live in one launch" if r.held_live else ""
    lines = [f"tuned at concurrency {r.concurrency}: {r.relaunches} relaunch(es){live}; stopped: {r.stop_reason}"]
    pred = r.nccl_prediction or {}
    if pred.get("winner"):
        if pred.get("step_saving_us") is not None:
            said = nccl_gains(pred)
            lines.append(
                f"NCCL: nccl-bench's winner {pred['winner']} predicted to save {pred['step_saving_us']:.1f} µs a "
                f"decode step against {pred['reference']}" + (f" ({said})" if said else "")
            )
            lines.append(f"  the prediction rests on: {pred['basis']}")
        elif pred.get("note"):
            lines.append(f"NCCL: nccl-bench's winner {pred['winner']}; no step prediction ({pred['note']})")
    for label, g in sorted(r.measured.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {label:<32} {g:>10.1f} tok/s measured")
    for label, why in (r.failed or {}).items():
        lines.append(f"  {label:<32} did not start: {why}")
    for label, levels in (r.sim_behind or {}).items():
        said = "; ".join(f"c={c}: {how}" for c, how in levels.items())
        lines.append(
            f"  {label:<32} measured while the simulator fell behind its clock ({said}): slower than its model "
            "there, so a choice resting on it may be wrong; lower --sim-speedup"
        )
    if r.chosen_why and r.verdict.get("verdict") != "start is already best":
        lines.append(f"chosen: {r.chosen_label}: {r.chosen_why}")
    v = r.verdict
    if v.get("verdict") == "start is already best":
        lines.append(f"verdict: the start is already best ({v['reason']})")
    elif v.get("verdict") == "faster":
        lines.append(
            f"verdict: {r.chosen_label} is faster than the start, by at least {v['at_least']:.1%} "
            f"({_interval_said(r)}); written to {r.best_preset}"
        )
    elif v.get("verdict") == "not confirmed":
        lines.append(f"no verdict: {v['reason']}; the start is kept (no best.yaml)")
    elif v.get("verdict") == "measurement only":
        lines.append(
            f"no verdict: {v['reason']}; A/B medians: start {v['baseline_median']:.1f}, "
            f"{r.chosen_label} {v['candidate_median']:.1f} tok/s (ratio {v['ratio']:.3f}); "
            "the start is kept (no best.yaml)"
        )
    else:
        reason = v.get("reason") or v.get("verdict")
        if v.get("verdict") == "slower":
            reason = f"{r.chosen_label} is slower than the start in the A/B, by at least {v['at_least']:.1%}"
        elif v.get("verdict") == "no significant difference":
            reason = f"no significant difference in the A/B ({_interval_said(r)})"
        lines.append(f"verdict: {reason}; the start is kept (no best.yaml)")
    lines += _proof_said(r)
    power = ((r.ab or {}).get("power") or {}).get("before")
    if power:
        lines.append(f"A/B power: {power['sentence']}")
    return "\n".join(lines)


def _proof_said(r: TuneSummary) -> list[str]:
    """Where the final A/B ran (`--proof live`): in the prepared launch, with its A/A check and what
    that leaves unproved; or why it could not and was launched instead."""
    ab = r.ab or {}
    if ab.get("live"):
        return [
            f"proof: in one launch, {len(ab['blocks'])} blocks over {ab['rounds']} round(s) (A, B and the A/A twin "
            f"A'), no launch of its own; {ab['aa']['sentence']}; the cost of being prepared is not resolved on "
            "this engine (docs/switch.md): best.yaml's own launch may differ from the prepared one by it"
        ]
    if r.proof_why:
        return [f"proof: static, not in one launch: {r.proof_why}"]
    return []


def _interval_said(r: TuneSummary) -> str:
    """'ratio 1.0400, 97.1% CI 1.0070-1.0610, p = 0.029' of the final A/B, and its rounds where it was sequential."""
    v = r.verdict
    lo, hi = v["ratio_ci"]
    return (
        f"ratio {v['ratio']:.4f}, {v.get('interval_level', 0.95):.1%} CI {lo:.4f}-{hi:.4f}, "
        f"p = {v['p_value']:.3f}{_ab_rounds_said(r)}"
    )


def _ab_rounds_said(r: TuneSummary) -> str:
    """', decided after 5 of up to 8 rounds' (a sequential final A/B), else ''."""
    ab = r.ab or {}
    return f", {ab['stopped']}" if ab.get("max_rounds", 0) > ab.get("first_look", 0) and ab.get("stopped") else ""
