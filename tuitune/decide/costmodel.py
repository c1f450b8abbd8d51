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
* per-position conditional acceptance from the accept-length histograms,
  ``P(len ≥ k+1 | len ≥ k)``, a Beta posterior widened to the spread between windows (a bootstrap
  over windows); positions never drafted follow a random walk in log-odds from the deepest one
  measured with a damped drift (no decay assumed: acceptance may fall, plateau or rise), its spread
  growing with the distance;
* the baseline step (no speculation) from a baseline launch when one was seen (the probe's
  windows, else its benchmark goodput, the engine's throughput lines only as a last resort),
  otherwise from the verify curve at one token a request with a prior leaning cheaper
  (``baseline_source`` says which);
* a calibration from the benchmarks: ``1/goodput = a/model + s``, s the time per output token a
  benchmark spends outside the decode cycles (prefills, ramp), a ≈ 1 (the windows time the cycles).

Uncertainty comes from the data: the windows' bootstrap at each measured point, the spread
between launches (estimated from what several launches measured alike, the draft steps; a prior
of 1.5 % until then), and the range monotonicity leaves away from the points measured. Every
prediction is goodput = bs × τ / cycle at bs = the concurrency with an interval that may be
wider on one side. No simulator import and none of its constants: the model knows only what a
real server shows.

Why one module: the curves, the acceptance and the calibration are fitted together from one set
of launches and each uses the others' fits (the tree factor needs the chain curve, the
calibration the whole raw model).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tuitune.base.errors import TuituneError
from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.decide.fitting import Cell, Estimate, MonotoneCurve, bootstrap_sd, fit_monotone, weighted_line

__all__ = ["Estimate"]  # (re-exported: the advice and tune read it from here)

MAX_DEPTH = 16  # acceptance is modelled for this many draft positions
RANDOM_WALK = 0.35  # log-odds sd one more undrafted position adds to the acceptance of the next
DAMPING = 0.5  # each undrafted position takes this share of the previous one's drift
# sibling-rank decay b of the tree model until a tree is measured: the published data of FACTS §6 fit
# b = 0.58 (SpecForge #339), 0.7 (EAGLE-1's six models) and 0.89 (Sequoia's acceptance by sibling
# rank, least squares over ranks 2-6); their mean, with a spread wider than theirs
SIBLING_PRIOR = (0.72, 0.2)
# a tree's verify / draft step against a chain's at the same token count, until a tree launch says:
# tree attention masks and top-k selection cost something, how much depends on the kernels
TREE_PRIOR = Estimate.split(1.05, 0.03, 0.10)
# a decode step against the verify curve at one token a request (relative), until a baseline launch
# is measured: a verify carries accept/sample work (the seeds' verify cost 40 % more, FACTS §1)
BASELINE_PRIOR = Estimate.split(-0.10, 0.10, 0.03)
SPREAD_PRIOR = (0.015, 3.0)  # launch-to-launch spread (relative sd) and its weight in pseudo-pairs
BOOTSTRAP = 48  # resamples of the windows


class FitError(TuituneError, ValueError):
    """Nothing usable to fit (one sentence)."""


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """A speculative configuration; steps 0 = speculation off."""

    steps: int = 0
    topk: int = 1
    draft_tokens: int = 1

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    @property
    def label(self) -> str:
        if not self.speculative:
            return "off"
        return f"steps {self.steps} topk {self.topk} tokens {self.draft_tokens}"

    @property
    def short(self) -> str:
        return "off" if not self.speculative else f"{self.steps}/{self.topk}/{self.draft_tokens}"

    @classmethod
    def chain(cls, steps: int) -> Config:
        return cls(steps, 1, steps + 1) if steps > 0 else OFF

    def to_dict(self) -> dict:
        return {"steps": self.steps, "topk": self.topk, "draft_tokens": self.draft_tokens}


OFF = Config()


def config_of_window(w: ProfileWindow) -> Config | None:
    if w.steps is None:
        return None
    if w.steps == 0:
        return OFF
    topk = w.topk or 1
    return Config(w.steps, topk, w.draft_tokens or (w.steps + 1 if topk == 1 else 0))


@dataclass
class Launch:
    """What one server launch showed: its configuration, profile windows, decode lines, and the
    goodput a benchmark measured at each concurrency (tok/s of all requests together)."""

    config: Config
    windows: list[ProfileWindow] = field(default_factory=list)
    decodes: list[DecodeStats] = field(default_factory=list)
    goodput: dict[int, float] = field(default_factory=dict)
    label: str = ""
    failure: str | None = None  # why the server did not come up (nothing measured then)
    engine: str = "sglang"  # whose server it was (costs of two engines are not one model)


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


