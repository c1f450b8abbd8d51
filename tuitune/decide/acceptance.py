"""Per-position conditional acceptance of a draft, fitted from the profile windows.

From the accept-length histograms, ``P(len ≥ k+1 | len ≥ k)``, a Beta posterior widened to the
spread between windows (a bootstrap over windows); positions never drafted follow a random walk in
log-odds from the deepest one measured with a damped drift (no decay assumed: acceptance may fall,
plateau or rise), its spread growing with the distance. A tree's expected accept length follows
from the chain's acceptance and a sibling-rank decay (``tree_tau``, FACTS §6), fitted from tree
launches when some were measured.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from tuitune.base.events import ProfileWindow
from tuitune.decide.fitting import Estimate, weighted_line
from tuitune.decide.launch import Config, FitError, Launch, config_of_window

MAX_DEPTH = 16  # acceptance is modelled for this many draft positions
RANDOM_WALK = 0.35  # log-odds sd one more undrafted position adds to the acceptance of the next
DAMPING = 0.5  # each undrafted position takes this share of the previous one's drift
# sibling-rank decay b of the tree model until a tree is measured: the published data of FACTS §6 fit
# b = 0.58 (SpecForge #339), 0.7 (EAGLE-1's six models) and 0.89 (Sequoia's acceptance by sibling
# rank, least squares over ranks 2-6); their mean, with a spread wider than theirs
SIBLING_PRIOR = (0.72, 0.2)
BOOTSTRAP = 48  # resamples of the windows


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
