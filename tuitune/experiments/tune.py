"""`tuitune tune`: measure, fit, advise, relaunch the predicted best, re-fit … then prove it.

The loop (``tune_loop``) is independent of where measurements come from: a ``Source`` launches a
configuration and returns what the launch showed (profile windows, decode lines, goodput per load
level). ``SessionSource`` does it for real: relaunch through the session, benchmark a few load
levels (the target concurrency and two others, so that one launch puts several verify token
counts on the curve), record everything to a capture. ``tune`` wraps the loop with the JSONL log,
``--resume``, and the final interleaved A/B (start vs chosen) that decides whether ``best.yaml``
is written.

Each round: fit the model to every launch so far; speculation off first when it was never
measured and its interval gives it a chance of being the best (else it is the spare relaunch,
before the loop would stop with one left); if the predicted best unmeasured configuration beats the best measured goodput by more
than the noise, launch it; otherwise launch the configuration with the highest chance of beating
the best by more than the noise (its interval and the launch noise counted); stop when none has
even 2.5 %, or the relaunch budget is spent. The choice is the best *measured* configuration: a
prediction is never the final word.

Why one module of this size: the loop, its sources, its JSONL log and ``--resume`` share one record
format; the models it decides with live in tuitune.decide.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.base.jsonl import append_row, is_count, is_figure, read_rows
from tuitune.decide import ncclstep as NS
from tuitune.decide.advise import Advice, advise, space
from tuitune.decide.costmodel import OFF, Config, FitError, Launch, fit
from tuitune.experiments.observe import preset_config
from tuitune.machine.errors import ControlError
from tuitune.measure import workload
from tuitune.measure.levels import bench_levels

NOISE = 0.02  # gains below this are inside launch-to-launch noise (FACTS §7: published gains are ~1-4 %)
CHANCE = 0.025  # a configuration with less chance than this of beating the best measured is not worth a relaunch


class TuneError(TuituneError):
    """Tuning cannot start or continue (one sentence); code 2 for bad input, 1 for failed work."""


class Source(Protocol):
    async def measure(self, config: Config, levels: list[int]) -> Launch: ...


def levels_for(concurrency: int) -> list[int]:
    """Load levels benchmarked in one launch: the target and two more, spreading bs × tokens."""
    c = max(1, concurrency)
    return sorted({max(1, c // 4), c, min(2 * c if c > 1 else 4, 256)})


def config_of(p: P.Preset) -> Config:
    c = preset_config(p)
    if c is None:
        raise TuneError(
            f"{p.name}: speculative.num_steps is unset (SGLang picks it at start); set it so that "
            f"tune knows where it starts",
            2,
        )
    return c


def preset_for(base: P.Preset, c: Config, spec_section: dict) -> P.Preset:
    """``base`` running configuration ``c`` (a static one); ``spec_section`` is the speculative
    section to vary (algorithm and draft model kept). The engine spells the configuration."""
    if not c.speculative:
        return P.with_changes(base, {"speculative": None})
    return P.with_changes(base, {"speculative": {**spec_section, **base.engine.config_changes(c, base)}})


@dataclass
class Step:
    round: int
    config: Config
    reason: str
    predicted: dict | None  # the prediction that chose it (None for the start)
    goodput: dict[int, float] = field(default_factory=dict)
    failure: str | None = None

    def to_dict(self) -> dict:
        return {
            "kind": "launch",
            "round": self.round,
            "config": self.config.to_dict(),
            "label": self.config.label,
            "reason": self.reason,
            "predicted": self.predicted,
            "failure": self.failure,
            "goodput": {str(k): v for k, v in self.goodput.items()},
            "time": time.time(),
        }


@dataclass
class TuneResult:
    start: Config
    chosen: Config
    concurrency: int
    steps: list[Step]
    launches: list[Launch]
    stop_reason: str
    advice: Advice | None

    @property
    def relaunches(self) -> int:
        return max(0, len(self.steps) - 1)

    def measured(self) -> dict[Config, float]:
        out: dict[Config, list[float]] = {}
        for ln in self.launches:
            if self.concurrency in ln.goodput:
                out.setdefault(ln.config, []).append(ln.goodput[self.concurrency])
        return {c: sum(v) / len(v) for c, v in out.items()}


def _best_measured(launches: list[Launch], concurrency: int) -> tuple[Config, float]:
    vals: dict[Config, list[float]] = {}
    for ln in launches:
        g = ln.goodput.get(concurrency)
        if g is not None and math.isfinite(g) and g > 0:
            vals.setdefault(ln.config, []).append(g)
    if not vals:
        raise TuneError("no launch measured any goodput (every benchmark failed)")
    # ties within the noise go to the simpler configuration (fewer steps, smaller tree)
    mean = {c: sum(v) / len(v) for c, v in vals.items()}
    top = max(mean.values())
    near = [c for c, g in mean.items() if g >= top * (1 - NOISE / 4)]
    c = min(near, key=lambda x: (x.steps, x.topk, x.draft_tokens))
    return c, mean[c]


def decide(
    launches: list[Launch],
    concurrency: int,
    configs: list[Config] | None = None,
    noise: float = NOISE,
    describe: Callable[[Config], str] = lambda c: c.label,
) -> tuple[Config | None, str, Advice | None]:
    """The next configuration to launch and why; None when tuning should stop. ``describe``
    names a configuration in the engine's words."""
    try:
        model = fit(launches)
    except FitError as e:
        raise TuneError(f"cannot fit the cost model: {e}") from None
    seen = {ln.config for ln in launches}
    adv = advise(model, concurrency, launches[-1].config if launches else None, configs)
    _, best = _best_measured(launches, concurrency)
    open_ = [p for p in adv.ranking if p.config not in seen]
    if not open_:
        return None, "every configuration has been measured", adv
    off = next((p for p in open_ if p.config == OFF), None)
    if off is not None and beat_chance(off.goodput.mean, off.goodput.sd_up, best, noise) > CHANCE:
        # every gain is judged against the baseline; predicted from the verify curve alone it may be
        # far off (issue 25: too low in 5 of 6 runs), so when it could be the best it is measured
        # before anything else (and, when it could not, before the loop stops with a relaunch left)
        return OFF, _baseline_reason(describe, off, best, "could be the best"), adv
    top = open_[0]
    if top.goodput.mean > best * (1 + noise):
        return (
            top.config,
            (
                f"predicted best: {top.goodput.mean:.1f} tok/s vs {best:.1f} measured "
                f"({top.goodput.mean / best - 1:+.1%})"
            ),
            adv,
        )
    # inside the noise by its mean; whether it could still win counts the model's interval (its upper
    # side) and the launch noise of the best measured together: the chance its true goodput is above
    # the best by more than the noise (a near twin of the best is as likely a hair faster as slower:
    # relaunching it cannot move the result by more than the noise)
    chance = {p.config: beat_chance(p.goodput.mean, p.goodput.sd_up, best * (1 + noise), noise) for p in open_}
    reach = [p for p in open_ if chance[p.config] > CHANCE]
    if reach:
        p = max(reach, key=lambda x: (chance[x.config], x.goodput.hi))
        return (
            p.config,
            (
                f"could still win: predicted {p.goodput.mean:.1f}, interval up to {p.goodput.hi:.1f} "
                f"vs {best:.1f} measured ({chance[p.config]:.0%} chance of beating it by more than the "
                f"{noise:.0%} noise, counting the model's interval and the launch noise)"
            ),
            adv,
        )
    if off is not None:  # the spare relaunch: the baseline first
        return OFF, _baseline_reason(describe, off, best, "a relaunch is left"), adv
    return (
        None,
        (
            f"predicted gain inside the noise: the best unmeasured, {describe(top.config)}, is predicted at "
            f"{top.goodput.mean:.1f} vs {best:.1f} measured, and no unmeasured configuration has even a "
            f"{CHANCE:.1%} chance of beating it by more than the {noise:.0%} noise (the model's interval and "
            "the launch noise counted)"
        ),
        adv,
    )


