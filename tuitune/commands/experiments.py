"""`tuitune ab|crossover|sweep|tune|nccl-bench`: experiments that relaunch the server and measure it.

Each experiment's flags, and their checks, are its options model's (experiments/options.py); the
bodies here build the model, run the experiment and print its result."""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import sys
from collections.abc import Callable

from tuitune.commands.common import (
    CliError,
    guarded,
    load_preset,
    run_async,
    run_experiment,
    say,
    with_control,
    write_json,
)
from tuitune.experiments.options import (
    ABOptions,
    CliOptions,
    CrossoverOptions,
    NcclBenchOptions,
    SweepOptions,
)
from tuitune.experiments.tuneoptions import TuneOptions


def parser_of(options: type[CliOptions], run: Callable[[argparse.Namespace], int]):
    """A command's parser: its options model's flags, and its body as ``run``."""

    def build(p: argparse.ArgumentParser) -> None:
        options.add_cli_args(p)
        p.set_defaults(run=run)

    return build


def cmd_ab(ns) -> int:
    from tuitune.experiments.ab import ab_notes, run_ab
    from tuitune.experiments.abreport import format_ab

    o = ABOptions.from_cli_args(ns)
    a, b = load_preset(o.a), load_preset(o.b)
    last = o.check(a, b)
    for note in ab_notes(a, b, o.rounds, last):
        print(f"note: {note}", file=sys.stderr)
    ov, spread, source = o.arms(a, b)
    t, _ = with_control(a)

    async def go(on_cleanup):
        return await run_ab(
            t,
            a,
            b,
            o.rounds,
            ov,
            o.min_effect,
            o.timeout,
            progress=say,
            allow_any=o.any,
            spread=spread,
            spread_source=source,
            judge=not o.no_verdict,
            max_rounds=last,
            on_cleanup=on_cleanup,
        )

    result = run_experiment("ab", lambda on_cleanup: guarded(lambda: go(on_cleanup), t))
    print(format_ab(result))
    if o.json:
        write_json(o.json, result)
    return 0 if result.verdict["verdict"] != "not comparable" else 1


def cmd_crossover(ns) -> int:
    from pathlib import Path

    from tuitune.experiments.crossover import (
        crossover,
        format_result,
        live_crossover,
        live_steps,
        plot_text,
        write_plot,
    )

    o = CrossoverOptions.from_cli_args(ns)
    p = load_preset(o.preset)
    ov = o.check()
    levels = sorted(o.levels)
    if o.live:
        against = 0 if o.against is None else o.against
        live_steps(p, against)  # refused before anything runs
        result = run_experiment(
            "crossover",
            lambda on_cleanup: live_crossover(
                p, levels, against, ov, o.rounds, o.min_effect, progress=say, on_cleanup=on_cleanup
            ),
        )
    else:
        result = run_experiment(
            "crossover",
            lambda on_cleanup: crossover(
                p, levels, ov, rounds=o.rounds, min_effect=o.min_effect, progress=say, on_cleanup=on_cleanup
            ),
        )
    print()
    print(format_result(result))
    if not o.no_plot:
        import shutil

        print()
        chart = plot_text(result, width=min(shutil.get_terminal_size((100, 24)).columns, 120))
        print(chart if sys.stdout.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", chart))  # no colour codes in files
    if o.json:
        write_json(o.json, result)
    if o.plot:
        write_plot(result, Path(o.plot))
        print(f"plot written to {o.plot}")
    return 0 if result.comparable else 1


def cmd_ncclbench(ns) -> int:
    from tuitune.experiments import ncclbench as NB

    o = NcclBenchOptions.from_cli_args(ns)
    p = load_preset(o.preset)
    o.check()  # a usage error before any connection
    t, _ = with_control(p)

    async def go():
        return await NB.run(t, p, o, progress=lambda m: print(m, file=sys.stderr, flush=True))

    report = run_async(guarded(go, t))
    print(NB.format_table(report))
    if o.json:
        write_json(o.json, report)
    return 0 if report.ranking else 1


def cmd_sweep(ns) -> int:
    from pathlib import Path

    from tuitune.experiments import grid as G
    from tuitune.experiments.sweep import format_table, plot, sweep
    from tuitune.measure.report import colour_wanted

    o = SweepOptions.from_cli_args(ns)
    base = load_preset(o.preset)
    baseline = load_preset(o.baseline) if o.baseline else None
    o.check()
    if o.live:
        return _live_sweep(o, base, G.parse(o.grid))
    result = run_experiment(
        "sweep",
        lambda on_cleanup: sweep(
            base,
            G.parse(o.grid),
            Path(o.out),
            baseline=baseline,
            repeats=o.repeats,
            baseline_every=o.baseline_every,
            resume=o.resume,
            overrides=o.overrides(),
            progress=say,
            on_cleanup=on_cleanup,
        ),
    )
    print()
    print(format_table(result))
    if not o.no_plot:
        chart = plot(result, colour=colour_wanted())
        if chart:
            print()
            print(chart)
    return 0 if result.best else 1


def _live_sweep(o, base, grid) -> int:
    from tuitune.experiments.live import LiveError, format_live, live_sweep, step_values

    try:
        values = step_values(base, grid)
    except LiveError as e:
        raise CliError(str(e), 2) from None
    result = run_experiment(
        "sweep", lambda on_cleanup: live_sweep(base, values, o, progress=say, on_cleanup=on_cleanup)
    )
    print()
    print(format_live(result))
    comparable = all(v.get("verdict") != "not comparable" for v in result.verdicts.values())
    return 0 if comparable else 1


def cmd_tune(ns) -> int:
    from tuitune.experiments.tune import TuneRun
    from tuitune.experiments.tunereport import format_result

    base = load_preset(ns.preset)
    o = TuneOptions.from_cli_args(ns, base)
    with _resumable(ns, o.out):
        result = run_experiment("tune", lambda on_cleanup: TuneRun(base, o, progress=say, on_cleanup=on_cleanup).run())
    print()
    print(format_result(result))
    if ns.json:
        write_json(ns.json, result)
    return 0 if result.verdict.get("verdict") != "not comparable" else 1


@contextlib.contextmanager
def _resumable(ns, out):
    """tune stopped early (interrupted, a launch of the final A/B that failed, the link lost) with its
    log written: the error's sentence names the exact command that goes on from it."""
    from tuitune.machine.errors import ControlError, TransportError

    try:
        yield
    except (CliError, ControlError, TransportError) as e:
        if (isinstance(e, CliError) and e.code not in (130, 143)) or not (out / "tune.jsonl").exists():
            raise  # bad usage, or nothing logged yet: nothing to resume
        argv = list(getattr(ns, "argv", None) or ["tune", ns.preset, "--budget", str(ns.budget), "--out", str(out)])
        again = shlex.join(["tuitune", *argv, *([] if "--resume" in argv else ["--resume"])])
        err = CliError(
            f"{e}; the run is logged in {out / 'tune.jsonl'}: `{again}` goes on from it", getattr(e, "code", 1)
        )
        err.log_tail = getattr(e, "log_tail", None)  # type: ignore[attr-defined]
        raise err from None


PARSERS = {
    "ab": parser_of(ABOptions, cmd_ab),
    "crossover": parser_of(CrossoverOptions, cmd_crossover),
    "nccl-bench": parser_of(NcclBenchOptions, cmd_ncclbench),
    "sweep": parser_of(SweepOptions, cmd_sweep),
    "tune": parser_of(TuneOptions, cmd_tune),
}
