"""A cost model of the running server, fitted from what any server exposes (its log, HTTP).

From profile windows (live or from a capture), decode-stats lines and benchmark goodput it fits,
assuming no shape that the measurements do not show:

* verify ms against the verify token count n = bs × draft tokens: a monotone piecewise-linear
  curve through the token counts measured, plus a cost per request (attention over each
  request's KV cache) where points at one n from different batch sizes pin it
  (``fitting.MonotoneCurve``). It follows tile steps between measured points and says, through
  its interval, how far it may be off between and beyond them: past the largest n measured a
  forward costs at least as much, and perhaps a tile step more;
* draft ms per step against bs × topk, the extend and the time outside the phases against bs, the
  same way; a tree's verify and draft steps against a chain's at the same token count (a factor
  measured from tree launches, else a prior leaning dearer: tree attention masks, top-k selection);
* per-position conditional acceptance from the accept-length histograms (``acceptance``: a Beta
  posterior widened to the spread between windows, a damped random walk past the deepest position
  measured);
* the baseline step (no speculation) from a baseline launch when one was seen (the probe's
  windows, else its benchmark goodput, the engine's throughput lines only as a last resort),
  otherwise from the verify curve at one token a request with a prior leaning cheaper
  (``baseline_source`` says which);
* a calibration from the benchmarks (``calibration``): ``1/goodput = a/model + s``, s the time per
  output token a benchmark spends outside the decode cycles (prefills, ramp), a ≈ 1.

Uncertainty comes from the data: the windows' bootstrap at each measured point, the spread
between launches (estimated from what several launches measured alike, the draft steps; a prior
of 1.5 % until then), and the range monotonicity leaves away from the points measured. Every
prediction is goodput = bs × τ / cycle at bs = the concurrency with an interval that may be
wider on one side. No simulator import and none of its constants: the model knows only what a
real server shows.

What is fitted is split by what it is: the curves and their sum into a cycle here, the acceptance
in ``acceptance``, the calibration in ``calibration``, the configuration and launch records in
``launch``. ``fit`` fits them together from one set of launches, each using the others' fits (the
tree factor needs the chain curve, the calibration the whole raw model).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from tuitune.base.events import ProfileWindow
from tuitune.decide.acceptance import BOOTSTRAP, Acceptance, fit_acceptance
from tuitune.decide.calibration import Calibration, fit_calibration
from tuitune.decide.fitting import Cell, Estimate, MonotoneCurve, bootstrap_sd, fit_monotone, log_sides
from tuitune.decide.launch import Config, FitError, Launch, config_of_window

# a tree's verify / draft step against a chain's at the same token count, until a tree launch says:
# tree attention masks and top-k selection cost something, how much depends on the kernels
TREE_PRIOR = Estimate.split(1.05, 0.03, 0.10)
# a decode step against the verify curve at one token a request (relative), until a baseline launch
# is measured: a verify carries accept/sample work (the seeds' verify cost 40 % more, FACTS §1)
BASELINE_PRIOR = Estimate.split(-0.10, 0.10, 0.03)
SPREAD_PRIOR = (0.015, 3.0)  # launch-to-launch spread (relative sd) and its weight in pseudo-pairs


# ---- combining estimates ----------------------------------------------------------------------


def _sum(parts: list[tuple[Estimate, float]]) -> Estimate:
    """Σ k·x over (x, k), sides combined in quadrature."""
    mean = sum(k * e.mean for e, k in parts)
    down = math.sqrt(sum((k * e.sd_down) ** 2 for e, k in parts))
    up = math.sqrt(sum((k * e.sd_up) ** 2 for e, k in parts))
    return Estimate.split(mean, down, up)


def _product(a: Estimate, b: Estimate) -> Estimate:
    """a × b (both positive), relative sides in quadrature."""
    m = a.mean * b.mean
    if m <= 0:
        return Estimate(0.0, 0.0)
    down = m * math.hypot(a.sd_down / a.mean, b.sd_down / b.mean)
    up = m * math.hypot(a.sd_up / a.mean, b.sd_up / b.mean)
    return Estimate.split(m, down, up)


# ---- the whole model --------------------------------------------------------------------------


@dataclass
class Prediction:
    config: Config
    concurrency: int
    goodput: Estimate
    tau: float
    cycle_ms: float
    parts: dict

    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "label": self.config.label,
            "concurrency": self.concurrency,
            "goodput": self.goodput.to_dict(),
            "accept_len": self.tau,
            "cycle_ms": self.cycle_ms,
            "parts": self.parts,
        }


@dataclass
class CostModel:
    verify: MonotoneCurve  # ms against verify tokens (+ per request)
    draft: MonotoneCurve | None  # ms a draft step against bs × topk
    extend: MonotoneCurve | None  # ms against bs
    other: MonotoneCurve  # ms outside the phases against bs
    baseline: MonotoneCurve | None  # step ms against bs, from a baseline launch (_baseline_samples)
    baseline_source: str
    basis: str  # the windows the curves come from: "chains" (trees scaled by tree_*) or "trees"
    tree_verify: Estimate  # a tree's verify against a chain's at the same token count
    tree_draft: Estimate
    tree_source: str
    acceptance: Acceptance
    calibration: Calibration  # speculative launches (their windows time the cycles)
    base_calibration: Calibration  # baseline launches (their windows leave out the prefills)
    launch_spread: float
    launches: list[Launch]
    draft_per_cycle: bool = False  # a look-up drafter: its time is one lookup a cycle, not a step

    def _factor(self, c: Config, tree: Estimate, curve: MonotoneCurve) -> Estimate:
        """What a curve's value is multiplied by for ``c`` (beyond what the curve itself applies)."""
        is_tree = c.topk > 1
        if curve.factored:
            return Estimate(1.0, 0.0)
        if (self.basis == "chains") == is_tree:
            if is_tree:
                return tree
            m = 1.0 / tree.mean  # a chain from a curve of trees
            return Estimate.split(m, m * tree.sd_up / tree.mean, m * tree.sd_down / tree.mean)
        return Estimate(1.0, 0.0)

    def step(self, bs: int) -> Estimate:
        """A decode step without speculation, ms."""
        if self.baseline is not None:
            lo, hi = self.baseline.n_range
            if lo <= bs <= hi:
                return self.baseline.predict(bs)
            # beyond the batch sizes measured: the baseline there plus what the verify curve adds
            edge = lo if bs < lo else hi
            be, v1, v0 = self.baseline.predict(edge), self.verify.predict(bs, bs), self.verify.predict(edge, edge)
            return Estimate.split(
                be.mean + v1.mean - v0.mean, math.hypot(be.sd_down, v1.sd_down), math.hypot(be.sd_up, v1.sd_up)
            )
        v = self.verify.predict(bs, bs)
        off = Estimate.split(1.0 + BASELINE_PRIOR.mean, BASELINE_PRIOR.sd_down, BASELINE_PRIOR.sd_up)
        return _sum([(_product(v, off), 1.0), (self.other.predict(bs), 1.0)])

    def cycle(self, c: Config, bs: int) -> tuple[Estimate, dict]:
        """Cycle (or baseline step) ms at batch size ``bs``, with its parts."""
        if not c.speculative:
            s = self.step(bs)
            return s, {"step_ms": s.mean}
        g = int(c.topk > 1)
        v = _product(self.verify.predict(bs * c.draft_tokens, bs, g), self._factor(c, self.tree_verify, self.verify))
        parts: list[tuple[Estimate, float]] = [(v, 1.0)]
        d = Estimate(0.0, 0.0)
        if self.draft is not None:
            if self.draft_per_cycle:
                d = self.draft.predict(bs)
            else:
                d = _product(self.draft.predict(bs * c.topk, 0.0, g), self._factor(c, self.tree_draft, self.draft))
                d = Estimate.split(d.mean * c.steps, d.sd_down * c.steps, d.sd_up * c.steps)
            parts.append((d, 1.0))
        e = self.extend.predict(bs) if self.extend is not None else Estimate(0.0, 0.0)
        o = self.other.predict(bs)
        total = _sum([*parts, (e, 1.0), (o, 1.0)])
        return total, {"draft_ms": d.mean, "verify_ms": v.mean, "extend_ms": e.mean, "other_ms": o.mean}

    def raw(self, c: Config, concurrency: int) -> tuple[Estimate, float, Estimate, dict]:
        """Steady-state goodput (tok/s) before calibration, accept length, cycle ms, parts."""
        bs = max(1, int(concurrency))
        cyc, parts = self.cycle(c, bs)
        tau = self.acceptance.estimate(c)
        if cyc.mean <= 0:
            return Estimate(0.0, 0.0), tau.mean, cyc, parts
        g = bs * tau.mean / cyc.mean * 1000.0
        td, tu = log_sides(tau)
        cd, cu = log_sides(cyc)
        down = math.hypot(td, cu)  # fewer tokens or a dearer cycle
        up = math.hypot(tu, cd)
        return Estimate.split(g, g * (1 - math.exp(-down)) / 1.96, g * (math.exp(up) - 1) / 1.96), tau.mean, cyc, parts

    def predict(self, c: Config, concurrency: int) -> Prediction:
        g, tau, cyc, parts = self.raw(c, concurrency)
        cal = self.base_calibration if (not c.speculative and self.baseline is not None) else self.calibration
        return Prediction(c, int(concurrency), cal.apply(g), tau, cyc.mean, parts)

    def summary(self) -> dict:
        v = self.verify
        vals = v.values()
        slope = (vals[-1] - vals[-2]) / (v.knots[-1] - v.knots[-2]) if len(vals) > 1 else 0.0
        out: dict = {
            "launches": len(self.launches),
            "verify": {
                "tokens": v.knots,
                "ms": [round(x, 4) for x in vals],
                "sd_ms": [round(x, 4) for x in v.sds],
                "ms_per_request": v.per_request().to_dict(),
                "floor_ms": vals[0],
                "ms_per_token": slope,  # the last segment's: what a few more tokens cost there
                "tokens_seen": list(v.n_range),
                "points": v.points,
                "basis": self.basis,
            },
            "trees": {
                "verify_factor": self.tree_verify.to_dict(),
                "draft_factor": self.tree_draft.to_dict(),
                "source": self.tree_source,
            },
            "other_ms": {"batch": self.other.knots, "ms": [round(x, 4) for x in self.other.values()]},
            "baseline": {"source": self.baseline_source},
            "acceptance": {
                "per_position": [round(x, 4) for x in self.acceptance.mean[:8]],
                "sd": [round(x, 4) for x in self.acceptance.sd[:8]],
                "measured_positions": self.acceptance.measured,
                "source": self.acceptance.source,
                "sibling_decay": self.acceptance.sibling_decay.to_dict(),
            },
            "calibration": self.calibration.to_dict(),
            "launch_spread": self.launch_spread,
        }
        if self.baseline is not None:
            out["baseline"].update(batch=self.baseline.knots, step_ms=[round(x, 4) for x in self.baseline.values()])
            out["baseline_calibration"] = self.base_calibration.to_dict()
        else:
            out["baseline"]["offset"] = BASELINE_PRIOR.to_dict()
        if self.extend is not None:
            out["extend"] = {"batch": self.extend.knots, "ms": [round(x, 4) for x in self.extend.values()]}
        if self.draft is not None:
            out["draft"] = {"tokens": self.draft.knots, "ms_per_step": [round(x, 4) for x in self.draft.values()]}
        return out