def _baseline_reason(describe: Callable[[Config], str], off, best: float, why: str) -> str:
    return (
        f"the baseline was never measured ({why}): {describe(OFF)} is predicted at {off.goodput.mean:.1f} "
        f"(interval {max(0.0, off.goodput.lo):.1f}-{off.goodput.hi:.1f}) vs {best:.1f} measured, from the verify "
        "curve alone"
    )


def beat_chance(mean: float, sd: float, best: float, noise: float = NOISE) -> float:
    """The chance that a configuration predicted at ``mean`` ± ``sd`` is truly above ``best``, a
    single launch's goodput whose own spread is ``noise`` (a 95 % half-width, relative)."""
    spread = math.hypot(sd, noise * best / 1.96)
    if spread <= 0:
        return 1.0 if mean > best else 0.0
    return 0.5 * math.erfc((best - mean) / (spread * math.sqrt(2)))


async def tune_loop(  # noqa: PLR0913
    source: Source,
    start: Config,
    budget: int,
    concurrency: int,
    levels: list[int] | None = None,
    configs: list[Config] | None = None,
    prior: list[tuple[Step, Launch]] | None = None,
    on_step: Callable[[Step, Launch], None] | None = None,
    progress: Callable[[str], None] | None = None,
    describe: Callable[[Config], str] = lambda c: c.label,
) -> TuneResult:
    """Measure ``start``, then up to ``budget`` relaunches chosen by the fitted model."""
    levels = levels or levels_for(concurrency)
    if concurrency not in levels:
        levels = sorted({*levels, concurrency})
    steps = [s for s, _ in prior or []]
    launches = [ln for _, ln in prior or []]

    async def run(c: Config, reason: str, predicted: dict | None) -> None:
        if progress:
            progress(f"launch {len(steps)}: {describe(c)} ({reason})")
        ln = await source.measure(c, levels)
        st = Step(len(steps), c, reason, predicted, dict(ln.goodput), ln.failure)
        steps.append(st)
        launches.append(ln)
        if on_step:
            on_step(st, ln)
        if progress:
            g = ln.goodput.get(concurrency)
            progress(
                f"  launch failed: {ln.failure}"
                if ln.failure
                else f"  goodput at concurrency {concurrency}: " + (f"{g:.1f} tok/s" if g else "not measured")
            )

    if not steps:
        await run(start, "the starting configuration", None)
    stop = "relaunch budget spent"
    adv = None
    while len(steps) - 1 < budget:
        nxt, why, adv = decide(launches, concurrency, configs, describe=describe)
        if nxt is None:
            stop = why
            break
        pred = None
        if adv is not None:
            p = next((x for x in adv.ranking if x.config == nxt), None)
            pred = p.goodput.to_dict() if p else None
        await run(nxt, why, pred)
    else:
        try:
            _, _, adv = decide(launches, concurrency, configs, describe=describe)
        except TuneError:
            adv = None
    chosen, _ = _best_measured(launches, concurrency)
    return TuneResult(start, chosen, concurrency, steps, launches, stop, adv)


