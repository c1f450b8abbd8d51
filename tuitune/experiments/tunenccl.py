"""`tune --nccl`: the NCCL screen before the search: nccl-bench ranks NCCL settings in seconds, and the
winner's predicted saving a decode step is said beside the gain its launch measured."""

from __future__ import annotations

from collections.abc import Callable

from tuitune import preset as P
from tuitune.decide import ncclstep as NS
from tuitune.experiments.results import NcclBenchReport
from tuitune.experiments.tuneloop import TuneError

NCCL_GRID = ("env.NCCL_PROTO=LL,LL128,Simple,unset", "env.NCCL_ALGO=Ring,Tree,unset")


async def nccl_screen(
    session,
    base: P.Preset,
    specs: list[str],
    backend: str,
    hidden_size: int | None,
    progress: Callable[[str], None] | None,
    concurrency: int = 1,
) -> tuple[dict, NcclBenchReport, dict]:
    """nccl-bench's ranking of a grid (default NCCL_PROTO x NCCL_ALGO) at decode sizes and at the
    size of a decode step at ``concurrency``: (changes of the winner, {} when the current setting
    wins; the report; the winner's predicted decode-step saving, ``nccl_prediction``)."""
    from tuitune.experiments import grid as G
    from tuitune.experiments import ncclbench as NB
    from tuitune.experiments.options import NcclBenchOptions

    try:
        grid = G.parse(specs or list(NCCL_GRID))
        NB.validate_grid(grid)
    except (G.GridError, NB.NcclBenchError) as e:
        raise TuneError(f"--nccl-grid: {e}", 2) from None
    cfg = await NB.model_config(session.transport, base)
    hidden = hidden_size or (cfg.get("hidden_size") if isinstance(cfg.get("hidden_size"), int) else None)
    layers = cfg.get("num_hidden_layers") if isinstance(cfg.get("num_hidden_layers"), int) else None
    sizes = None
    if hidden:
        step = NS.TPShape(layers or 1, hidden).message_bytes(NS.step_tokens(concurrency, draft_tokens(base)))
        sizes = sorted({*NB.decode_sizes(base, hidden), step})  # ranked at the largest: the step's
    try:
        o = NcclBenchOptions(
            preset=base.name,
            grid=list(specs or NCCL_GRID),
            sizes=",".join(map(str, sizes)) if sizes else None,
            hidden_size=hidden,
            backend=backend,
        )
        report = await NB.run(session.transport, base, o, progress=progress)
    except NB.NcclBenchError as e:
        raise TuneError(f"--nccl: {e}", e.code) from None
    if not report.ranking:
        raise TuneError("--nccl: no NCCL setting could be measured (see `tuitune nccl-bench` for the errors)")
    row = report.row(report.ranking[0])
    prediction = nccl_prediction(report, base, hidden, layers, concurrency)
    return ({} if row.current else row.changes), report, prediction


def draft_tokens(base: P.Preset) -> int | None:
    """Tokens a request verifies a step (None without speculation: one)."""
    spec = base.speculative
    return spec.resolved().num_draft_tokens if base.is_speculative and spec is not None else None


def nccl_prediction(
    report: NcclBenchReport, base: P.Preset, hidden: int | None, layers: int | None, concurrency: int
) -> dict:
    """What the screen's winner is predicted to save a decode step against the current setting
    (``tuitune.decide.ncclstep``), and what that rests on; a step figure needs the model's layer
    count (config.json's num_hidden_layers), else only the saving per all-reduce is given."""
    tokens = NS.step_tokens(concurrency, draft_tokens(base))
    winner = report.ranking[0]
    current = next((r.label for r in report.rows if r.current and r.results is not None), None)
    out: dict = {"winner": winner, "reference": current, "concurrency": concurrency, "tokens": tokens}
    if not hidden:
        out["note"] = "no hidden size: nothing predicted"
        return out
    rows = {r.label: NS.points_of(r.results) for r in report.rows if r.results is not None}
    size = NS.TPShape(layers=1, hidden=hidden).message_bytes(tokens)
    lat = {label: NS.latency_us(pts, size) for label, pts in rows.items()}
    out.update(bytes=size, allreduce_us=lat)
    if current is None:
        out["note"] = "the preset's current setting was not in the grid: no saving against it"
        return out
    cur_us, win_us = lat.get(current), lat.get(winner)
    if cur_us is None or win_us is None:
        out["note"] = f"nccl-bench did not measure {size} B: nothing predicted"
        return out
    out["saving_per_allreduce_us"] = cur_us - win_us
    if layers is None:
        out["note"] = "the model's layer count is unknown (no num_hidden_layers in its config.json): no step figure"
        return out
    shape = NS.TPShape(layers=layers, hidden=hidden)
    step = {p.label: p for p in NS.predict(rows, shape, tokens, current)}
    out.update(
        allreduces=shape.count(),
        step_saving_us=step[winner].saving_us,
        basis=NS.basis(shape, tokens, report.world_size)
        + " (the target model's forward only: the draft model's few all-reduces are left out)",
    )
    return out


def cycle_ms(windows: list, concurrency: int) -> float | None:
    """Median cycle of a launch's profile windows at ``concurrency`` (all of them if none is)."""
    at = [w.cycle_ms for w in windows if w.bs == concurrency and w.cycle_ms > 0] or [
        w.cycle_ms for w in windows if w.cycle_ms > 0
    ]
    return sorted(at)[len(at) // 2] if at else None


def nccl_gains(decided: dict | None) -> str:
    """'measured +4.1 %, predicted +3.8 %' (what of the two is known)."""
    if not decided:
        return ""
    parts = [
        f"{what} {decided[key]:+.1%}"
        for what, key in (("measured", "measured_gain"), ("predicted", "predicted_gain"))
        if decided.get(key) is not None
    ]
    return ", ".join(parts)


def nccl_summary(screen: dict, decided: dict | None) -> dict:
    pred = dict(screen.get("prediction") or {})
    for key in ("predicted_gain", "measured_gain", "cycle_ms"):
        if decided and decided.get(key) is not None:
            pred[key] = decided[key]
    return pred