def _log_sides(e: Estimate) -> tuple[float, float]:
    """The 95 % interval of a positive estimate as log-distances below and above its mean."""
    lo = max(e.lo, e.mean * 1e-3)
    return math.log(e.mean / lo), math.log(e.hi / e.mean) if e.hi > e.mean else 0.0


# ---- acceptance ------------------------------------------------------------------------------


def tree_tau(a: list[float], depth: int, topk: int, tokens: int, b: float) -> float:
    """Expected tokens a cycle (bonus included) for a draft of ``depth`` steps, ``topk`` branches
    and ``tokens`` draft tokens, with conditional per-depth acceptance ``a`` (FACTS §6)."""
    if depth <= 0:
        return 1.0
    if topk == 1:
        e, p = 1.0, 1.0
        for d in range(min(depth, tokens - 1)):
            p *= a[d]
            e += p
        return e
    ranks = [(r - 1) ** -b - r**-b for r in range(2, topk + 1)]
    pool: list[float] = []
    frontier = [1.0]
    for d in range(depth):
        ad = a[min(d, len(a) - 1)]
        q = [ad] + [(1.0 - ad) * x for x in ranks]
        children = [p * qr for p in frontier for qr in q]
        pool.extend(children)
        frontier = sorted(children, reverse=True)[:topk]
    pool.sort(reverse=True)
    return 1.0 + sum(pool[: max(0, tokens - 1)])


def tree_tails(a: list[float], depth: int, topk: int, tokens: int, b: float) -> list[float]:
    """P(len ≥ k+1) for k = 1..depth: the chance the accepted path reaches depth k of the draft
    tree (tree_tau = 1 + their sum), with the same candidate pool and sibling model."""
    tails = [0.0] * max(0, depth)
    if depth <= 0:
        return tails
    if topk == 1:
        p = 1.0
        for d in range(min(depth, tokens - 1)):
            p *= a[d]
            tails[d] = p
        return tails
    ranks = [(r - 1) ** -b - r**-b for r in range(2, topk + 1)]
    pool: list[tuple[float, int]] = []
    frontier = [1.0]
    for d in range(depth):
        ad = a[min(d, len(a) - 1)]
        q = [ad] + [(1.0 - ad) * x for x in ranks]
        children = [p * qr for p in frontier for qr in q]
        pool.extend((c, d) for c in children)
        frontier = sorted(children, reverse=True)[:topk]
    pool.sort(key=lambda x: -x[0])
    for p, d in pool[: max(0, tokens - 1)]:
        tails[d] += p
    return tails


@dataclass
class Acceptance:
    """Conditional acceptance per draft position (index 0 = position 1) with uncertainties."""

    mean: list[float]
    sd: list[float]
    measured: int  # positions 1..measured come from histograms (or from accept length)
    sibling_decay: Estimate
    source: str  # "histograms" | "accept length" | ...

    def tau(self, c: Config, shift: float = 0.0, b: float | None = None) -> float:
        if not c.speculative:
            return 1.0
        a = [min(0.995, max(0.0, m + shift * s)) for m, s in zip(self.mean, self.sd, strict=False)]
        return tree_tau(a, c.steps, c.topk, c.draft_tokens, self.sibling_decay.mean if b is None else b)

    def estimate(self, c: Config) -> Estimate:
        if not c.speculative:
            return Estimate(1.0, 0.0)
        mean = self.tau(c)
        # all positions moved together by one sd: conservative (their errors are correlated
        # through the walk from the last measured position anyway)
        up, down = self.tau(c, 1.0) - mean, mean - self.tau(c, -1.0)
        if c.topk > 1:
            b = self.sibling_decay
            ts = (self.tau(c, b=b.mean + b.sd), self.tau(c, b=max(0.05, b.mean - b.sd)))
            up, down = math.hypot(up, max(0.0, max(ts) - mean)), math.hypot(down, max(0.0, mean - min(ts)))
        return Estimate.split(mean, down, up)


