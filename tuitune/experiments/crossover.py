"""`tuitune crossover`: where speculation stops paying, on this box, for this drafter.

The preset and its twin with speculation off (everything else the same) are benchmarked at each
concurrency level, interleaved: level 1 on then off, level 2 off then on, … (A B B A …), so that
drift over the run hits both arms alike and the server running at the end of one level serves
the start of the next (levels + 1 launches, not 2 × levels). Per level: goodput of each arm, the
speedup (on / off) with a 95 % bootstrap CI over requests, and a verdict. The crossover is the
first level where speculation is significantly slower.

`crossover --live` measures both arms inside one launch prepared to switch (``speculative.switch``,
docs/switch.md): the preset's own step count against another (``--against``, 0 by default), each
block held through the engine's own switching code, in the same interleaved order, no relaunch;
a level where a profile window after the hold ran under another step count is not comparable.
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


def said(level: int, arm: str, run: BenchRun) -> str:
    """One block's line of progress: its level, its arm, its goodput (and failures)."""
    gp = run.goodput()
    return (
        f"  concurrency {level}, {arm}: "
        + (f"{gp['tok_s']:.1f} tok/s" if gp else "no successful request")
        + (f", {run.failed} failed" if run.failed else "")
    )


def _mean(vals: list[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def summarize(
    preset: P.Preset, levels: list[int], runs: dict, min_effect: float, problems: dict[int, str] | None = None
) -> CrossoverResult:
    """Every level's verdict; ``problems``: a level's blocks that did not run the step count they
    claim (`--live`), by level, which makes that level not comparable."""
    rows = [level_verdict(runs[(c, "on")], runs[(c, "off")], c, min_effect) for c in levels]
    for row in rows:
        why = (problems or {}).get(row.concurrency)
        if why and row.verdict != "not comparable":
            row.verdict, row.reason, row.speedup, row.ci95 = "not comparable", why, math.nan, [math.nan, math.nan]
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
                    progress(said(cfg.concurrency, f"speculation {arm}", run))

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


def live_steps(preset: P.Preset, against: int) -> tuple[int, int]:
    """(the preset's own step count, the one it is crossed against) for `crossover --live`, both
    ones its launch is prepared to hold; CrossoverError (one sentence) otherwise."""
    e = preset.engine
    word = e.step_name
    prepared = preset.switch_steps
    if prepared is None:
        raise CrossoverError(
            f"{preset.name}: --live measures inside one launch prepared to switch; set speculative.switch to hold "
            f"its own {word} and {word} {against} (docs/switch.md), or run crossover without --live"
        )
    own = e.static_config(preset)
    if own is None:
        raise CrossoverError(f"{preset.name}: {e.label} picks its {word} at start, so there is no own {word} to cross")
    if own[0] == against:
        raise CrossoverError(f"--against {against}: that is {preset.name}'s own {word}; cross it against another")
    missing = [k for k in (own[0], against) if k not in prepared]
    if missing:
        raise CrossoverError(
            f"{word} {missing[0]} is not one the launch is prepared to hold ({prepared}): add it to "
            "speculative.switch, or run crossover without --live"
        )
    return own[0], against


def live_notes(word: str, on: int, off: int, runs: dict, levels: list[int]) -> list[str]:
    """What a crossover inside one launch is not, said with its result."""
    notes = [
        f"both arms ran in one launch prepared to switch, {word} {on} and {word} {off} held in turn; "
        "nothing else differed between them"
    ]
    if off == 0:
        notes.append(
            f"{word} 0 held is not a launch without speculation: the draft stays loaded (an engine may still run "
            "its forward), so speculation is crossed against this launch's own off; run crossover without --live "
            "to compare with a launch that has none"
        )
    caps = sorted({r.server.get("max_running_requests") for rs in runs.values() for r in rs} - {None})
    if caps and caps[0] < max(levels):
        notes.append(
            f"both arms ran under this launch's limit of {caps[0]} requests at once; a launch without "
            "speculation may allow more"
        )
    return notes


async def live_crossover(
    preset: P.Preset,
    levels: list[int],
    against: int = 0,
    overrides: dict | None = None,
    rounds: int = 1,
    min_effect: float = 0.02,
    progress: Callable[[str], None] | None = None,
    on_cleanup: Callable[[str], None] | None = None,
) -> CrossoverResult:
    """Both arms at every level inside one launch prepared to switch, in crossover's interleaved order,
    each block held at its arm's step count; a hold in force before it is put back at the end (as
    `sweep --live` does). Interrupted, the server keeps running (what became of the hold is said to
    ``on_cleanup``)."""
    from tuitune.experiments.live import block_check, collected_windows, prepared_launch

    on, off = live_steps(preset, against)
    steps = {"on": on, "off": off}
    word = preset.engine.step_name
    say = progress or (lambda _m: None)
    runs: dict[tuple[int, str], list[BenchRun]] = {(c, a): [] for c in levels for a in ARMS}
    problems: dict[int, str] = {}
    async with prepared_launch(preset, say, on_cleanup) as session:
        with collected_windows(session) as windows:
            for level, arm in schedule(levels, rounds):
                k = steps[arm]
                await session.hold(k)
                windows.clear()
                (run,) = await bench_levels(session, [level], overrides, label=f"{word} {k} c={level}")
                runs[(level, arm)].append(run)
                n, _held, other = block_check(list(windows), k)
                if other and level not in problems:
                    problems[level] = (
                        f"{other} of the {n} profile windows of {word} {k}'s block ran under another step count "
                        "than the one held"
                    )
                say(said(level, f"{word} {k} held", run))
    result = summarize(preset, levels, runs, min_effect, problems)
    result.twin = f"{preset.name} at {word} {off}"
    result.step_name, result.steps = word, [on, off]
    result.notes = live_notes(word, on, off, runs, levels)
    if not preset.profile:
        result.notes.append("profile is off: which step count each block ran under was not checked (set profile: true)")
    return result


def arm_labels(result: CrossoverResult) -> tuple[str, str]:
    """The two arms' names: speculation on and off, or the two step counts held (`--live`)."""
    if result.steps:
        return f"{result.step_name} {result.steps[0]}", f"{result.step_name} {result.steps[1]}"
    return "spec on", "spec off"


def format_result(result: CrossoverResult) -> str:
    a, b = arm_labels(result)
    lines = [f"{'conc':>5} {a + ' tok/s':>14} {b + ' tok/s':>15} {'speedup':>8} {'95% CI':>15}  verdict"]
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
    what = f"{a} against {b}" if result.steps else "speculation"
    if not result.comparable:
        lines.append("\ncrossover: not comparable (see the levels above)")
    elif result.crossover is not None:
        lines.append(
            f"\ncrossover: {what} stops paying at concurrency {result.crossover} "
            f"(the first level where it is significantly slower)"
        )
    else:
        lines.append(
            f"\ncrossover: not within the tested range ({what} is never significantly slower "
            f"at concurrency {', '.join(str(r.concurrency) for r in result.levels)})"
        )
    lines += [f"note: {n}" for n in result.notes or []]
    return "\n".join(lines)


def _series(result: CrossoverResult) -> tuple[list[int], dict[str, list[float]]]:
    xs = [r.concurrency for r in result.levels]
    a, b = arm_labels(result) if result.steps else ("speculation on", "speculation off")
    return xs, {a: [r.on.goodput for r in result.levels], b: [r.off.goodput for r in result.levels]}


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
        plt.plot(xs, ys, label=name, marker="o" if name == next(iter(series)) else "x")
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
