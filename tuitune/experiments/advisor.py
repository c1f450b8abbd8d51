"""`tuitune advise`: launches observed (tuitune.experiments.observe) -> a fitted cost model -> the
predicted best configuration at each concurrency, and, on request, an engine schedule written to a
file: SGLang's --speculative-adaptive-config, or vLLM's num_speculative_tokens_per_batch_size (one
K per batch-size range), both from the same per-bucket decision (``decide.advise.adaptive_schedule``).

The models are pure (tuitune.decide); this module is the use case around them: it gathers the
launches, fits, ranks the engine's configuration space, writes the schedule, and says the result
as JSON or as text.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from tuitune import engines
from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.decide import advise as A
from tuitune.decide.costmodel import CostModel, bootstrap, fit
from tuitune.decide.launch import Config, FitError
from tuitune.experiments.observe import _is_preset, launches_from
from tuitune.measure.workload import differ as workload_differ

EMIT_ENGINES = {e.schedule: e for e in engines.ENGINES.values() if e.schedule}  # format -> the engine loading it
EMIT_FORMATS = tuple(EMIT_ENGINES)
_DSD = engines.get("vllm")  # its schedule: one K per batch-size range (num_speculative_tokens_per_batch_size)
DSD = str(_DSD.schedule)  # "vllm-dsd"
ADAPTIVE = str(engines.get("sglang").schedule)  # "sglang-adaptive": candidate steps per bucket
REFITS = 64  # the model refitted to resampled windows this many times to say how sure each bucket is
SURE = 0.5  # a bucket's choice within the tolerance of the best in fewer of the refits than this: unsure


class AdvisorError(TuituneError):
    """One sentence; ``code`` 2 for bad input, 1 for failed work."""


@dataclass
class Advised:
    model: CostModel
    advices: list[A.Advice]
    describe: Callable[[Config], str]  # the engine's name for a configuration
    emitted: str | None = None  # the schedule's file
    schedule: dict | None = None  # the file's content
    buckets: list[dict] = field(default_factory=list)  # why each bucket got its candidates (and its K)
    emit_format: str = ADAPTIVE
    floor: dict | None = None  # vLLM's schedule against no speculation at the concurrencies asked (A.dsd_floor)
    per_request: tuple[float, float] | None = None  # the verify's ms a request: the fit's, the plane's
    off_refused: bool = False  # the engine cannot run 0 steps in its schedule (SGLang on a CPU)
    warnings: list[str] = field(default_factory=list)  # what the sources do not share (their workloads)

    def to_dict(self) -> dict:
        out = {"model": self.model.summary(), "advice": [a.to_dict() for a in self.advices]}
        if self.warnings:
            out["warnings"] = self.warnings
        if self.schedule is not None:
            key = self.emit_format.replace("-", "_")  # sglang_adaptive, vllm_dsd
            emitted: dict = {"file": self.emitted, "config": self.schedule, "buckets": self.buckets}
            if self.off_refused:
                emitted["off_refused"] = True
            if self.floor is not None:
                emitted["floor"] = self.floor
            out[key] = emitted
        return out

    def format(self, top: int = 5) -> str:  # noqa: C901
        lines = [A.format_advice(self.model, self.advices, top=top, describe=self.describe)]
        lines += [f"warning: {w}" for w in self.warnings]
        if self.schedule is None:
            return "\n".join(lines)
        dsd = self.emit_format == DSD
        if dsd:
            lines.append(
                f"\nwrote {self.emitted} (vLLM num_speculative_tokens_per_batch_size; per batch-size range the "
                f"shortest K within {A.TOLERANCE:.0%} of its best with both the fitted per-request verify cost and "
                f"the plane's, 0 where speculation off is):"
            )
        else:
            lines.append(
                f"\nwrote {self.emitted} (SGLang --speculative-adaptive-config; candidates within "
                f"{A.TOLERANCE:.0%} of each bucket's best with both the fitted per-request verify cost and the plane's):"
            )
            if self.off_refused:
                lines.append(
                    "  (0 steps not offered: SGLang on a CPU crashes at a 0-step candidate; each bucket keeps a chain)"
                )

        def left(w: dict) -> str:  # a tie by a prediction outside what was measured: measurement wins it
            out = sorted(w.get("left_out", {}))
            return f"  (tied by extrapolation, left out: steps {', '.join(map(str, out))})" if out else ""

        def sure(w: dict) -> str:  # how often the refits to resampled windows agree
            if "sure" not in w or (dsd and w.get("measured_floor")) or w.get("per_request"):
                return ""  # refits of the fit's cost alone do not judge a bucket that cost decides
            share = w["sure"].get(w["k"], 0.0) if dsd else w["sure_candidates"]
            return f"; in {share:.0%} of {w['draws']} refits"

        def unsure(w: dict) -> str:
            u = w.get("unsure")
            if not u:
                return ""
            _, what = _judged(w, dsd)
            fav = ", ".join(f"{'K' if dsd else 'steps'} {s} {v:.0%}" for s, v in u["favoured"].items())
            return f"  UNSURE: {what} within {A.TOLERANCE:.0%} of the best in only {u['share']:.0%} of the refits" + (
                f" (more often: {fav})" if fav else ""
            )

        def costly(w: dict) -> str:
            p = w.get("per_request")
            if not p:
                return ""
            _, what = _judged(w, dsd)
            name = "K" if dsd else "steps"
            return (
                f"  PER-REQUEST COST DECIDES: the fit's cost puts {name} {p['fit_best']} first, the plane's "
                f"{name} {p['best']}; {what} is at most {1 - p['ratio']:.0%} below the best with either"
            )

        for w in self.buckets:
            mark = f"  EXTRAPOLATED: {'; '.join(w['extrapolated'])}" if w.get("extrapolated") else ""
            seen = f"; measured there: steps {', '.join(map(str, sorted(w['measured'])))}" if w.get("measured") else ""
            if dsd:
                sizes = f"{w['key']}-{w['end']}" if w["end"] != w["key"] else f"{w['key']}"
                floor = f"  0 by measurement: {w['measured_floor']}" if w.get("measured_floor") else ""
                lines.append(
                    f"  batch sizes {sizes:<9} (judged at {w['batch_size']}{seen}): K {w['k']}  "
                    f"(within {A.TOLERANCE:.0%}: {w['candidates']}{sure(w)})"
                    + left(w)
                    + floor
                    + unsure(w)
                    + costly(w)
                    + mark
                )
            else:
                lines.append(
                    f"  batch size >= {w['key']:<4} (judged at {w['batch_size']}{seen}): candidate_steps {w['candidates']}"
                    + (f"  (one of them within {A.TOLERANCE:.0%} of the best {sure(w)[2:]})" if sure(w) else "")
                    + left(w)
                    + unsure(w)
                    + costly(w)
                    + mark
                )
        doubt = [w for w in self.buckets if w.get("unsure")]
        if doubt:
            lines.append(
                _closing(
                    doubt,
                    len(self.buckets),
                    "{is} unsure: the model refitted to resampled profile windows often puts another choice "
                    "ahead (a few noisy windows decide {it}); ",
                )
            )
        priced = [w for w in self.buckets if w.get("per_request")]
        if priced and self.per_request:
            fit_c, plane_c = self.per_request
            lines.append(
                _closing(
                    priced,
                    len(self.buckets),
                    f"{{changes}} with the verify's cost per request, which the launches pin poorly ({fit_c:.2f} ms "
                    f"fitted, {plane_c:.2f} from a plane through the windows): ",
                )
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
        if not dsd:
            union = sorted(
                {s for v in self.schedule.values() if isinstance(v, dict) for s in v.get("candidate_steps", [])}
            )
            lines.append(
                "  use it: speculative.adaptive_config: /path/on/the/target.json in the preset (eagle_topk 1, "
                f"num_steps one of {union}: SGLang starts at num_steps and refuses one the file does not list)"
            )
            return "\n".join(lines)
        top_k = max(w["k"] for w in self.buckets)
        fl = self.floor
        if fl is not None:
            asked = ", ".join(str(p["concurrency"]) for p in fl["points"])
            lines.append(
                f"  no-regret floor (never more than {fl['tolerance']:.0%} below speculation off) at concurrency "
                f"{asked}: met"
                if fl["met"]
                else f"  {fl['sentence'][0].upper()}{fl['sentence'][1:]}."
            )
        if top_k == 0:
            lines.append(
                "  speculation pays at none of these batch sizes: serve without speculation rather than with "
                "this file (vLLM at K 0 still runs its speculative path; K=0 is not off)"
            )
        else:
            if any(w["k"] == 0 for w in self.buckets):
                lines.append(
                    "  K 0 is not off: where the file says 0, vLLM still runs its speculative path (reported 7-22 % "
                    "slower than a launch without speculation, vllm #49548); a benchmark there against such a "
                    "launch says what it costs"
                )
            lines.append(
                f"  use it: speculative.dynamic_schedule: {os.path.abspath(self.emitted or '')} in the preset "
                "(a path on this machine, "
                f"read when the preset loads), with num_speculative_tokens {top_k} or more"
            )
        return "\n".join(lines)


def measured_floor(launches, key: int, end: int, k: int) -> str | None:
    """The no-regret check against measurement: why K ``k`` must give way to 0 in the batch-size
    range [key, end], or None. It must when a benchmark at a concurrency inside the range measured
    speculation off, and measured K ``k`` (or, K ``k`` unmeasured there, every speculative
    configuration measured there) more than the tolerance below it."""
    for c in sorted({c for ln in launches for c in ln.goodput if key <= c <= end}):
        off = [ln.goodput[c] for ln in launches if not ln.config.speculative and ln.goodput.get(c, 0) > 0]
        if not off:
            continue
        base = max(off)
        spec = {ln.config: ln.goodput[c] for ln in launches if ln.config.speculative and ln.goodput.get(c, 0) > 0}
        mine = [g for cfg, g in spec.items() if cfg.topk == 1 and cfg.steps == k]
        judged = mine or list(spec.values())
        if judged and max(judged) < base * (1 - A.TOLERANCE):
            what = f"{k} spec tokens" if mine else "every speculative launch"
            return f"measured at concurrency {c}: {what} {max(judged):.0f} tok/s, off {base:.0f}"
    return None


def dsd_schedule(buckets: list[dict], last_end: int = _DSD.schedule_last_end or 0, launches=()) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` from the per-bucket decision SGLang's schedule
    is made of (``A.adaptive_schedule``: each key's candidates, the chain steps within the tolerance
    of the bucket's best, 0 = off). vLLM runs one K per batch size, so each bucket gets 0 when off is
    a candidate (speculation does not pay by more than the tolerance: no regret), else the shortest
    candidate (the cheapest within the tolerance, and the one that loses least if acceptance is
    lower than fitted). A key's range runs to the next key - 1, the last to ``last_end``; adjacent
    ranges of one K are merged. Then the measurements the ``launches`` hold overrule the model: a
    range where a benchmark measured speculation off ahead (``measured_floor``) gets 0. Each bucket
    gets ``k`` and ``end`` (the decision, for the output), and ``measured_floor`` when overruled."""
    rows: list[list[int]] = []
    for i, w in enumerate(buckets):
        end = buckets[i + 1]["key"] - 1 if i + 1 < len(buckets) else max(last_end, w["key"])
        k = 0 if 0 in w["candidates"] else min(w["candidates"])
        if k and (why := measured_floor(launches, w["key"], end, k)):
            w["measured_floor"] = why
            k = 0
        w["k"], w["end"] = k, end
        if rows and rows[-1][2] == k:
            rows[-1][1] = end
        else:
            rows.append([w["key"], end, k])
    _DSD.check_schedule_table(rows)
    return rows


