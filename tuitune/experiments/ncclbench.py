"""NCCL pre-screen: rank NCCL settings with an all-reduce micro-benchmark in seconds.

A relaunch of a large model takes minutes; an all-reduce at the model's decode message size takes
seconds and orders NCCL settings the same way for the communication part. The worker
(``nccl_worker.py``, stdlib + torch) is uploaded to the target's state dir and run once per
configuration with the target's python, one process per GPU. ``NCCL_DEBUG=INFO`` with subsystem
TUNING makes NCCL print what it applied and which algorithm/protocol it chose per size: shown
beside each result, as proof that the setting took effect.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.base.events import NcclAlgo, NcclEnv, ServerError
from tuitune.experiments import grid as G
from tuitune.experiments.options import NcclBenchOptions
from tuitune.experiments.results import NcclBenchReport, NcclBenchRow
from tuitune.machine.readiness import classify
from tuitune.machine.record import STATE_DIR
from tuitune.machine.transport import Transport, TransportError
from tuitune.measure.parse import parse_line
from tuitune.preset import nccl

DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"}
DTYPE_BYTES = 2  # bf16 activations: the bytes of one element of an all-reduce's message


class NcclBenchError(TuituneError):
    """One sentence; ``code`` 1 for failed work (the default), 2 for bad input."""


async def model_config(t: Transport, preset: P.Preset) -> dict:
    """The model's ``config.json`` on the target (its ``text_config`` for multimodal models), or {}."""
    path = preset.server.args.get("model-path") or preset.server.args.get("model")
    if not isinstance(path, str):
        return {}
    r = await t.run(f"cat -- {P.shell_path(path.rstrip('/') + '/config.json')} 2>/dev/null", timeout=30)
    if not r.ok:
        return {}
    try:
        cfg = json.loads(r.stdout)
    except ValueError:
        return {}
    if not isinstance(cfg, dict):
        return {}
    text = cfg.get("text_config")
    return {**text, **cfg} if isinstance(text, dict) else cfg  # top-level keys first, as before


async def model_hidden_size(t: Transport, preset: P.Preset) -> int | None:
    v = (await model_config(t, preset)).get("hidden_size")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def decode_sizes(preset: P.Preset, hidden: int, dtype_bytes: int = 2) -> list[int]:
    """Decode all-reduce sizes: hidden × tokens per step × bytes (1 token; draft tokens for verify)."""
    sizes = [hidden * dtype_bytes]
    if preset.speculative is not None and preset.is_speculative:
        r = preset.speculative.resolved()
        if r.num_draft_tokens:
            sizes.append(hidden * r.num_draft_tokens * dtype_bytes)
    return sizes


def configs(preset: P.Preset, grid: dict) -> list[dict]:
    """One entry per grid combination: changes, the resulting NCCL env, or why it is skipped."""
    out = []
    for changes in G.combinations(grid) or [{}]:
        bad = [k for k in changes if not k.startswith("env.")]
        if bad:
            raise NcclBenchError(f"--grid {bad[0]}: nccl-bench varies environment variables only (env.…)", 2)
        p, reason = G.apply(preset, changes)
        entry: dict[str, Any] = {"changes": changes, "label": G.label(changes)}
        if p is None:
            entry["skipped"] = reason
        else:
            entry["env"] = p.env
            entry["current"] = all(preset.env.get(k.split(".", 1)[1]) == v for k, v in changes.items())
        out.append(entry)
    return out


def parse_output(text: str) -> dict:
    """Result JSON, NCCL's echo of its variables, its algorithm choices, and errors, from the run's output."""
    result, failed = None, None
    seen_env: dict[str, str] = {}
    algos: dict[int, str] = {}
    errors: list[ServerError] = []
    for line in text.splitlines():
        if line.startswith("NCCL_BENCH_RESULT "):
            try:
                result = json.loads(line[len("NCCL_BENCH_RESULT ") :])
            except ValueError:
                pass
            continue
        if line.startswith("NCCL_BENCH_FAILED "):
            failed = line[len("NCCL_BENCH_FAILED ") :].strip()
            continue
        ev = parse_line(line)
        if isinstance(ev, NcclEnv):
            seen_env[ev.name] = ev.value
        elif isinstance(ev, NcclAlgo) and ev.collective.lower() == "allreduce":
            algos[ev.bytes] = f"{ev.algo}/{ev.proto}"
        elif isinstance(ev, ServerError):
            errors.append(ev)
    return {"result": result, "failed": failed, "nccl_env": seen_env, "algos": algos, "errors": errors}