def _other_ms(w: ProfileWindow) -> float:
    if w.other_ms is not None and math.isfinite(w.other_ms):
        return w.other_ms
    return max(0.0, w.cycle_ms - w.draft_ms - w.verify_ms - w.extend_ms)


def _ok(w: ProfileWindow) -> bool:
    return (
        all(math.isfinite(x) and x >= 0 for x in (w.draft_ms, w.verify_ms, w.extend_ms, w.cycle_ms))
        and w.verify_ms > 0
        and w.cycles > 0
    )


Sample = tuple[int, float, float, float, float]  # launch, x, bs, value, weight


def _cells(samples: list[Sample], spread: float, trees: set[int] = frozenset()) -> list[Cell]:  # type: ignore[assignment]
    """One cell per (launch, x): the windows' weighted mean, its bootstrap variance, the launch
    spread (a launch's clocks move all its windows together); launches in ``trees`` are group 1.
    (A floor under a lone window's variance, one window's scatter pooled over the cells of
    several, was tried for the real engine's cells of one window: on benchmarks/advisor_worlds.py
    it cost 7 of 360 cases within 2 % and moved the real captures' extrapolations, with no
    measured gain on the engine; dropped. advise's refits (``bootstrap``) say instead how much
    a schedule rests on such windows.)"""
    groups: dict[tuple[int, float], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s[0], round(s[1], 6)), []).append(s)
    rng = random.Random(1)
    out = []
    for (li, x), g in sorted(groups.items()):
        ys, ws = [s[3] for s in g], [s[4] for s in g]
        tot = sum(ws)
        y = sum(a * b for a, b in zip(ys, ws, strict=True)) / tot
        bs = sum(s[2] * s[4] for s in g) / tot
        boot = bootstrap_sd(ys, ws, rng, BOOTSTRAP)
        var = boot**2 + (spread * y) ** 2 + (0.002 * y) ** 2
        out.append(Cell(x, bs, y, var, int(li in trees)))
    return out


