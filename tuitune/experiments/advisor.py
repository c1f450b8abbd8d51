"""`tuitune advise`: launches observed (tuitune.experiments.observe) -> a fitted cost model -> the
predicted best configuration at each concurrency, and, on request, an engine schedule written to a
file (SGLang's --speculative-adaptive-config).

The models are pure (tuitune.decide); this module is the use case around them: it gathers the
launches, fits, ranks the engine's configuration space, writes the schedule, and says the result
as JSON or as text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tuitune import engines
from tuitune.decide import advise as A
from tuitune.decide.costmodel import Config, CostModel, FitError, fit
from tuitune.experiments.observe import launches_from

EMIT_FORMATS = ("sglang-adaptive",)


class AdvisorError(Exception):
    """One sentence; ``code`` 2 for bad input, 1 for failed work."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass
class Advised:
    model: CostModel
    advices: list[A.Advice]
    describe: Callable[[Config], str]  # the engine's name for a configuration
    emitted: str | None = None  # the schedule's file
    schedule: dict | None = None
    buckets: list[dict] = field(default_factory=list)  # why each bucket got its candidates

    def to_dict(self) -> dict:
        out = {"model": self.model.summary(), "advice": [a.to_dict() for a in self.advices]}
        if self.schedule is not None:
            out["sglang_adaptive"] = {"file": self.emitted, "config": self.schedule, "buckets": self.buckets}
        return out

    def format(self, top: int = 5) -> str:
        lines = [A.format_advice(self.model, self.advices, top=top, describe=self.describe)]
        if self.schedule is not None:
            lines.append(
                f"\nwrote {self.emitted} (SGLang --speculative-adaptive-config; candidates within "
                f"{A.TOLERANCE:.0%} of each bucket's best):"
            )
            for w in self.buckets:
                mark = f"  EXTRAPOLATED: {'; '.join(w['extrapolated'])}" if w.get("extrapolated") else ""
                lines.append(
                    f"  batch size >= {w['key']:<4} (judged at {w['batch_size']}"
                    + (
                        f"; measured there: steps {', '.join(map(str, sorted(w['measured'])))}"
                        if w.get("measured")
                        else ""
                    )
                    + f"): candidate_steps {w['candidates']}"
                    + mark
                )
            marked = [w for w in self.buckets if w.get("extrapolated")]
            if marked:
                levels = [str(w["batch_size"]) for w in marked if any("benchmark" in x for x in w["settle"])]
                settle = [f"benchmarks at concurrency {','.join(levels)} (profile on)"] if levels else []
                if any("speculation off" in x for w in marked for x in w["settle"]):
                    settle.append("a launch with speculation off")
                lines.append(
                    f"  {len(marked)} of {len(self.buckets)} buckets rest on extrapolation, not measurement: "
                    f"check them before serving with the file ({' and '.join(settle)} would settle them)"
                )
            lines.append("  use it: speculative.adaptive_config: /path/on/the/target.json in the preset (eagle_topk 1)")
        return "\n".join(lines)


def mark_buckets(model: CostModel, buckets: list[dict]) -> None:
    """Mark each bucket of an emitted schedule whose choice rests on extrapolation: its batch size
    or its candidates' token counts outside what was measured, or "off" never launched. A marked
    bucket gets ``extrapolated`` (the reasons) and ``settle`` (the measurement that would decide it)."""
    seen = A.Seen.of(model)
    for w in buckets:
        bs = w["batch_size"]
        reasons: list[str] = []
        for steps in w["candidates"]:
            reasons += [r for r in seen.reasons(Config.chain(steps), bs) if r not in reasons]
        if not reasons:
            continue
        settle = []
        if any(r.startswith("batch size") or "tokens" in r for r in reasons):
            settle.append(f"a benchmark at concurrency {bs} (profile on)")
        if any(r.startswith("speculation off") for r in reasons):
            settle.append("a launch with speculation off")
        w["extrapolated"] = reasons
        w["settle"] = settle


async def advise_sources(
    sources: list[str],
    concurrencies: list[int] | None = None,
    emit: str | None = None,
    buckets: list[int] | None = None,
) -> Advised:
    """Advice for each of ``concurrencies`` (default: the load the launches were measured at) from
    presets' running servers or captures; with ``emit``, SGLang's adaptive schedule over
    ``buckets`` (batch sizes) is written to that file. Raises ObserveError (the sources),
    ControlError / TransportError (a server's link) or AdvisorError."""
    launches, running, load = await launches_from(sources)
    engine = engines.get(launches[-1].engine)
    if emit and engine.name != "sglang":
        raise AdvisorError(
            f"--emit sglang-adaptive is SGLang's schedule; {engine.label} has no adaptive speculation to load it", 2
        )
    try:
        model = fit(launches)
    except FitError as e:
        raise AdvisorError(f"cannot fit a cost model: {e}", 1) from None
    # look-up drafting (the windows say drafter=ngram): chains only, as tune searches it
    lookup = any(w.drafter for ln in launches for w in ln.windows)
    space = A.space(topks=(1,) if lookup else engine.topks)
    describe = engine.config_label
    out = Advised(model, [A.advise(model, c, running, space, describe) for c in concurrencies or [load]], describe)
    if emit:
        out.schedule, out.buckets = A.adaptive_schedule(model, tuple(buckets or A.ADAPTIVE_BUCKETS))
        mark_buckets(model, out.buckets)
        try:
            A.write_adaptive(emit, out.schedule)
        except OSError as e:
            raise AdvisorError(f"{emit}: cannot write it ({e.strerror or e})", 1) from None
        out.emitted = emit
    return out
