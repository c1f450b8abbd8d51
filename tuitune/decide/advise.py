"""Advice from a fitted cost model: every configuration's predicted goodput, the best few, the
measurement worth making next, and SGLang's own adaptive schedule (core; no UI).

The space is the engine's (``Engine.space``; SGLang's rules when no engine is named):
speculation off; steps 1-8; topk 1, 2, 4, 8; draft tokens = steps + 1 for topk 1, and for trees
the budgets SGLang accepts. An engine that drafts chains only (vLLM: ``Engine.topks == (1,)``)
gets the chains and "off". The schedule's file format and its checks are SGLang's (its engine's
``check_schedule_table``, ``write_schedule``: ``check_adaptive``, ``write_adaptive`` here); what
goes in it is decided here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuitune import engines
from tuitune.decide.costmodel import CostModel, Prediction
from tuitune.decide.launch import OFF, Config
from tuitune.engines.base import MAX_STEPS, Engine

_ADAPTIVE = engines.get("sglang")  # the engine whose adaptive schedule is decided here
ADAPTIVE_BUCKETS = _ADAPTIVE.schedule_buckets
TOPKS = _ADAPTIVE.topks
check_adaptive = _ADAPTIVE.check_schedule_table
write_adaptive = _ADAPTIVE.write_schedule  # (the command line writes it from here)

TOLERANCE = 0.02  # "within 2 % of the best" (adaptive candidates; ties)
BATCH_REACH = 1.5  # a batch size within this factor of those measured is interpolation, beyond it extrapolation
# the same for the token count of a verify (or draft) forward: above those measured 1.25x, as a tile step
# can sit just past them (FACTS §6's H200: 256 -> 384 tokens costs 58 % more); below, 2x (a smaller
# forward costs no more than the smallest measured)
TOKEN_REACH = 1.25
TOKEN_REACH_BELOW = 2.0


def space(max_steps: int = MAX_STEPS, topks: tuple[int, ...] = TOPKS, engine: Engine | None = None) -> list[Config]:
    """The configurations to compare, as costmodel Configs: the engine's space when one is given,
    else SGLang's rules for these tree widths (``topks=(1,)``: chains only)."""
    raw = engine.space(max_steps) if engine is not None else _ADAPTIVE.space(max_steps, topks)
    return [Config(*c) if c[0] else OFF for c in raw]


def rank(model: CostModel, concurrency: int, configs: list[Config] | None = None) -> list[Prediction]:
    preds = [model.predict(c, concurrency) for c in (configs or space())]
    preds.sort(key=lambda p: -p.goodput.mean)
    return preds