# ---- the real thing: a session, captures, the JSONL log, the A/B ---------------------------------


class SessionSource:
    """Relaunch a preset's server with each configuration and benchmark it at a few load levels."""

    def __init__(self, session, base: P.Preset, out: Path, overrides: dict | None = None, settle_s: float = 0.5):
        from tuitune.measure.capture import CaptureWriter, redacted_preset

        self._writer_cls, self._redact = CaptureWriter, redacted_preset
        self.session = session
        self.base = base
        if base.speculative is None:  # (tune() refuses such a preset first)
            raise TuneError(f"{base.name} has no speculative section: there is nothing to tune", 2)
        self.spec = base.speculative.model_dump()
        self.out = out
        self.overrides = overrides or {}
        self.settle_s = settle_s
        self.count = 0
        # levels where a simulator fell behind its clock: configuration -> concurrency -> how far
        self.behind: dict[Config, dict[int, str]] = {}

    def preset(self, c: Config) -> P.Preset:
        return preset_for(self.base, c, self.spec)

    async def measure(self, config: Config, levels: list[int]) -> Launch:
        from tuitune.base.events import DecodeStats, LogLine, ProfileWindow

        p = self.preset(config)
        (self.out / "captures").mkdir(parents=True, exist_ok=True)
        path = self.out / "captures" / f"launch-{self.count:02d}-{config.short.replace('/', '-')}.jsonl.gz"
        self.count += 1
        writer = self._writer_cls(
            path,
            {
                "preset": self._redact(P.to_dict(p)),
                "preset_hash": p.hash(),
                "target": p.target.label(),
                "tune_config": config.to_dict(),
            },
        )
        launch = Launch(config, label=str(path))
        level_of: list[int] = [0]

        def sink(events) -> None:
            writer.write([e for e in events if not isinstance(e, LogLine)])
            for e in events:
                if isinstance(e, ProfileWindow):
                    launch.windows.append(e)
                elif isinstance(e, DecodeStats) and level_of[0]:
                    launch.decodes.append(e)

        self.session.subscribe(sink)
        try:
            try:
                await self.session.relaunch(p)
            except ControlError as e:  # this configuration does not start (OOM, a refused flag …): the
                launch.failure = str(e)  # loop records it and moves on; the link failing still stops it
                return launch

            def starting(cfg) -> None:
                level_of[0] = cfg.concurrency

            def done(cfg, run) -> None:
                gp = run.goodput() if not run.failed else None
                if gp:
                    launch.goodput[cfg.concurrency] = gp["tok_s"]
                    if run.sim_behind():  # kept (tune decides by it) but said: the choice may rest on it
                        self.behind.setdefault(config, {})[cfg.concurrency] = run.sim_behind() or ""

            # two requests at least, also at concurrency 1 (above it, two per stream: BenchConfig.at_level)
            b = {**self.overrides, "requests": max(int(self.overrides.get("requests") or p.bench.requests), 2)}
            await bench_levels(
                self.session, levels, b, label=lambda c: f"{config.short} c={c}", on_level=starting, on_run=done
            )
            await asyncio.sleep(self.settle_s)  # the tail's last batch (windows logged at the end)
        finally:
            self.session.subscribers.remove(sink)
            writer.close()
        return launch


def load_log(out: Path) -> list[dict]:
    """The usable rows of the tune log; a damaged one is skipped with a warning naming its line
    (its launch, if it was one, runs again on --resume)."""
    return read_rows(out / "tune.jsonl", check=row_problem)


def row_problem(r: dict) -> str | None:  # noqa: C901
    """Why a tune log row cannot be used (None when it can): what --resume reads of it checked."""
    kind = r.get("kind")
    if kind == "launch":
        c = r.get("config")
        if not isinstance(c, dict) or not c or set(c) - {"steps", "topk", "draft_tokens"}:
            return "its config is not a configuration"
        if not (
            is_count(c.get("steps", 0), 0, 64)
            and is_count(c.get("topk", 1), 1, 64)
            and is_count(c.get("draft_tokens", 1), 1, 4096)
        ):
            return f"its config {c} is out of range"
        if not is_count(r.get("round", 0)):
            return "its round is not a count"
        g = r.get("goodput") or {}
        if not isinstance(g, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and 0 < int(k) <= 65536 and is_figure(v)
            for k, v in g.items()
        ):
            return "its goodput is not a finite figure per concurrency"
        for key in ("capture", "reason", "env"):
            if key in r and not isinstance(r[key], str):
                return f"its {key} is not text"
        if r.get("failure") is not None and not isinstance(r["failure"], str):
            return "its failure is not text"
        if r.get("predicted") is not None and not isinstance(r["predicted"], dict):
            return "its prediction is not an object"
        lag = r.get("sim_behind")
        if lag is not None and not (
            isinstance(lag, dict)
            and all(isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in lag.items())
        ):
            return "its simulator lag is not text per concurrency"
    elif kind == "nccl":
        ch = r.get("changes")
        if not isinstance(ch, dict) or not all(
            isinstance(k, str) and "." in k and (v is None or isinstance(v, str | int | float)) for k, v in ch.items()
        ):
            return "its NCCL changes are not preset keys"
        if r.get("prediction") is not None and not isinstance(r["prediction"], dict):
            return "its prediction is not an object"
    elif kind == "nccl_decision" and not isinstance(r.get("env"), str):
        return "its env is not text"
    elif kind == "workload" and not (isinstance(r.get("hash"), str) and isinstance(r.get("name"), str)):
        return "its workload has no name and hash"
    return None