def _benchmark_at(bs: int) -> str:
    return f"a benchmark at concurrency {bs} (profile on)"


def _settle_by_benchmark(w: dict) -> None:
    """Name a benchmark at the bucket's batch size among what would settle it (once)."""
    if _benchmark_at(w["batch_size"]) not in w.setdefault("settle", []):
        w["settle"].append(_benchmark_at(w["batch_size"]))


def _closing(marked: list[dict], total: int, said: str) -> str:
    """The line after the buckets for those ``marked`` one way: ``said`` (with its separator) with
    {is}, {it}, {changes} in the number of its subject, then the benchmarks that would settle them."""
    one = len(marked) == 1
    words = {"is": "is" if one else "are", "it": "it" if one else "them", "changes": "changes" if one else "change"}
    levels = ",".join(str(w["batch_size"]) for w in marked)
    return (
        f"  {len(marked)} of {total} buckets {said.format(**words)}{'a benchmark' if one else 'benchmarks'} at "
        f"concurrency {levels} (profile on) would settle {words['it']}"
    )


def _judged(w: dict, dsd: bool) -> tuple[set[int], str]:
    """A bucket's choice (vLLM's K, or SGLang's candidates) and its name in the output."""
    return ({w["k"]}, f"K {w['k']}") if dsd else (set(w["candidates"]), f"candidate_steps {w['candidates']}")