def _counts(w: ProfileWindow) -> tuple[list[float], list[float]] | None:
    """Successes and trials per draft position from one chain window's histogram."""
    h = w.accept_counts
    if not h or not w.steps or (w.topk or 1) != 1:
        return None
    depth = min(w.steps, MAX_DEPTH, (w.draft_tokens or w.steps + 1) - 1)
    tail = [0] * (len(h) + 1)
    for i in range(len(h) - 1, -1, -1):
        tail[i] = tail[i + 1] + h[i]
    succ, trials = [0.0] * MAX_DEPTH, [0.0] * MAX_DEPTH
    for k in range(1, depth + 1):  # position k reached when len >= k, accepted when len >= k+1
        reached = tail[k - 1] if k - 1 < len(tail) else 0
        if reached:
            trials[k - 1] = reached
            succ[k - 1] = tail[k] if k < len(tail) else 0
    return succ, trials


def _position_counts(windows: Iterable[ProfileWindow]) -> tuple[list[float], list[float]]:
    """Successes and trials per draft position from chain windows' histograms."""
    succ = [0.0] * MAX_DEPTH
    trials = [0.0] * MAX_DEPTH
    for w in windows:
        got = _counts(w)
        if got is not None:
            for i in range(MAX_DEPTH):
                succ[i] += got[0][i]
                trials[i] += got[1][i]
    return succ, trials


def _logit(p: float) -> float:
    p = min(0.999, max(0.001, p))
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _walk(mean: list[float], sd: list[float], measured: int, trials: list[float]) -> None:
    """Fill positions after ``measured``: a random walk in log-odds from the deepest measured one.
    Its drift is the measured positions' trend, damped (half of it for the next position, half of
    that for the one after: a trend of two or three points says little about the next five, and
    acceptance often plateaus); the spread grows with the distance."""
    last = measured - 1
    use = [i for i in range(measured) if trials[i] >= 20 and 0.01 < mean[i] < 0.99]
    drift, drift_sd = 0.0, 0.15
    if len(use) >= 2:
        xs = [float(i) for i in use]
        ys = [_logit(mean[i]) for i in use]
        ws = [(mean[i] * (1 - mean[i]) / max(sd[i], 1e-4)) ** 2 for i in use]
        _, slope, _ = weighted_line(xs, ys, ws)
        drift, drift_sd = 0.5 * slope, math.hypot(0.5 * abs(slope), 0.1)
    p = mean[last]
    base = _logit(p)
    var0 = (sd[last] / max(p * (1 - p), 1e-3)) ** 2
    for i in range(measured, MAX_DEPTH):
        d = i - last
        damped = (1 - DAMPING**d) / (1 - DAMPING)  # the drift's total over d positions
        centre = base + drift * damped
        spread = math.sqrt(var0 + d * RANDOM_WALK**2 + (damped * drift_sd) ** 2)
        mean[i] = _sigmoid(centre)
        sd[i] = (_sigmoid(centre + spread) - _sigmoid(centre - spread)) / 2


def fit_acceptance(launches: list[Launch]) -> Acceptance:
    windows = [w for ln in launches for w in ln.windows if w.steps]
    per = [c for w in windows if (c := _counts(w)) is not None]
    succ, trials = _position_counts(windows)
    measured = 0
    while measured < MAX_DEPTH and trials[measured] > 0:
        measured += 1
    mean = [0.0] * MAX_DEPTH
    sd = [0.0] * MAX_DEPTH
    source = "histograms"
    for i in range(measured):  # Beta(1 + successes, 1 + failures) posterior
        a, b = succ[i] + 1, trials[i] - succ[i] + 1
        mean[i] = a / (a + b)
        sd[i] = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    if measured and len(per) >= 2:
        # prompts differ from window to window more than coin flips do: a bootstrap over windows
        rng = random.Random(0)
        rates: list[list[float]] = [[] for _ in range(measured)]
        for _ in range(BOOTSTRAP):
            pick = [per[rng.randrange(len(per))] for _ in per]
            for i in range(measured):
                t = sum(p[1][i] for p in pick)
                if t > 0:
                    rates[i].append(sum(p[0][i] for p in pick) / t)
        for i in range(measured):
            r = rates[i]
            if len(r) > 2:
                m = sum(r) / len(r)
                sd[i] = max(sd[i], math.sqrt(sum((x - m) ** 2 for x in r) / (len(r) - 1)))
    trees = [w for w in windows if (w.topk or 1) > 1 and math.isfinite(w.accept_len)]
    if measured == 0:
        # no chain histogram: one acceptance for every position (no decay assumed) read off the
        # accept lengths (v1 lines, trees), its spread growing past the first position
        obs = _observations([w for w in windows if math.isfinite(w.accept_len)])
        if not obs:
            raise FitError("no speculative profile window with an accept length to fit acceptance from")

        def err(a1: float) -> float:
            prof = [a1] * MAX_DEPTH
            return sum(
                wt * (tree_tau(prof, c.steps, c.topk, c.draft_tokens, SIBLING_PRIOR[0]) - acc) ** 2
                for c, acc, wt in obs
            )

        mean[0], sd[0], measured = min([i / 100 for i in range(2, 99)], key=err), 0.08, 1
        trials[0] = 0.0
        source = "accept length (no histogram)"
    _walk(mean, sd, measured, trials)
    decay = Estimate(*SIBLING_PRIOR)
    tails = _tree_tails_observed(trees)
    if tails and measured and source == "histograms":
        # trees' histograms: b from the depths chains measured, then each deeper position from its depth
        decay = _fit_tree_depths(tails, mean, sd, measured)
        deepest = min(MAX_DEPTH, max(max((k + 1 for k, x in enumerate(t) if x > 0), default=0) for _, _, t in tails))
        if deepest > measured:
            measured = deepest
            source = "histograms (chains and trees)"
            _walk(mean, sd, measured, [1e9] * MAX_DEPTH)
    elif trees:
        decay = _fit_sibling_decay(trees, mean) or decay
    return Acceptance(mean, sd, measured, decay, source)


