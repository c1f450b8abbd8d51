"""Statistics for benchmark comparisons: bootstrap CIs of medians, exact Mann-Whitney U, and the
decision of a launch-level A/B (one look, or a group-sequential design with its repeated interval).

Stdlib only. The bootstrap uses a seeded RNG so that a report is reproducible. The Mann-Whitney
p-value is exact (the null distribution of U counted by dynamic programming), which matters at the
small sample sizes of server launches: with 4 launches per arm p < 0.05 is just reachable.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    n_boot: int = 2000,
) -> dict:
    """Verdict for candidate vs baseline (higher is better, e.g. tok/s).

    "faster"/"slower" need both a significant Mann-Whitney p and a CI of the ratio of medians that
    lies entirely beyond ±min_effect; anything else is "no significant difference". ``n_boot`` 0:
    no bootstrap (the interval is NaN, the verdict "no significant difference").
    """
    med_a = median(baseline) if baseline else math.nan
    med_b = median(candidate) if candidate else math.nan
    ratio = med_b / med_a if baseline and candidate and med_a > 0 else math.nan
    lo, hi = bootstrap_ratio_ci(baseline, candidate, level, n_boot) if n_boot > 0 else (math.nan, math.nan)
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


# ---- the decision of a launch-level A/B: the exact Mann-Whitney test, once or at several looks ----
#
# `tuitune ab` decides on launches (one number each). One look (the fixed design): the exact two-sided
# Mann-Whitney test at level alpha. Several looks (the sequential design: a look after every round
# from `first` to `last` launches a side, stopping at the first that decides): a group-sequential
# Mann-Whitney test whose per-look critical values spend alpha with the Lan-DeMets Pocock-type
# function alpha·ln(1 + (e - 1)·t), t = rounds / last. Under "no difference" (every launch value
# drawn from one continuous distribution) the ranks of the launches are a uniformly random order
# whatever that distribution is, so the chance that any look crosses is a property of the design
# alone: it is computed by simulating random orders (SIMS of them, a fixed seed: deterministic),
# and each look's budget is lowered by two Monte-Carlo standard errors so that the simulation's own
# error does not push the overall rate above alpha. The interval is the test inverted: the ratios
# r for which B / r against A would not cross at that look (the m·n ratios b_j / a_i, ordered;
# Moses' interval). Under a multiplicative shift (B's launches are A's times r, same spread) it
# holds the true ratio at every look at once with probability ≥ 1 - alpha, which is what makes
# "stop when the interval decides" safe; one look's interval is the ordinary exact one.

SIMS = 40000  # simulated null orders per sequential design
SEQUENTIAL_METHOD = (
    "group-sequential exact Mann-Whitney test, Lan-DeMets Pocock-type alpha spending alpha·ln(1+(e-1)t) "
    "over looks after every round, boundaries from simulated null orders; interval: the test inverted "
    "(repeated confidence interval)"
)
FIXED_METHOD = "exact two-sided Mann-Whitney test; interval: the test inverted (Moses' exact interval)"


def u_critical(m: int, n: int, alpha: float) -> int | None:
    """The largest U at which the exact two-sided test of m against n values still rejects at level
    alpha (2 P(U ≤ c) < alpha); None when no U does (too few values)."""
    if m < 1 or n < 1:
        return None
    counts = _u_counts(m, n)
    total = sum(counts)
    crit, tail = None, 0
    for u, c in enumerate(counts):
        tail += c
        if 2 * tail / total >= alpha:
            break
        crit = u
    return crit


def u_level(m: int, n: int, c: int | None) -> float:
    """The exact two-sided level of rejecting at U ≤ c or U ≥ m·n - c (0 when c is None)."""
    if c is None:
        return 0.0
    counts = _u_counts(m, n)
    return min(1.0, 2 * sum(counts[: c + 1]) / sum(counts))


def u_count(a: Sequence[float], b: Sequence[float]) -> float:
    """Pairs (a_i, b_j) with b_j above a_i (ties count half): m·n when every B beats every A."""
    return sum(1.0 if y > x else 0.5 if y == x else 0.0 for x in a for y in b)


def _log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return sorted(math.log(y) - math.log(x) for x in a for y in b)


def shift_interval(a: Sequence[float], b: Sequence[float], c: int | None) -> tuple[float, float]:
    """The ratio B/A interval of the test that rejects at U ≤ c or U ≥ m·n - c, inverted: [the
    (c+1)-th smallest, the (c+1)-th largest] of the ratios b_j / a_i (values > 0). No c: (0, inf)."""
    if c is None or not a or not b:
        return 0.0, math.inf
    d = _log_ratios(a, b)
    return math.exp(d[c]), math.exp(d[len(d) - 1 - c])


def hodges_lehmann(a: Sequence[float], b: Sequence[float]) -> float:
    """The ratio B/A the Mann-Whitney test is centred on: the median of the ratios b_j / a_i."""
    return math.exp(median(_log_ratios(a, b))) if a and b else math.nan


def pocock_spending(t: float, alpha: float) -> float:
    """Lan-DeMets' Pocock-type spending function: the error spent by information fraction t."""
    return alpha * math.log(1 + (math.e - 1) * min(max(t, 0.0), 1.0))


