"""Small weighted least-squares fits in pure Python (a handful of parameters, tens of points).

The cost model fits curves of three or four parameters to a few dozen profile windows; a
numerical library would be a large dependency for that. ``least_squares`` is a damped
Gauss-Newton (Levenberg-Marquardt) with a numerical Jacobian, bounds by clamping, and optional
Gaussian priors on parameters (as extra residuals), which keep unidentifiable parameters (two
that the data cannot tell apart) near a sensible value instead of wandering; it returns the
parameter covariance so that predictions carry an uncertainty.
"""

from __future__ import annotations

import math
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


def least_squares(
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