def _tree_prior(f: float) -> float:
    """Log prior density of a tree's cost factor (TREE_PRIOR, a split normal)."""
    side = TREE_PRIOR.sd_down if f < TREE_PRIOR.mean else TREE_PRIOR.sd_up
    return -0.5 * ((f - TREE_PRIOR.mean) / side) ** 2


def _launch_spread(samples: list[Sample]) -> float:
    """Launch-to-launch spread (relative sd) from what several launches measured alike — the draft
    step at one token count, whatever the steps — pooled with a prior of 1.5 %."""
    by: dict[int, dict[float, list[float]]] = {}
    for li, x, _, y, _ in samples:
        if y > 0:
            by.setdefault(li, {}).setdefault(round(x, 6), []).append(y)
    means = {li: {x: sum(v) / len(v) for x, v in d.items()} for li, d in by.items()}
    ids = sorted(means)
    devs = []
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            shared = [math.log(means[a][x] / means[b][x]) for x in means[a] if x in means[b]]
            if shared:
                shared.sort()
                devs.append(shared[len(shared) // 2] ** 2 / 2)  # var of one launch = var of a ratio / 2
    prior, weight = SPREAD_PRIOR
    return math.sqrt((weight * prior**2 + sum(devs)) / (weight + len(devs)))


def fit(launches: list[Launch], plane: bool = False) -> CostModel:
    """Fit the model to every launch seen so far (more launches: more points on every curve).
    ``plane``: the verify curve's per-request term centred on the plane through its points
    (``fitting.per_request_plane``) and weighed on held-out cells: the second model a schedule's
    buckets must hold with (``advise.adaptive_schedule``'s ``alt``)."""
    tagged = [(i, w) for i, ln in enumerate(launches) for w in ln.windows if _ok(w) and config_of_window(w) is not None]
    spec = [(i, w) for i, w in tagged if w.steps]
    if not spec:
        raise FitError(
            "no speculative profile window with steps (run with profile: true, format v2 "
            "lines carry the steps; v1 lines need steps=…)"
        )
    chains = [(i, w) for i, w in spec if (w.topk or 1) == 1]
    trees = [(i, w) for i, w in spec if (w.topk or 1) > 1]
    basis = "chains" if chains else "trees"
    # with chains and trees both measured, one curve of both: the trees' a factor of it, fitted
    tree_ids = {i for i, _ in trees} - {i for i, _ in chains} if chains else set()
    both = bool(chains and trees)
    lookup = all(w.drafter for _, w in spec)

    def draft_x(w: ProfileWindow) -> float:
        return float((w.bs or 1) * (1 if lookup else (w.topk or 1)))

    def draft_y(w: ProfileWindow) -> float:
        return w.draft_ms if lookup else w.draft_ms / (w.steps or 1)

    draft_samples = [(i, draft_x(w), float(w.bs or 1), draft_y(w), float(w.cycles)) for i, w in spec if w.draft_ms > 0]
    spread = _launch_spread([s for s in draft_samples if s[0] not in tree_ids] if both else draft_samples)

    def verify_point(w: ProfileWindow) -> tuple[float, float, float]:
        c = config_of_window(w)
        assert c is not None  # tagged holds only windows with a configuration
        bs = w.bs or 1
        return float(w.verify_tokens or bs * c.draft_tokens), float(bs), w.verify_ms

    vs = [(i, *verify_point(w), float(w.cycles)) for i, w in spec]
    for i, w in tagged:  # steps-0 cycles of adaptive mode: a verify over one token a request
        if not w.steps and w.verify_ms > 0:
            bs = w.bs or 1
            vs.append((i, float(w.verify_tokens or bs), float(bs), w.verify_ms, float(w.cycles)))
    prior = _tree_prior if both else None
    verify = fit_monotone(_cells(vs, spread, tree_ids), per_request=True, factor_prior=prior, tokens=True, plane=plane)
    draft = (
        fit_monotone(_cells(draft_samples, spread, tree_ids), factor_prior=prior, tokens=not lookup)
        if draft_samples
        else None
    )
    ext = [(i, float(w.bs or 1), float(w.bs or 1), w.extend_ms, float(w.cycles)) for i, w in spec if w.extend_ms > 0]
    extend = fit_monotone(_cells(ext, spread)) if ext else None
    oth = [(i, float(w.bs or 1), float(w.bs or 1), _other_ms(w), float(w.cycles)) for i, w in tagged]
    other = fit_monotone(_cells(oth, spread))
    tree_v, tree_d, source = TREE_PRIOR, TREE_PRIOR, "prior (no tree and chain launches both measured)"
    if both:
        tree_v = verify.factor()
        tree_d = draft.factor() if draft is not None else TREE_PRIOR
        source = "tree launches against the chains' curve"
    base, base_source = _baseline_samples(launches)
    baseline = fit_monotone(_cells(base, spread)) if base else None
    model = CostModel(
        verify,
        draft,
        extend,
        other,
        baseline,
        base_source if baseline is not None else "verify curve at 1 token (no baseline launch)",
        basis,
        tree_v,
        tree_d,
        source,
        fit_acceptance(launches),
        Calibration(),
        Calibration(),
        spread,
        launches,
        lookup,
    )
    model.calibration, model.base_calibration = _calibrations(model, launches)
    return model


def bootstrap(launches: list[Launch], draws: int, seed: int = 0) -> list[CostModel]:
    """Models refitted to the launches with each launch's profile windows resampled (with
    replacement): what the fit would have been from other windows of the same launches. A cell of
    one window comes and goes, so a tile step the curve put between two noisy points moves or
    vanishes, which moving each point within its own sd does not do. For decisions that compare
    configurations: within one draw every configuration sees the same curves, as on the engine.
    Draws whose windows leave nothing to fit are skipped (fewer may come back)."""
    rng = random.Random(seed)
    out: list[CostModel] = []
    for _ in range(draws):
        again = [
            replace(ln, windows=[ln.windows[rng.randrange(len(ln.windows))] for _ in ln.windows]) for ln in launches
        ]
        try:
            out.append(fit(again))
        except FitError:
            continue
    return out


BASELINE_SOURCES = {
    "windows": "baseline launch (probe windows' step times)",
    "goodput": "baseline launch (benchmark goodput)",
    "decodes": (
        "baseline launch (decode-stats throughput lines, a last resort: averages over the logging "
        "interval that count idle gaps and prefills)"
    ),
}


def _baseline_samples(launches: list[Launch]) -> tuple[list[Sample], str]:
    """(launch, bs, bs, step ms, weight) of the launches without speculation, and what they come
    from. Per launch the best it shows: the probe's windows (a step timed alone, at its batch
    size), else the goodput its benchmarks measured (concurrency / goodput: the prefills and ramp
    included, as in what is compared), and only as a last resort the engine's throughput lines (vLLM's
    ``Avg generation throughput`` is a 2-second average with idle gaps and prefills in it: at one
    stream of the real CPU engine 88-103 tok/s where the probe timed 4.9 ms steps)."""
    out: list[Sample] = []
    used: set[str] = set()
    for i, ln in enumerate(launches):
        if ln.config.speculative:
            continue
        wins = [
            w
            for w in ln.windows
            if (w.steps or 0) == 0
            and w.draft_ms == 0
            and math.isfinite(w.cycle_ms)
            and w.cycle_ms > 0
            and w.cycles > 0
            and (w.bs or 0) > 0
        ]
        if wins:
            used.add("windows")
            out += [(i, float(w.bs or 1), float(w.bs or 1), w.cycle_ms, float(w.cycles)) for w in wins]
            continue
        good = [(c, g) for c, g in ln.goodput.items() if c > 0 and math.isfinite(g) and g > 0]
        if good:
            used.add("goodput")
            out += [(i, float(c), float(c), c / g * 1000.0, 1.0) for c, g in good]
            continue
        for d in ln.decodes:
            if d.running_req and d.gen_throughput > 0 and d.accept_len is None:
                used.add("decodes")
                bs = float(d.running_req)
                out.append((i, bs, bs, d.running_req / d.gen_throughput * 1000.0, 1.0))
    worst = next((k for k in ("decodes", "goodput", "windows") if k in used), None)
    return out, BASELINE_SOURCES[worst] if worst else ""


def _calibrations(model: CostModel, launches: list[Launch]) -> tuple[Calibration, Calibration]:
    spec, base = [], []
    for ln in launches:
        for conc, measured in ln.goodput.items():
            if measured <= 0 or not math.isfinite(measured):
                continue
            if ln.config.speculative:
                g = model.raw(ln.config, conc)[0].mean
                if g > 0:
                    spec.append((g, measured))
            elif model.baseline is not None:
                g = model.raw(ln.config, conc)[0].mean
                if g > 0:
                    base.append((g, measured))
    noise = max(0.01, model.launch_spread)
    return fit_calibration(spec, noise), fit_calibration(base, noise)
