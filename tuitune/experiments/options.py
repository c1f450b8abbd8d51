"""What each experiment is asked to do (ab, sweep, crossover, nccl-bench, record; tune's is
``experiments/tuneoptions.py``): one options model each, which declares its own command-line flags (``add_cli_args``), is built from the parsed
arguments (``from_cli_args``) and is checked in one place (``check``) before anything starts; and
the bench flags several of them share (``bench_flags``, ``overrides``), which ``tuitune bench`` uses too.

Imports stay light (argparse and dataclasses at the top, the rest inside the methods): the parser of
any command is built from these classes, and building it loads no heavy module.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from tuitune.base.errors import CliError

if TYPE_CHECKING:
    from tuitune import preset as P

AB_MAX_ROUNDS = 8  # --until-decided without --max-rounds; tune's --ab-max-rounds


class CliOptions:
    """The shape every options model has: its flags, and itself built from them (a flag's ``dest`` is
    the field's name; a field without a flag keeps its default)."""

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> Self:
        assert dataclasses.is_dataclass(cls)
        given = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls) if hasattr(ns, f.name)}
        return cls(**given)


# ---- the bench flags ----------------------------------------------------------------------------


def any_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--any", action="store_true", help="act on the server on the preset's port even if another preset started it"
    )


def levels_arg(text: str) -> list[int]:
    """``1,4,16,64`` -> [1, 4, 16, 64] (argparse turns the ValueError into a usage error)."""
    from tuitune.measure.levels import parse_levels

    return parse_levels(text)


levels_arg.__name__ = "concurrency list (distinct integers 1..1024, e.g. 1,4,16,64)"


