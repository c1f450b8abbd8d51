"""The tuning loop: measure, fit, advise, launch the predicted best, re-fit … (``tune_loop``).

The loop is independent of where measurements come from: a ``Source`` launches a configuration and
returns what the launch showed (profile windows, decode lines, goodput per load level). `tuitune
tune` drives it through a session (``experiments.tune``: ``SessionSource``, its log, the final A/B);
the benchmarks drive it through worlds written in them, and ``experiments.recorded`` through the
launches of a recorded run.

Each round: fit the model to every launch so far; speculation off first when it was never
measured and its interval gives it a chance of being the best (else it is the spare relaunch,
before the loop would stop with one left); if the predicted best unmeasured configuration beats the best measured goodput by more
than the noise, launch it; otherwise launch the configuration with the highest chance of beating
the best by more than the noise (its interval and the launch noise counted); stop when none has
even 2.5 %, or the relaunch budget is spent. The choice is the best *measured* configuration: a
prediction is never the final word. The models it decides with live in tuitune.decide.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.decide.advise import Advice, advise
from tuitune.decide.costmodel import fit
from tuitune.decide.launch import OFF, Config, FitError, Launch
from tuitune.experiments.observe import preset_config

NOISE = 0.02  # gains below this are inside launch-to-launch noise (FACTS §7: published gains are ~1-4 %)
CHANCE = 0.025  # a configuration with less chance than this of beating the best measured is not worth a relaunch


BASELINE_FIRST = (
    "the baseline first: speculation off cannot be held in the prepared launch, so it gets a launch of its own "
    "before the start's, which then holds every chain it is prepared for"
)


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
    baseline_first: bool = False,
) -> TuneResult:
    """Measure ``start``, then up to ``budget`` relaunches chosen by the fitted model.

    ``baseline_first``: where the start is prepared to switch (its chains held in its one launch) and
    speculation off is not, off is measured before the start, in a launch of its own, besides the
    budget: measured after the start (as the search would when off could be the best, or with the
    spare relaunch), it makes the prepared start launch a second time for the chains after it. The caller
    decides that it applies (``TuneRun.baseline_first``: a start the launch holds, a budget, off in the
    space); the loop only leaves it out on a resumed run."""
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
                else f"  goodput at concurrency {concurrency}: "
                + (f"{g:.1f} tok/s" if g else "not measured")
                + (" (held live in the prepared launch: no relaunch)" if ln.live else "")
            )

    seen = {st.config for st in steps}
    if baseline_first and not seen:  # (the caller decides it applies: ``TuneRun.baseline_first``)
        await run(OFF, BASELINE_FIRST, None)
        seen.add(OFF)
    if start not in seen:  # (on --resume, a run stopped after its baseline-first launch measures the start next)
        await run(start, "the starting configuration", None)
    # the baseline measured first is the start's companion, not one of the budget's measurements (the
    # search would otherwise spend one on it, in most worlds: tests/experiments/test_tune_replay.py)
    extra = 1 if steps and steps[0].config == OFF and steps[0].reason == BASELINE_FIRST else 0
    stop = "relaunch budget spent"
    adv = None
    while len(steps) - 1 - extra < budget:
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