def worker_command(  # noqa: PLR0913
    preset: P.Preset,
    env: dict[str, str],
    worker: str,
    backend: str,
    world: int,
    sizes: list[int],
    iters: int,
    warmup: int,
    dtype_bytes: int,
    graph: bool,
) -> str:
    """The worker's command line: every value quoted (env values come from presets and grids)."""
    return (
        f"env -- {' '.join(shlex.quote(f'{k}={v}') for k, v in env.items())} "
        f"{P.shell_path(preset.python())} {P.shell_path(worker)} --backend {shlex.quote(backend)} "
        f"--world-size {int(world)} --sizes {','.join(str(int(s)) for s in sizes)} --iters {int(iters)} "
        f"--warmup {int(warmup)} --dtype-bytes {int(dtype_bytes)}" + (" --graph" if graph else "") + " 2>&1"
    )


async def run(
    t: Transport, preset: P.Preset, o: NcclBenchOptions, *, progress: Callable[[str], None] | None = None
) -> NcclBenchReport:
    """Time the decode all-reduces under each NCCL setting of ``o.grid`` on ``t`` (``o.check``'s grid and
    sizes; the sizes from the model's hidden size where ``o.sizes`` is not given): the report that
    ``format_table`` prints, its ``ranking`` the settings that ran, fastest first."""
    grid, sizes = o.check()
    iters, warmup, backend, timeout_s, dtype_bytes = o.iters, o.warmup, o.backend, o.timeout, DTYPE_BYTES
    world = o.world_size or preset.tp_size()
    graph = o.graph and backend == "nccl"  # CUDA graphs need the GPU path
    if world < 1:
        raise NcclBenchError(f"world size must be at least 1 (got {world})", 2)
    if sizes is None:
        hidden = o.hidden_size or await model_hidden_size(t, preset)
        if hidden is None:
            raise NcclBenchError(
                "cannot read hidden_size from the model's config.json on the target; "
                "pass --hidden-size (e.g. 7168) or --sizes",
                2,
            )
        sizes = decode_sizes(preset, hidden, dtype_bytes)
    plan = configs(preset, grid)
    worker = f"{STATE_DIR}/nccl_worker.py"
    await t.upload(resources.files("tuitune.machine.remote").joinpath("nccl_worker.py").read_bytes(), worker)
    rows: list[NcclBenchRow] = []
    for entry in plan:
        row = NcclBenchRow(label=entry["label"], changes=entry["changes"], current=entry.get("current", False))
        if "skipped" in entry:
            row.skipped = entry["skipped"]
            rows.append(row)
            continue
        env = {k: v for k, v in entry["env"].items()}
        if backend == "nccl":
            env.update({k: v for k, v in DEBUG_ENV.items() if k not in env})
        cmd = worker_command(preset, env, worker, backend, world, sizes, iters, warmup, dtype_bytes, graph)
        if progress:
            progress(f"running {entry['label']} ({world} process(es), {len(sizes)} size(s))")
        t0 = time.monotonic()
        try:
            r = await t.run(cmd, timeout=timeout_s)
        except TransportError as e:
            if "timed out" not in str(e):
                raise
            row.error = f"timed out after {timeout_s:.0f} s (a hung collective?)"
            rows.append(row)
            continue
        if r.exit_status == 3 and "NCCL_BENCH_NO_CUDA " in r.stdout:
            have = r.stdout.split("NCCL_BENCH_NO_CUDA ", 1)[1].split()[0]
            raise NcclBenchError(
                f"{t.label} has {'no' if have == '0' else 'only ' + have} CUDA device(s) for "
                f"{world} NCCL process(es); the nccl backend needs one GPU per process "
                f"(--backend gloo tries the tool out on CPUs)",
                1,
            )
        out = parse_output(r.stdout + r.stderr)
        row.seconds = time.monotonic() - t0
        row.nccl_env = out["nccl_env"]
        row.algos = {str(k): v for k, v in out["algos"].items()}
        want = {k: v for k, v in entry["env"].items() if k.startswith("NCCL_") and k not in DEBUG_ENV}
        row.confirmed = (
            {k: ("applied" if out["nccl_env"].get(k) == want[k] else "missing") for k in want}
            if backend == "nccl"
            else {}
        )
        if out["result"] is None or r.exit_status != 0:
            cause = classify(out["errors"])
            tail = (r.stdout + r.stderr).strip().splitlines()
            if cause:
                msg = cause[1]
            elif out["failed"]:
                msg = out["failed"]
            else:
                msg = tail[-1] if tail else f"exit status {r.exit_status}"
            row.error = msg[:300]
        else:
            row.results = out["result"]["results"]
            row.info = {k: v for k, v in out["result"].items() if k != "results"}
        rows.append(row)
    decode_bytes = max(sizes)
    timed = [(at["median_us"], x) for x in rows if (at := _at(x, decode_bytes)) is not None]
    ranked = [x for _, x in sorted(timed, key=lambda t: t[0])]
    return NcclBenchReport(
        preset=preset.name,
        world_size=world,
        backend=backend,
        graph=graph,
        sizes=sizes,
        decode_bytes=decode_bytes,
        rows=rows,
        ranking=[x.label for x in ranked],
    )