def bench_flags(p: argparse.ArgumentParser, levels: bool = False) -> None:
    p.add_argument("--requests", type=int, help="measured requests (at least 2 per stream at concurrency > 1)")
    p.add_argument("--warmup", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument(
        "--concurrency",
        type=levels_arg,
        metavar="C,C,..." if levels else "C",
        help="concurrent request streams; a list measures each level in turn (goodput curve)"
        if levels
        else "concurrent request streams",
    )
    p.add_argument(
        "--api",
        choices=["native", "openai", "chat"],
        help="native (SGLang's /generate), openai (/v1/completions) or chat (/v1/chat/completions, the model's chat template)",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="your own prompts (one a line, JSONL, or ShareGPT JSON; overrides bench.prompts; default: the built-in twelve)",
    )


def _one_level(ns) -> int | None:
    if ns.concurrency is None:
        return None
    if len(ns.concurrency) > 1:
        raise CliError(
            f"--concurrency takes one level here (got {len(ns.concurrency)}); "
            "`tuitune bench` and `tuitune crossover` measure several",
            2,
        )
    return ns.concurrency[0]


def overrides(ns, level: int | None = None) -> dict:
    """The bench flags given on the command line (``ns``: the parsed arguments or an options model
    with the same names), checked (bench, ab, sweep, crossover and tune share them)."""
    level = _one_level(ns) if level is None else level
    ov = {
        k: v
        for k, v in (
            ("requests", ns.requests),
            ("warmup", ns.warmup),
            ("max_tokens", ns.max_tokens),
            ("concurrency", level),
            ("api", ns.api),
            ("prompts", _prompt_file(getattr(ns, "prompts", None))),
        )
        if v is not None
    }
    for k, v in ov.items():
        least = 0 if k == "warmup" else (2 if k == "max_tokens" else 1)
        if isinstance(v, int) and v < least:
            raise CliError(f"--{k.replace('_', '-')} must be at least {least} (got {v})", 2)
    return ov


def _prompt_file(path: str | None) -> str | None:
    """``--prompts FILE`` as an absolute path, checked now (one sentence, before any launch)."""
    if path is None:
        return None
    import os

    from tuitune.measure.workload import WorkloadError
    from tuitune.measure.workload import load as load_workload

    try:
        load_workload(path)
    except WorkloadError as e:
        raise CliError(f"--prompts: {e}", 2) from None
    return os.path.abspath(os.path.expanduser(path))


def int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise CliError(f"{flag} {text!r}: expected positive integers, comma-separated (e.g. 1,8,32)", 2)
    return sorted(set(vals))


def check_positive(ns, *flags: str) -> None:
    """Each of ``flags`` given is above 0, or a usage error naming it."""
    for flag in flags:
        v = getattr(ns, flag.replace("-", "_"))
        if v is not None and v <= 0:
            raise CliError(f"--{flag} must be positive (got {v})", 2)


@dataclass(kw_only=True)
class BenchOptions(CliOptions):
    """The bench flags as fields (``overrides`` reads them by these names)."""

    requests: int | None = None
    warmup: int | None = None
    max_tokens: int | None = None
    concurrency: list[int] | None = None
    api: str | None = None
    prompts: str | None = None

    def overrides(self, level: int | None = None) -> dict:
        return overrides(self, level)


# ---- ab -------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class ABOptions(BenchOptions):
    """`tuitune ab A B`: launches of two presets interleaved, and the verdict."""

    a: str
    b: str
    rounds: int = 4
    until_decided: bool = False
    max_rounds: int | None = None
    no_verdict: bool = False
    min_effect: float = 0.01
    spread_from: list[str] = field(default_factory=list)
    spread: float | None = None
    timeout: float = 900.0
    json: str | None = None
    any: bool = False

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
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

    def check(self, a: P.Preset, b: P.Preset) -> int:
        """The refusals that need no launch, in order; the most rounds a side (``--max-rounds``, or
        ``--rounds`` for a fixed A/B)."""
        from tuitune.experiments.ab import MAX_ROUNDS, rounds_refusal

        if a.target.label() != b.target.label():
            raise CliError(f"{a.name} and {b.name} must run on the same target to be interleaved", 2)
        if self.rounds < 1:
            raise CliError(f"--rounds must be at least 1 (got {self.rounds})", 2)
        if not 0 <= self.min_effect < 1:
            raise CliError(f"--min-effect must be in [0, 1) (got {self.min_effect})", 2)
        if self.max_rounds is not None and not self.until_decided:
            raise CliError("--max-rounds is the budget of a sequential A/B: add --until-decided", 2)
        last = self.rounds
        if self.until_decided:
            if self.no_verdict:
                raise CliError("--until-decided runs until a verdict: it cannot be combined with --no-verdict", 2)
            last = self.max_rounds if self.max_rounds is not None else max(AB_MAX_ROUNDS, self.rounds + 4)
            if not self.rounds < last <= MAX_ROUNDS:
                raise CliError(
                    f"--max-rounds must be above --rounds ({self.rounds}) and at most {MAX_ROUNDS} (got {last})", 2
                )
            if why := rounds_refusal(last, "--max-rounds"):
                raise CliError(why, 2)
        elif (why := rounds_refusal(self.rounds)) and not self.no_verdict:
            raise CliError(why, 2)  # before any relaunch: no launch could change the answer
        if self.spread is not None and not 0 < self.spread < 1:
            raise CliError(f"--spread must be between 0 and 1 (got {self.spread})", 2)
        if self.spread is not None and self.spread_from:
            raise CliError("--spread and --spread-from both state the spread: give one", 2)
        return last

    def arms(self, a: P.Preset, b: P.Preset) -> tuple[dict, float | None, str]:
        """The bench overrides, checked against both arms (one API for both), and the spread the
        power is stated with and where it comes from."""
        from tuitune.experiments.ab import spread_from

        ov = self.overrides()
        api_a, api_b = (ov.get("api", p.bench.api) for p in (a, b))
        if api_a != api_b:  # /generate and /v1/completions are timed differently (ITL spread evenly)
            raise CliError(
                f"{a.name} is benchmarked through the {api_a} API and {b.name} through the {api_b} "
                "API, which is not comparable; set bench.api: openai in both (or pass --api openai)",
                2,
            )
        spread, source = self.spread, "a stated prior (--spread)"
        if self.spread_from:
            conc = ov.get("concurrency", a.bench.concurrency)
            try:
                spread, source = spread_from(self.spread_from, [a, b], conc)
            except ValueError as e:
                raise CliError(str(e), 2) from None
        return ov, spread, source


# ---- crossover ------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CrossoverOptions(BenchOptions):
    """`tuitune crossover PRESET`: speculation on against off at each load level."""

    preset: str
    rounds: int = 1
    min_effect: float = 0.02
    plot: str | None = None
    no_plot: bool = False
    json: str | None = None
    live: bool = False
    against: int | None = None

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("preset", help="a preset with speculation on; its twin has it off")
        bench_flags(p, levels=True)
        p.add_argument("--rounds", type=int, default=1, help="times each level is measured per arm (default 1)")
        p.add_argument(
            "--min-effect", type=float, default=0.02, help="smallest speedup change that counts (0.02 = 2%%, default)"
        )
        p.add_argument("--plot", metavar="OUT.png|OUT.svg", help="also write the plot to a file")
        p.add_argument("--no-plot", action="store_true", help="leave out the terminal plot")
        p.add_argument("--json", metavar="OUT", help="write the levels, speedups and verdict as JSON")
        p.add_argument(
            "--live",
            action="store_true",
            help="both arms in one launch prepared to switch (speculative.switch): the preset's own step count "
            "held against --against's, no relaunch (docs/switch.md)",
        )
        p.add_argument(
            "--against",
            type=int,
            metavar="N",
            help="with --live: the step count the preset's own is crossed against (default 0, the launch's own off)",
        )

    @property
    def levels(self) -> list[int]:
        return self.concurrency or [1, 4, 16, 64]

    def check(self) -> dict:
        """The refusals that need no launch; the bench overrides without the level (each level's own)."""
        if self.rounds < 1 or not 0 <= self.min_effect < 1:
            raise CliError("--rounds must be at least 1 and --min-effect in [0, 1)", 2)
        if self.plot and Path(self.plot).suffix.lower() not in (".png", ".svg"):
            raise CliError(f"--plot {self.plot}: the file must end in .png or .svg", 2)
        if self.against is not None and not self.live:
            raise CliError("--against is the step count held against the preset's own inside one launch: add --live", 2)
        if self.against is not None and not 0 <= self.against <= 64:
            raise CliError(f"--against {self.against}: step counts run from 0 to 64", 2)
        ov = self.overrides(level=self.levels[0])
        ov.pop("concurrency", None)
        return ov


# ---- sweep ----------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SweepOptions(BenchOptions):
    """`tuitune sweep PRESET --grid ...`: every configuration of a grid, against a baseline."""

    preset: str
    grid: list[str]
    baseline: str | None = None
    repeats: int = 1
    baseline_every: int = 4
    out: str = "sweep-out"
    resume: bool = False
    no_plot: bool = False
    live: bool = False
    rounds: int | None = None
    seed: int = 0
    no_aa: bool = False
    no_verdict: bool = False

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
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
        live = p.add_argument_group("in one launch (--live: the step count, held through the engine's switch)")
        live.add_argument(
            "--live",
            action="store_true",
            help="measure the step counts of --grid inside one launch prepared to switch (speculative.switch): "
            "blocks in a random order each round, an A/A check, ab's verdicts; no relaunch",
        )
        live.add_argument("--rounds", type=int, help="--live: blocks per step count (default 6)")
        live.add_argument("--seed", type=int, default=0, help="--live: the seed of each round's order (default 0)")
        live.add_argument("--no-aa", action="store_true", help="--live: leave out the A/A arm")
        live.add_argument(
            "--no-verdict",
            action="store_true",
            help="--live: allow fewer rounds than a verdict needs (a measurement without verdicts)",
        )

    def check(self) -> None:
        if self.repeats < 1 or self.baseline_every < 0:
            raise CliError("--repeats must be at least 1 and --baseline-every at least 0", 2)
        if self.live:
            used = [
                flag
                for flag, on in (
                    ("--baseline", self.baseline is not None),
                    ("--repeats", self.repeats != 1),
                    ("--baseline-every", self.baseline_every != 4),
                    ("--resume", self.resume),
                )
                if on
            ]
            if used:
                raise CliError(f"{', '.join(used)}: a relaunching sweep's; --live runs rounds of blocks (--rounds)", 2)
            if self.rounds is not None and self.rounds < 1:
                raise CliError(f"--rounds must be at least 1 (got {self.rounds})", 2)
        elif self.rounds is not None or self.no_aa or self.no_verdict or self.seed:
            raise CliError("--rounds, --seed, --no-aa and --no-verdict go with --live", 2)


# ---- nccl-bench -----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class NcclBenchOptions(CliOptions):
    """`tuitune nccl-bench PRESET`: the decode all-reduces timed under each NCCL setting of a grid."""

    preset: str
    grid: list[str] = field(default_factory=list)
    sizes: str | None = None
    hidden_size: int | None = None
    graph: bool = True
    iters: int = 200
    warmup: int = 20
    world_size: int | None = None
    backend: str = "nccl"
    timeout: float = 600.0
    json: str | None = None

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
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

    def check(self) -> tuple[dict, list[int] | None]:
        """The grid (parsed and checked) and the message sizes (None: from the model's hidden size)."""
        from tuitune.experiments import grid as G
        from tuitune.experiments.ncclbench import validate_grid

        grid = G.parse(self.grid)
        validate_grid(grid)
        try:
            sizes = [int(x) for x in self.sizes.split(",")] if self.sizes else None
        except ValueError:
            raise CliError(f"--sizes {self.sizes!r}: expected bytes, comma-separated (e.g. 14336,43008)", 2) from None
        for flag in ("iters", "hidden_size", "world_size"):
            v = getattr(self, flag)
            if v is not None and v < 1:
                raise CliError(f"--{flag.replace('_', '-')} must be at least 1 (got {v})", 2)
        return grid, sizes


# ---- record (the main command's --record OUT) -----------------------------------------------------


@dataclass(kw_only=True)
class RecordOptions(CliOptions):
    """`tuitune --record OUT [PRESET]`: the headless capture of a server's live event stream."""

    record: str | None = None
    duration: float | None = None
    cycles: int | None = None
    relaunch: bool = False
    load: int | None = None
    bench: int | None = None
    raw: bool = False
    from_start: bool = False

    @classmethod
    def add_cli_args(cls, p: Any) -> None:
        """Into the main parser's group (``p``: its "headless capture (--record)" group)."""
        p.add_argument("--record", metavar="OUT", help="capture the live event stream to OUT (.jsonl or .jsonl.gz)")
        stop = p.add_mutually_exclusive_group()
        stop.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
        stop.add_argument("--cycles", type=int, metavar="N", help="stop after N profiled cycles")
        p.add_argument("--relaunch", action="store_true", help="relaunch the server first")
        p.add_argument(
            "--load",
            type=int,
            nargs="?",
            const=1,
            metavar="C",
            help="keep C concurrent request streams running (default 1)",
        )
        p.add_argument("--bench", type=int, metavar="N", help="run a benchmark of N requests at the start")
        p.add_argument("--raw", action="store_true", help="keep the raw log lines too")
        p.add_argument(
            "--from-start",
            action="store_true",
            help="on a running server, record its whole log so far too (default: from now on)",
        )

    def check(self) -> None:
        """Without --record OUT none of its flags applies; with it, the counts are positive."""
        if not self.record:
            for flag in ("duration", "cycles", "load", "bench"):
                if getattr(self, flag) is not None:
                    raise CliError(f"--{flag} only applies with --record OUT", 2)
            if self.relaunch or self.raw or self.from_start:
                raise CliError("--relaunch, --raw and --from-start only apply with --record OUT", 2)
            return
        check_positive(self, "duration", "cycles", "load", "bench")
