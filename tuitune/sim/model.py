"""The simulator's cost model: how long one decode cycle takes for a batch, and how many tokens
each request of the batch gets from it.

This is a *model* of a machine, read from a machine file (``presets/machines/*.yaml``,
``--sim-machine``), not a prediction of real hardware. It exists so that tuitune can be developed,
demonstrated and tested end to end without a GPU, with the effects that decide a tuning question
showing up with the right sizes: NCCL tuning speeds up every all-reduce; the seeds' verify is
fixed-cost bound (2 draft steps beat 5); and as the batch grows, the verify forward's
``bs × draft_tokens`` tokens pass the GPU's memory-bound knee and speculation stops paying.

Costs (ms), for a batch of ``bs`` running requests with mean context ``ctx``:

* one target forward over ``n`` tokens: ``(mem^k + (ms_per_token·n)^k)^(1/k)`` (flat while
  memory-bound, then linear; ``k`` sets how sharp the knee is), plus the all-reduce ``comm_ms``
  (scaled by ``nccl_factor(env)`` where NCCL carries it, and by the TP size), plus attention over
  the KV cache ``kv_ms_per_token · bs · ctx``;
* baseline decode step: one target forward over ``bs`` tokens;
* speculative cycle: ``steps`` draft forwards over ``bs·topk`` tokens (same form, the draft's
  own curve) + one verify forward over ``bs·draft_tokens`` tokens (+ ``verify_extra_ms``, which
  only the seeds' box needs) + the draft extend ``extend_ms·(1 + 0.05·(bs−1))``; n-gram lookup
  (NGRAM, vLLM's ngram and suffix) runs no draft model: ``ngram_ms·bs`` on the host, no extend,
  its own acceptance (``ngram_acceptance``);
* both: the scheduler's ``sched_ms ÷ --num-continuous-decode-steps``.

Acceptance (FACTS.md §6): at depth ``d`` the target picks exactly one of the drafter's ranked
candidates: rank 1 with probability ``a_d`` (the machine's ``acceptance`` list), rank ``k ≥ 2``
with ``(1 − a_d)·((k−1)^−b − k^−b)`` (``b`` = ``sibling_decay``). SGLang's tree keeps the
``draft_tokens − 1`` nodes with the largest path probabilities (``topk`` at depth 1, then the
``topk²`` children of the top ``topk`` nodes per depth); a request's cycle yields 1 + the depth its
drawn path stays inside that tree. A chain (topk 1) reduces to ``E = 1 + a1 + a1·a2 + …``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

# an installed package holds the presets (machines included) as tuitune/presets; a checkout at the top
MACHINES_DIR = next(
    (
        d
        for d in (
            Path(__file__).resolve().parents[1] / "presets" / "machines",
            Path(__file__).resolve().parents[2] / "presets" / "machines",
        )
        if d.is_dir()
    ),
    Path(__file__).resolve().parents[2] / "presets" / "machines",
)
DEFAULT_MACHINE = "seed-pcie8"
# Mean context of a running request in steady state: tuitune's bench prompts (~25 tokens) plus
# half of the default 500 generated tokens.
DEFAULT_CONTEXT_TOKENS = 275
# With NVLink and SGLang's custom all-reduce on, small all-reduces bypass NCCL: this fraction of
# NCCL's time, whatever the NCCL variables say (FACTS.md §4).
NVLINK_CUSTOM_AR = 0.22

ACCEPTANCE_PROFILES: dict[str, tuple[float, ...]] = {
    # Conditional acceptance per draft position, from the seeds (about 47 % overall).
    "seed": (0.65, 0.42, 0.22, 0.20, 0.18, 0.18, 0.16, 0.15, 0.14, 0.13),
    # A better drafter (accept length 3.2-3.5 at 5-6 steps).
    "strong": (0.85, 0.75, 0.65, 0.58, 0.52, 0.47, 0.43, 0.40, 0.37, 0.35),
    # The seeds' drafter before the hidden-state wiring fix (about 19 %).
    "broken": (0.25, 0.12, 0.08, 0.06, 0.05, 0.04, 0.04, 0.03, 0.03, 0.03),
    # n-gram lookup (prompt lookup, no draft model): a chain that follows a repeat once one is
    # found. The first three from vLLM's CPU build on a random Llama (TESTING.md: per-position
    # 0.729, 0.529, 0.357 -> conditional 0.73, 0.73, 0.68), then falling by 8 % a position.
    "ngram": (0.73, 0.73, 0.68, 0.63, 0.58, 0.53, 0.49, 0.45, 0.41, 0.38),
}
MODEL_FREE = ("NGRAM", "SUFFIX")  # drafting by lookup in the request's tokens: no draft forward
NGRAM_MS = 0.02  # the lookup's host time per request and cycle (a trie / n-gram match)


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


# ---- machines ------------------------------------------------------------------------------------


class MachineError(ValueError):
    """A machine file that cannot be used; the message is one sentence naming the key."""


@dataclass(frozen=True, slots=True)
class Curve:
    """Time of one forward over ``n`` tokens: memory-bound floor, compute slope, knee sharpness."""

    mem_ms: float
    ms_per_token: float
    knee: float

    def __call__(self, n: float) -> float:
        k = self.knee
        return (self.mem_ms**k + (self.ms_per_token * max(n, 1)) ** k) ** (1.0 / k)


@dataclass(frozen=True, slots=True)
class Machine:
    name: str
    tp_size: int
    topology: str  # pcie | nvlink
    target: Curve
    comm_ms: float
    kv_ms_per_token: float
    draft: Curve
    extend_ms: float
    sched_ms: float
    acceptance: tuple[float, ...]
    launch_sigma: float = 0.01
    sibling_decay: float = 0.7
    verify_extra_ms: float = 0.0
    source: str = ""
    ngram_acceptance: tuple[float, ...] = ACCEPTANCE_PROFILES["ngram"]
    ngram_ms: float = NGRAM_MS


_NUM = (int, float)
# key -> (required, check, what is allowed); nested sections have their own tables.
_POS = (lambda v: isinstance(v, _NUM) and not isinstance(v, bool) and v > 0, "a number > 0")
_NONNEG = (lambda v: isinstance(v, _NUM) and not isinstance(v, bool) and v >= 0, "a number >= 0")
_TARGET = {
    "mem_ms": (True, *_POS),
    "ms_per_token": (True, *_NONNEG),
    "knee_sharpness": (True, lambda v: _POS[0](v) and v <= 20, "a number in (0, 20]"),
    "comm_ms": (True, *_NONNEG),
    "kv_ms_per_token": (True, *_NONNEG),
    "verify_extra_ms": (False, *_NONNEG),
}
_DRAFT = {"mem_ms": (True, *_POS), "ms_per_token": (True, *_NONNEG)}
_TOP = {
    "name": (True, lambda v: isinstance(v, str) and v.strip() != "", "a non-empty name"),
    "tp_size": (True, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "an integer >= 1"),
    "topology": (True, lambda v: v in ("pcie", "nvlink"), "pcie or nvlink"),
    "target": (True, None, "a section"),
    "draft": (True, None, "a section"),
    "extend_ms": (True, *_NONNEG),
    "sched_ms": (True, *_NONNEG),
    "acceptance": (
        True,
        lambda v: (
            isinstance(v, list)
            and v != []
            and all(isinstance(a, _NUM) and not isinstance(a, bool) and 0 <= a <= 1 for a in v)
        ),
        "a non-empty list of conditional acceptance rates in [0, 1], one per draft position",
    ),
    "launch_sigma": (False, *_NONNEG),
    "sibling_decay": (False, *_POS),
    "ngram_acceptance": (
        False,
        lambda v: (
            isinstance(v, list)
            and v != []
            and all(isinstance(a, _NUM) and not isinstance(a, bool) and 0 <= a <= 1 for a in v)
        ),
        "a non-empty list of conditional acceptance rates of n-gram lookup in [0, 1], one per draft position",
    ),
    "ngram_ms": (False, *_NONNEG),
}


def _check(where: str, data: Any, table: dict, prefix: str) -> dict:
    if not isinstance(data, dict):
        raise MachineError(f"{where}: {prefix.rstrip('.') or 'the file'} must be a mapping of keys")
    for key in data:
        if key not in table:
            raise MachineError(f"{where}: unknown key {prefix}{key} (allowed: {', '.join(table)})")
    for key, (required, ok, what) in table.items():
        if key not in data:
            if required:
                raise MachineError(f"{where}: {prefix}{key} is missing (it must be {what})")
            continue
        if ok is not None and not ok(data[key]):
            raise MachineError(f"{where}: {prefix}{key} must be {what} (got {data[key]!r})")
    return data


def machine_from_dict(data: Any, where: str = "machine") -> Machine:
    d = _check(where, data, _TOP, "")
    t = _check(where, d["target"], _TARGET, "target.")
    dr = _check(where, d["draft"], _DRAFT, "draft.")
    k = float(t["knee_sharpness"])
    return Machine(
        name=d["name"],
        tp_size=d["tp_size"],
        topology=d["topology"],
        target=Curve(float(t["mem_ms"]), float(t["ms_per_token"]), k),
        comm_ms=float(t["comm_ms"]),
        kv_ms_per_token=float(t["kv_ms_per_token"]),
        verify_extra_ms=float(t.get("verify_extra_ms", 0.0)),
        draft=Curve(float(dr["mem_ms"]), float(dr["ms_per_token"]), k),
        extend_ms=float(d["extend_ms"]),
        sched_ms=float(d["sched_ms"]),
        acceptance=tuple(float(a) for a in d["acceptance"]),
        launch_sigma=float(d.get("launch_sigma", 0.01)),
        sibling_decay=float(d.get("sibling_decay", 0.7)),
        source=where,
        ngram_acceptance=tuple(float(a) for a in d.get("ngram_acceptance", ACCEPTANCE_PROFILES["ngram"])),
        ngram_ms=float(d.get("ngram_ms", NGRAM_MS)),
    )


def machine_path(spec: str | Path | None) -> Path:
    """A machine file: a path, or the name of a shipped one (``h100-llama8b``); None = the default."""
    if spec is None:
        spec = DEFAULT_MACHINE
    p = Path(spec).expanduser()
    if p.is_file():
        return p
    shipped = MACHINES_DIR / f"{spec}.yaml"
    if "/" not in str(spec) and shipped.is_file():
        return shipped
    names = ", ".join(sorted(x.stem for x in MACHINES_DIR.glob("*.yaml")))
    raise MachineError(f"{spec}: no such machine file (shipped machines: {names})")


def load_machine(spec: str | Path | None = None) -> Machine:
    path = machine_path(spec)
    try:
        data = yaml.safe_load(path.read_text("utf-8"))
    except OSError as e:
        raise MachineError(f"{path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise MachineError(f"{path}: not valid YAML{at}") from None
    return machine_from_dict(data, str(path))


# ---- one configuration on one machine ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimConfig:
    machine: Machine
    tp_size: int | None = None  # None = the machine's
    custom_all_reduce: bool = True  # False with --disable-custom-all-reduce
    continuous_decode_steps: int = 1
    algorithm: str | None = None  # None = no speculation
    steps: int = 0
    topk: int = 1
    draft_tokens: int = 0
    acceptance: tuple[float, ...] | None = None  # None = the machine's
    env_factor: float = 1.0  # nccl_factor of the process environment
    launch_factor: float = 1.0  # this launch's speed (clocks, placement): launches differ a little
    internode_ms: float = 0.0  # all-reduce time across nodes a forward (multinode.internode_ms)
    tree: tuple[tuple[int, ...], ...] = field(default=(), compare=False)

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    @property
    def model_free(self) -> bool:
        return self.algorithm in MODEL_FREE

    @property
    def rates(self) -> tuple[float, ...]:
        if self.acceptance is not None:
            return self.acceptance
        return self.machine.ngram_acceptance if self.model_free else self.machine.acceptance

    def comm_ms(self) -> float:
        """All-reduce time of one target forward: within the node, plus across nodes (multi-node)."""
        return self._node_comm_ms() + self.internode_ms

    def _node_comm_ms(self) -> float:
        m = self.machine
        tp = self.tp_size if self.tp_size is not None else m.tp_size
        if tp <= 1 or m.tp_size <= 1:
            return 0.0
        size = (tp - 1) / (m.tp_size - 1)  # the ring all-reduce's steps grow with the ranks
        if m.topology == "nvlink" and self.custom_all_reduce:
            return m.comm_ms * NVLINK_CUSTOM_AR * size
        return m.comm_ms * size * self.env_factor


def sim_config(machine: Machine, *, algorithm=None, steps=0, topk=1, draft_tokens=0, **kw) -> SimConfig:
    """A SimConfig with its draft tree built (the tree depends on the acceptance and the budget)."""
    cfg = SimConfig(
        machine, algorithm=algorithm, steps=steps or 0, topk=topk or 1, draft_tokens=draft_tokens or 0, **kw
    )
    return replace(cfg, tree=build_tree(cfg)) if cfg.speculative else cfg


@dataclass(frozen=True, slots=True)
class CycleCost:
    draft_ms: float
    verify_ms: float
    extend_ms: float
    other_ms: float

    @property
    def cycle_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.extend_ms + self.other_ms


def cycle_cost(cfg: SimConfig, bs: int = 1, context: float = DEFAULT_CONTEXT_TOKENS) -> CycleCost:
    """Mean cost of one decode cycle (speculative) or one decode step (baseline) for a batch."""
    m = cfg.machine
    bs = max(1, bs)
    f = cfg.launch_factor
    other = m.sched_ms / max(1, cfg.continuous_decode_steps) * f
    fixed = cfg.comm_ms() + m.kv_ms_per_token * bs * context  # every target forward pays these
    if not cfg.speculative:
        return CycleCost(0.0, (m.target(bs) + fixed) * f, 0.0, other)
    verify = m.target(bs * cfg.draft_tokens) + fixed + m.verify_extra_ms
    if cfg.model_free:  # a lookup on the host per request; no draft model to run or to catch up
        return CycleCost(m.ngram_ms * bs * f, verify * f, 0.0, other)
    draft = cfg.steps * m.draft(bs * cfg.topk)
    extend = m.extend_ms * (1 + 0.05 * (bs - 1))
    return CycleCost(draft * f, verify * f, extend * f, other)


# ---- acceptance ------------------------------------------------------------------------------------


def rank_prob(a: float, k: int, b: float) -> float:
    """Probability that the target's token is the drafter's rank-k candidate at a depth."""
    return a if k == 1 else (1 - a) * ((k - 1) ** -b - k**-b)


def build_tree(cfg: SimConfig) -> tuple[tuple[int, ...], ...]:
    """The draft tree SGLang verifies: the ``draft_tokens − 1`` nodes with the largest path
    probabilities, each a tuple of candidate ranks from the root (a chain: (1,), (1, 1), …)."""
    rates, b, K = cfg.rates, cfg.machine.sibling_decay, max(1, cfg.topk)
    budget = max(0, min(cfg.draft_tokens - 1, cfg.steps * K))

    def a(d: int) -> float:
        return rates[min(d, len(rates) - 1)]

    # Best-first over path products: a child's product never exceeds its parent's, so the first
    # `budget` nodes popped form a tree. Each node expands to its top-K children (SGLang's pool).
    heap = [(-rank_prob(a(0), k, b), (k,)) for k in range(1, K + 1)]
    heapq.heapify(heap)
    chosen: list[tuple[int, ...]] = []
    while heap and len(chosen) < budget:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        if len(path) < cfg.steps:
            for k in range(1, K + 1):
                heapq.heappush(heap, (neg * rank_prob(a(len(path)), k, b), path + (k,)))
    return tuple(chosen)


def expected_accept_len(cfg: SimConfig) -> float:
    """Expected tokens per cycle per request, bonus token included (1.0 for a baseline server)."""
    if not cfg.speculative:
        return 1.0
    rates, b = cfg.rates, cfg.machine.sibling_decay
    total = 1.0
    for path in cfg.tree:
        p = 1.0
        for d, k in enumerate(path):
            p *= rank_prob(rates[min(d, len(rates) - 1)], k, b)
        total += p
    return total


def draw_rank(u: float, a: float, b: float) -> int:
    """The rank drawn by a uniform ``u`` in [0, 1) (inverse of the rank distribution)."""
    if u < a:
        return 1
    r = (u - a) / (1 - a)  # cumulative of ranks >= 2 is 1 - k^-b
    return max(2, int((1 - r) ** (-1 / b)) + 1)


def draw_accepted(cfg: SimConfig, uniform: Callable[[int], float]) -> int:
    """Tokens one cycle yields for one request: 1 + the depth its drawn path stays in the tree.

    ``uniform(d)`` gives the draw for draft position ``d`` (random, or quasi-random per position).
    """
    n = 1
    if not cfg.speculative:
        return n
    rates, b, nodes = cfg.rates, cfg.machine.sibling_decay, set(cfg.tree)
    path: tuple[int, ...] = ()
    for d in range(cfg.steps):
        path = path + (draw_rank(uniform(d), rates[min(d, len(rates) - 1)], b),)
        if path not in nodes:
            break
        n += 1
    return n


# ---- ground truth ------------------------------------------------------------------------------------


def goodput(cfg: SimConfig, bs: int, context: float = DEFAULT_CONTEXT_TOKENS) -> float:
    """Output tok/s of a batch of ``bs`` requests decoding together (steady state)."""
    return bs * expected_accept_len(cfg) / cycle_cost(cfg, bs, context).cycle_ms * 1000.0


def expected_tok_s(cfg: SimConfig, bs: int = 1, context: float = DEFAULT_CONTEXT_TOKENS) -> float:
    """Decode rate of one request in a batch of ``bs`` (tokens a second of one stream)."""
    return goodput(cfg, bs, context) / max(1, bs)


def config_from_dict(machine: Machine, config: dict) -> SimConfig:
    """A SimConfig from a preset's names (see ``expected_goodput``); SGLang's topk-1 rule applied."""
    algo = config.get("algorithm")
    algo = algo.upper() if isinstance(algo, str) else algo
    steps, topk = config.get("num_steps"), config.get("eagle_topk")
    tokens = config.get("num_draft_tokens")
    if config.get("num_speculative_tokens") is not None:  # vLLM: a chain of K drafts
        steps, topk = int(config["num_speculative_tokens"]), 1
        tokens = steps + 1
    elif algo == "NGRAM":  # SGLang's NGRAM: a looked-up tree of N tokens (12), breadth up to 10
        tokens = int(tokens or 12)
        steps, topk = tokens - 1, int(config.get("ngram_max_bfs_breadth") or 10)
    elif algo is not None:
        steps = 3 if steps is None else int(steps)  # SGLang's automatic choice (3, 1, 4)
        topk = 1 if topk is None else int(topk)
        if topk == 1 or tokens is None:
            tokens = steps + 1 if topk == 1 else steps * topk + 1
    env = {k: str(v) for k, v in (config.get("env") or {}).items()}
    return sim_config(
        machine,
        algorithm=algo,
        steps=steps or 0,
        topk=topk or 1,
        draft_tokens=tokens or 0,
        tp_size=config.get("tp_size"),
        env_factor=nccl_factor(env),
        custom_all_reduce=not config.get("disable_custom_all_reduce", False),
        continuous_decode_steps=int(config.get("num_continuous_decode_steps") or 1),
    )


def expected_goodput(machine: str | Path | Machine | None, config: dict, concurrency: int) -> float:
    """The simulator's ground truth: output tok/s of all requests together, in steady state, when
    ``concurrency`` requests decode as one batch on ``machine``.

    ``machine``: a machine file path or shipped name (``h100-llama8b``), a loaded Machine, or None
    for the default (the seeds' 8-GPU PCIe box). ``config``: the preset's names, ``algorithm``
    (None or "EAGLE3"), ``num_steps``, ``eagle_topk``, ``num_draft_tokens``, ``env`` (NCCL
    variables), ``tp_size`` (None = the machine's); optional ``num_continuous_decode_steps``,
    ``disable_custom_all_reduce`` and ``context_tokens`` (mean context of a running request,
    default 275). "Chain length 3" in the EAGLE-3 paper is ``num_steps 3, eagle_topk 1,
    num_draft_tokens 4``. For the simulator and tests; tuitune's core never imports it.
    """
    m = machine if isinstance(machine, Machine) else load_machine(machine)
    cfg = config_from_dict(m, config)
    return goodput(cfg, max(1, int(concurrency)), float(config.get("context_tokens", DEFAULT_CONTEXT_TOKENS)))


def prefill_ms(cfg: SimConfig, prompt_tokens: int) -> float:
    """One prefill forward over the new requests' prompts together."""
    return (cfg.machine.target(prompt_tokens) + cfg.comm_ms()) * cfg.launch_factor


PHI = (5**0.5 - 1) / 2


class QuasiDraws:
    """Low-discrepancy draws: one Weyl sequence per draft position, so each position's acceptance
    frequency converges to its rate as 1/N instead of 1/sqrt(N) (for low-noise comparisons
    between configurations; ``--sim-draws quasi``)."""

    def __init__(self, seed: int):
        self.offsets = [((seed + 1) * (i + 3) * PHI) % 1.0 for i in range(64)]
        self.counts = [0] * 64

    def __call__(self, i: int) -> float:
        self.counts[i] += 1
        return (self.offsets[i] + self.counts[i] * PHI) % 1.0


def jitter(rng, sigma: float = 0.02) -> float:
    """Multiplicative noise with mean exactly 1 (so averages match the model)."""
    return math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2.0)