def _at(row: NcclBenchRow, size: int) -> dict | None:
    """The result for ``size`` (the worker rounds to whole elements, so match the nearest)."""
    res = row.results or []
    return min(res, key=lambda r: abs(r["bytes"] - size)) if res else None


def format_table(report: NcclBenchReport) -> str:
    sizes = report.sizes
    w = max([len(r.label) + 1 for r in report.rows] + [14])
    head = (
        f"{'rank':>4}  {'configuration':<{w}}" + "".join(f" {f'{s} B p50/p99 µs':>22}" for s in sizes) + "  NCCL chose"
    )
    lines = [
        f"{report.preset}: all-reduce, {report.world_size} process(es), backend {report.backend}"
        + (", CUDA graph" if report.graph else "")
        + f"; ranked at {report.decode_bytes} B",
        head,
    ]
    order = {label: i for i, label in enumerate(report.ranking)}
    for row in sorted(report.rows, key=lambda x: order.get(x.label, 10**6)):
        mark = "*" if row.current else " "
        name = f"{mark}{row.label}"
        if row.skipped is not None:
            lines.append(f"{'-':>4}  {name:<{w}} skipped: {row.skipped}")
            continue
        if row.error is not None:
            err = row.error if len(row.error) <= 110 else row.error[:50] + " … " + row.error[-55:]
            lines.append(f"{'-':>4}  {name:<{w}} failed: {err}")
            continue
        cells = ""
        for s in sizes:
            r = _at(row, s)
            cells += f" {r['median_us']:>10.1f}/{r['p99_us']:<10.1f}" if r else f" {'-':>22}"
        chose = ", ".join(sorted(set((row.algos or {}).values()))) or "-"
        missing = [k for k, v in (row.confirmed or {}).items() if v != "applied"]
        note = f"  (not echoed by NCCL: {', '.join(missing)})" if missing else ""
        lines.append(f"{order[row.label] + 1:>4}  {name:<{w}}{cells}  {chose}{note}")
    lines.append("* = the preset's current setting")
    if report.backend == "gloo":
        lines.append(
            "backend gloo: NCCL is not used, so the NCCL variables are not exercised "
            "(a trial of the tool; rank NCCL settings with --backend nccl on GPUs)"
        )
    if report.world_size == 1 and report.backend == "nccl":
        lines.append(
            "world size 1: PyTorch creates no NCCL communicator, so NCCL variables are not exercised "
            "(a smoke test of the GPU path)"
        )
    return "\n".join(lines)


def validate_grid(grid: dict) -> None:
    """Reject values NCCL would refuse before uploading anything (clear, early)."""
    for key, values in grid.items():
        name = key.split(".", 1)[1] if key.startswith("env.") else None
        for v in values:
            if name and v is not None:
                errs, _ = nccl.check(name, str(v))
                if errs:
                    raise NcclBenchError(f"--grid {key}: {errs[0]}", 2)
