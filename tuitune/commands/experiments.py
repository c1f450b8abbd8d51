"""`tuitune ab|crossover|sweep|tune|nccl-bench`: experiments that relaunch the server and measure it."""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import sys

from tuitune.commands.common import (
    CliError,
    any_arg,
    bench_flags,
    guarded,
    int_list,
    load_preset,
    overrides,
    run_async,
    run_experiment,
    say,
    with_control,
    write_json,
)

AB_MAX_ROUNDS = 8  # --until-decided without --max-rounds; tune's --ab-max-rounds


def ab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="baseline preset")
    p.add_argument("b", help="candidate preset")
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="launches per preset (default 4; 4 is the "
        "fewest with which the exact Mann-Whitney test can reach p < 0.05); with --until-decided, the first look",
    )
    p.add_argument(
        "--until-decided",
        action="store_true",
        help="sequential: after --rounds, look after every round and add rounds until the interval decides "
        "or --max-rounds are spent (group-sequential Mann-Whitney, Pocock-type alpha spending: 5%% overall)",
    )
    p.add_argument(
        "--max-rounds", type=int, help="with --until-decided: the most launches per preset (default 8, at most 40)"
    )
    p.add_argument(
        "--no-verdict",
        action="store_true",
        help="run fewer rounds than a verdict needs anyway, as a measurement without a verdict",
    )
    p.add_argument(
        "--min-effect",
        type=float,
        default=0.01,
        help="minimum practical effect (0.01 = 1%%, the default): a decided difference is reported against it "
        "(and never discarded for it); with --until-decided an interval inside 1 ± it also stops the A/B",
    )
    p.add_argument(
        "--spread-from",
        action="append",
        default=[],
        metavar="FILE",
        help="earlier `ab --json` / `tune --json` results (or a tune.jsonl): the launch-to-launch spread of "
        "these presets' launches there states the power before relaunching (repeatable)",
    )
    p.add_argument(
        "--spread",
        type=float,
        metavar="SD",
        help="a launch-to-launch spread to state the power with (relative sd, 0.02 = 2%%, the prior otherwise)",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each launch")
    bench_flags(p)
    p.add_argument("--json", metavar="OUT", help="write the launches, medians and verdict as JSON")
    any_arg(p)
    p.set_defaults(run=cmd_ab)


def cmd_ab(ns) -> int:  # noqa: C901
    from tuitune.experiments.ab import MAX_ROUNDS, ab_notes, format_ab, rounds_refusal, run_ab, spread_from

    a, b = load_preset(ns.a), load_preset(ns.b)
    if a.target.label() != b.target.label():
        raise CliError(f"{a.name} and {b.name} must run on the same target to be interleaved", 2)
    if ns.rounds < 1:
        raise CliError(f"--rounds must be at least 1 (got {ns.rounds})", 2)
    if not 0 <= ns.min_effect < 1:
        raise CliError(f"--min-effect must be in [0, 1) (got {ns.min_effect})", 2)
    if ns.max_rounds is not None and not ns.until_decided:
        raise CliError("--max-rounds is the budget of a sequential A/B: add --until-decided", 2)
    last = ns.rounds
    if ns.until_decided:
        if ns.no_verdict:
            raise CliError("--until-decided runs until a verdict: it cannot be combined with --no-verdict", 2)
        last = ns.max_rounds if ns.max_rounds is not None else max(AB_MAX_ROUNDS, ns.rounds + 4)
        if not ns.rounds < last <= MAX_ROUNDS:
            raise CliError(
                f"--max-rounds must be above --rounds ({ns.rounds}) and at most {MAX_ROUNDS} (got {last})", 2
            )
        if why := rounds_refusal(last, "--max-rounds"):
            raise CliError(why, 2)
    elif (why := rounds_refusal(ns.rounds)) and not ns.no_verdict:
        raise CliError(why, 2)  # before any relaunch: no launch could change the answer
    if ns.spread is not None and not 0 < ns.spread < 1:
        raise CliError(f"--spread must be between 0 and 1 (got {ns.spread})", 2)
    if ns.spread is not None and ns.spread_from:
        raise CliError("--spread and --spread-from both state the spread: give one", 2)
    for note in ab_notes(a, b, ns.rounds, last):
        print(f"note: {note}", file=sys.stderr)
    ov = overrides(ns)
    api_a, api_b = (ov.get("api", p.bench.api) for p in (a, b))
    if api_a != api_b:  # /generate and /v1/completions are timed differently (ITL spread evenly)
        raise CliError(
            f"{a.name} is benchmarked through the {api_a} API and {b.name} through the {api_b} "
            "API, which is not comparable; set bench.api: openai in both (or pass --api openai)",
            2,
        )
    spread, source = ns.spread, "a stated prior (--spread)"
    if ns.spread_from:
        conc = ov.get("concurrency", a.bench.concurrency)
        try:
            spread, source = spread_from(ns.spread_from, [a, b], conc)
        except ValueError as e:
            raise CliError(str(e), 2) from None
    t, _ = with_control(a)

    async def go(on_cleanup):
        return await run_ab(
            t,
            a,
            b,
            ns.rounds,
            ov,
            ns.min_effect,
            ns.timeout,
            progress=say,
            allow_any=ns.any,
            spread=spread,
            spread_source=source,
            judge=not ns.no_verdict,
            max_rounds=last,
            on_cleanup=on_cleanup,
        )

    result = run_experiment("ab", lambda on_cleanup: guarded(lambda: go(on_cleanup), t))
    print(format_ab(result))
    if ns.json:
        write_json(ns.json, result)
    return 0 if result["verdict"]["verdict"] != "not comparable" else 1


def crossover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset", help="a preset with speculation on; its twin has it off")
    bench_flags(p, levels=True)
    p.add_argument("--rounds", type=int, default=1, help="times each level is measured per arm (default 1)")
    p.add_argument(
        "--min-effect", type=float, default=0.02, help="smallest speedup change that counts (0.02 = 2%%, default)"
    )
    p.add_argument("--plot", metavar="OUT.png|OUT.svg", help="also write the plot to a file")
    p.add_argument("--no-plot", action="store_true", help="leave out the terminal plot")
    p.add_argument("--json", metavar="OUT", help="write the levels, speedups and verdict as JSON")
    p.set_defaults(run=cmd_crossover)


def cmd_crossover(ns) -> int:
    from pathlib import Path

    from tuitune.experiments.crossover import crossover, format_result, plot_text, write_plot

    p = load_preset(ns.preset)
    levels = ns.concurrency or [1, 4, 16, 64]
    if ns.rounds < 1 or not 0 <= ns.min_effect < 1:
        raise CliError("--rounds must be at least 1 and --min-effect in [0, 1)", 2)
    if ns.plot and Path(ns.plot).suffix.lower() not in (".png", ".svg"):
        raise CliError(f"--plot {ns.plot}: the file must end in .png or .svg", 2)
    ov = overrides(ns, level=levels[0])
    ov.pop("concurrency", None)
    result = run_experiment(
        "crossover",
        lambda on_cleanup: crossover(
            p, sorted(levels), ov, rounds=ns.rounds, min_effect=ns.min_effect, progress=say, on_cleanup=on_cleanup
        ),
    )
    print()
    print(format_result(result))
    if not ns.no_plot:
        import shutil

        print()
        chart = plot_text(result, width=min(shutil.get_terminal_size((100, 24)).columns, 120))
        print(chart if sys.stdout.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", chart))  # no colour codes in files
    if ns.json:
        write_json(ns.json, result)
    if ns.plot:
        write_plot(result, Path(ns.plot))
        print(f"plot written to {ns.plot}")
    return 0 if result["comparable"] else 1


def ncclbench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="env.VAR=V1,V2,...",
        help="a grid axis (repeatable); 'unset' leaves the variable out",
    )
    p.add_argument(
        "--sizes",
        help="message sizes in bytes, comma-separated (default: decode all-reduces from the model's hidden size)",
    )
    p.add_argument("--hidden-size", type=int, help="the model's hidden size when config.json is not readable")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--graph",
        action="store_true",
        default=True,
        help="replay the all-reduces in a CUDA graph, as SGLang decode does (the default)",
    )
    mode.add_argument(
        "--eager",
        dest="graph",
        action="store_false",
        help="time eager all-reduces instead (they can rank protocols differently from decode)",
    )
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--world-size", type=int, help="processes (default: the preset's tp-size)")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="gloo: CPU, for trying the tool out (NCCL variables are not exercised)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--json", metavar="OUT")
    p.set_defaults(run=cmd_ncclbench)


def cmd_ncclbench(ns) -> int:
    from tuitune.experiments import grid as G
    from tuitune.experiments import ncclbench as NB

    p = load_preset(ns.preset)
    grid = G.parse(ns.grid)
    NB.validate_grid(grid)
    try:
        sizes = [int(x) for x in ns.sizes.split(",")] if ns.sizes else None
    except ValueError:
        raise CliError(f"--sizes {ns.sizes!r}: expected bytes, comma-separated (e.g. 14336,43008)", 2) from None
    for flag in ("iters", "hidden_size", "world_size"):
        v = getattr(ns, flag)
        if v is not None and v < 1:
            raise CliError(f"--{flag.replace('_', '-')} must be at least 1 (got {v})", 2)
    t, _ = with_control(p)

    async def go():
        return await NB.run(
            t,
            p,
            grid,
            sizes=sizes,
            hidden_size=ns.hidden_size,
            graph=ns.graph,
            iters=ns.iters,
            warmup=ns.warmup,
            world_size=ns.world_size,
            backend=ns.backend,
            timeout_s=ns.timeout,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
        )

    report = run_async(guarded(go, t))
    print(NB.format_table(report))
    if ns.json:
        write_json(ns.json, report)
    return 0 if report["ranking"] else 1


def sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2,...",
        help="a preset path and its values (repeatable): speculative.num_steps=1,2,3, "
        "env.NCCL_PROTO=LL,unset, env=@tuned-preset,@untuned-preset",
    )
    p.add_argument("--baseline", help="baseline preset (default: PRESET itself)")
    p.add_argument("--repeats", type=int, default=1, help="launches per configuration (default 1)")
    p.add_argument("--baseline-every", type=int, default=4, help="re-measure the baseline every N trials")
    p.add_argument("--out", default="sweep-out", help="directory for results and captures (default sweep-out)")
    p.add_argument("--resume", action="store_true", help="skip the trials already in OUT/results.jsonl")
    bench_flags(p)
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(run=cmd_sweep)