@dataclass(frozen=True)
class Design:
    """Where an A/B looks (after ``first``, ``first`` + 1 … ``last`` launches a side) and the
    critical U of each look (None: that look cannot decide); ``nominal``: each look's own level."""

    first: int
    last: int
    alpha: float
    critical: tuple[int | None, ...]
    nominal: tuple[float, ...]
    null_rate: float  # the chance of crossing at some look when nothing differs (exact for one look)

    @property
    def sequential(self) -> bool:
        return self.last > self.first

    @property
    def method(self) -> str:
        return SEQUENTIAL_METHOD if self.sequential else FIXED_METHOD

    def at(self, rounds: int) -> tuple[int | None, float]:
        """(critical U, nominal level) of the look after ``rounds`` launches a side."""
        if not self.first <= rounds <= self.last:
            return None, 0.0
        return self.critical[rounds - self.first], self.nominal[rounds - self.first]

    def to_dict(self) -> dict:
        return {
            "first": self.first,
            "last": self.last,
            "alpha": self.alpha,
            "method": self.method,
            "null_rate": self.null_rate,
            "looks": [
                {"rounds": r, "critical_u": c, "nominal_level": lv}
                for r, c, lv in zip(range(self.first, self.last + 1), self.critical, self.nominal, strict=True)
            ],
        }


def _null_paths(first: int, last: int, sims: int, seed: int) -> list[list[int]]:
    """U (pairs where B is above A) at each look of ``sims`` random orders of equal arms."""
    rng = random.Random(seed)
    paths = []
    for _ in range(sims):
        xs: list[float] = []
        ys: list[float] = []
        u, path = 0, []
        for r in range(1, last + 1):
            x, y = rng.random(), rng.random()  # distinct almost surely: U is a whole number
            u += len(ys) - bisect.bisect_left(ys, x)  # earlier B above the new A
            bisect.insort(xs, x)
            u += bisect.bisect_left(xs, y)  # A (the new one too) below the new B
            bisect.insort(ys, y)
            if r >= first:
                path.append(u)
        paths.append(path)
    return paths


