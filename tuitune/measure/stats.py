"""Statistics for benchmark comparisons: bootstrap CIs of medians, exact Mann-Whitney U.

Stdlib only. The bootstrap uses a seeded RNG so that a report is reproducible. The Mann-Whitney
p-value is exact (the null distribution of U counted by dynamic programming), which matters at the
small sample sizes of server launches: with 4 launches per arm p < 0.05 is just reachable.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from statistics import median

from tuitune.measure.metrics import quantile


def bootstrap_median_ci(
    values: Sequence[float], level: float = 0.95, n_boot: int = 2000, seed: int = 12345
) -> tuple[float, float]:
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    if len(vals) == 1:
        return vals[0], vals[0]
    rng = random.Random(seed)
    n = len(vals)
    meds = sorted(median(rng.choices(vals, k=n)) for _ in range(n_boot))
    alpha = (1 - level) / 2
    return quantile(meds, alpha), quantile(meds, 1 - alpha)


def bootstrap_ci(
    sample: Sequence, statistic: Callable[[Sequence], float], level: float = 0.95, n_boot: int = 2000, seed: int = 24680
) -> tuple[float, float]:
    """Percentile bootstrap CI of ``statistic`` over ``sample`` (any items, resampled whole)."""
    if not sample:
        return math.nan, math.nan
    rng = random.Random(seed)
    vals = sorted(statistic(rng.choices(sample, k=len(sample))) for _ in range(n_boot))
    alpha = (1 - level) / 2
    return quantile(vals, alpha), quantile(vals, 1 - alpha)


def bootstrap_ratio_ci(
    a: Sequence,
    b: Sequence,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 54321,
    statistic: Callable[[Sequence], float] = median,
) -> tuple[float, float]:
    """CI of statistic(b) / statistic(a) (medians unless told), resampling each arm independently."""
    if statistic is median:
        a = [v for v in a if math.isfinite(v)]
        b = [v for v in b if math.isfinite(v)]
    if not a or not b:
        return math.nan, math.nan
    rng = random.Random(seed)
    ratios = []
    for _ in range(n_boot):
        ma = statistic(rng.choices(a, k=len(a)))
        mb = statistic(rng.choices(b, k=len(b)))
        if ma > 0:
            ratios.append(mb / ma)
    ratios.sort()
    alpha = (1 - level) / 2
    return quantile(ratios, alpha), quantile(ratios, 1 - alpha)


@lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of arrangements giving each U value, for sample sizes m, n (no ties)."""
    # f[i][j][u]: built iteratively over (i, j) with the recurrence f(i,j,u) = f(i-1,j,u-j) + f(i,j-1,u)
    prev_row = [[1] for _ in range(n + 1)]  # i = 0: only U = 0
    for i in range(1, m + 1):
        row = [[1]]  # j = 0: only U = 0
        for j in range(1, n + 1):
            size = i * j + 1
            cur = [0] * size
            a = prev_row[j]  # (i-1, j): shift by j
            for u, c in enumerate(a):
                if c:
                    cur[u + j] += c
            b = row[j - 1]  # (i, j-1)
            for u, c in enumerate(b):
                if c:
                    cur[u] += c
            row.append(cur)
        prev_row = row
    return tuple(prev_row[n])


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """U statistic of ``a`` and the two-sided p-value (exact without ties for small samples,
    normal approximation with tie correction otherwise)."""
    a = [v for v in a if math.isfinite(v)]
    b = [v for v in b if math.isfinite(v)]
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        return math.nan, 1.0
    combined = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    ranks = [0.0] * len(combined)
    i = 0
    ties = []
    while i < len(combined):
        j = i
        while j + 1 < len(combined) and combined[j + 1][0] == combined[i][0]:
            j += 1
        r = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[k] = r
        if j > i:
            ties.append(j - i + 1)
        i = j + 1
    r_a = sum(r for r, (_, g) in zip(ranks, combined, strict=False) if g == 0)
    u = r_a - m * (m + 1) / 2
    mean_u = m * n / 2
    if not ties and m * n <= 2500:
        counts = _u_counts(m, n)
        total = sum(counts)
        lo = min(u, m * n - u)
        tail = sum(counts[: int(math.floor(lo)) + 1]) / total
        return u, min(1.0, 2 * tail)
    tie_term = sum(t**3 - t for t in ties) / ((m + n) * (m + n - 1)) if ties else 0.0
    var = m * n / 12 * ((m + n + 1) - tie_term)
    if var <= 0:
        return u, 1.0
    z = (abs(u - mean_u) - 0.5) / math.sqrt(var)
    p = math.erfc(max(z, 0.0) / math.sqrt(2))
    return u, min(1.0, p)


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    min_effect: float = 0.01,
    alpha: float = 0.05,
    level: float = 0.95,
) -> dict:
    """Verdict for candidate vs baseline (higher is better, e.g. tok/s).

    "faster"/"slower" need both a significant Mann-Whitney p and a CI of the ratio of medians that
    lies entirely beyond ±min_effect; anything else is "no significant difference".
    """
    med_a = median(baseline) if baseline else math.nan
    med_b = median(candidate) if candidate else math.nan
    ratio = med_b / med_a if baseline and candidate and med_a > 0 else math.nan
    lo, hi = bootstrap_ratio_ci(baseline, candidate, level)
    _, p = mann_whitney_u(baseline, candidate)
    verdict = "no significant difference"
    if p < alpha and math.isfinite(lo):
        if lo > 1 + min_effect:
            verdict = "faster"
        elif hi < 1 - min_effect:
            verdict = "slower"
    return {
        "baseline_median": med_a,
        "candidate_median": med_b,
        "ratio": ratio,
        "ratio_ci": [lo, hi],
        "p_value": p,
        "verdict": verdict,
        "min_effect": min_effect,
        "n_baseline": len(baseline),
        "n_candidate": len(candidate),
    }


def verdict_why(cmp: dict, alpha: float = 0.05) -> str:
    """Why ``compare`` gave its verdict, in one clause naming the p-value and the ratio's interval:
    "faster"/"slower" need both; a small p with an interval that reaches 1 ± min_effect is not enough."""
    lo, hi = cmp["ratio_ci"]
    p, m = cmp["p_value"], cmp.get("min_effect", 0.01)
    ci = f"the ratio's 95% CI {lo:.3f}-{hi:.3f}"
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(p)):
        return "too few values to compare"
    if cmp["verdict"] == "faster":
        return f"p = {p:.3f} < {alpha} and {ci} lies above {1 + m:.2f}"
    if cmp["verdict"] == "slower":
        return f"p = {p:.3f} < {alpha} and {ci} lies below {1 - m:.2f}"
    if p >= alpha:
        return f"p = {p:.3f} is not below {alpha}"
    return f"p = {p:.3f} < {alpha}, but {ci} reaches within {m:.0%} of 1"


def legend(min_effect: float = 0.01, alpha: float = 0.05) -> str:
    """The marks of the tables that decide (runs, sweep), explained in one line."""
    return (
        f"▲ faster / ▼ slower: p < {alpha} (Mann-Whitney) and the ratio's 95% CI entirely beyond 1 ± {min_effect:.0%}; "
        f"≈ no significant difference: either fails (a small p whose interval reaches 1 ± {min_effect:.0%} is not enough)"
    )