def _tree_tails_observed(trees: list[ProfileWindow]) -> list[tuple[Config, float, list[float]]]:
    """(configuration, request-cycles, P(len ≥ k+1) for k = 1..steps) of each tree configuration,
    pooled over its windows' histograms."""
    pooled: dict[Config, list[float]] = {}
    for w in trees:
        c, h = config_of_window(w), w.accept_counts
        if c is None or not h:
            continue
        acc = pooled.setdefault(c, [0.0] * (c.steps + 1))
        for i, n in enumerate(h[: c.steps + 1]):
            acc[i] += n
    out: list[tuple[Config, float, list[float]]] = []
    for c, counts in pooled.items():
        total = sum(counts)
        if total <= 0:
            continue
        tail: list[float] = []
        run = total
        for k in range(c.steps):
            run -= counts[k]
            tail.append(max(0.0, run) / total)
        out.append((c, total, tail[:MAX_DEPTH]))
    return out


def _fit_tree_depths(
    tails: list[tuple[Config, float, list[float]]], mean: list[float], sd: list[float], measured: int
) -> Estimate:
    """Sibling decay b from the tree depths the chains measured, then the acceptance of each deeper
    position from the trees' tails at that depth (a grid, in order: depth d needs 1..d−1). Updates
    ``mean`` and ``sd`` in place; returns b's estimate."""

    def err(a: list[float], b: float, depths: range) -> float:
        """≈ χ² of the step from each depth to the next, P(reach k+1 | reach k), binomial."""
        e = 0.0
        for c, n, obs in tails:
            model = [1.0, *tree_tails(a, c.steps, c.topk, c.draft_tokens, b)]
            seen = [1.0, *obs]
            for k in depths:
                if k < len(obs) and seen[k] > 0 and model[k] > 0:
                    p = min(0.999, max(0.001, seen[k + 1] / seen[k]))
                    e += n * seen[k] * (model[k + 1] / model[k] - seen[k + 1] / seen[k]) ** 2 / (p * (1 - p))
        return e

    grid_b = [x / 100 for x in range(20, 151, 2)]
    errs = [err(mean, b, range(measured)) for b in grid_b]
    i = min(range(len(grid_b)), key=errs.__getitem__)
    ok = [grid_b[j] for j, e in enumerate(errs) if e <= errs[i] + 1.0]
    b = grid_b[i]
    decay = Estimate(b, max(0.03, (max(ok) - min(ok)) / 2))
    # the depths the trees reached (a depth no tree's budget holds a node at says nothing)
    deepest = min(MAX_DEPTH, max(max((k + 1 for k, x in enumerate(t) if x > 0), default=0) for _, _, t in tails))
    if deepest <= measured:
        return decay
    depths = range(deepest)
    grid_a = [x / 50 for x in range(1, 50)]
    for d in range(measured, deepest):  # start from the walk's guesses, then coordinate descent
        mean[d] = min(grid_a, key=lambda a: abs(a - mean[d]))
    for _ in range(3):
        for d in range(measured, deepest):
            es = []
            for a in grid_a:
                trial = mean[:d] + [a] + mean[d + 1 :]
                es.append(err(trial, b, depths))
            j = min(range(len(grid_a)), key=es.__getitem__)
            mean[d] = grid_a[j]
            near = [grid_a[k] for k, e in enumerate(es) if e <= es[j] + 1.0]
            # the grid's own width, b's spread carried into the depth it explains
            sd[d] = math.hypot(max(0.02, (max(near) - min(near)) / 2), 0.5 * decay.sd * (1 - mean[d]))
    return decay