def _append(out: Path, row: dict) -> None:
    append_row(out / "tune.jsonl", row)


def _replay_prior(rows: list[dict]) -> list[tuple[Step, Launch]]:
    """Launches of an earlier run, rebuilt from the log and their captures (for --resume)."""
    from tuitune.base.events import DecodeStats, ProfileWindow
    from tuitune.measure.capture import CaptureError, read_capture

    prior = []
    for r in rows:
        if r.get("kind") != "launch":
            continue
        c = Config(**r["config"])
        ln = Launch(
            c,
            goodput={int(k): v for k, v in (r.get("goodput") or {}).items()},
            label=r.get("capture", ""),
            failure=r.get("failure"),
        )
        try:
            cap = read_capture(r["capture"])
        except (CaptureError, KeyError):
            continue  # its capture is gone: that launch runs again
        ln.windows = [x.event for x in cap.records if isinstance(x.event, ProfileWindow)]
        ln.decodes = [x.event for x in cap.records if isinstance(x.event, DecodeStats)]
        st = Step(r["round"], c, r.get("reason", ""), r.get("predicted"), dict(ln.goodput), ln.failure)
        prior.append((st, ln))
    return prior


NCCL_GRID = ("env.NCCL_PROTO=LL,LL128,Simple,unset", "env.NCCL_ALGO=Ring,Tree,unset")


async def _nccl_screen(
    session,
    base: P.Preset,
    specs: list[str],
    backend: str,
    hidden_size: int | None,
    progress: Callable[[str], None] | None,
    concurrency: int = 1,
) -> tuple[dict, dict, dict]:
    """nccl-bench's ranking of a grid (default NCCL_PROTO x NCCL_ALGO) at decode sizes and at the
    size of a decode step at ``concurrency``: (changes of the winner, {} when the current setting
    wins; the report; the winner's predicted decode-step saving, ``nccl_prediction``)."""
    from tuitune.experiments import grid as G
    from tuitune.experiments import ncclbench as NB

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
        step = NS.TPShape(layers or 1, hidden).message_bytes(NS.step_tokens(concurrency, _draft_tokens(base)))
        sizes = sorted({*NB.decode_sizes(base, hidden), step})  # ranked at the largest: the step's
    try:
        report = await NB.run(
            session.transport, base, grid, sizes=sizes, hidden_size=hidden, backend=backend, progress=progress
        )
    except NB.NcclBenchError as e:
        raise TuneError(f"--nccl: {e}", e.code) from None
    if not report["ranking"]:
        raise TuneError("--nccl: no NCCL setting could be measured (see `tuitune nccl-bench` for the errors)")
    row = next(r for r in report["rows"] if r["label"] == report["ranking"][0])
    prediction = nccl_prediction(report, base, hidden, layers, concurrency)
    return ({} if row.get("current") else row["changes"]), report, prediction


def _draft_tokens(base: P.Preset) -> int | None:
    """Tokens a request verifies a step (None without speculation: one)."""
    spec = base.speculative
    return spec.resolved().num_draft_tokens if base.is_speculative and spec is not None else None


def nccl_prediction(report: dict, base: P.Preset, hidden: int | None, layers: int | None, concurrency: int) -> dict:
    """What the screen's winner is predicted to save a decode step against the current setting
    (``tuitune.decide.ncclstep``), and what that rests on; a step figure needs the model's layer
    count (config.json's num_hidden_layers), else only the saving per all-reduce is given."""
    tokens = NS.step_tokens(concurrency, _draft_tokens(base))
    winner = report["ranking"][0]
    current = next((r["label"] for r in report["rows"] if r.get("current") and "results" in r), None)
    out: dict = {"winner": winner, "reference": current, "concurrency": concurrency, "tokens": tokens}
    if not hidden:
        out["note"] = "no hidden size: nothing predicted"
        return out
    rows = {r["label"]: NS.points_of(r) for r in report["rows"] if "results" in r}
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
        basis=NS.basis(shape, tokens, report["world_size"])
        + " (the target model's forward only: the draft model's few all-reduces are left out)",
    )
    return out


