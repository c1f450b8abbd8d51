"""`tuitune sweep`: relaunch, bench and record every configuration of a grid, with a baseline.

Each trial is one launch (the unit of replication): relaunch with the trial's preset, wait ready,
benchmark, and record the events of the trial to ``captures/``. The baseline is relaunched and
re-measured every ``baseline_every`` trials and at the end, so that a drifting machine shows up as
a drifting baseline instead of as a false winner. Every finished trial is appended to
``results.jsonl`` (and ``results.csv``) at once; ``--resume`` skips the trials already there.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.base.jsonl import append_row, end_partial_line, is_count, is_figure, plain, read_rows
from tuitune.experiments import grid as G
from tuitune.experiments.results import SweepDelta, SweepResult, SweepRow
from tuitune.machine.errors import ControlError
from tuitune.machine.session import Session
from tuitune.machine.telemetry import CaptureThrottle
from tuitune.machine.transport import TransportError
from tuitune.measure import stats, workload
from tuitune.measure.capture import CaptureWriter, redacted_preset
from tuitune.measure.metrics import quantile
from tuitune.measure.serverinfo import limit_confound

CSV_FIELDS = (
    "trial",
    "kind",
    "label",
    "repeat",
    "status",
    "concurrency",
    "tok_s_median",
    "ci_low",
    "ci_high",
    "goodput",
    "accept_len",
    "cycle_ms",
    "requests",
    "failed",
    "reason",
    "preset_hash",
    "time",
)


class SweepError(TuituneError):
    code = 2


def trial_id(kind: str, label: str, index: int) -> str:
    return f"{kind}-{hashlib.sha1(label.encode()).hexdigest()[:8]}-{index}"


def plan(base: P.Preset, grid: dict, baseline: P.Preset, repeats: int, baseline_every: int) -> list[dict]:
    trials: list[dict] = []
    n_base = 0

    def add_baseline() -> None:
        nonlocal n_base
        trials.append(
            {
                "id": trial_id("baseline", "baseline", n_base),
                "kind": "baseline",
                "label": "baseline",
                "changes": {},
                "repeat": n_base,
                "preset": baseline,
            }
        )
        n_base += 1

    add_baseline()
    done = 0
    for rep in range(repeats):
        for changes in G.combinations(grid):
            label = G.label(changes, grid)
            p, reason = G.apply(base, changes)
            trials.append(
                {
                    "id": trial_id("config", label, rep),
                    "kind": "config",
                    "label": label,
                    "changes": changes,
                    "repeat": rep,
                    "preset": p,
                    "reason": reason,
                }
            )
            if p is not None:
                done += 1
                if baseline_every and done % baseline_every == 0:
                    add_baseline()
    if trials[-1]["kind"] != "baseline":
        add_baseline()
    return trials


def load_results(out: Path) -> list[dict]:
    """The usable rows of results.jsonl; a damaged one is skipped with a warning naming its line
    (its trial runs again on --resume)."""
    return read_rows(out / "results.jsonl", check=row_problem)


def row_problem(r: dict) -> str | None:
    """Why a results row cannot be used (None when it can): what --resume and the summary read."""
    for key in ("trial", "label", "kind", "status"):
        if not isinstance(r.get(key), str):
            return f"its {key} is not text"
    if r["status"] == "ok":
        if not is_figure(r.get("tok_s_median")):
            return "its tok_s_median is not a finite figure"
        if not isinstance(r.get("values") or [], list) or not all(is_figure(v) for v in r.get("values") or []):
            return "its values are not finite figures"
        for key in ("accept_len", "cycle_ms", "goodput"):
            if r.get(key) is not None and not is_figure(r[key]):
                return f"its {key} is not a finite figure"
    if not is_count(r.get("concurrency", 1), 1):
        return "its concurrency is not a count"
    for key in ("changes", "axes", "workload"):
        if not isinstance(r.get(key, {}), dict):
            return f"its {key} is not an object"
    return None


def _append(out: Path, row: dict) -> None:
    append_row(out / "results.jsonl", row)
    end_partial_line(out / "results.csv")  # a row cut short by an interrupted run stays one line
    new = not (out / "results.csv").exists()
    with open(out / "results.csv", "a", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


async def run_trial(session: Session, trial: dict, out: Path, overrides: dict, work: dict) -> dict:
    p: P.Preset = trial["preset"]
    row = {
        "trial": trial["id"],
        "kind": trial["kind"],
        "label": trial["label"],
        "repeat": trial["repeat"],
        "changes": G.masked(trial["changes"]),
        "axes": {k: G.show(v, k) for k, v in trial["changes"].items()},
        "time": time.time(),
    }
    if p is None:
        return {**row, "status": "skipped", "reason": trial.get("reason")}
    row["preset_hash"] = p.hash()
    (out / "captures").mkdir(exist_ok=True)
    writer = CaptureWriter(
        out / "captures" / f"{trial['id']}.jsonl.gz",
        {
            "preset": redacted_preset(P.to_dict(p)),
            "preset_hash": p.hash(),
            "target": p.target.label(),
            "trial": trial["id"],
            "workload": work,
        },
    )
    gpu_rate = CaptureThrottle(p.telemetry.record_every_s)

    def sink(events: list) -> None:
        writer.write(gpu_rate.filter(events))

    session.subscribe(sink)
    try:
        await session.relaunch(p)
        run = await session.bench(label=trial["label"], **overrides)
    except (ControlError, TransportError) as e:
        return {**row, "status": "failed", "reason": str(e)}
    finally:
        session.subscribers.remove(sink)
        writer.close()
    s = run.summary()
    tok = s.get("tok_s") or {}
    ci = tok.get("ci95") or [None, None]
    # a benchmark that timed no request's tokens measured nothing: a failed trial, not a figure of None
    blank = not run.failed and tok.get("median") is None
    return {
        **row,
        "status": "ok" if not run.failed and not blank else "failed",
        "reason": "; ".join(s["errors"])
        if run.failed
        else ("the benchmark measured no throughput (no request's tokens were timed)" if blank else None),
        "concurrency": run.config.concurrency,
        "max_running_requests": run.server.get("max_running_requests"),
        "goodput": (s.get("goodput") or {}).get("tok_s"),
        "tok_s_median": tok.get("median"),
        "ci_low": ci[0],
        "ci_high": ci[1],
        "accept_len": (s.get("accept_len") or {}).get("mean"),
        "cycle_ms": run.cycle_ms,
        "gpu_note": run.gpu_note,
        "requests": s["requests"],
        "failed": s["failed"],
        "values": run.tok_s(),
    }


async def sweep(  # noqa: PLR0913
    base: P.Preset,
    grid: dict,
    out: Path,
    *,
    baseline: P.Preset | None = None,
    repeats: int = 1,
    baseline_every: int = 4,
    resume: bool = False,
    overrides: dict | None = None,
    progress: Callable[[str], None] | None = None,
    session: Session | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> SweepResult:
    """Every trial of the plan, appended to OUT as it ends. Interrupted (Ctrl-C, SIGTERM), it stops
    the server it started and says so to ``on_cleanup``; ``--resume`` goes on from the trials done."""
    baseline = baseline or base
    if (baseline.target.label(), baseline.server.port) != (base.target.label(), base.server.port):
        raise SweepError(f"baseline {baseline.name} must run on the same target and port as {base.name}")
    out.mkdir(parents=True, exist_ok=True)
    done_rows = load_results(out)
    if done_rows and not resume:
        raise SweepError(f"{out} already holds results; pass --resume to continue, or choose another --out")
    work = workload.for_preset(base, overrides).as_dict()  # a bad prompt file: said before any launch
    other = next((why for r in done_rows if (why := workload.differ(work, r.get("workload")))), None)
    if other:
        raise SweepError(
            f"{out}'s trials were measured on another workload ({other}, the results'): resuming would compare "
            "the two; pass their prompts again (--prompts or bench.prompts), or choose another --out"
        )
    done = {r["trial"] for r in done_rows}
    labels = [G.label(c, grid) for c in G.combinations(grid)]
    twins = sorted({x for x in labels if labels.count(x) > 1})
    if twins:  # trials and results are keyed by label: two configurations must never share one
        raise SweepError(f"two grid configurations read the same ({twins[0]}); give the presets distinct names")
    trials = plan(base, grid, baseline, repeats, baseline_every)
    session = session or Session(base)
    status = await session.connect()
    foreign = (
        session.control.foreign(status.record, {base.name, baseline.name}) if status.running and status.ours else None
    )
    if foreign:
        await session.close()
        raise SweepError(
            foreign.replace("pass --any to act on it anyway", "stop it first (`tuitune stop PRESET --any`)")
        )
    try:
        for i, trial in enumerate(trials, 1):
            if trial["id"] in done:
                continue
            if progress:
                progress(
                    f"[{i}/{len(trials)}] {trial['kind']} {trial['label']}"
                    + (f" (repeat {trial['repeat'] + 1})" if repeats > 1 and trial["kind"] == "config" else "")
                )
            row = await run_trial(session, trial, out, overrides or {}, work)
            _append(out, {**row, "workload": work})
            if progress:
                if row["status"] == "ok":
                    progress(f"    {row['tok_s_median']:.2f} tok/s")
                else:
                    progress(f"    {row['status']}: {row.get('reason')}")
        await session.stop_server()
    except asyncio.CancelledError:
        await session.stop_started(on_cleanup)
        raise
    finally:
        await session.close()
    real = {t["id"]: t["changes"] for t in trials}  # results.jsonl holds secrets masked; best.yaml needs them
    return summarize(
        base, [{**r, "changes": real.get(r["trial"], r.get("changes", {}))} for r in load_results(out)], out
    )


def summarize(base: P.Preset, rows: list[dict], out: Path | None = None) -> SweepResult:  # noqa: C901
    """Per configuration: launch medians, pooled requests, Δ vs baseline; sorted by tok/s."""
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(
            r["label"],
            {
                "label": r["label"],
                "kind": r["kind"],
                "changes": r.get("changes", {}),
                "axes": r.get("axes", {}),
                "launches": [],
                "values": [],
                "accept": [],
                "cycle": [],
                "goodput": [],
                "concurrency": r.get("concurrency", 1),
                "limits": [],
                "skipped": None,
                "failed": 0,
            },
        )
        if r["status"] == "skipped":
            g["skipped"] = r.get("reason")
        elif r["status"] == "ok":
            g["limits"].append(r.get("max_running_requests"))
            g["launches"].append(r["tok_s_median"])
            g["values"].extend(r.get("values") or [])
            if r.get("accept_len"):
                g["accept"].append(r["accept_len"])
            if r.get("cycle_ms"):
                g["cycle"].append(r["cycle_ms"])
            if r.get("goodput"):
                g["goodput"].append(r["goodput"])
        else:
            g["failed"] += 1
    base_g = groups.get("baseline")
    table: list[SweepRow] = []
    for g in groups.values():
        if not g["launches"]:
            table.append(SweepRow(label=g["label"], kind=g["kind"], skipped=g["skipped"], failed=g["failed"]))
            continue
        launches = sorted(g["launches"])
        entry = SweepRow(
            label=g["label"],
            kind=g["kind"],
            changes=g["changes"],
            axes=g["axes"],
            launches=len(launches),
            tok_s=quantile(launches, 0.5),
            ci95=list(stats.bootstrap_median_ci(g["values"])),
            accept_len=sum(g["accept"]) / len(g["accept"]) if g["accept"] else None,
            cycle_ms=sum(g["cycle"]) / len(g["cycle"]) if g["cycle"] else None,
            failed=g["failed"],
            concurrency=g["concurrency"],
            goodput=quantile(sorted(g["goodput"]), 0.5) if g["goodput"] else None,
        )
        confound = (
            limit_confound({"baseline": base_g["limits"], g["label"]: g["limits"]}, g["concurrency"])
            if base_g and g is not base_g
            else None
        )
        if confound:
            entry.limits = confound[1]
        if base_g and g is not base_g and (g["concurrency"] != base_g["concurrency"] or (confound and confound[0])):
            # per-request speed falls as the batch grows: no comparison with another concurrency, nor with a
            # server held to fewer requests at once than the streams sent
            nan = math.nan
            entry.delta = SweepDelta(ratio=nan, ratio_ci=[nan, nan], p_value=nan, verdict="not comparable")
        elif base_g and base_g["launches"] and g is not base_g:
            # launches are the unit once both sides have 4; before that, a request-level check
            if len(g["launches"]) >= 4 and len(base_g["launches"]) >= 4:
                cmp = stats.compare(base_g["launches"], g["launches"])
                entry.delta_unit = "launch"
            else:
                cmp = stats.compare(base_g["values"], g["values"])
                entry.delta_unit = "request"
            entry.delta = SweepDelta(
                ratio=cmp["ratio"],
                ratio_ci=list(cmp["ratio_ci"]),
                p_value=cmp["p_value"],
                verdict=cmp["verdict"],
                min_effect=cmp["min_effect"],
            )
        table.append(entry)
    ranked = sorted([t for t in table if t.tok_s is not None], key=lambda t: -(t.tok_s or 0.0))
    # the baseline is a candidate too: a configuration wins only when significantly faster than it
    # (a configuration at another concurrency is "not comparable", so never the best)
    best = next((t for t in ranked if t.kind == "config" and t.delta is not None and t.delta.verdict == "faster"), None)
    keys = list(dict.fromkeys(k for r in rows for k in (r.get("axes") or {})))
    flat = P.flatten(base)
    result = SweepResult(
        preset=base.name,
        table=ranked + [t for t in table if t.tok_s is None],
        best=best.label if best else None,
        # the grid's axes as the baseline (the preset unchanged) has them: its point in plot()
        baseline_axes={k: flat.get(k) for k in keys},
    )
    if best is None and base_g and base_g["launches"]:
        result.best = "baseline"
        result.best_note = "no configuration was significantly faster than the baseline: the baseline stays best"
    if best and out is not None:
        p, _ = G.apply(base, best.changes or {})
        if p is not None:
            name = f"{base.name}-best"
            P.save(
                P.with_changes(p, {"name": name, "description": f"best of the sweep in {out}: {best.label}"}),
                out / "best.yaml",
            )
            result.best_preset = str(out / "best.yaml")
    return result


def format_table(result: SweepResult) -> str:
    """One row per configuration: the Δ against the baseline with its mark, then what decided it (the
    interval of the ratio and p); a legend line explains the marks, and each ≈ with a small p says why."""
    lines = [
        f"{'config':<40} {'conc':>4} {'tok/s':>8} {'95% CI':>17} {'goodput':>9} {'launches':>8} {'accept':>7} "
        f"{'cycle ms':>9} {'Δ vs baseline':>14} {'ratio 95% CI':>13} {'p':>6}"
    ]
    why = []
    min_effect = 0.01
    for t in result.table:
        if t.tok_s is None:
            reason = f"skipped: {t.skipped}" if t.skipped else f"{t.failed} failed launch(es)"
            lines.append(f"{t.label:<40} {reason}")
            continue
        lo, hi = t.ci95 or [math.nan, math.nan]
        d = t.delta
        if d and d.verdict == "not comparable":
            delta = "n/c (other limit)" if t.limits and "above" in t.limits else "n/c (other concurrency)"
            if t.limits:
                why.append(f"  {t.label}: {t.limits}")
        elif d:
            mark = {"faster": "▲", "slower": "▼"}.get(d.verdict, "≈")
            rlo, rhi = d.ratio_ci
            min_effect = d.min_effect if d.min_effect is not None else min_effect
            pv = f"{d.p_value:.3f}" if d.p_value >= 0.001 else "<0.001"
            delta = f"{(d.ratio - 1) * 100:>+7.1f}% {mark:<5} {rlo:>6.3f}-{rhi:<6.3f} {pv:>6}"
            if mark == "≈" and d.p_value < 0.05:
                why.append(f"  {t.label}: ≈ because {stats.verdict_why({**plain(d), 'min_effect': min_effect})}")
        else:
            delta = f"{'—':>8}"  # the baseline itself
        acc = f"{t.accept_len:.2f}" if t.accept_len else "—"
        cyc = f"{t.cycle_ms:.2f}" if t.cycle_ms else "—"
        gp = f"{t.goodput:.1f}" if t.goodput else "—"
        lines.append(
            f"{t.label:<40} {t.concurrency or 1:>4} {t.tok_s:>8.2f} {lo:>8.2f}-{hi:<8.2f} {gp:>9} "
            f"{t.launches:>8} {acc:>7} {cyc:>9} {delta}".rstrip()
        )
    units = {t.delta_unit for t in result.table if t.delta_unit}
    lines.append(
        "\n"
        + stats.legend(min_effect)
        + (
            "; compared per request (fewer than 4 launches a side)"
            if units == {"request"}
            else "; compared per launch"
            if units == {"launch"}
            else ""
        )
    )
    lines += why
    if result.best_note:
        lines.append(f"\nbest: {result.best_note} (no best.yaml written)")
    elif result.best:
        lines.append(f"\nbest: {result.best}" + (f" (written to {result.best_preset})" if result.best_preset else ""))
    return "\n".join(lines)


def plot(result: SweepResult, width: int = 100, height: int = 18, colour: bool = True) -> str | None:
    """tok/s against steps, one line per other setting (when the grid has speculative.num_steps)."""
    rows = [
        t
        for t in result.table
        if t.kind == "config" and t.tok_s is not None and "speculative.num_steps" in (t.changes or {})
    ]
    if not rows:
        return None
    import plotext as plt

    steps = "speculative.num_steps"

    def series(axes: dict) -> str:
        return " ".join(f"{k.split('.')[-1]}={v}" for k, v in axes.items() if k != steps) or "preset"

    lines: dict[str, list[tuple[int, float]]] = {}
    for t in rows:
        lines.setdefault(series(t.axes or {}), []).append(((t.changes or {})[steps], t.tok_s or 0.0))
    base = next((t for t in result.table if t.kind == "baseline" and t.tok_s is not None), None)
    base_axes = result.baseline_axes or {}
    on_line = None
    if base and isinstance(base_axes.get(steps), int):
        # the baseline is a point of the series it belongs to (its steps between the grid's), not
        # only a horizontal line: without it a line joins steps 1 and 3 over the measured 2
        name = series(base_axes)
        pts = lines.get(name)
        if pts is not None and all(x != base_axes[steps] for x, _ in pts):
            pts.append((base_axes[steps], base.tok_s or 0.0))
            on_line = base_axes[steps]
    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    for name, pts in lines.items():
        pts.sort()
        plt.plot([p[0] for p in pts], [p[1] for p in pts], label=name, marker="dot")
    if base:
        plt.horizontal_line(base.tok_s)
    note = f"baseline: the point at steps {on_line}, and the line" if on_line else "horizontal line: baseline"
    plt.title("tok/s against speculative steps" + (f" ({note})" if base else ""))
    plt.xlabel("speculative.num_steps")
    from tuitune.measure.report import finish_chart

    return finish_chart(plt.build(), colour)
