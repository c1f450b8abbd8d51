"""A cost model of the running server, fitted from what any server exposes (its log, HTTP).

From profile windows (live or from a capture), decode-stats lines and benchmark goodput it fits:

* verify ms as a function of the verify token count n = bs × draft tokens: a fixed part ``f``
  (all-reduces, launch overheads) plus a memory-bound floor ``m`` joined to a compute slope ``s``
  by a knee, ``(m^k + (s·n)^k)^(1/k)``, plus ``c·bs`` for attention over the KV cache (which
  grows with the batch, not with the draft tokens);
* draft ms per step as the same knee over bs × topk tokens;
* extend ms as a line in bs, and the scheduler overhead as a mean;
* per-position conditional acceptance from the accept-length histograms,
  ``P(len ≥ k+1 | len ≥ k)``, with a geometric decay fitted to the measured positions for the
  positions never drafted yet, and a Beta posterior (or the decay fit's spread) as uncertainty;
* the baseline step (no speculation) from a baseline launch's decode lines when one was seen,
  otherwise from the verify curve at one token a request (``baseline_source`` says which).

Trees (topk > 1) use the sibling model of FACTS §6: the rank-r candidate at depth d is the
accepted one with probability a_d for r = 1 and (1 − a_d)((r−1)^−b − r^−b) after, and
τ = 1 + the N − 1 largest path products over SGLang's candidate pool; b (``sibling_decay``) is
fitted from tree launches when there are any, else 0.7 ± 0.12.

Every prediction is goodput = bs × τ / cycle at bs = the concurrency, with a standard deviation
propagated from the fits; predictions are scaled by the ratio of benchmark goodput to the model
at the configurations measured (prefill and ramp time that no profile window sees).
No simulator import: the model knows only what a real server shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median

from tuitune.base.events import DecodeStats, ProfileWindow
from tuitune.decide.fitting import Fit, least_squares, weighted_line

MAX_DEPTH = 16  # acceptance is modelled for this many draft positions
KNEES = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # knee sharpness exponents tried
SIBLING_DECAY = (0.7, 0.12)  # prior on b: FACTS §6 (0.58 fits one report, 0.7 six models)
DECAY_PRIOR = (math.log(0.85), 0.12)  # ratio of successive conditional acceptances (log)


class FitError(ValueError):
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


@dataclass(frozen=True, slots=True)
class Estimate:
    mean: float
    sd: float

    @property
    def lo(self) -> float:
        return self.mean - 1.96 * self.sd

    @property
    def hi(self) -> float:
        return self.mean + 1.96 * self.sd

    def to_dict(self) -> dict:
        return {"mean": self.mean, "sd": self.sd, "lo": self.lo, "hi": self.hi}


def knee(n: float, m: float, s: float, k: float) -> float:
    """(m^k + (s·n)^k)^(1/k), computed without overflow."""
    a, b = m, s * n
    big, small = (a, b) if a >= b else (b, a)
    if big <= 0:
        return 0.0
    return big * (1.0 + (small / big) ** k) ** (1.0 / k)


@dataclass
class Curve:
    """A fitted knee curve y(n, bs) = f + knee(n; m, s, k) + c·bs, with its parameter covariance."""

    params: list[float]  # f, m, s, c
    cov: list[list[float]]
    k: float
    alternatives: list[tuple[float, list[float]]]  # other knee exponents that fit about as well
    points: int
    n_range: tuple[float, float]

    def value(self, n: float, bs: float, params: list[float] | None = None, k: float | None = None) -> float:
        f, m, s, c = params or self.params
        return f + knee(n, m, s, self.k if k is None else k) + c * bs

    def predict(self, n: float, bs: float) -> Estimate:
        mean = self.value(n, bs)
        grad = []
        for i in range(4):
            h = max(abs(self.params[i]) * 1e-4, 1e-9)
            q = self.params[:]
            q[i] += h
            grad.append((self.value(n, bs, q) - mean) / h)
        var = sum(grad[i] * self.cov[i][j] * grad[j] for i in range(4) for j in range(4))
        # the knee's shape is known only as well as the exponents that fit about as well agree
        spread = max((abs(self.value(n, bs, p, k) - mean) for k, p in self.alternatives), default=0.0)
        return Estimate(mean, math.sqrt(max(var, 0.0) + spread**2 + (0.005 * mean) ** 2))


def fit_curve(points: list[tuple[float, float, float, float]], with_bs: bool, what: str) -> Curve:
    """Fit f + knee(n) (+ c·bs) to (n, bs, y, weight) points.

    Few distinct n cannot pin a knee: the exponent then stays at 2 and the floor/slope split is
    held by weak priors (the data decide wherever they can); the covariance says how little is
    known, so predictions far from the measured n come with wide intervals.
    """
    pts = [p for p in points if p[0] > 0 and p[2] > 0 and math.isfinite(p[2])]
    if not pts:
        raise FitError(f"no {what} measurements to fit")
    ns = [p[0] for p in pts]
    distinct = len({round(n, 3) for n in ns})
    ymin = min(p[2] for p in pts)
    ymed = median(p[2] for p in pts)
    nmax = max(ns)
    bsmed = median(p[1] for p in pts)
    xs = [(p[0], p[1]) for p in pts]
    ys = [p[2] for p in pts]
    ws = [p[3] for p in pts]
    # priors (sd wide): the fixed part is small next to the floor unless the data say otherwise;
    # the floor is about the smallest time seen; the slope is such that the largest n seen sits
    # near the knee; the KV term is a minor share of the median time
    few = distinct < 3
    priors = [
        (0.0, 0.5 * ymin),
        (ymin, 0.5 * ymin if few else 10 * ymed),
        (ymin / nmax, 3 * ymed / nmax if few else 100 * ymed / nmax),
        (0.0, 0.1 * ymed / max(bsmed, 1.0)) if with_bs else (0.0, 1e-9),
    ]
    fits: list[tuple[float, Fit]] = []
    for k in KNEES if not few else (2.0,):

        def model(p, x, k=k):
            return p[0] + knee(x[0], p[1], p[2], k) + (p[3] * x[1] if with_bs else 0.0)

        fits.append((k, least_squares(model, xs, ys, ws, [0.0, ymin * 0.9, ymin / nmax, 0.0], [0.0] * 4, priors)))
    fits.sort(key=lambda kf: kf[1].sse)
    k, best = fits[0]
    # exponents whose fit is not clearly worse (within the noise of one more parameter)
    alt = [(kk, f.params) for kk, f in fits[1:] if f.sse <= best.sse + max(2.0 * best.sse / best.dof, 1e-6)]
    return Curve(best.params, best.cov, k, alt, len(pts), (min(ns), nmax))


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
        mean = self.tau(c)
        if not c.speculative:
            return Estimate(1.0, 0.0)
        # all positions moved together by one sd: conservative (their errors are correlated
        # through the decay fit anyway)
        sd = (self.tau(c, 1.0) - self.tau(c, -1.0)) / 2
        if c.topk > 1:
            b = self.sibling_decay
            sd = math.hypot(sd, (self.tau(c, b=b.mean + b.sd) - self.tau(c, b=max(0.05, b.mean - b.sd))) / 2)
        return Estimate(mean, sd)


def _position_counts(windows: Iterable[ProfileWindow]) -> tuple[list[float], list[float]]:
    """Successes and trials per draft position from chain windows' histograms."""
    succ = [0.0] * MAX_DEPTH
    trials = [0.0] * MAX_DEPTH
    for w in windows:
        h = w.accept_counts
        if not h or not w.steps or (w.topk or 1) != 1:
            continue
        depth = min(w.steps, MAX_DEPTH, (w.draft_tokens or w.steps + 1) - 1)
        tail = [0] * (len(h) + 1)
        for i in range(len(h) - 1, -1, -1):
            tail[i] = tail[i + 1] + h[i]
        for k in range(1, depth + 1):  # position k reached when len >= k, accepted when len >= k+1
            reached = tail[k - 1] if k - 1 < len(tail) else 0
            if reached:
                trials[k - 1] += reached
                succ[k - 1] += tail[k] if k < len(tail) else 0
    return succ, trials


