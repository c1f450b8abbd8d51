"""Small fits in pure Python: weighted least squares (a handful of parameters, tens of points),
isotonic regression, monotone piecewise-linear curves with the intervals monotonicity leaves, and
the bootstrap.

The cost model fits curves of three or four parameters to a few dozen profile windows; a
numerical library would be a large dependency for that. ``least_squares`` is a damped
Gauss-Newton (Levenberg-Marquardt) with a numerical Jacobian, bounds by clamping, and optional
Gaussian priors on parameters (as extra residuals), which keep unidentifiable parameters (two
that the data cannot tell apart) near a sensible value instead of wandering; it returns the
parameter covariance so that predictions carry an uncertainty.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass


def solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a·x = b (Gauss-Jordan with partial pivoting); None when a is singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        m[col] = [v / p for v in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col]
                m[r] = [vr - f * vc for vr, vc in zip(m[r], m[col], strict=False)]
    return [m[i][n] for i in range(n)]


def inverse(a: list[list[float]]) -> list[list[float]] | None:
    n = len(a)
    cols = []
    for i in range(n):
        x = solve(a, [1.0 if j == i else 0.0 for j in range(n)])
        if x is None:
            return None
        cols.append(x)
    return [[cols[j][i] for j in range(n)] for i in range(n)]


@dataclass
class Fit:
    params: list[float]
    cov: list[list[float]]  # parameter covariance (residual variance x (JᵀJ)⁻¹)
    sse: float  # weighted sum of squared data residuals (priors left out)
    dof: int


def least_squares(  # noqa: PLR0913
    model: Callable[[list[float], Sequence[float]], float],
    xs: Sequence[Sequence[float]],
    ys: Sequence[float],
    weights: Sequence[float],
    x0: list[float],
    lower: list[float],
    priors: Sequence[tuple[float, float] | None] = (),
    relative: bool = True,
    iters: int = 60,
) -> Fit:
    """Minimise Σ w·((model(p, x) − y)/y)² (or absolute residuals) + Σ ((p − μ)/σ)² over priors."""
    n_p = len(x0)
    priors = list(priors) + [None] * (n_p - len(priors))
    scale = [abs(y) if relative and y else 1.0 for y in ys]
    sw = [math.sqrt(max(w, 0.0)) for w in weights]

    def residuals(p: list[float]) -> list[float]:
        r = [(model(p, x) - y) / s * w for x, y, s, w in zip(xs, ys, scale, sw, strict=False)]
        r += [(p[i] - pr[0]) / pr[1] for i, pr in enumerate(priors) if pr is not None]
        return r

    def jacobian(p: list[float], r0: list[float]) -> list[list[float]]:
        cols = []
        for i in range(n_p):
            h = max(abs(p[i]) * 1e-6, 1e-9)
            q = p[:]
            q[i] += h
            r1 = residuals(q)
            cols.append([(a - b) / h for a, b in zip(r1, r0, strict=False)])
        return [[cols[i][k] for i in range(n_p)] for k in range(len(r0))]

    p = [max(v, lo) for v, lo in zip(x0, lower, strict=False)]
    r = residuals(p)
    cost = sum(v * v for v in r)
    lam = 1e-3
    for _ in range(iters):
        jac = jacobian(p, r)
        jtj = [[sum(row[i] * row[j] for row in jac) for j in range(n_p)] for i in range(n_p)]
        jtr = [sum(row[i] * rv for row, rv in zip(jac, r, strict=False)) for i in range(n_p)]
        improved = False
        for _ in range(12):
            a = [[jtj[i][j] + (lam * (jtj[i][i] + 1e-12) if i == j else 0.0) for j in range(n_p)] for i in range(n_p)]
            step = solve(a, [-v for v in jtr])
            if step is None:
                lam *= 10
                continue
            q = [max(pi + si, lo) for pi, si, lo in zip(p, step, lower, strict=False)]
            rq = residuals(q)
            cq = sum(v * v for v in rq)
            if cq < cost:
                done = cost - cq < 1e-12 * (1 + cost)
                p, r, cost, lam = q, rq, cq, max(lam / 3, 1e-9)
                improved = True
                break
            lam *= 4
        if not improved or done:
            break
    jac = jacobian(p, r)
    jtj = [[sum(row[i] * row[j] for row in jac) for j in range(n_p)] for i in range(n_p)]
    n_data = len(ys)
    sse = sum(v * v for v in r[:n_data])
    dof = max(1, n_data - n_p)
    sigma2 = max(sse / dof, 1e-6)  # never claim better than 0.1 % per point
    inv = inverse(jtj) or [[(1e6 if i == j else 0.0) for j in range(n_p)] for i in range(n_p)]
    cov = [[v * sigma2 for v in row] for row in inv]
    return Fit(p, cov, sse, dof)


def weighted_line(xs: Sequence[float], ys: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float]:
    """(intercept, slope, residual sd) of a weighted straight line; slope 0 when x does not vary."""
    sw = sum(ws)
    if sw <= 0:
        return math.nan, 0.0, math.nan
    mx = sum(w * x for w, x in zip(ws, xs, strict=False)) / sw
    my = sum(w * y for w, y in zip(ws, ys, strict=False)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=False))
    slope = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys, strict=False)) / sxx if sxx > 1e-12 else 0.0
    icpt = my - slope * mx
    var = sum(w * (y - icpt - slope * x) ** 2 for w, x, y in zip(ws, xs, ys, strict=False)) / sw
    return icpt, slope, math.sqrt(var)


# ---- estimates, monotone curves, the bootstrap ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Estimate:
    """A prediction with its uncertainty. ``sd`` for a symmetric interval; ``down`` and ``up`` (the
    standard deviation of each side) when what is known bounds one side more than the other — a
    forward over more tokens than any measured costs at least the largest measured, and perhaps a
    tile step more."""

    mean: float
    sd: float
    down: float | None = None
    up: float | None = None

    @classmethod
    def split(cls, mean: float, down: float, up: float) -> Estimate:
        down, up = max(0.0, down), max(0.0, up)
        return cls(mean, 0.5 * (down + up), down, up)

    @property
    def sd_down(self) -> float:
        return self.sd if self.down is None else self.down

    @property
    def sd_up(self) -> float:
        return self.sd if self.up is None else self.up

    @property
    def lo(self) -> float:
        return self.mean - 1.96 * self.sd_down

    @property
    def hi(self) -> float:
        return self.mean + 1.96 * self.sd_up

    def to_dict(self) -> dict:
        out = {"mean": self.mean, "sd": self.sd, "lo": self.lo, "hi": self.hi}
        if self.down is not None:
            out.update(sd_down=self.sd_down, sd_up=self.sd_up)
        return out


def pav(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted isotonic regression: the non-decreasing sequence nearest ``values`` in weighted
    least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, max(w, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks[-1]
            blocks[-1] = [(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * int(n)
    return out


def bootstrap_sd(values: Sequence[float], weights: Sequence[float], rng: random.Random, draws: int = 64) -> float:
    """Standard deviation of the weighted mean of ``values`` over bootstrap resamples of them."""
    n = len(values)
    if n < 2:
        return 0.0
    means = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        sw = sum(weights[i] for i in idx)
        means.append(sum(values[i] * weights[i] for i in idx) / sw if sw > 0 else values[idx[0]])
    m = sum(means) / draws
    # x n/(n-1): the plain bootstrap of a mean is biased low by that factor for few values
    return math.sqrt(sum((x - m) ** 2 for x in means) / (draws - 1) * n / (n - 1))


JUMP = 0.5  # a forward past the tokens measured may cross a tile boundary: up to this much dearer
# Where a forward's memory-bound floor ends, when the measured curve is still flat at its top: somewhere
# in the next KNEE_SPAN× of tokens, log-uniformly, and not below KNEE_FLOOR tokens — a forward over
# fewer tokens reads its weights in the time of one on datacenter GPUs (roofline ridge points of
# 150-400 FLOP/byte for 16-bit weights; FACTS §6's H200 forward is flat to 96 tokens).
KNEE_FLOOR = 64.0
KNEE_SPAN = 16.0


def past_the_knee(r: float) -> float:
    """E[max(1, r·a/n_k)] for n_k log-uniform over [a, KNEE_SPAN·a]: what a forward ``r`` times
    the knee's lowest place costs, relative to the floor, when the cost grows in proportion to the
    tokens past the knee."""
    if r <= 1.0:
        return 1.0
    span = math.log(KNEE_SPAN)
    if r >= KNEE_SPAN:
        return r * (1.0 - 1.0 / KNEE_SPAN) / span
    return (r - 1.0 + math.log(KNEE_SPAN / r)) / span


@dataclass(frozen=True, slots=True)
class Cell:
    """One launch's measurement of a curve at one point: ``x`` (tokens), the batch size, the mean
    value and its variance (windows' bootstrap and the launch-to-launch spread)."""

    x: float
    bs: float
    y: float
    var: float
    group: int = 0  # 1: a tree's (its cost a factor of the chains' at the same point)


@dataclass
class MonotoneCurve:
    """y(x, bs) = g(x) + c·bs: g non-decreasing, piecewise linear through its knots (the x values
    measured), c ≥ 0 a cost per request (attention over each request's KV cache).

    No shape is assumed between or beyond the knots, so a prediction's interval is what
    monotonicity allows: between two knots anywhere from the lower to the upper (a tile step may
    sit anywhere between them); past the largest x at least the largest value, and up to a tile
    step (``jump``) or proportionally more tokens' worth more; below the smallest x at most the
    smallest value and down to a step less or proportionally fewer tokens' worth. The mean
    interpolates linearly and extends the end segments' slopes. ``c`` is known only where points
    at one x come from different batch sizes: predictions average over its posterior on a grid
    (``fits``), so an unidentified ``c`` widens exactly the predictions that depend on it. Cells
    of group 1 (trees) are the curve times a factor f, fitted the same way where both groups
    measured near one another (``factored``)."""

    knots: list[float]
    fits: list[tuple[float, float, float, list[float]]]  # (c, f, posterior weight, knot values of g)
    sds: list[float]  # standard deviation of each knot's value
    points: int
    factored: bool = False  # f fitted (group 1 cells were there)
    tokens: bool = False  # x is a forward's token count: past a flat top, the knee prior applies
    jump: float = JUMP

    @property
    def n_range(self) -> tuple[float, float]:
        return (self.knots[0], self.knots[-1])

    def values(self) -> list[float]:
        return [sum(w * vals[i] for _, _, w, vals in self.fits) for i in range(len(self.knots))]

    def per_request(self) -> Estimate:
        m = sum(w * c for c, _, w, _ in self.fits)
        return Estimate(m, math.sqrt(max(0.0, sum(w * (c - m) ** 2 for c, _, w, _ in self.fits))))

    def factor(self) -> Estimate:
        m = sum(w * f for _, f, w, _ in self.fits)
        return Estimate(m, math.sqrt(max(0.0, sum(w * (f - m) ** 2 for _, f, w, _ in self.fits))))

    def shape(self, vals: list[float], x: float) -> tuple[float, float, float]:
        """(mean, sd down, sd up) of g at x from knot values ``vals``: the interpolation, and the
        range monotonicity leaves it. Between knots i and i+1 a step may sit anywhere: the value
        at a fraction t of the way is the upper knot's with chance t (sd √(t(1−t))·gap, no wider
        than the bracket); past the ends the chance of a step grows with log2 of the distance. Past the largest x of a
        token curve the mean is the last segment's slope extended or, when larger, the geometric
        middle of that and the knee prior's expectation (``past_the_knee``): the floor may last
        (a wave-quantised GEMM stays memory-bound to 600 tokens) or end (an 8B on an H200 rises
        past ~100); on the worlds of benchmarks/advisor_worlds.py the middle ranked better than
        either end or than a knee prior spread wider (measured during development)."""
        k = self.knots
        j = 1.0 + self.jump
        if x >= k[-1]:
            v = vals[-1]
            if x <= k[-1] * (1 + 1e-9):
                return v, 0.0, 0.0
            slope = (vals[-1] - vals[-2]) / (k[-1] - k[-2]) if len(k) > 1 else 0.0
            m = v + max(0.0, slope) * (x - k[-1])
            if self.tokens:  # the geometric middle of "as measured" and "past a knee"
                m = max(m, math.sqrt(m * v * past_the_knee(x / max(k[-1], KNEE_FLOOR))))
            hi = max(m, v * max(j, x / k[-1]))
            reach = math.sqrt(min(1.0, math.log2(x / k[-1])))
            return m, (m - v) / 1.96, reach * (hi - m) / 1.96
        if x <= k[0]:
            v = vals[0]
            if x >= k[0] * (1 - 1e-9):
                return v, 0.0, 0.0
            slope = (vals[1] - vals[0]) / (k[1] - k[0]) if len(k) > 1 else 0.0
            lo = v * max(x / k[0], 1.0 / j)
            m = max(lo, v - max(0.0, slope) * (k[0] - x))
            reach = math.sqrt(min(1.0, math.log2(k[0] / x)))
            return m, reach * (m - lo) / 1.96, (v - m) / 1.96
        i = bisect.bisect_right(k, x) - 1
        t = (x - k[i]) / (k[i + 1] - k[i])
        gap = vals[i + 1] - vals[i]
        step = math.sqrt(t * (1 - t)) * gap
        return vals[i] + t * gap, min(step, t * gap / 1.96), min(step, (1 - t) * gap / 1.96)

    def noise(self, x: float) -> float:
        k, s = self.knots, self.sds
        if x <= k[0]:
            return s[0]
        if x >= k[-1]:
            return s[-1]
        i = bisect.bisect_right(k, x) - 1
        t = (x - k[i]) / (k[i + 1] - k[i])
        return math.hypot((1 - t) * s[i], t * s[i + 1])

    def predict(self, x: float, bs: float = 0.0, group: int = 0) -> Estimate:
        m1 = m2 = d2 = u2 = 0.0
        for c, f, w, vals in self.fits:
            m, d, u = self.shape(vals, x)
            m += c * bs
            if group:
                m, d, u = m * f, d * f, u * f
            m1 += w * m
            m2 += w * m * m
            d2 += w * d * d
            u2 += w * u * u
        between = max(0.0, m2 - m1 * m1)  # the per-request term's own uncertainty
        n2 = self.noise(x) ** 2 + (0.002 * m1) ** 2
        return Estimate.split(m1, math.sqrt(d2 + between + n2), math.sqrt(u2 + between + n2))


def per_request_plane(cells: Sequence[Cell]) -> tuple[float, float] | None:
    """c of the plane y = a + b·x + c·bs through the cells (weighted least squares, the weights
    their inverse variances; group 0 only) and its standard deviation, the scatter about the plane
    counted when it exceeds the cells' own; None where the cells cannot tell c from b (one chain
    length: x proportional to bs) or are fewer than four. The monotone curve alone pins c only
    through points that would break its monotonicity, which a few lone noisy windows decide (the
    real CPU engine's launches of K 3 and K 5 in benchmarks/data/schedule_refits_2026-12-03/run-1:
    c 0.04 ms a request against the plane's 0.51 ± 0.16; 0.52 ± 0.03 from all nine launches of
    tests/data/real-engine-c8); the plane borrows strength across x, and bends where tile steps do,
    so it centres a prior (``fit_monotone``'s ``plane``) and does not replace the curve."""
    pts = [c for c in cells if not c.group and c.var > 0]
    if len(pts) < 4:
        return None
    m = [[0.0] * 3 for _ in range(3)]
    v = [0.0] * 3
    for c in pts:
        row, w = (1.0, c.x, c.bs), 1.0 / c.var
        for i in range(3):
            v[i] += w * row[i] * c.y
            for j in range(3):
                m[i][j] += w * row[i] * row[j]
    inv = inverse(m)
    if inv is None:
        return None
    coef = [sum(inv[i][j] * v[j] for j in range(3)) for i in range(3)]
    chi2 = sum((c.y - coef[0] - coef[1] * c.x - coef[2] * c.bs) ** 2 / c.var for c in pts)
    var_c = inv[2][2] * max(1.0, chi2 / (len(pts) - 3))
    if not (var_c > 0 and math.isfinite(var_c)):
        return None
    return coef[2], math.sqrt(var_c)


def _held_out(
    knots: list[float], where: list[int], r: list[float], inv: list[float], num: list[float], wsum: list[float]
) -> float | None:
    """Log likelihood of a per-request cost (and tree factor) from how well the monotone curve
    through the other cells predicts each cell (leave one out: a cell's value against the curve
    of the rest at its token count, interpolated), the errors' common scale profiled out
    (−m/2 · log SSE); None when fewer than three cells lie inside the span of the others.

    The in-sample fit cannot weigh c: the curve passes through every lone cell whatever c is and
    resists only where c would break its monotonicity, so a cost per request reads as a step in
    the curve where the batch sizes jump (the real engine's run 2 of
    benchmarks/data/schedule_refits_2026-12-03: c 0.03 ms in-sample, a step at 31-34 tokens
    where the windows go from 4 to 9 requests). Held out, a step the cell's neighbours do not
    show costs what it mispredicts."""
    errs = []
    for i, rj, wj in zip(where, r, inv, strict=True):
        n2, w2 = num[:], wsum[:]
        n2[i] -= rj * wj
        w2[i] -= wj
        keep = [k for k in range(len(knots)) if w2[k] > 1e-9 * wsum[k]]
        if not keep or knots[keep[0]] > knots[i] or knots[keep[-1]] < knots[i]:
            continue  # past the others' ends: an extrapolation, not a test of c
        vals = pav([n2[k] / w2[k] for k in keep], [w2[k] for k in keep])
        xs = [knots[k] for k in keep]
        q = bisect.bisect_left(xs, knots[i])
        if xs[q] == knots[i]:
            pred = vals[q]
        else:
            t = (knots[i] - xs[q - 1]) / (xs[q] - xs[q - 1])
            pred = vals[q - 1] + t * (vals[q] - vals[q - 1])
        errs.append((rj - pred) ** 2 * wj)
    if len(errs) < 3:
        return None
    return -0.5 * len(errs) * math.log(max(sum(errs), 1e-300))


def fit_monotone(
    cells: Sequence[Cell],
    per_request: bool = False,
    factor_prior: Callable[[float], float] | None = None,
    grid: int = 9,
    tokens: bool = False,
    plane: bool = False,
) -> MonotoneCurve:
    """Fit a MonotoneCurve to cells. With ``per_request``, c is given a grid over [0, c_max]
    (c_max: half the smallest value per request measured) and an exponential prior whose mean is a
    tenth of the smallest value per request (with ``plane``, where ``per_request_plane`` tells c
    from the slope: normal about the plane's c, its sd at least one grid step). With cells of
    group 1 and ``factor_prior`` (the log prior density of f), f gets a grid over 0.8-1.6. The
    posterior weights come from how well each (c, f) lets the points at one x agree (their
    variances: windows and launch spread); with the plane's prior, from how well the curve through
    the other cells predicts each one held out (``_held_out``). The in-sample weighing stays the
    default: with it, ``tune`` on benchmarks/advisor_worlds.py's GPU-shaped worlds (their cost per
    request small) is 2-11 cases of 360 better than with the held-out weighing or a looser prior
    (measured 2026-12-03)."""
    if not cells:
        raise ValueError("no points to fit")
    knots = sorted({round(c.x, 6) for c in cells})
    at = {x: i for i, x in enumerate(knots)}
    where = [at[round(c.x, 6)] for c in cells]
    cs = [0.0]
    scale = 1.0
    centre: tuple[float, float] | None = None
    if per_request and len({c.bs for c in cells}) > 1:
        cmax = 0.5 * min(c.y / c.bs for c in cells if c.bs > 0)
        cs = [cmax * j / (grid - 1) for j in range(grid)]
        scale = max(0.2 * cmax, 1e-12)
        flat = per_request_plane(cells) if plane else None
        if flat is not None and flat[1] < cmax:
            centre = (flat[0], max(flat[1], cmax / (grid - 1)))

    def c_prior(c: float) -> float:
        return -c / scale if centre is None else -0.5 * ((c - centre[0]) / centre[1]) ** 2

    factored = factor_prior is not None and any(c.group for c in cells)
    fs = [0.8 * 2.0 ** (j / 12) for j in range(13)] if factored else [1.0]
    logs = []
    tables = []
    knot_var = [0.0] * len(knots)
    for c in cs:
        for f in fs:
            r, inv = [], []
            for cell in cells:
                k = f if cell.group else 1.0
                r.append((cell.y / k) - c * cell.bs)
                inv.append(k * k / max(cell.var, 1e-12))
            num = [0.0] * len(knots)
            wsum = [0.0] * len(knots)
            for i, ri, w in zip(where, r, inv, strict=True):
                num[i] += ri * w
                wsum[i] += w
            vals = pav([n / w for n, w in zip(num, wsum, strict=True)], wsum)
            chi2 = sum((ri - vals[i]) ** 2 * w for i, ri, w in zip(where, r, inv, strict=True))
            held = _held_out(knots, where, r, inv, num, wsum) if centre is not None else None
            fit_term = -0.5 * chi2 if held is None else held
            logs.append(fit_term + c_prior(c) + (factor_prior(f) if factored and factor_prior else 0.0))
            tables.append((c, f, vals, wsum))
    top = max(logs)
    ws = [math.exp(x - top) for x in logs]
    tot = sum(ws)
    keep = [(c, f, w / tot, vals, wsum) for (c, f, vals, wsum), w in zip(tables, ws, strict=True) if w / tot > 1e-4]
    norm = sum(k[2] for k in keep)
    for _, _, w, _, wsum in keep:
        for i in range(len(knots)):
            knot_var[i] += w / norm / wsum[i]
    sds = [math.sqrt(v) for v in knot_var]
    return MonotoneCurve(knots, [(c, f, w / norm, v) for c, f, w, v, _ in keep], sds, len(cells), factored, tokens)


def log_sides(e: Estimate) -> tuple[float, float]:
    """The 95 % interval of a positive estimate as log-distances below and above its mean."""
    lo = max(e.lo, e.mean * 1e-3)
    return math.log(e.mean / lo), math.log(e.hi / e.mean) if e.hi > e.mean else 0.0