def _cycle_ms(windows: list, concurrency: int) -> float | None:
    """Median cycle of a launch's profile windows at ``concurrency`` (all of them if none is)."""
    at = [w.cycle_ms for w in windows if w.bs == concurrency and w.cycle_ms > 0] or [
        w.cycle_ms for w in windows if w.cycle_ms > 0
    ]
    return sorted(at)[len(at) // 2] if at else None


@dataclass(frozen=True)
class TuneOptions:
    """What `tune` is asked to do, checked in one place (``check``) before anything starts."""

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

        if self.ab_rounds and (why := rounds_refusal(self.ab_rounds, "--ab-rounds")) and self.ab_judge:
            raise TuneError(why, 2)  # before the first relaunch: the search would end in an A/B that cannot decide
        start = config_of(base)
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


async def tune(
    base: P.Preset,
    budget: int,
    concurrency: int,
    out: Path,
    *,
    progress: Callable[[str], None] | None = None,
    session=None,
    on_cleanup: Callable[[str], None] | None = None,
    **options,
) -> dict:
    """The search, then the final A/B (``TuneRun``; ``options``: the rest of ``TuneOptions``)."""
    opts = TuneOptions(budget, concurrency, out, **options)
    return await TuneRun(base, opts, progress=progress, session=session, on_cleanup=on_cleanup).run()


class TuneRun:
    """One `tune`: its phases in order, each writing its rows to OUT/tune.jsonl: the NCCL screen
    (``nccl_phase``), the search (``search``), the result (``summarize``) and the proof, the final
    A/B (``prove``). Interrupted (Ctrl-C, SIGTERM), it stops the server it started (the search's or
    the A/B's) and says so to ``on_cleanup``; ``--resume`` goes on from its log."""

    def __init__(
        self,
        base: P.Preset,
        opts: TuneOptions,
        *,
        progress: Callable[[str], None] | None = None,
        session=None,
        on_cleanup: Callable[[str], None] | None = None,
    ):
        self.original = self.base = base
        self.opts = opts
        self.progress = progress
        self.session = session
        self.on_cleanup = on_cleanup
        self.start = OFF  # the starting configuration (``run`` reads it off the preset, after the checks)
        self.budget = opts.budget
        self.env_label = ""  # the NCCL variables kept, as "K=V …" ("" none)
        self.screen: dict | None = None  # the NCCL screen's row
        self.decided: dict | None = None  # the NCCL decision's row
        self.describe: Callable[[Config], str] = base.engine.config_label

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    def append(self, row: dict) -> None:
        _append(self.opts.out, row)

    async def run(self) -> dict:
        from tuitune.machine.session import Session

        opts, base = self.opts, self.base
        self.start = opts.check(base)
        opts.out.mkdir(parents=True, exist_ok=True)
        rows = load_log(opts.out)
        if rows and not opts.resume:
            raise TuneError(
                f"{opts.out} already holds a tune log; pass --resume to continue, or choose another --out", 2
            )
        work = workload.for_preset(base, opts.overrides).as_dict()  # a bad prompt file: said before any launch
        logged = next((r for r in rows if r.get("kind") == "workload"), None)
        if rows and (other := workload.differ(work, logged)):
            raise TuneError(
                f"{opts.out}'s launches were measured on another workload ({other}, the log's): resuming would "
                "compare the two; pass the log's prompts again (--prompts or bench.prompts), or choose another --out",
                2,
            )
        if logged is None:
            self.append({"kind": "workload", **work})
        self.session = self.session or Session(base)
        await self.session.connect()
        self.say(plan_line(base, opts.budget, opts.ab_last, rows, self.session.record))
        try:
            await self.nccl_phase()
            source, result = await self.search()
            summary = self.summarize(source, result)
            await self.prove(source, result, summary)
            self.append(summary)
            return summary
        except asyncio.CancelledError:
            await self.session.stop_started(self.on_cleanup)  # (the A/B stopped its own arm: nothing left then)
            raise
        finally:
            await self.session.close()

    async def nccl_phase(self) -> None:
        """With --nccl (or a screen in the log): rank NCCL settings with nccl-bench, then one launch of
        the start with the winner's variables decides whether they stay for the rest of the search."""
        opts, session = self.opts, self.session
        rows = load_log(opts.out)
        screen = next((r for r in rows if r.get("kind") == "nccl"), None)
        if opts.nccl and screen is None:
            changes, report, prediction = await _nccl_screen(
                session,
                self.base,
                opts.nccl_grid or [],
                opts.nccl_backend,
                opts.hidden_size,
                self.progress,
                opts.concurrency,
            )
            screen = {
                "kind": "nccl",
                "changes": changes,
                "ranking": report["ranking"],
                "resolved": False,
                "prediction": prediction,
            }
            self.append(screen)
        self.screen = screen
        if screen is None or not screen["changes"]:
            return
        env_label = " ".join(
            f"{k.split('.', 1)[1]}={v if v is not None else 'unset'}" for k, v in screen["changes"].items()
        )
        rows = load_log(opts.out)
        decided = next((r for r in rows if r.get("kind") == "nccl_decision"), None)
        if decided is None:
            decided = await self._nccl_decide(screen, env_label, rows)
        self.decided = decided
        self.budget -= 1  # the launch with the screened variables
        if decided["env"]:
            self.base = P.with_changes(self.base, screen["changes"])
            self.env_label = env_label

    async def _nccl_decide(self, screen: dict, env_label: str, rows: list[dict]) -> dict:
        """The start measured without, then with the screened variables; kept above the noise."""
        opts, start, concurrency = self.opts, self.start, self.opts.concurrency
        cand = P.with_changes(self.base, screen["changes"])
        cur_src = SessionSource(self.session, self.base, opts.out, opts.overrides)
        cur_src.count = sum(1 for r in rows if r.get("kind") == "launch")
        lv = sorted({*(opts.levels or levels_for(concurrency)), concurrency})
        pred = screen.get("prediction") or {}
        self.say(f"NCCL: nccl-bench ranks {env_label} first; measuring the start with and without it")
        if pred.get("step_saving_us") is not None:
            self.say(
                f"NCCL: predicted to save {pred['step_saving_us']:.1f} µs a decode step at concurrency "
                f"{concurrency} against the current setting; rests on: {pred['basis']}"
            )
        now = await cur_src.measure(start, lv)
        step = Step(0, start, "the starting configuration", None, dict(now.goodput))
        self.append({**step.to_dict(), "capture": now.label, "env": ""})
        cand_src = SessionSource(self.session, cand, opts.out, opts.overrides)
        cand_src.count = cur_src.count
        new = await cand_src.measure(start, lv)
        step = Step(0, start, f"NCCL {env_label}", None, dict(new.goodput))
        self.append({**step.to_dict(), "capture": new.label, "env": env_label})
        keep = new.goodput.get(concurrency, 0.0) > now.goodput.get(concurrency, 0.0) * (1 + NOISE)
        decided: dict = {
            "kind": "nccl_decision",
            "env": env_label if keep else "",
            "goodput": {"current": now.goodput.get(concurrency), "candidate": new.goodput.get(concurrency)},
        }
        # the prediction beside the measurement: the step saving over the start's own cycle
        cycle = _cycle_ms(now.windows, concurrency)
        if pred.get("step_saving_us") is not None and cycle:
            decided["predicted_gain"] = NS.predicted_gain(pred["step_saving_us"], cycle)
            decided["cycle_ms"] = cycle
        if now.goodput.get(concurrency) and new.goodput.get(concurrency) is not None:
            decided["measured_gain"] = new.goodput[concurrency] / now.goodput[concurrency] - 1.0
        self.append(decided)
        said = _nccl_gains(decided)
        self.say(f"NCCL: {'keeping' if keep else 'dropping'} {env_label}" + (f" ({said})" if said else ""))
        return decided

    async def search(self) -> tuple[SessionSource, TuneResult]:
        """The fitted model's search from the start, within the budget left (``tune_loop``)."""
        opts, session, env_label, base = self.opts, self.session, self.env_label, self.base
        rows = load_log(opts.out)
        prior = _replay_prior([r for r in rows if r.get("kind") == "launch" and r.get("env", "") == env_label])
        source = SessionSource(session, base, opts.out, opts.overrides)
        source.count = sum(1 for r in rows if r.get("kind") == "launch")
        for r in rows:  # (--resume) the earlier launches' levels where the simulator fell behind
            if r.get("kind") == "launch" and r.get("env", "") == env_label and r.get("sim_behind"):
                source.behind[Config(**r["config"])] = {int(k): v for k, v in r["sim_behind"].items()}

        def on_step(st: Step, ln: Launch) -> None:
            ready = session.last_ready.elapsed_s if session.last_ready is not None and not ln.failure else None
            row = {**st.to_dict(), "capture": ln.label, "env": env_label, "ready_s": ready}
            if source.behind.get(st.config):
                row["sim_behind"] = {str(k): v for k, v in source.behind[st.config].items()}
            self.append(row)

        result = await tune_loop(
            source,
            self.start,
            max(0, self.budget),
            opts.concurrency,
            opts.levels,
            opts.configs or space(topks=base.engine.search_topks(base)),
            prior,
            on_step,
            self.progress,
            self.describe,
        )
        return source, result

    def summarize(self, source: SessionSource, result: TuneResult) -> dict:
        """The result row: what was measured, what was chosen and why (the verdict comes from ``prove``)."""
        describe, env_label, screen = self.describe, self.env_label, self.screen
        summary = {
            "kind": "result",
            "start": self.start.to_dict(),
            "chosen": result.chosen.to_dict(),
            "chosen_label": describe(result.chosen) + (f" with {env_label}" if env_label else ""),
            "concurrency": self.opts.concurrency,
            "relaunches": sum(1 for r in load_log(self.opts.out) if r.get("kind") == "launch") - 1,
            "stop_reason": result.stop_reason,
            "nccl": env_label or None,
            "nccl_prediction": _nccl_summary(screen, self.decided)
            if screen is not None and screen["changes"]
            else None,
            "measured": {describe(c): g for c, g in result.measured().items()},
            "failed": {describe(st.config): st.failure for st in result.steps if st.failure},
        }
        if source.behind:
            summary["sim_behind"] = {describe(c): {str(k): v for k, v in lv.items()} for c, lv in source.behind.items()}
        if result.advice is not None:
            summary["advice"] = result.advice.to_dict(full=False)
        summary["chosen_why"] = choice_reason(result, describe)
        return summary

    async def prove(self, source: SessionSource, result: TuneResult, summary: dict) -> None:
        """The verdict: none needed (the start is best), none asked (--ab-rounds 0), or the final A/B
        of the start against the choice, whose "faster" writes OUT/best.yaml."""
        from tuitune.experiments.ab import run_ab

        opts, session, concurrency = self.opts, self.session, self.opts.concurrency
        start_preset = preset_for(self.original, self.start, source.spec)
        chosen_preset = source.preset(result.chosen)
        if chosen_preset.hash() == start_preset.hash():
            summary["verdict"] = {"verdict": "start is already best", "reason": summary["chosen_why"]}
            await session.stop_server()  # as the A/B (and sweep) do: the search's last server goes
            return
        if not opts.ab_rounds:
            summary["verdict"] = {
                "verdict": "not confirmed",
                "reason": "--ab-rounds 0: no final A/B, and the search launched each configuration once",
            }
            await session.stop_server()
            return
        b = P.with_changes(
            chosen_preset,
            {
                "name": f"{self.original.name}-tuned",
                "description": f"tuitune tune at concurrency {concurrency}: {summary['chosen_label']}",
            },
        )
        # the final A/B: sequential (a look after every round from --ab-rounds, adding rounds until
        # the interval decides or --ab-max-rounds are spent), its power stated from the launch-to-launch
        # spread measured before when there is one (repeated launches of one configuration in the
        # search, launches of these presets in an earlier A/B of this log), else the prior
        last = opts.ab_last
        spread, spread_source = ab_spread(result.launches, concurrency, load_log(opts.out), [start_preset, b])
        self.say(f"chosen: {summary['chosen_label']}: {summary['chosen_why']}")
        self.say(
            f"A/B: {start_preset.name} ({self.describe(self.start)}) vs {summary['chosen_label']}, "
            + (
                f"{opts.ab_rounds} to {last} rounds each (until the interval decides)"
                if last > opts.ab_rounds
                else f"{opts.ab_rounds} rounds each"
            )
        )
        ab_over = {
            **(opts.overrides or {}),
            "concurrency": concurrency,
            "requests": max(int((opts.overrides or {}).get("requests") or self.base.bench.requests), 2 * concurrency),
        }
        await session.stop_follow()
        ab = await run_ab(
            session.transport,
            start_preset,
            b,
            opts.ab_rounds,
            ab_over,
            min_effect=0.0,  # no minimum practical effect: a decided gain is taken (issue 25: p = 0.029 kept the start)
            progress=self.progress,
            judge=opts.ab_judge,
            spread=spread,
            spread_source=spread_source,
            max_rounds=last,
            on_cleanup=self.on_cleanup,
        )
        summary["ab"] = ab
        v = ab["verdict"]
        summary["verdict"] = v
        if v.get("verdict") == "faster":
            summary["best_preset"] = str(P.save(b, opts.out / "best.yaml"))


def plan_line(base: P.Preset, budget: int, ab_last: int, rows: list[dict], running=None) -> str:
    """What tune is about to spend, said before its first launch: how many launches at the most (the
    search's, those of an earlier run of this log counted, and the final A/B's maximum) and roughly
    how long, from the last launch of this preset it knows of (this log's, or the running server's
    record); else that it does not know."""
    done = [r for r in rows if r.get("kind") == "launch"]
    search = max(0, 1 + budget - len(done))
    total = search + 2 * ab_last
    parts = [f"up to {search} for the search (the start and up to {budget} relaunch(es)"]
    parts[0] += f"; {len(done)} done before)" if done else ")"
    parts.append(f"up to {2 * ab_last} for the final A/B ({ab_last} round(s) per arm at most)" if ab_last else "no A/B")
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


def choice_reason(result: TuneResult, describe: Callable[[Config], str] = lambda c: c.label) -> str:
    """Why the search's answer is the configuration it is (what the A/B then proves): the best
    measured goodput at the target concurrency, why it was launched; or, when another measured a
    hair more, that the tie within the noise goes to the simpler one."""
    c = result.concurrency
    measured = result.measured()
    chosen, got = result.chosen, measured.get(result.chosen)
    top = max(measured, key=lambda k: measured[k]) if measured else chosen
    if got is None:
        return f"{describe(chosen)} measured nothing at concurrency {c}"
    start = measured.get(result.start)
    said = f"measured {got:.1f} tok/s at concurrency {c}"
    if start and chosen != result.start:
        said += f" ({got / start - 1:+.1%} on the start's {start:.1f})"
    launched = next((st.reason for st in result.steps if st.config == chosen), None)
    if top == chosen:
        return f"the best measured: {said}" + (f"; launched as {launched}" if launched else "")
    return (
        f"{said}; not the best measured ({describe(top)}, {measured[top]:.1f} tok/s), but within "
        f"{NOISE / 4:.1%} of it and simpler (fewer steps, a smaller tree): a tie inside the noise goes to "
        "the simpler configuration"
    )


def ab_spread(launches: list[Launch], concurrency: int, rows: list[dict], presets: list) -> tuple[float | None, str]:
    """The launch-to-launch spread the final A/B states its power from: configurations the search
    launched more than once (goodput at ``concurrency``) and launches of ``presets`` in an earlier
    A/B of this log, pooled (sd of log goodput); (None, ""): nothing was measured twice."""
    from tuitune.experiments.ab import earlier_launches, pooled_spread

    groups: dict[object, list] = {}
    for ln in launches:
        g = ln.goodput.get(concurrency)
        if g:
            groups.setdefault(ln.config, []).append(g)
    earlier = [x for x in earlier_launches([r for r in rows if r.get("kind") == "result"])]
    for p in presets:
        groups[p.hash()] = [
            x.get("goodput") for x in earlier if x.get("hash") == p.hash() and x.get("concurrency") == concurrency
        ]
    sd, used = pooled_spread(list(groups.values()))
    if sd is None:
        return None, ""
    return (
        sd,
        f"measured: {used} launches in this tune log of configurations launched more than once (the search, an earlier A/B)",
    )


def _nccl_gains(decided: dict | None) -> str:
    """'measured +4.1 %, predicted +3.8 %' (what of the two is known)."""
    if not decided:
        return ""
    parts = [
        f"{what} {decided[key]:+.1%}"
        for what, key in (("measured", "measured_gain"), ("predicted", "predicted_gain"))
        if decided.get(key) is not None
    ]
    return ", ".join(parts)


def _nccl_summary(screen: dict, decided: dict | None) -> dict:
    pred = dict(screen.get("prediction") or {})
    for key in ("predicted_gain", "measured_gain", "cycle_ms"):
        if decided and decided.get(key) is not None:
            pred[key] = decided[key]
    return pred


def format_result(r: dict) -> str:
    lines = [f"tuned at concurrency {r['concurrency']}: {r['relaunches']} relaunch(es); stopped: {r['stop_reason']}"]
    pred = r.get("nccl_prediction") or {}
    if pred.get("winner"):
        if pred.get("step_saving_us") is not None:
            said = _nccl_gains(pred)
            lines.append(
                f"NCCL: nccl-bench's winner {pred['winner']} predicted to save {pred['step_saving_us']:.1f} µs a "
                f"decode step against {pred['reference']}" + (f" ({said})" if said else "")
            )
            lines.append(f"  the prediction rests on: {pred['basis']}")
        elif pred.get("note"):
            lines.append(f"NCCL: nccl-bench's winner {pred['winner']}; no step prediction ({pred['note']})")
    for label, g in sorted(r["measured"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {label:<32} {g:>10.1f} tok/s measured")
    for label, why in (r.get("failed") or {}).items():
        lines.append(f"  {label:<32} did not start: {why}")
    for label, levels in (r.get("sim_behind") or {}).items():
        said = "; ".join(f"c={c}: {how}" for c, how in levels.items())
        lines.append(
            f"  {label:<32} measured while the simulator fell behind its clock ({said}): slower than its model "
            "there, so a choice resting on it may be wrong; lower --sim-speedup"
        )
    if r.get("chosen_why") and r["verdict"].get("verdict") != "start is already best":
        lines.append(f"chosen: {r['chosen_label']}: {r['chosen_why']}")
    v = r["verdict"]
    if v.get("verdict") == "start is already best":
        lines.append(f"verdict: the start is already best ({v['reason']})")
    elif v.get("verdict") == "faster":
        lines.append(
            f"verdict: {r['chosen_label']} is faster than the start, by at least {v['at_least']:.1%} (ratio "
            f"{v['ratio']:.4f}, {v.get('interval_level', 0.95):.1%} CI {v['ratio_ci'][0]:.4f}-{v['ratio_ci'][1]:.4f}, "
            f"p = {v['p_value']:.3f}{_ab_rounds_said(r)}); written to {r.get('best_preset')}"
        )
    elif v.get("verdict") == "not confirmed":
        lines.append(f"no verdict: {v['reason']}; the start is kept (no best.yaml)")
    elif v.get("verdict") == "measurement only":
        lines.append(
            f"no verdict: {v['reason']}; A/B medians: start {v['baseline_median']:.1f}, "
            f"{r['chosen_label']} {v['candidate_median']:.1f} tok/s (ratio {v['ratio']:.3f}); "
            "the start is kept (no best.yaml)"
        )
    else:
        why = v.get("reason") or v.get("verdict")
        if v.get("verdict") == "slower":
            why = f"{r['chosen_label']} is slower than the start in the A/B, by at least {v['at_least']:.1%}"
        elif v.get("verdict") == "no significant difference":
            lo, hi = v["ratio_ci"]
            why = (
                f"no significant difference in the A/B (ratio {v['ratio']:.4f}, {v.get('interval_level', 0.95):.1%} "
                f"CI {lo:.4f}-{hi:.4f}, p = {v['p_value']:.3f}{_ab_rounds_said(r)})"
            )
        lines.append(f"verdict: {why}; the start is kept (no best.yaml)")
    power = ((r.get("ab") or {}).get("power") or {}).get("before")
    if power:
        lines.append(f"A/B power: {power['sentence']}")
    return "\n".join(lines)


def _ab_rounds_said(r: dict) -> str:
    """', decided after 5 of up to 8 rounds' (a sequential final A/B), else ''."""
    ab = r.get("ab") or {}
    return f", {ab['stopped']}" if ab.get("max_rounds", 0) > ab.get("first_look", 0) and ab.get("stopped") else ""
