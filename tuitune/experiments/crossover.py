"""`tuitune crossover`: where speculation stops paying, on this box, for this drafter.

The preset and its twin with speculation off (everything else the same) are benchmarked at each
concurrency level, interleaved: level 1 on then off, level 2 off then on, … (A B B A …), so that
drift over the run hits both arms alike and the server running at the end of one level serves
the start of the next (levels + 1 launches, not 2 × levels). Per level: goodput of each arm, the
speedup (on / off) with a 95 % bootstrap CI over requests, and a verdict. The crossover is the
first level where speculation is significantly slower.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.experiments.results import CrossoverArm, CrossoverLevel, CrossoverResult
from tuitune.machine.session import Session
from tuitune.measure import stats
from tuitune.measure.benchrun import BenchRun, stream_goodput
from tuitune.measure.levels import bench_levels
from tuitune.measure.serverinfo import limit_confound

ARMS = ("on", "off")


class CrossoverError(TuituneError):
    """One sentence; ``code`` 2 for bad input (nothing to compare), 1 for failed work (the plot file)."""

    code = 2


def twin(preset: P.Preset) -> P.Preset:
    """The same preset with speculation off."""
    return P.with_changes(
        preset,
        {"speculative": None, "name": f"{preset.name}-nospec", "description": f"{preset.name} with speculation off"},
    )


def schedule(levels: list[int], rounds: int) -> list[tuple[int, str]]:
    """(level, arm) in measuring order: A B, B A, A B … so consecutive levels share a launch."""
    order, flip = [], False
    for _ in range(rounds):
        for c in levels:
            order += [(c, arm) for arm in (ARMS[::-1] if flip else ARMS)]
            flip = not flip
    return order


def launches(order: list[tuple[int, str]]) -> list[tuple[str, list[int]]]:
    """The schedule as launches: each arm with the levels measured before the next relaunch."""
    out: list[tuple[str, list[int]]] = []
    for level, arm in order:
        if out and out[-1][0] == arm:
            out[-1][1].append(level)
        else:
            out.append((arm, [level]))
    return out


def level_verdict(on: list[BenchRun], off: list[BenchRun], level: int, min_effect: float) -> CrossoverLevel:
    """One level: goodput per arm, speedup with its CI, and whether speculation pays there."""
    failed = sum(r.failed for r in on + off)
    pairs = {arm: [p for r in runs for p in r.goodput_pairs()] for arm, runs in (("on", on), ("off", off))}
    arm_of = {
        arm: CrossoverArm(
            goodput=stream_goodput(pairs[arm], level) if pairs[arm] else math.nan,
            batch_size=_mean([b for r in runs for b in r.batch_sizes]),
            accept_len=_mean([q.accept_len for r in runs for q in r.ok if q.accept_len]),
        )
        for arm, runs in (("on", on), ("off", off))
    }
    late = [r for r in on + off if r.sim_behind()]
    held = [r for r in on + off if r.gpu_note]
    mixed = held and len(held) < len(on + off)  # GPUs held back in one arm's runs only, as in `ab`
    confound = limit_confound(
        {
            "speculation on": [r.server.get("max_running_requests") for r in on],
            "off": [r.server.get("max_running_requests") for r in off],
        },
        level,
    )
    row = CrossoverLevel(
        concurrency=level,
        on=arm_of["on"],
        off=arm_of["off"],
        limits=confound[1] if confound else None,
        speedup=math.nan,
        ci95=[math.nan, math.nan],
        verdict="not comparable",
    )
    if failed or late or mixed or not pairs["on"] or not pairs["off"] or (confound and confound[0]):
        row.reason = (
            confound[1]
            if confound and confound[0]
            else f"{failed} request(s) failed"
            if failed
            else f"the simulator fell behind its clock ({late[0].sim_behind()}): lower --sim-speedup"
            if late
            else f"GPUs were held back during part of it ({held[0].gpu_note})"
            if mixed
            else "no successful request in one arm"
        )
        return row
    row.speedup = row.on.goodput / row.off.goodput
    lo, hi = stats.bootstrap_ratio_ci(pairs["off"], pairs["on"], statistic=lambda s: stream_goodput(s, level))
    row.ci95 = [lo, hi]
    row.verdict = "faster" if lo > 1 + min_effect else "slower" if hi < 1 - min_effect else "no significant difference"
    # A level the server could not batch is not the level it claims to be: say so.
    short = [
        (arm, a.batch_size) for arm, a in arm_of.items() if a.batch_size is not None and a.batch_size < 0.5 * level
    ]
    if short:
        row.note = f"the server ran about {short[0][1]:.0f} requests at once (speculation {short[0][0]}), not {level}"
    return row


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def summarize(preset: P.Preset, levels: list[int], runs: dict, min_effect: float) -> CrossoverResult:
    rows = [level_verdict(runs[(c, "on")], runs[(c, "off")], c, min_effect) for c in levels]
    return CrossoverResult(
        preset=preset.name,
        twin=twin(preset).name,
        levels=rows,
        crossover=next((r.concurrency for r in rows if r.verdict == "slower"), None),
        min_effect=min_effect,
        comparable=all(r.verdict != "not comparable" for r in rows),
    )


async def crossover(
    preset: P.Preset,
    levels: list[int],
    overrides: dict | None = None,
    rounds: int = 1,
    min_effect: float = 0.02,
    progress: Callable[[str], None] | None = None,
    session: Session | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> CrossoverResult:
    """Both arms at every level, interleaved. Interrupted (Ctrl-C, SIGTERM), it stops the server it
    started and says so to ``on_cleanup``."""
    if not preset.is_speculative:
        raise CrossoverError(f"{preset.name} has no speculation to turn off (speculative.algorithm is unset)")
    arms = {"on": preset, "off": twin(preset)}
    runs: dict[tuple[int, str], list[BenchRun]] = {(c, a): [] for c in levels for a in ARMS}
    session = session or Session(preset)
    await session.connect()
    try:
        for arm, group in launches(schedule(levels, rounds)):
            if progress:
                progress(f"launching {arms[arm].name}")
            await session.relaunch(arms[arm])

            def done(cfg, run, arm=arm) -> None:
                runs[(cfg.concurrency, arm)].append(run)
                if progress:
                    gp = run.goodput()
                    progress(
                        f"  concurrency {cfg.concurrency}, speculation {arm}: "
                        + (f"{gp['tok_s']:.1f} tok/s" if gp else "no successful request")
                        + (f", {run.failed} failed" if run.failed else "")
                    )

            def label(c, name=arms[arm].name) -> str:
                return f"{name} c={c}"

            await bench_levels(session, group, overrides, label=label, on_run=done)
        await session.stop_server()
    except asyncio.CancelledError:
        await session.stop_started(on_cleanup)
        raise
    finally:
        await session.close()
    return summarize(preset, levels, runs, min_effect)


def format_result(result: CrossoverResult) -> str:
    lines = [f"{'conc':>5} {'spec on tok/s':>14} {'spec off tok/s':>15} {'speedup':>8} {'95% CI':>15}  verdict"]
    for r in result.levels:
        lo, hi = r.ci95
        lines.append(
            f"{r.concurrency:>5} {r.on.goodput:>14.1f} {r.off.goodput:>15.1f} "
            f"{r.speedup:>8.3f} {lo:>7.3f}-{hi:<7.3f}  {r.verdict}" + (f" ({r.reason})" if r.reason else "")
        )
        if r.note:
            lines.append(f"      note: {r.note}")
    m = result.min_effect
    lines.append(
        f"\nverdict: faster / slower when the speedup's 95% CI (bootstrap) lies entirely "
        f"beyond 1 ± {m:.0%}, else no significant difference; the interval alone decides (no p-value here)"
    )
    if not result.comparable:
        lines.append("\ncrossover: not comparable (see the levels above)")
    elif result.crossover is not None:
        lines.append(
            f"\ncrossover: speculation stops paying at concurrency {result.crossover} "
            f"(the first level where it is significantly slower)"
        )
    else:
        lines.append(
            f"\ncrossover: not within the tested range (speculation is never significantly slower "
            f"at concurrency {', '.join(str(r.concurrency) for r in result.levels)})"
        )
    return "\n".join(lines)


def _series(result: CrossoverResult) -> tuple[list[int], dict[str, list[float]]]:
    xs = [r.concurrency for r in result.levels]
    return xs, {
        "speculation on": [r.on.goodput for r in result.levels],
        "speculation off": [r.off.goodput for r in result.levels],
    }


MARKERS = {"on": "o", "off": "x"}  # plot_text's marker per arm


def plot_text(result: CrossoverResult, width: int = 100, height: int = 20) -> str:
    """Goodput against concurrency for both arms, in the terminal (plotext)."""
    import plotext as plt

    xs, series = _series(result)
    plt.clear_figure()
    plt.plotsize(width, height)
    plt.theme("clear")
    if max(xs) >= 8 * min(xs):
        plt.xscale("log")
    for name, ys in series.items():
        # a marker of its own for each arm: told apart without colour (NO_COLOR, a print-out)
        plt.plot(xs, ys, label=name, marker=MARKERS.get(name.split()[-1], "dot"))
    if result.crossover is not None:
        plt.vertical_line(result.crossover)
    plt.title("goodput (tok/s) against concurrency" + (", | = crossover" if result.crossover is not None else ""))
    plt.xlabel("concurrent requests")
    return plt.build()


def write_plot(result: CrossoverResult, path: Path) -> None:
    """The same plot as a PNG or SVG file (matplotlib: `pip install 'tuitune[plot]'`)."""
    if path.suffix.lower() not in (".png", ".svg"):
        raise CrossoverError(f"--plot {path}: the file must end in .png or .svg", 2)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CrossoverError("--plot needs matplotlib: pip install 'tuitune[plot]'", 1) from None
    xs, series = _series(result)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    try:
        for name, ys in series.items():
            ax.plot(xs, ys, marker="o", label=name)
        if max(xs) >= 8 * min(xs):
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        if result.crossover is not None:
            ax.axvline(result.crossover, color="grey", linestyle="--", label="crossover")
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("goodput (output tok/s)")
        ax.set_title(f"{result.preset}: speculation on vs off")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, metadata={"Date": None} if path.suffix.lower() == ".svg" else None)
    except OSError as e:
        raise CrossoverError(f"--plot {path}: cannot write it ({e.strerror or e})", 1) from None
    finally:
        plt.close(fig)
