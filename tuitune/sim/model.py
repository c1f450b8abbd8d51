"""The simulator's cost model: how long one decode cycle takes and how many tokens it yields.

This is a *model* fitted to the seed measurements (FACTS.md §1), not a prediction of real
hardware. It exists so that tuitune can be developed, demonstrated and tested end to end without
a GPU, and so that the effects the seeds saw (NCCL tuning speeds up every all-reduce; verify time
is dominated by a fixed cost; 2 draft steps beat 5) show up with the right sizes.

Structure (all times in ms, per cycle, batch size ``bs``):

* every target forward is ``compute + comm``; ``comm`` is the all-reduce part, multiplied by
  ``nccl_factor(env)`` (1.0 untuned) on PCIe boxes. With NVLink and SGLang's custom all-reduce
  left on, messages below 8 MiB bypass NCCL: ``comm`` is small and the NCCL variables do nothing.
* baseline decode step: ``BASE_COMPUTE + BASE_COMM + bs * BASE_PER_SEQ`` (comm scaled).
* speculative cycle: ``draft`` (DRAFT_PER_STEP per step) + ``verify`` (fixed + per token, each
  split into compute and comm) + ``extend`` + a scheduler overhead that shrinks with
  ``--num-continuous-decode-steps``.
* acceptance: chain drafting with per-position conditional acceptance ``a_i`` (the acceptance
  profile); expected tokens a cycle ``E = 1 + a1 + a1*a2 + …``. With topk > 1 each position gets
  ``topk`` independent chances: ``1 - (1 - a_i)^topk``, capped by the tree's draft-token budget.

Fit (seed C1..C8, single stream): untuned verify fixed 22.5 ms, 1.03 ms a token; tuned both about
×0.76; baseline 15.9 ms untuned, 11.26 ms tuned. Splitting compute/comm so that the tuned NCCL
set multiplies comm by ~0.40 reproduces all of them within ±10 % (``benchmarks/sim_calibration.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Baseline (no speculation) decode step, bs = 1 -> 15.9 ms untuned, 11.26 ms tuned.
BASE_COMPUTE = 8.17
BASE_COMM = 7.73
BASE_PER_SEQ = 0.35  # extra compute per running sequence beyond the first

# Speculative verify: fixed and per-token costs, each compute + comm.
VERIFY_FIXED_COMPUTE = 13.5
VERIFY_FIXED_COMM = 9.0
VERIFY_TOKEN_COMPUTE = 0.613
VERIFY_TOKEN_COMM = 0.417

DRAFT_PER_STEP = 0.2
DRAFT_TOPK_EXTRA = 0.03  # per extra branch per step
EXTEND = 0.2
SCHED_OVERHEAD = 0.2  # divided by --num-continuous-decode-steps

# NVLink with custom all-reduce: comm shrinks to this fraction and ignores NCCL variables.
NVLINK_CUSTOM_AR_COMM = 0.12
NVLINK_NCCL_COMM = 0.55  # NVLink box with custom all-reduce disabled: NCCL over NVLink

ACCEPTANCE_PROFILES: dict[str, tuple[float, ...]] = {
    # Conditional acceptance per draft position, from the seeds (about 47 % overall).
    "seed": (0.65, 0.42, 0.22, 0.20, 0.18, 0.18, 0.16, 0.15, 0.14, 0.13),
    # A better drafter (accept length 3.2-3.5 at 5-6 steps).
    "strong": (0.85, 0.75, 0.65, 0.58, 0.52, 0.47, 0.43, 0.40, 0.37, 0.35),
    # The seeds' drafter before the hidden-state wiring fix (about 19 %).
    "broken": (0.25, 0.12, 0.08, 0.06, 0.05, 0.04, 0.04, 0.03, 0.03, 0.03),
}


def _proto_factor(value: str) -> float:
    tokens = [t.strip().lower() for t in value.replace(";", ",").split(",") if t.strip()]
    if not tokens:
        return 1.0
    if tokens[0].startswith("^"):
        excluded = {t.lstrip("^") for t in tokens}
        # Excluding Simple leaves LL/LL128 to choose from: mostly LL at decode sizes.
        return 0.65 if "simple" in excluded else 1.0
    chosen = {t.split(":")[-1] for t in tokens}
    if chosen == {"ll"}:
        return 0.60
    if chosen == {"ll128"}:
        return 0.80
    if "ll" in chosen:
        return 0.70
    return 1.0


def _algo_factor(value: str) -> float:
    v = value.lower()
    if "ring" in v and "tree" not in v:
        return 0.92
    if "tree" in v and "ring" not in v:
        return 1.06
    return 1.0


def _p2p_factor(value: str) -> float:
    # On a PCIe box P2P across the root complex is disabled unless the level allows it.
    levels = {"LOC": 1.15, "NVL": 1.1, "PIX": 1.05, "PXB": 1.0, "PHB": 0.95, "SYS": 0.84}
    legacy = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}
    v = value.strip()
    if v.isdigit():
        v = legacy.get(v, "SYS")
    return levels.get(v, 1.0)


def _int(value: str, default: int) -> int:
    try:
        return int(value.strip())
    except ValueError:
        return default


def nccl_factor(env: dict[str, str]) -> float:
    """Multiplier on the all-reduce time for a set of NCCL variables (1.0 = none set)."""
    f = 1.0
    if "NCCL_PROTO" in env:
        f *= _proto_factor(env["NCCL_PROTO"])
    if "NCCL_ALGO" in env:
        f *= _algo_factor(env["NCCL_ALGO"])
    if "NCCL_P2P_LEVEL" in env:
        f *= _p2p_factor(env["NCCL_P2P_LEVEL"])
    if env.get("NCCL_P2P_DISABLE", "0").strip() == "1":
        f *= 1.25
    channels = env.get("NCCL_MAX_NCHANNELS") or env.get("NCCL_MAX_CTAS")
    if channels is not None:
        n = _int(channels, 32)
        f *= 0.92 if 8 <= n <= 24 else (1.1 if n < 4 else 1.0)
    if "NCCL_BUFFSIZE" in env:
        b = _int(env["NCCL_BUFFSIZE"], 4194304)
        f *= 0.94 if b >= 8 * 1024 * 1024 else (1.08 if b < 1024 * 1024 else 1.0)
    if "NCCL_NTHREADS" in env:
        n = _int(env["NCCL_NTHREADS"], 512)
        f *= 1.0 if n >= 256 else 1.12
    return f


@dataclass(frozen=True, slots=True)
class SimConfig:
    tp_size: int = 8
    topology: str = "pcie"  # pcie | nvlink
    custom_all_reduce: bool = True  # False with --disable-custom-all-reduce
    continuous_decode_steps: int = 1
    algorithm: str | None = None  # None = no speculation
    steps: int = 0
    topk: int = 1
    draft_tokens: int = 0
    acceptance: tuple[float, ...] = ACCEPTANCE_PROFILES["seed"]
    env_factor: float = 1.0  # nccl_factor of the process environment
    launch_factor: float = 1.0  # this launch's speed (clocks, placement): launches differ a little
    internode_ms: float = 0.0  # all-reduce time across nodes a forward (multinode.internode_ms)

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def comm_scale(self) -> float:
        if self.tp_size <= 1:
            return 0.0
        size = (self.tp_size - 1) / 7.0  # the fit is for TP 8
        if self.topology == "nvlink":
            if self.custom_all_reduce:
                return NVLINK_CUSTOM_AR_COMM * size
            return NVLINK_NCCL_COMM * size * self.env_factor
        return size * self.env_factor


@dataclass(frozen=True, slots=True)
class CycleCost:
    draft_ms: float
    verify_ms: float
    extend_ms: float
    other_ms: float

    @property
    def cycle_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.extend_ms + self.other_ms


def cycle_cost(cfg: SimConfig, bs: int = 1) -> CycleCost:
    """Mean cost of one decode cycle (speculative) or one decode step (baseline)."""
    comm = cfg.comm_scale()
    other = SCHED_OVERHEAD / max(1, cfg.continuous_decode_steps)
    bs = max(1, bs)
    if not cfg.speculative:
        step = BASE_COMPUTE + BASE_COMM * comm + BASE_PER_SEQ * (bs - 1) + cfg.internode_ms
        return CycleCost(0.0, step * cfg.launch_factor, 0.0, other * cfg.launch_factor)
    tokens = bs * cfg.draft_tokens
    verify = (VERIFY_FIXED_COMPUTE + VERIFY_FIXED_COMM * comm + cfg.internode_ms
              + tokens * (VERIFY_TOKEN_COMPUTE + VERIFY_TOKEN_COMM * comm))
    draft = cfg.steps * (DRAFT_PER_STEP + DRAFT_TOPK_EXTRA * (cfg.topk - 1)) * (1 + 0.05 * (bs - 1))
    extend = EXTEND * (1 + 0.05 * (bs - 1))
    f = cfg.launch_factor
    return CycleCost(draft * f, verify * f, extend * f, other * f)


def position_acceptance(cfg: SimConfig) -> list[float]:
    """Probability that draft position i is accepted given all before it were."""
    probs = []
    for i in range(cfg.steps):
        a = cfg.acceptance[min(i, len(cfg.acceptance) - 1)]
        probs.append(1.0 - (1.0 - a) ** max(1, cfg.topk))
    # A tree with fewer draft tokens than steps*topk+1 cannot reach the deepest positions.
    depth = min(cfg.steps, max(0, cfg.draft_tokens - 1)) if cfg.topk == 1 else cfg.steps
    return probs[:depth]


def expected_accept_len(cfg: SimConfig) -> float:
    """Expected tokens per cycle, bonus token included (1.0 for a baseline server)."""
    if not cfg.speculative:
        return 1.0
    e, p = 1.0, 1.0
    for a in position_acceptance(cfg):
        p *= a
        e += p
    return e


def expected_tok_s(cfg: SimConfig, bs: int = 1) -> float:
    """Single-request decode rate the model predicts (tokens a second of one stream)."""
    return expected_accept_len(cfg) / cycle_cost(cfg, bs).cycle_ms * 1000.0


def prefill_ms(cfg: SimConfig, prompt_tokens: int) -> float:
    comm = cfg.comm_scale()
    return 18.0 + 0.02 * prompt_tokens + BASE_COMM * comm + cfg.internode_ms


def draw_accepted(cfg: SimConfig, accept) -> int:
    """Tokens one cycle yields for one request: 1 + the accepted draft prefix.

    ``accept(i, a)`` says whether draft position ``i`` (acceptance probability ``a``) is accepted.
    """
    n = 1
    if cfg.speculative:
        for i, a in enumerate(position_acceptance(cfg)):
            if not accept(i, a):
                break
            n += 1
    return n


PHI = (5 ** 0.5 - 1) / 2


class QuasiDraws:
    """Low-discrepancy acceptance draws: one Weyl sequence per draft position, so each position's
    acceptance frequency converges to its rate as 1/N instead of 1/sqrt(N) (for low-noise
    comparisons between configurations; ``--sim-draws quasi``)."""

    def __init__(self, seed: int):
        self.offsets = [((seed + 1) * (i + 3) * PHI) % 1.0 for i in range(64)]
        self.counts = [0] * 64

    def __call__(self, i: int, a: float) -> bool:
        self.counts[i] += 1
        return (self.offsets[i] + self.counts[i] * PHI) % 1.0 < a


def jitter(rng, sigma: float = 0.02) -> float:
    """Multiplicative noise with mean exactly 1 (so averages match the model)."""
    return math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2.0)