# ---- what a prediction rests on ----------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """What the model's curves were fitted from: batch sizes and forward token counts measured,
    and whether a launch without speculation was."""

    batch: tuple[int, int]
    verify_tokens: tuple[float, float]
    draft_tokens: tuple[float, float] | None
    baseline: bool

    @classmethod
    def of(cls, model: CostModel) -> Seen:
        bss = [w.bs or 1 for ln in model.launches for w in ln.windows if w.steps is not None]
        bss += [
            d.running_req for ln in model.launches if not ln.config.speculative for d in ln.decodes if d.running_req
        ]
        batch = (min(bss), max(bss)) if bss else (1, 1)
        draft = model.draft.n_range if model.draft is not None else None
        return cls(batch, model.verify.n_range, draft, model.baseline_source.startswith("baseline launch"))

    def reasons(self, c: Config, concurrency: int) -> list[str]:
        """Why the prediction of ``c`` at ``concurrency`` is an extrapolation ([] when it is not)."""
        bs = max(1, int(concurrency))
        out = []
        lo, hi = self.batch
        if not lo / BATCH_REACH <= bs <= hi * BATCH_REACH:
            out.append(f"batch size {bs} (measured {_span(lo, hi)})")
        n = bs * c.draft_tokens if c.speculative else bs
        if not self.verify_tokens[0] / TOKEN_REACH_BELOW <= n <= self.verify_tokens[1] * TOKEN_REACH:
            out.append(f"{n} verify tokens (measured {_span(*self.verify_tokens)})")
        if c.speculative and self.draft_tokens is not None:
            d = bs * c.topk
            if not self.draft_tokens[0] / TOKEN_REACH_BELOW <= d <= self.draft_tokens[1] * TOKEN_REACH:
                out.append(f"{d} draft tokens a step (measured {_span(*self.draft_tokens)})")
        if not c.speculative and not self.baseline:
            out.append("speculation off (never launched)")
        return out


def _label(c: Config) -> str:
    return c.label


def _span(lo: float, hi: float) -> str:
    return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"


@dataclass
class Extrapolation:
    """A ranking that rests on predictions outside what was measured: the one sentence that says
    so, and the measurements that would settle it."""

    sentence: str
    settle: list[str]
    contenders: dict[Config, list[str]]  # the best and those that could beat it, each with its reasons
    configs: dict[Config, list[str]]  # every configuration predicted outside what was measured

    def to_dict(self) -> dict:
        return {
            "sentence": self.sentence,
            "settle": self.settle,
            "contenders": [{"label": c.label, "config": c.to_dict(), "reasons": r} for c, r in self.contenders.items()],
        }


def extrapolation(
    model: CostModel,
    concurrency: int,
    ranking: list[Prediction],
    measured: dict[Config, float],
    describe: Callable[[Config], str] = _label,
) -> Extrapolation | None:
    """None when the best and every configuration whose interval reaches its prediction (the
    contenders) are predicted inside what was measured, or were benchmarked at this concurrency."""
    if not ranking:
        return None
    seen = Seen.of(model)
    best = ranking[0]
    contenders = [best] + [p for p in ranking[1:] if p.goodput.hi >= best.goodput.mean]
    rows = {p.config: r for p in ranking if p.config not in measured and (r := seen.reasons(p.config, concurrency))}
    why = {p.config: rows[p.config] for p in contenders if p.config in rows}
    if not why:
        return None
    bs = max(1, int(concurrency))
    reasons = [r for rs in why.values() for r in rs]
    settle = []
    if any(r.startswith("batch size") for r in reasons):
        settle.append(f"a benchmark at concurrency {bs} (profile on)")
    else:
        far = [c for c, rs in why.items() if c.speculative and any("tokens" in r for r in rs)]
        if far:
            c = max(far, key=lambda x: (x.draft_tokens, x.topk))
            settle.append(f"a launch of {describe(c)} benchmarked at concurrency {bs}")
    if OFF in why and not seen.baseline:
        settle.append("a launch with speculation off")
    what = [f"batch size {_span(*seen.batch)}", f"{_span(*seen.verify_tokens)} verify tokens"]
    if not seen.baseline:
        what.append("no launch with speculation off")
    ns = [bs * c.draft_tokens if c.speculative else bs for c in why]
    asked = f"concurrency {bs} ({_span(min(ns), max(ns))} verify tokens)"
    sentence = (
        f"measured {', '.join(what)}; asked for {asked}: this ranking rests on extrapolation, "
        f"not measurement, and {' and '.join(settle) or 'a benchmark at this concurrency'} would settle it"
    )
    return Extrapolation(sentence, settle, why, rows)


@dataclass
class Advice:
    concurrency: int
    ranking: list[Prediction]
    running: Prediction | None
    measured: dict[Config, float]  # goodput a benchmark measured at this concurrency
    next_measurement: Prediction | None
    extrapolation: Extrapolation | None = None  # the ranking rests on predictions outside the data

    @property
    def best(self) -> Prediction:
        return self.ranking[0]

    def gain(self, p: Prediction) -> float | None:
        """Predicted gain of ``p`` over the running configuration (a fraction)."""
        if self.running is None or self.running.goodput.mean <= 0:
            return None
        return p.goodput.mean / self.running.goodput.mean - 1.0

    def top(self, n: int = 5) -> list[Prediction]:
        return self.ranking[:n]

    def to_dict(self, full: bool = True) -> dict:
        def row(p: Prediction) -> dict:
            d = p.to_dict()
            g = self.gain(p)
            if g is not None:
                d["gain_over_running"] = g
            if p.config in self.measured:
                d["measured_goodput"] = self.measured[p.config]
            if self.extrapolation is not None and p.config in self.extrapolation.configs:
                d["extrapolated"] = self.extrapolation.configs[p.config]
            return d

        out = {
            "concurrency": self.concurrency,
            "top": [row(p) for p in self.top()],
            "running": row(self.running) if self.running else None,
            "next_measurement": row(self.next_measurement) if self.next_measurement else None,
            "extrapolation": self.extrapolation.to_dict() if self.extrapolation else None,
        }
        if full:
            out["all"] = [row(p) for p in self.ranking]
        return out


def next_measurement(ranking: list[Prediction], measured: set[Config]) -> Prediction | None:
    """The unmeasured configuration whose interval reaches above the best prediction and is the
    widest on that side: measuring it shrinks the uncertainty that could still change the answer
    the most."""
    best = ranking[0].goodput.mean
    open_ = [p for p in ranking if p.config not in measured and p.goodput.hi > best]
    return max(open_, key=lambda p: p.goodput.sd_up, default=None)


def advise(
    model: CostModel,
    concurrency: int,
    running: Config | None = None,
    configs: list[Config] | None = None,
    describe: Callable[[Config], str] = _label,
) -> Advice:
    ranking = rank(model, concurrency, configs)
    measured = {ln.config: ln.goodput[concurrency] for ln in model.launches if concurrency in ln.goodput}
    run = next((p for p in ranking if p.config == running), None) if running is not None else None
    if running is not None and run is None:
        run = model.predict(running, concurrency)
    seen = {ln.config for ln in model.launches}
    return Advice(
        concurrency,
        ranking,
        run,
        measured,
        next_measurement(ranking, seen),
        extrapolation(model, concurrency, ranking, measured, describe),
    )


def neighbours(c: Config, topks: tuple[int, ...] = TOPKS) -> list[Config]:
    """The running configuration and the moves an operator would try next: steps ±1, the other
    topk values (of those the engine runs) at a comparable budget, speculation off."""
    out = [c]
    if c.speculative:
        for s in (c.steps - 1, c.steps + 1):
            if 1 <= s <= MAX_STEPS:
                out.append(Config.chain(s) if c.topk == 1 else Config(s, c.topk, min(c.draft_tokens, s * c.topk + 1)))
        for k in topks:
            if k != c.topk:
                n = c.steps + 1 if k == 1 else min(max(c.draft_tokens, c.steps + 2), c.steps * k + 1)
                out.append(Config(c.steps, k, n))
        out.append(OFF)
    else:
        out += [Config.chain(s) for s in (1, 2, 3)]
    seen: list[Config] = []
    for x in out:
        if x not in seen:
            seen.append(x)
    return seen


# ---- SGLang's adaptive schedule -----------------------------------------------------------------


def adaptive_schedule(
    model: CostModel,
    buckets: tuple[int, ...] = ADAPTIVE_BUCKETS,
    tolerance: float = TOLERANCE,
    draws: list[CostModel] | None = None,
    alt: CostModel | None = None,
    off: bool = True,
) -> tuple[dict, list[dict]]:
    """An SGLang ``--speculative-adaptive-config`` and the reasoning per bucket.

    ``off``: whether a bucket may hold 0 steps (speculation off); False where the engine cannot run
    it (``Engine.schedule_allows_off``: SGLang 0.5.18 on a CPU crashes at 0 steps).

    SGLang routes a batch of size bs to the largest key <= bs (FACTS §7), and adapts steps only
    with topk 1; so each key gets the chain steps (0 = off) within ``tolerance`` of the best at the
    bucket's middle batch size (geometric, to the next key): a chain's goodput there is what a
    benchmark measured at that batch size when one did, else the model's prediction.

    A tie goes to what was measured: a prediction outside it (``Seen.reasons``: a verify forward of
    more tokens than any measured, say) joins the candidates only when it is ahead of the best
    inside by more than the tolerance (then the bucket's choice rests on it, and ``mark_buckets``
    marks it); within the tolerance it is left out (``left_out``, with its reasons). A convex cost
    past the last tokens measured is extended along its last slope, so such a prediction errs high
    (the simulator's PCIe world: a chain of 3 at 88 tokens predicted at 0.89 of off in one run and
    within 2 % of it in another, truly 0.74, from chains measured up to 48). A bucket with nothing
    inside (a batch size past those measured) is chosen from the predictions as they are.

    With ``draws`` (``costmodel.bootstrap``: the model refitted to resampled windows), each bucket
    also gets ``sure``: per chain steps, the share of draws in which that choice is within the
    tolerance of the draw's best (a measured goodput counts as measured in every draw), and
    ``draws``, how many. It says how much the bucket's choice rests on a few noisy windows.
    With ``alt`` (the model with its per-request verify cost from the plane through the windows,
    ``fit(plane=True)``), the candidates are those within ``tolerance`` of the best *with both*
    models: per chain steps the lesser of its ratios to each model's best (``both``), kept within
    the tolerance of the highest; where the models agree that is the fit's choice, where they do not
    the choice that loses least with either (``fit_alone``: what the fit alone would have held).
    The fit's cost per request is pinned only where a cell breaks monotonicity, and on the real CPU
    engine it put K 1-2 in the bucket 8-15 three runs out of three, a quarter below the best
    there (benchmarks/schedule_refits.py); with both costs, K 7, 4 and 8 (the eight-stream grid:
    0.95, 1.00, 0.92 of its best). Each bucket also gets ``alt``: that model's value per steps.
    """
    keys = sorted(set(int(b) for b in buckets if int(b) >= 1))
    if not keys:
        raise ValueError("no batch-size buckets given")
    steps = [OFF] + [Config.chain(s) for s in range(1, MAX_STEPS + 1)]
    seen = {(ln.config, int(conc)): g for ln in model.launches for conc, g in ln.goodput.items() if g > 0}
    reach = Seen.of(model)
    cfg: dict = {}
    why: list[dict] = []
    for i, key in enumerate(keys):
        nxt = keys[i + 1] if i + 1 < len(keys) else key
        bs = max(1, round(math.sqrt(key * max(key, nxt - 1))))
        preds = sorted((model.predict(c, bs) for c in steps if off or c.steps), key=lambda p: -p.goodput.mean)
        measured = {p.config.steps: seen[(p.config, bs)] for p in preds if (p.config, bs) in seen}
        value = {p.config.steps: measured.get(p.config.steps, p.goodput.mean) for p in preds}
        outside = {
            p.config.steps: r for p in preds if p.config.steps not in measured and (r := reach.reasons(p.config, bs))
        }
        inside = {s: g for s, g in value.items() if s not in outside} or value
        best = max(inside.values())
        pool = value if max(value.values()) > best * (1 + tolerance) else inside
        best = max(pool.values())
        chosen = sorted(s for s, g in pool.items() if g >= best * (1 - tolerance))
        extra: dict = {}
        if alt is not None:  # candidates within the tolerance with either per-request cost
            other = {s: measured.get(s, alt.predict(steps[s], bs).goodput.mean) for s in pool}
            top = max(other.values())
            both = {s: min(pool[s] / best, other[s] / top) if top > 0 else pool[s] / best for s in pool}
            floor = max(both.values())
            robust = sorted(s for s, v in both.items() if v >= floor * (1 - tolerance))
            extra = {
                "alt": {s: round(other[s], 1) for s in sorted(other)},
                "both": {s: round(both[s], 3) for s in sorted(both)},
            }
            if robust != chosen:
                extra["fit_alone"], chosen = chosen, robust
        cfg[str(key)] = {"candidate_steps": chosen}
        row = {
            "key": key,
            "batch_size": bs,
            "candidates": chosen,
            "predicted": {p.config.steps: round(p.goodput.mean, 1) for p in preds},
            "measured": {s: round(g, 1) for s, g in measured.items()},
        }
        left = {s: r for s, r in outside.items() if s not in pool and value[s] >= best * (1 - tolerance)}
        if left:
            row["left_out"] = left
        if draws:
            row["sure"], row["sure_candidates"] = _sure(draws, steps, bs, measured, set(pool), chosen, tolerance)
            row["draws"] = len(draws)
        row.update(extra)
        why.append(row)
    check_adaptive(cfg)
    return cfg, why


def _sure(
    draws: list[CostModel],
    steps: list[Config],
    bs: int,
    measured: dict[int, float],
    pool: set[int],
    chosen: list[int],
    tolerance: float,
) -> tuple[dict[int, float], float]:
    """Per chain steps of ``pool``: the share of ``draws`` in which it is within ``tolerance`` of
    that draw's best of the pool at batch size ``bs`` (``measured`` goodputs fixed in every draw);
    and the share in which one of ``chosen`` is."""
    hits = dict.fromkeys(sorted(pool), 0)
    some = 0
    for d in draws:
        g = {c.steps: measured.get(c.steps, d.predict(c, bs).goodput.mean) for c in steps if c.steps in pool}
        top = max(g.values())
        near = {s for s, v in g.items() if v >= top * (1 - tolerance)}
        for s in near:
            hits[s] += 1
        some += bool(near & set(chosen))
    return {s: round(n / len(draws), 3) for s, n in hits.items()}, round(some / len(draws), 3)


# ---- text ---------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def format_advice(
    model: CostModel, advices: list[Advice], top: int = 5, describe: Callable[[Config], str] = lambda c: c.label
) -> str:
    """The advice as text; ``describe`` names a configuration in the engine's words."""
    s = model.summary()
    v = s["verify"]
    acc = s["acceptance"]
    ks, ms = v["tokens"], v["ms"]
    curve = f"{ms[0]:.2f} ms at {ks[0]:.0f} tokens" + (
        f" to {ms[-1]:.2f} ms at {ks[-1]:.0f} ({len(ks)} token counts measured)"
        if len(ks) > 1
        else " (one token count measured)"
    )
    lines = [
        f"model from {s['launches']} launch(es): verify {curve}; acceptance per position "
        + " ".join(f"{a:.2f}" for a in acc["per_position"][:6])
        + f" (measured to position {acc['measured_positions']}, {acc['source']})",
        f"baseline step from the {s['baseline']['source']}",
    ]
    for a in advices:
        lines.append("")
        x = a.extrapolation
        lines.append(f"concurrency {a.concurrency}:" + ("  (order not established: extrapolated)" if x else ""))
        if x is not None:
            lines.append(f"  {x.sentence}.")
        lines.append(f"  {'#':>2} {'configuration':<30} {'goodput tok/s':>14} {'95% interval':>21} {'gain':>7}  accept")
        rows = a.top(top)
        if a.running is not None and a.running not in rows:
            rows = rows + [a.running]
        for p in rows:
            tag = "  (running)" if a.running is not None and p.config == a.running.config else ""
            if p.config in a.measured:
                tag += f"  measured {a.measured[p.config]:.1f}"
            num = f"{a.ranking.index(p) + 1:>2}" if x is None else " ?"
            if x is not None and p.config in x.configs:
                tag += "  extrapolated"
            lines.append(
                f"  {num} {describe(p.config):<30} {p.goodput.mean:>14.1f} "
                f"{max(0.0, p.goodput.lo):>10.1f}-{p.goodput.hi:<10.1f} {_pct(a.gain(p)):>7}  "
                f"{p.tau:.2f}{tag}"
            )
        if a.next_measurement is not None:
            n = a.next_measurement
            lines.append(
                f"  measure next: {describe(n.config)} (predicted {n.goodput.mean:.1f}, interval up to "
                f"{n.goodput.hi:.1f}: the widest that could still beat the best)"
            )
        else:
            lines.append("  measure next: nothing (no unmeasured configuration could beat the best)")
    return "\n".join(lines)


