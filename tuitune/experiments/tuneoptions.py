"""What `tune` is asked to do (``TuneOptions``): its flags, built from the parsed arguments and checked in one
place, the shape every experiment's options model has (``experiments/options.py``, whose bench helpers it uses).

Imports stay light, as there: the parser is built from this class, and building it loads no heavy module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from tuitune.base.errors import CliError
from tuitune.experiments.options import AB_MAX_ROUNDS, CliOptions, int_list, overrides

if TYPE_CHECKING:
    from tuitune import preset as P
    from tuitune.decide.launch import Config


@dataclass(frozen=True)
class TuneOptions(CliOptions):
    """What `tune` is asked to do, checked in one place before anything starts: the flags alone
    (``from_cli_args``), then against the preset (``check``)."""

    budget: int
    concurrency: int
    out: Path
    resume: bool = False
    levels: list[int] | None = None
    overrides: dict | None = None
    ab_rounds: int = 4
    ab_judge: bool = True
    ab_max_rounds: int | None = None
    configs: list[Config] | None = None
    nccl: bool = False
    nccl_backend: str = "nccl"
    nccl_grid: list[str] | None = None
    hidden_size: int | None = None
    live: bool = True
    proof: str = "static"

    @classmethod
    def add_cli_args(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("preset")
        p.add_argument(
            "--budget",
            type=int,
            required=True,
            help="measurements the search may spend, each a relaunch unless held live (the A/B comes on top)",
        )
        p.add_argument("--concurrency", type=int, help="the load to tune for (default: the preset's bench.concurrency)")
        p.add_argument(
            "--out", default="tune-out", help="directory for the log, captures and best.yaml (default tune-out)"
        )
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
        p.add_argument(
            "--no-live",
            action="store_true",
            help="relaunch for every configuration even where the preset's launch is prepared to switch "
            "(speculative.switch: its step counts are otherwise held live, without a relaunch)",
        )
        p.add_argument(
            "--proof",
            choices=["static", "live"],
            default="static",
            help="the final A/B: launches of the start and the choice of their own, without the switch (static, "
            "the default: what best.yaml runs), or blocks inside the prepared launch (live: no launch, with an "
            "A/A check; where both are chains it is prepared to hold and no NCCL variable changed, else static); "
            "the cost of being prepared is not resolved (docs/switch.md)",
        )

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace, base: P.Preset | None = None) -> Self:
        """The flags checked, in the order the command always checked them (``base``: the preset,
        whose bench.concurrency is the default load)."""
        from tuitune.experiments.ab import MAX_ROUNDS

        if ns.budget < 0:
            raise CliError(f"--budget must be at least 0 (got {ns.budget})", 2)
        if ns.ab_rounds < 0:
            raise CliError(f"--ab-rounds must be at least 0 (got {ns.ab_rounds}; 0: no final A/B)", 2)
        if not 1 <= ns.ab_max_rounds <= MAX_ROUNDS:
            raise CliError(f"--ab-max-rounds must be between 1 and {MAX_ROUNDS} (got {ns.ab_max_rounds})", 2)
        conc = ns.concurrency if ns.concurrency is not None else base.bench.concurrency if base else 0
        if conc < 1:
            raise CliError(f"--concurrency must be at least 1 (got {conc})", 2)
        levels = int_list(ns.levels, "--levels") if ns.levels else None
        bench = argparse.Namespace(**{**vars(ns), "concurrency": None, "api": None})
        return cls(
            ns.budget,
            conc,
            Path(ns.out),
            resume=ns.resume,
            levels=levels,
            overrides=overrides(bench),
            ab_rounds=ns.ab_rounds,
            ab_judge=not ns.no_verdict,
            ab_max_rounds=ns.ab_max_rounds,
            nccl=ns.nccl or bool(ns.nccl_grid),
            nccl_backend=ns.nccl_backend,
            nccl_grid=ns.nccl_grid,
            hidden_size=ns.hidden_size,
            live=not ns.no_live,
            proof=ns.proof,
        )

    @property
    def ab_last(self) -> int:
        """The final A/B's most rounds a side (0: none)."""
        if not self.ab_rounds:
            return 0
        return max(self.ab_rounds, self.ab_max_rounds or self.ab_rounds) if self.ab_judge else self.ab_rounds

    def check(self, base: P.Preset) -> Config:
        """Refusals that need no launch (a final A/B that cannot decide, a preset with nothing to tune
        or no step count to start from), in that order; the configuration the search starts from."""
        from tuitune.experiments.ab import rounds_refusal
        from tuitune.experiments.tuneloop import TuneError, config_of

        if self.ab_rounds and (why := rounds_refusal(self.ab_rounds, "--ab-rounds")) and self.ab_judge:
            raise TuneError(why, 2)  # before the first relaunch: the search would end in an A/B that cannot decide
        start = config_of(base)
        if self.proof == "live" and (base.switch_steps is None or not self.live):
            raise TuneError(
                "--proof live proves the choice inside the launch the search held its chains in: "
                + (
                    f"{base.name} is not prepared to switch (set speculative.switch to the step counts to try)"
                    if base.switch_steps is None
                    else "drop --no-live"
                ),
                2,
            )
        if not base.is_speculative:
            raise TuneError(
                f"{base.name} has no speculative section: tune needs the algorithm and draft model "
                f"(speculative.draft_model_path) to try configurations; start from a speculative preset",
                2,
            )
        if not base.profile:
            raise TuneError(
                f"{base.name} has profile: false; tune fits its model to EAGLE3_PROFILE windows, so set profile: true",
                2,
            )
        return start