def mark_unsure(buckets: list[dict], dsd: bool) -> None:
    """Mark each bucket whose choice the refits (``A.adaptive_schedule``'s ``sure``) do not bear out:
    vLLM's K (or SGLang's candidates: one of them) within the tolerance of the best in fewer than
    ``SURE`` of them. A marked bucket gets ``unsure`` (the share, and the steps the refits favour
    more) and a ``settle`` naming the benchmark that would decide it. A K a measurement set to 0
    (``measured_floor``) is not judged by the refits."""
    for w in buckets:
        sure = w.get("sure")
        if not sure or (dsd and w.get("measured_floor")) or w.get("per_request"):
            continue  # a bucket the per-request cost decides: the refits of the fit alone do not judge it
        share = sure.get(w["k"], 0.0) if dsd else w["sure_candidates"]
        if share >= SURE:
            continue
        mine, _ = _judged(w, dsd)
        better = {s: v for s, v in sorted(sure.items(), key=lambda x: -x[1]) if s not in mine and v > share}
        w["unsure"] = {"share": share, "favoured": dict(list(better.items())[:3])}
        _settle_by_benchmark(w)


def mark_per_request(buckets: list[dict], dsd: bool) -> None:
    """Mark each bucket whose choice the per-request verify cost decides: no choice is within the
    tolerance of the best both with the fit's cost and with the plane's (``A.adaptive_schedule``'s
    ``both``: per chain steps the lesser of its two ratios to the best; vLLM's K, or SGLang's best
    candidate, below 1 − the tolerance). The schedule then holds a choice within the tolerance of
    the one that loses least with either cost, and the bucket gets ``per_request`` (each model's
    best steps and the choice's worse ratio) and the benchmark that would settle it. On the real
    CPU engine the fit alone put K 1-2 in the bucket 8-15 three runs out of three, a quarter below
    the best there (benchmarks/schedule_refits.py)."""
    for w in buckets:
        both, alt = w.get("both"), w.get("alt")
        if not both or not alt or (dsd and w.get("measured_floor")):
            continue
        mine, _ = _judged(w, dsd)
        got = max((both[s] for s in mine if s in both), default=0.0)
        if got >= 1 - A.TOLERANCE:
            continue
        fit = {s: w["measured"].get(s, v) for s, v in w["predicted"].items() if s in alt}
        w["per_request"] = {
            "fit_best": max(fit, key=lambda s: fit[s]),
            "best": max(alt, key=lambda s: alt[s]),
            "ratio": got,
        }
        _settle_by_benchmark(w)


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
            settle.append(_benchmark_at(bs))
        if any(r.startswith("speculation off") for r in reasons):
            settle.append("a launch with speculation off")
        w["extrapolated"] = reasons
        w["settle"] = settle