# ---- the no-regret floor of vLLM's dynamic schedule ---------------------------------------------


def _value(model: CostModel, c: Config, concurrency: int) -> tuple[float, str]:
    """Goodput of ``c`` at ``concurrency``: what a benchmark measured there (the best launch), else
    the model's prediction; and which of the two."""
    got = [ln.goodput[concurrency] for ln in model.launches if ln.config == c and ln.goodput.get(concurrency, 0) > 0]
    if got:
        return max(got), "measured"
    return model.predict(c, concurrency).goodput.mean, "predicted"


def schedule_k(rows: list[list[int]], batch_size: int) -> int:
    """The K a ``num_speculative_tokens_per_batch_size`` table runs at ``batch_size`` (past the last
    range, the last range's K: vLLM carries it on)."""
    for start, end, k in rows:
        if start <= batch_size <= end:
            return k
    return rows[-1][2] if rows and batch_size > rows[-1][1] else 0


def dsd_floor(model: CostModel, rows: list[list[int]], concurrencies: list[int], tolerance: float = TOLERANCE) -> dict:
    """The no-regret floor of an emitted vLLM schedule at each asked concurrency: the schedule is
    never to be more than ``tolerance`` below a launch without speculation. K 0 is not off (vLLM
    still runs its speculative path: measured 0.76x of no speculation at 16 streams on its CPU
    build), so a range at K 0 cannot meet it, nor a K measured or predicted below the floor; where
    no K of 1-8 is within the tolerance of off either, no schedule meets it, and the recommendation
    for loads that reach there is a launch without speculation, with what that loses (measured or
    predicted) at the concurrencies where the schedule beats off. Returns ``met``, ``points`` (one
    per concurrency), ``sentence`` (empty when met) and ``loses``."""
    points: list[dict[str, Any]] = []
    for conc in sorted(set(int(c) for c in concurrencies if int(c) >= 1)):
        k = schedule_k(rows, conc)
        off, off_src = _value(model, OFF, conc)
        spec = {s: _value(model, Config.chain(s), conc) for s in range(1, MAX_STEPS + 1)}
        best_k = max(spec, key=lambda s: spec[s][0])
        mine, mine_src = spec[k] if k else (None, "")
        floor = off * (1 - tolerance)
        meets = k > 0 and mine is not None and mine >= floor
        point: dict[str, Any] = {
            "concurrency": conc,
            "k": k,
            "goodput": mine,
            "source": mine_src or None,
            "off": off,
            "off_source": off_src,
            "best_k": best_k,
            "best_k_goodput": spec[best_k][0],
            "best_k_source": spec[best_k][1],
            "meets": meets,
            "any_schedule_meets": spec[best_k][0] >= floor,
        }
        if not meets:
            point["why"] = (
                "K 0 still runs vLLM's speculative path: K 0 is not off"
                if k == 0
                else f"K {k} is {1 - (mine or 0.0) / off:.0%} below speculation off ({mine_src})"
            )
        points.append(point)
    broken = [p for p in points if not p["meets"] and not p["any_schedule_meets"]]
    fixable = [p for p in points if not p["meets"] and p["any_schedule_meets"]]
    loses = [
        {
            "concurrency": p["concurrency"],
            "schedule": p["goodput"],
            "off": p["off"],
            "loss": 1 - p["off"] / p["goodput"],
            "source": "measured" if p["source"] == p["off_source"] == "measured" else "predicted",
        }
        for p in points
        if p["meets"] and p["goodput"] > p["off"]
    ]
    sentence = ""
    if broken:
        where = ", ".join(str(p["concurrency"]) for p in broken)
        worst = broken[0]
        sentence = (
            f"no schedule meets the no-regret floor at concurrency {where}: every K is more than {tolerance:.0%} "
            f"below speculation off there (the best, K {worst['best_k']}, {worst['best_k_goodput']:.0f} tok/s "
            f"{worst['best_k_source']}, off {worst['off']:.0f} {worst['off_source']} at {worst['concurrency']}), and "
            "K 0 still runs vLLM's speculative path; for loads that reach "
            f"{min(p['concurrency'] for p in broken)} streams launch without speculation"
        )
        if loses:
            sentence += ", which loses " + ", ".join(
                f"{x['loss']:.0%} at concurrency {x['concurrency']} ({x['off']:.0f} vs {x['schedule']:.0f} tok/s, "
                f"{x['source']})"
                for x in loses
            )
        else:
            sentence += " (the schedule beats it at none of the concurrencies asked)"
    if fixable:
        sentence += (
            ("; " if sentence else "")
            + "the file misses the no-regret floor at concurrency "
            + ", ".join(
                f"{p['concurrency']} (K {p['k']} there; {p['why']}), where K {p['best_k']} would meet it "
                f"({p['best_k_goodput']:.0f} tok/s {p['best_k_source']}, off {p['off']:.0f} {p['off_source']})"
                for p in fixable
            )
        )
    return {
        "met": not broken and not fixable,
        "tolerance": tolerance,
        "points": points,
        "sentence": sentence,
        "recommend": "a launch without speculation" if broken else None,
        "loses": loses if broken else [],
    }