@lru_cache(maxsize=32)
def design(first: int, last: int, alpha: float = 0.05, sims: int = SIMS, seed: int = 2025) -> Design:
    """The fixed (first == last: exact) or sequential design of an A/B; see the notes above."""
    if first < 1 or last < first:
        raise ValueError(f"looks from {first} to {last} launches a side")
    if first == last:
        c = u_critical(first, first, alpha)
        lv = u_level(first, first, c)
        return Design(first, last, alpha, (c,), (lv,), lv)
    paths = _null_paths(first, last, sims, seed)
    alive = list(range(sims))
    crossed = 0
    crit: list[int | None] = []
    for k, r in enumerate(range(first, last + 1)):
        spend = pocock_spending(r / last, alpha)
        budget = (spend - 2 * math.sqrt(spend * (1 - spend) / sims)) * sims
        mn = r * r
        extreme: dict[int, int] = {}
        for i in alive:
            e = min(paths[i][k], mn - paths[i][k])
            extreme[e] = extreme.get(e, 0) + 1
        c, acc = None, crossed
        for e in range(mn // 2 + 1):
            acc += extreme.get(e, 0)
            if acc > budget:
                break
            c = e
        if c is not None:
            keep = [i for i in alive if min(paths[i][k], mn - paths[i][k]) > c]
            crossed += len(alive) - len(keep)
            alive = keep
        crit.append(c)
    nominal = tuple(u_level(r, r, c) for r, c in zip(range(first, last + 1), crit, strict=True))
    return Design(first, last, alpha, tuple(crit), nominal, crossed / sims)


def decide(a: Sequence[float], b: Sequence[float], d: Design) -> dict:
    """The look after len(a) == len(b) launches a side: "faster" / "slower" when U crosses this
    look's critical value (then the interval lies wholly above / below 1), else "undecided"."""
    n = min(len(a), len(b))
    c, nominal = d.at(n)
    u = u_count(a, b)
    lo, hi = shift_interval(a, b, c)
    mn = len(a) * len(b)
    out = "faster" if c is not None and u >= mn - c else "slower" if c is not None and u <= c else "undecided"
    return {
        "rounds": n,
        "u": u,
        "pairs": mn,
        "critical_u": c,
        "nominal_level": nominal,
        "interval": [lo, hi],
        "interval_level": 1 - nominal,
        "shift": hodges_lehmann(a, b),
        "decision": out,
    }


POWER_TRIALS = 2000  # simulated A/Bs per power figure (common random numbers: deterministic, monotone)


@lru_cache(maxsize=8)
def _normal_draws(last: int, trials: int, seed: int = 25) -> tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]:
    rng = random.Random(seed)
    return tuple(
        (tuple(rng.gauss(0, 1) for _ in range(last)), tuple(rng.gauss(0, 1) for _ in range(last)))
        for _ in range(trials)
    )


def design_power(d: Design, shift: float, trials: int = POWER_TRIALS) -> tuple[float, float]:
    """(chance of "faster", mean rounds a side run) when B's log value is A's + ``shift`` standard
    deviations (launches log-normal with one spread): the design's looks, simulated."""
    hits, rounds = 0, 0
    for za, zb in _normal_draws(d.last, trials):
        xs: list[float] = []
        ys: list[float] = []
        u = 0
        stop = d.last
        for r in range(1, d.last + 1):
            x, y = za[r - 1], shift + zb[r - 1]
            u += len(ys) - bisect.bisect_left(ys, x)
            bisect.insort(xs, x)
            u += bisect.bisect_left(xs, y)
            bisect.insort(ys, y)
            c = d.critical[r - d.first] if r >= d.first else None
            if c is not None and (u >= r * r - c or u <= c):
                hits += u >= r * r - c
                stop = r
                break
        rounds += stop
    return hits / trials, rounds / trials


@lru_cache(maxsize=64)
def detectable_shift(d: Design, power: float = 0.8) -> float | None:
    """The smallest shift (standard deviations of log value) the design calls "faster" with
    probability ``power``; None when no shift up to 12 sd is (a design that cannot decide)."""
    if all(c is None for c in d.critical) or design_power(d, 12.0)[0] < power:
        return None
    lo, hi = 0.0, 12.0
    for _ in range(18):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if design_power(d, mid)[0] >= power else (mid, hi)
    return hi
