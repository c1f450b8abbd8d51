"""The cost model's calibration to the benchmarks: ``1/goodput = a/model + s``, s the time per output
token a benchmark spends outside the decode cycles (prefills, ramp), a ≈ 1 (the windows time the
cycles)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuitune.decide.fitting import Estimate, log_sides


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
        down, up = log_sides(g)
        sd_down = math.hypot(share * down / 1.96, rel)
        sd_up = math.hypot(share * up / 1.96, rel)
        mean = 1.0 / y
        return Estimate.split(mean, mean * (1 - math.exp(-sd_down)), mean * (math.exp(sd_up) - 1))

    def to_dict(self) -> dict:
        return {"a": self.a, "s_per_token": self.s, "points": self.points}


def fit_calibration(pairs: list[tuple[float, float]], noise: float) -> Calibration:
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