def _ran_a_schedule(src: str) -> bool:
    """Whether a source (a preset, or a capture's recorded preset) runs vLLM's dynamic schedule."""
    if _is_preset(src):
        try:
            spec = P.resolve(src).speculative
        except P.PresetError:
            return False  # said by launches_from, in its words
        return spec is not None and spec.dynamic_schedule is not None
    from tuitune.measure.capture import CaptureError, iter_capture

    try:
        meta = iter_capture(src)[0]
    except (CaptureError, OSError, ValueError):
        return False  # said by launches_from
    spec = (meta.get("preset") or {}).get("speculative") if isinstance(meta.get("preset"), dict) else None
    return isinstance(spec, dict) and spec.get("dynamic_schedule") is not None


def _workload_of(src: str) -> tuple[bool, dict | None]:
    """(whether the source is a capture, the workload tuitune sent while it was recorded: None for
    the server's own traffic, or a preset's running server)."""
    if _is_preset(src):
        return False, None
    from tuitune.measure.capture import CaptureError, iter_capture

    try:
        w = iter_capture(src)[0].get("workload")
    except (CaptureError, OSError, ValueError):
        return True, None  # said by launches_from
    return True, w if isinstance(w, dict) else None


def workload_warning(sources: list[str]) -> str | None:
    """One sentence when the captures advised from ran different workloads: each launch's acceptance
    is its prompts', so a model fitted across them mixes two questions."""
    found = [(src, w) for src in sources for cap, w in [_workload_of(src)] if cap]
    for src, w in found[1:]:
        if other := workload_differ(w, found[0][1], traffic=True):
            return (
                f"the captures ran different workloads ({other}: {found[0][0]} and {src}); acceptance is the "
                "prompts', so the fit mixes them: advise from captures of one workload"
            )
    return None