def _observations(windows: list[ProfileWindow]) -> list[tuple[Config, float, int]]:
    """(configuration, accept length, weight: cycles x batch) of each window that names its configuration."""
    obs = []
    for w in windows:
        c = config_of_window(w)
        if c is not None:
            obs.append((c, w.accept_len, w.cycles * (w.bs or 1)))
    return obs


def _fit_sibling_decay(trees: list[ProfileWindow], mean: list[float]) -> Estimate | None:
    obs = _observations(trees)
    grid = [x / 100 for x in range(20, 151, 2)]
    errs = []
    for b in grid:
        errs.append(sum(wt * (tree_tau(mean, c.steps, c.topk, c.draft_tokens, b) - acc) ** 2 for c, acc, wt in obs))
    i = min(range(len(grid)), key=errs.__getitem__)
    total = sum(wt for _, _, wt in obs)
    ok = [grid[j] for j, e in enumerate(errs) if e <= errs[i] + 0.02**2 * total]  # within 0.02 of τ
    return Estimate(grid[i], max(0.03, (max(ok) - min(ok)) / 2))


# ---- calibration to the benchmarks --------------------------------------------------------------


@dataclass
class Calibration:
    """Benchmark goodput against the model's steady state: ``1/g = a/model + s`` (per token of all
    streams), s the time a benchmark spends outside the decode cycles (prefills, ramp), a the
    windows' timing against the wall clock; fitted to every benchmark of the launches it covers."""

    a: float = 1.0
    s: float = 0.0  # seconds per token
    cov: tuple[tuple[float, float], tuple[float, float]] = ((0.03**2, 0.0), (0.0, 0.0))
    points: int = 0

    def apply(self, g: Estimate) -> Estimate:
        if g.mean <= 0:
            return g
        x = 1.0 / g.mean
        y = self.a * x + self.s
        if y <= 0:
            return g
        (vaa, vas), (_, vss) = self.cov
        rel = math.sqrt(max(0.0, x * x * vaa + 2 * x * vas + vss)) / y  # of the calibration itself
        share = self.a * x / y  # the model's part of the time
        down, up = _log_sides(g)
        sd_down = math.hypot(share * down / 1.96, rel)
        sd_up = math.hypot(share * up / 1.96, rel)
        mean = 1.0 / y
        return Estimate.split(mean, mean * (1 - math.exp(-sd_down)), mean * (math.exp(sd_up) - 1))

    def to_dict(self) -> dict:
        return {"a": self.a, "s_per_token": self.s, "points": self.points}


def _fit_calibration(pairs: list[tuple[float, float]], noise: float) -> Calibration:
    """(model goodput, measured goodput) pairs -> a and s by weighted least squares on
    ``1/measured = a/model + s``, a held near 1 (sd 0.1) so that one point or one load level
    gives s; each point's sd is the benchmark noise (relative)."""
    if not pairs:
        return Calibration()
    prior_sd = 0.1
    sxx = sx = s1 = sxy = sy = 0.0
    for model, meas in pairs:
        x, y = 1.0 / model, 1.0 / meas
        w = 1.0 / (noise * y) ** 2
        sxx += w * x * x
        sx += w * x
        s1 += w
        sxy += w * x * y
        sy += w * y
    # normal equations with the prior (a − 1)/prior_sd as one more residual
    a11, a12, a22 = sxx + 1.0 / prior_sd**2, sx, s1
    b1, b2 = sxy + 1.0 / prior_sd**2, sy
    det = a11 * a22 - a12 * a12
    a = (b1 * a22 - a12 * b2) / det
    s = (a11 * b2 - a12 * b1) / det
    resid = sum((1.0 / (noise / meas)) ** 2 * (1.0 / meas - a / model - s) ** 2 for model, meas in pairs)
    scale = max(1.0, resid / max(1, len(pairs) - 1))  # scatter beyond the noise widens it
    cov = ((a22 / det * scale, -a12 / det * scale), (-a12 / det * scale, a11 / det * scale))
    return Calibration(a, s, cov, len(pairs))


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
        td, tu = _log_sides(tau)
        cd, cu = _log_sides(cyc)
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
    return _fit_calibration(spec, noise), _fit_calibration(base, noise)