def _extend_decay(mean: list[float], sd: list[float], measured: int, trials: list[float]) -> None:
    """Fill positions after ``measured`` with a geometric decay fitted to the measured ones."""
    use = [i for i in range(measured) if trials[i] >= 20 and mean[i] > 0.01]
    if len(use) >= 2:
        xs = [float(i) for i in use]
        ys = [math.log(mean[i]) for i in use]
        ws = [trials[i] / (1 + trials[i] * (sd[i] / mean[i]) ** 2) for i in use]
        _, slope, resid = weighted_line(xs, ys, ws)
        lo, hi = math.log(0.55), math.log(1.0)
        beta = min(hi, max(lo, slope))
        sd_beta = max(0.05, resid / max(1.0, len(use) - 1) ** 0.5, DECAY_PRIOR[1] / len(use) ** 0.5)
    else:
        beta, sd_beta = DECAY_PRIOR
    last = measured - 1
    for i in range(measured, MAX_DEPTH):
        dist = i - last
        mean[i] = min(0.98, mean[last] * math.exp(beta * dist))
        sd[i] = math.hypot(sd[last], mean[i] * sd_beta * dist)


def fit_acceptance(launches: list[Launch]) -> Acceptance:
    windows = [w for ln in launches for w in ln.windows if w.steps]
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
    trees = [w for w in windows if (w.topk or 1) > 1 and math.isfinite(w.accept_len)]
    if measured == 0:
        # no chain histogram: read a geometric profile off the accept lengths (v1 lines, trees)
        obs = _observations([w for w in windows if math.isfinite(w.accept_len)])
        if not obs:
            raise FitError("no speculative profile window with an accept length to fit acceptance from")

        def err(a1: float) -> float:
            prof = [a1 * math.exp(DECAY_PRIOR[0] * d) for d in range(MAX_DEPTH)]
            return sum(
                wt * (tree_tau(prof, c.steps, c.topk, c.draft_tokens, SIBLING_DECAY[0]) - acc) ** 2
                for c, acc, wt in obs
            )

        mean[0], sd[0], measured = min([i / 100 for i in range(2, 99)], key=err), 0.08, 1
        trials[0] = 0.0
        source = "accept length (no histogram)"
    _extend_decay(mean, sd, measured, trials)
    decay = Estimate(*SIBLING_DECAY)
    if trees:
        decay = _fit_sibling_decay(trees, mean) or decay
    return Acceptance(mean, sd, measured, decay, source)


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
    verify: Curve
    draft: Curve | None
    extend: tuple[float, float, float]  # intercept, slope per request, residual sd
    other: Estimate
    baseline_offset: Estimate  # measured baseline step minus the verify curve at one token
    baseline_source: str
    acceptance: Acceptance
    calibration: Estimate  # benchmark goodput / model goodput at the measured configurations
    launches: list[Launch]

    def cycle(self, c: Config, bs: int) -> tuple[Estimate, dict]:
        """Cycle (or baseline step) ms at batch size ``bs``, with its parts."""
        if not c.speculative:
            v = self.verify.predict(bs, bs)
            mean = v.mean + self.baseline_offset.mean + self.other.mean
            return Estimate(mean, math.sqrt(v.sd**2 + self.baseline_offset.sd**2 + self.other.sd**2)), {"step_ms": mean}
        v = self.verify.predict(bs * c.draft_tokens, bs)
        if self.draft is not None:
            d1 = self.draft.predict(bs * c.topk, bs)
            d = Estimate(d1.mean * c.steps, d1.sd * c.steps)
        else:
            d = Estimate(0.0, 0.0)
        icpt, slope, resid = self.extend
        e = Estimate(max(0.0, icpt + slope * bs), resid + 0.05 * abs(icpt + slope * bs))
        total = v.mean + d.mean + e.mean + self.other.mean
        sd = math.sqrt(v.sd**2 + d.sd**2 + e.sd**2 + self.other.sd**2)
        return Estimate(total, sd), {
            "draft_ms": d.mean,
            "verify_ms": v.mean,
            "extend_ms": e.mean,
            "other_ms": self.other.mean,
        }

    def raw(self, c: Config, concurrency: int) -> tuple[Estimate, float, Estimate, dict]:
        bs = max(1, int(concurrency))
        cyc, parts = self.cycle(c, bs)
        tau = self.acceptance.estimate(c)
        g = bs * tau.mean / cyc.mean * 1000.0 if cyc.mean > 0 else 0.0
        rel = math.hypot(tau.sd / tau.mean if tau.mean else 0.0, cyc.sd / cyc.mean if cyc.mean else 0.0)
        return Estimate(g, g * rel), tau.mean, cyc, parts

    def predict(self, c: Config, concurrency: int) -> Prediction:
        g, tau, cyc, parts = self.raw(c, concurrency)
        cal = self.calibration
        mean = g.mean * cal.mean
        sd = mean * math.hypot(g.sd / g.mean if g.mean else 0.0, cal.sd / cal.mean if cal.mean else 0.0)
        return Prediction(c, int(concurrency), Estimate(mean, sd), tau, cyc.mean, parts)

    def summary(self) -> dict:
        f, m, s, c = self.verify.params
        out = {
            "launches": len(self.launches),
            "verify": {
                "fixed_ms": f,
                "floor_ms": m,
                "ms_per_token": s,
                "kv_ms_per_request": c,
                "knee_sharpness": self.verify.k,
                "tokens_seen": list(self.verify.n_range),
                "points": self.verify.points,
            },
            "extend": {"ms": self.extend[0], "ms_per_request": self.extend[1]},
            "other_ms": self.other.to_dict(),
            "baseline": {"source": self.baseline_source, "offset_ms": self.baseline_offset.to_dict()},
            "acceptance": {
                "per_position": [round(x, 4) for x in self.acceptance.mean[:8]],
                "sd": [round(x, 4) for x in self.acceptance.sd[:8]],
                "measured_positions": self.acceptance.measured,
                "source": self.acceptance.source,
                "sibling_decay": self.acceptance.sibling_decay.to_dict(),
            },
            "calibration": self.calibration.to_dict(),
        }
        if self.draft is not None:
            df, dm, ds, _ = self.draft.params
            out["draft"] = {"step_floor_ms": df + dm, "ms_per_token": ds, "knee_sharpness": self.draft.k}
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