def cmd_sweep(ns) -> int:
    from pathlib import Path

    from tuitune.experiments import grid as G
    from tuitune.experiments.sweep import format_table, plot, sweep
    from tuitune.measure.report import colour_wanted

    base = load_preset(ns.preset)
    baseline = load_preset(ns.baseline) if ns.baseline else None
    if ns.repeats < 1 or ns.baseline_every < 0:
        raise CliError("--repeats must be at least 1 and --baseline-every at least 0", 2)
    result = run_experiment(
        "sweep",
        lambda on_cleanup: sweep(
            base,
            G.parse(ns.grid),
            Path(ns.out),
            baseline=baseline,
            repeats=ns.repeats,
            baseline_every=ns.baseline_every,
            resume=ns.resume,
            overrides=overrides(ns),
            progress=say,
            on_cleanup=on_cleanup,
        ),
    )
    print()
    print(format_table(result))
    if not ns.no_plot:
        chart = plot(result, colour=colour_wanted())
        if chart:
            print()
            print(chart)
    return 0 if result.get("best") else 1


def tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--budget", type=int, required=True, help="relaunches the search may spend (the A/B comes on top)")
    p.add_argument("--concurrency", type=int, help="the load to tune for (default: the preset's bench.concurrency)")
    p.add_argument("--out", default="tune-out", help="directory for the log, captures and best.yaml (default tune-out)")
    p.add_argument("--resume", action="store_true", help="continue the run logged in OUT/tune.jsonl")
    p.add_argument(
        "--levels", help="load levels benchmarked per launch (default: concurrency/4, concurrency, 2 x concurrency)"
    )
    p.add_argument(
        "--ab-rounds",
        type=int,
        default=4,
        help="launches per arm of the final A/B before its first look (default 4; 0: no A/B, the "
        "search's answer is reported unconfirmed and no best.yaml is written)",
    )
    p.add_argument(
        "--ab-max-rounds",
        type=int,
        default=AB_MAX_ROUNDS,
        help="the final A/B adds rounds until its interval decides, up to this many per arm (default 8; "
        "equal to --ab-rounds: a fixed A/B)",
    )
    p.add_argument(
        "--no-verdict",
        action="store_true",
        help="run a final A/B with fewer rounds than a verdict needs anyway, as a measurement (no best.yaml)",
    )
    p.add_argument(
        "--nccl",
        action="store_true",
        help="first rank NCCL settings with nccl-bench (seconds) and measure the start with the winner (one relaunch)",
    )
    p.add_argument(
        "--nccl-grid",
        action="append",
        default=[],
        metavar="env.VAR=V1,V2,...",
        help="the NCCL settings --nccl ranks (repeatable; default NCCL_PROTO x NCCL_ALGO)",
    )
    p.add_argument("--nccl-backend", choices=["nccl", "gloo"], default="nccl", help="gloo: CPU, for trying it out")
    p.add_argument(
        "--hidden-size", type=int, help="the model's hidden size for --nccl when config.json is not readable"
    )
    p.add_argument("--requests", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--prompts", metavar="FILE", help="your own prompts (see `tuitune bench --help`)")
    p.add_argument("--json", metavar="OUT", help="write the result as JSON")
    p.set_defaults(run=cmd_tune)


def cmd_tune(ns) -> int:
    from pathlib import Path

    from tuitune.experiments.tune import format_result

    base = load_preset(ns.preset)
    if ns.budget < 0:
        raise CliError(f"--budget must be at least 0 (got {ns.budget})", 2)
    if ns.ab_rounds < 0:
        raise CliError(f"--ab-rounds must be at least 0 (got {ns.ab_rounds}; 0: no final A/B)", 2)
    from tuitune.experiments.ab import MAX_ROUNDS

    if not 1 <= ns.ab_max_rounds <= MAX_ROUNDS:
        raise CliError(f"--ab-max-rounds must be between 1 and {MAX_ROUNDS} (got {ns.ab_max_rounds})", 2)
    conc = ns.concurrency if ns.concurrency is not None else base.bench.concurrency
    if conc < 1:
        raise CliError(f"--concurrency must be at least 1 (got {conc})", 2)
    levels = int_list(ns.levels, "--levels") if ns.levels else None
    ns.concurrency, ns.api = None, None
    ov = overrides(ns)
    with _resumable(ns, Path(ns.out)):
        result = _tune(ns, base, conc, levels, ov)
    print()
    print(format_result(result))
    if ns.json:
        write_json(ns.json, result)
    return 0 if result["verdict"].get("verdict") != "not comparable" else 1


def _tune(ns, base, conc: int, levels: list[int] | None, ov: dict) -> dict:
    from pathlib import Path

    from tuitune.experiments.tune import tune

    return run_experiment(
        "tune",
        lambda on_cleanup: tune(
            base,
            ns.budget,
            conc,
            Path(ns.out),
            resume=ns.resume,
            levels=levels,
            overrides=ov,
            ab_rounds=ns.ab_rounds,
            ab_judge=not ns.no_verdict,
            ab_max_rounds=ns.ab_max_rounds,
            nccl=ns.nccl or bool(ns.nccl_grid),
            nccl_backend=ns.nccl_backend,
            nccl_grid=ns.nccl_grid,
            hidden_size=ns.hidden_size,
            progress=say,
            on_cleanup=on_cleanup,
        ),
    )


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
    "ab": ab_args,
    "crossover": crossover_args,
    "nccl-bench": ncclbench_args,
    "sweep": sweep_args,
    "tune": tune_args,
}