@dataclass(frozen=True)
class Suggestion:
    """What the advisor puts forward among ``rows`` (predictions of the running configuration and
    its neighbours): ``kind`` is "gain" (predicted faster, beyond the running configuration's
    interval), "within" (predicted faster, but inside the running configuration's 95 % interval:
    not a sure gain), "measure" (the running configuration is predicted best: ``config`` is the
    measurement worth making next, ``next_measurement``) or "none" (nothing to put forward)."""

    kind: str
    config: Config | None = None
    gain: float = 0.0  # predicted goodput over the running configuration's, -1 .. ; 0 when unknown

    @property
    def faster(self) -> bool:
        return self.kind in ("gain", "within")


def suggestion(rows: list[Prediction], running: Config | None) -> Suggestion:
    """Never a configuration predicted slower than the running one as a move: when the running
    configuration is predicted best, the unmeasured neighbour whose interval reaches above it is
    offered as a measurement instead."""
    run = next((p for p in rows if p.config == running), None)
    others = sorted((p for p in rows if p.config != running), key=lambda p: -p.goodput.mean)
    if not others:
        return Suggestion("none")
    if run is None or run.goodput.mean <= 0:
        return Suggestion("gain", others[0].config)
    best = others[0]
    gain = best.goodput.mean / run.goodput.mean - 1
    if best.goodput.mean > run.goodput.mean:
        return Suggestion("within" if best.goodput.mean <= run.goodput.hi else "gain", best.config, gain)
    nxt = next_measurement([run, *others], {run.config})
    if nxt is None:
        return Suggestion("none")
    return Suggestion("measure", nxt.config, nxt.goodput.mean / run.goodput.mean - 1)