def fit(launches: list[Launch]) -> CostModel:
    """Fit the model to every launch seen so far (more launches: more points on every curve)."""
    windows = [w for ln in launches for w in ln.windows if _ok(w) and config_of_window(w) is not None]
    spec = [w for w in windows if w.steps]
    if not spec:
        raise FitError(
            "no speculative profile window with steps (run with profile: true, format v2 "
            "lines carry the steps; v1 lines need steps=…)"
        )
    wt = [float(w.cycles) for w in spec]
    others = [_other_ms(w) for w in windows]
    other_w = [float(w.cycles) for w in windows]
    om = sum(o * x for o, x in zip(others, other_w, strict=False)) / sum(other_w)
    osd = math.sqrt(sum(x * (o - om) ** 2 for o, x in zip(others, other_w, strict=False)) / sum(other_w))
    other = Estimate(om, max(osd / math.sqrt(len(others)), 0.01 * om, 1e-4))
    vpts = []
    for w, x in zip(spec, wt, strict=False):
        c = config_of_window(w)
        assert c is not None  # windows holds only those with a configuration
        bs = w.bs or 1
        n = w.verify_tokens or bs * c.draft_tokens
        vpts.append((float(n), float(bs), w.verify_ms, x))
    for w in windows:  # steps-0 cycles of adaptive mode: a verify over one token a request
        if not w.steps and w.verify_ms > 0:
            bs = w.bs or 1
            vpts.append((float(w.verify_tokens or bs), float(bs), w.verify_ms, float(w.cycles)))
    verify = fit_curve(vpts, with_bs=True, what="verify")
    dpts = [
        (float((w.bs or 1) * (w.topk or 1)), float(w.bs or 1), w.draft_ms / steps, x)
        for w, x in zip(spec, wt, strict=False)
        if w.draft_ms > 0 and (steps := w.steps)  # (every window in spec has steps)
    ]
    draft = fit_curve(dpts, with_bs=False, what="draft") if dpts else None
    icpt, slope, resid = weighted_line([float(w.bs or 1) for w in spec], [w.extend_ms for w in spec], wt)
    if len({w.bs for w in spec}) < 2:  # one batch size: the seeds' 5 % per extra request as slope
        slope = 0.05 * icpt / (1 + 0.05 * ((spec[0].bs or 1) - 1))
        icpt = spec[0].extend_ms - slope * (spec[0].bs or 1)
    base = _baseline_points(launches)
    if base:
        res = [(ms - verify.value(bs, bs) - other.mean, x) for bs, ms, x in base]
        tot = sum(x for _, x in res)
        off = sum(r * x for r, x in res) / tot
        spread = math.sqrt(sum(x * (r - off) ** 2 for r, x in res) / tot)
        offset = Estimate(off, max(spread / math.sqrt(len(res)), 0.01 * abs(off), 0.005 * verify.value(1, 1)))
        source = "baseline launch"
    else:
        # a plain decode step is a forward over one token a request: the verify curve there.
        # A verify forward may carry fixed extra work (tree masks, sampling, accept: the seeds'
        # verify cost 40 % more than a decode step), so the step is likely cheaper; a wide,
        # lower-leaning interval says so until a baseline launch is measured.
        v11 = verify.value(1, 1)
        offset = Estimate(-0.1 * v11, 0.2 * v11)
        source = "verify curve at 1 token (no baseline launch)"
    model = CostModel(
        verify,
        draft,
        (icpt, slope, resid),
        other,
        offset,
        source,
        fit_acceptance(launches),
        Estimate(1.0, 0.0),
        launches,
    )
    model.calibration = _calibration(model, launches)
    return model


def _baseline_points(launches: list[Launch]) -> list[tuple[float, float, float]]:
    """(bs, step ms, weight) from the decode lines of launches without speculation."""
    out = []
    for ln in launches:
        if ln.config.speculative:
            continue
        for d in ln.decodes:
            if d.running_req and d.gen_throughput > 0 and d.accept_len is None:
                out.append((float(d.running_req), d.running_req / d.gen_throughput * 1000.0, 1.0))
    return out


def _calibration(model: CostModel, launches: list[Launch]) -> Estimate:
    logs = []
    for ln in launches:
        for conc, measured in ln.goodput.items():
            if measured > 0 and (ln.config.speculative or model.baseline_source == "baseline launch"):
                g = model.raw(ln.config, conc)[0].mean
                if g > 0:
                    logs.append(math.log(measured / g))
    if not logs:
        return Estimate(1.0, 0.03)
    mu = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mu) ** 2 for x in logs) / max(1, len(logs) - 1)) if len(logs) > 1 else 0.02
    return Estimate(math.exp(mu), max(0.01, sd / math.sqrt(len(logs))) * math.exp(mu))