def _refuse_emit(emit_format: str, engine: engines.Engine) -> None:
    """The one sentence for a schedule asked of an engine that cannot load it."""
    owner = EMIT_ENGINES[emit_format]
    if emit_format == ADAPTIVE:
        why = "has no adaptive speculation to load it"
    else:
        why = "has no num_speculative_tokens_per_batch_size to load it"
    instead = f" (its own is --emit {engine.schedule})" if engine.schedule else ""
    raise AdvisorError(f"--emit {emit_format} is {owner.label}'s schedule; {engine.label} {why}{instead}", 2)


async def advise_sources(
    sources: list[str],
    concurrencies: list[int] | None = None,
    emit: str | None = None,
    buckets: list[int] | None = None,
    emit_format: str = ADAPTIVE,
) -> Advised:
    """Advice for each of ``concurrencies`` (default: the load the launches were measured at) from
    presets' running servers or captures; with ``emit``, the engine schedule ``emit_format`` (SGLang's
    adaptive config, or vLLM's K per batch-size range) over ``buckets`` (batch sizes) is written to
    that file, atomically. Raises ObserveError (the sources), ControlError / TransportError (a
    server's link) or AdvisorError."""
    if emit_format not in EMIT_FORMATS:
        raise AdvisorError(f"--emit {emit_format!r}: the formats are {' and '.join(EMIT_FORMATS)}", 2)
    owner = EMIT_ENGINES[emit_format]
    for src in sources:
        if _ran_a_schedule(src):
            raise AdvisorError(
                f"{src}: runs vLLM's dynamic schedule (speculative.dynamic_schedule), whose K changes with the "
                "batch size while the probe's windows name num_speculative_tokens; advise from launches with a "
                "static K",
                2,
            )
    if emit:  # a preset of the other engine is refused before its server is asked for anything
        for src in sources:
            if _is_preset(src):
                try:
                    name = P.resolve(src).server.engine
                except P.PresetError:
                    continue  # said by launches_from, in its words
                if name != owner.name:
                    _refuse_emit(emit_format, engines.get(name))
    launches, running, load = await launches_from(sources)
    engine = engines.get(launches[-1].engine)
    if emit and engine.name != owner.name:
        _refuse_emit(emit_format, engine)
    try:
        model = fit(launches)
    except FitError as e:
        raise AdvisorError(f"cannot fit a cost model: {e}", 1) from None
    # look-up drafting (the windows say drafter=ngram): chains only, as tune searches it
    lookup = any(w.drafter for ln in launches for w in ln.windows)
    space = A.space(topks=(1,) if lookup else engine.topks)
    describe = engine.config_label
    out = Advised(model, [A.advise(model, c, running, space, describe) for c in concurrencies or [load]], describe)
    if said := workload_warning(sources):
        out.warnings.append(said)
    if emit:
        out.emit_format = emit_format
        draws = bootstrap(launches, REFITS)
        alt = fit(launches, plane=True)  # the fit itself where no plane tells c from the slope: nothing marked
        off = engine.schedule_allows_off([w for ln in launches for w in ln.windows])
        out.schedule, out.buckets = A.adaptive_schedule(
            model, tuple(buckets or A.ADAPTIVE_BUCKETS), draws=draws, alt=alt, off=off
        )
        out.off_refused = not off
        out.per_request = (model.verify.per_request().mean, alt.verify.per_request().mean)
        mark_buckets(model, out.buckets)
        if emit_format == DSD:
            rows = dsd_schedule(out.buckets, launches=model.launches)
            out.schedule = owner.schedule_document(rows)
            out.floor = A.dsd_floor(model, rows, concurrencies or [load])
        mark_per_request(out.buckets, emit_format == DSD)
        mark_unsure(out.buckets, emit_format == DSD)
        try:
            owner.write_schedule(emit, out.schedule)
        except OSError as e:
            raise AdvisorError(f"{emit}: cannot write it ({e.strerror or e})", 1) from None
        out.emitted = emit
    return out
