"""SGLang's ``--speculative-adaptive`` in the simulator: steps chosen per batch-size bucket from
the acceptance seen, changed while the server runs (FACTS.md §7).

Behaviour modelled (SGLang 0.5.23, EMA strategy): the config's digit keys are lower bounds of
batch-size ranges, each with its candidate steps (0 = no drafting); each bucket keeps an
exponential average of accepted drafts per request (weight ``ema_alpha``, 0.2), waits
``warmup_batches`` (10) batches, then every ``update_interval`` (5) batches steps down while the
average is at or below the next lower candidate less a half (plus ``down_hysteresis``, -0.25),
else up while it is above the current candidate less a half (plus ``up_hysteresis``, 0); after
an interval at 0 steps it probes the next candidate. Acceptance alone decides: no cost model.
"""

from __future__ import annotations

import bisect
import json

# SGLang 0.5.23's schedule when --speculative-adaptive comes without a config file (FACTS §7)
DEFAULT = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}


def load_config(config) -> dict[int, list[int]]:
    """The batch-size buckets of a schedule, read as SGLang 0.5.23's loader reads the file
    (``adaptive_spec_params._load_adaptive_config``): a JSON object; keys made of digits are
    batch sizes, any other key a setting shared by every bucket; each bucket an object whose
    ``candidate_steps`` is a non-empty list of integers >= 0; at least one bucket. ValueError
    (one sentence) for a file SGLang refuses. The simulator's own reading: it plays the server."""
    if not isinstance(config, dict):
        raise ValueError(f"an adaptive config must be a JSON object, got {type(config).__name__}")
    buckets: dict[int, list[int]] = {}
    for key, entry in config.items():
        if not (isinstance(key, str) and key.isdigit()):
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or not steps or any(type(x) is not int or x < 0 for x in steps):
            raise ValueError(  # (type(x) is int: a bool is no step count)
                f"batch size {key}: candidate_steps must be a non-empty list of integers >= 0 (got {steps!r})"
            )
        buckets[int(key)] = steps
    if not buckets:
        raise ValueError(
            "an adaptive config needs at least one batch-size key made of digits, "
            'e.g. {"1": {"candidate_steps": [1, 3]}}'
        )
    return buckets


def from_args(ns) -> AdaptiveSteps | None:
    """The adaptive schedule the flags ask for, or None; ValueError as SGLang refuses at start."""
    if not ns.speculative_adaptive:
        return None
    if ns.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        raise ValueError(f"speculative adaptive supports EAGLE/EAGLE3 only (got {ns.speculative_algorithm})")
    if ns.speculative_eagle_topk != 1:
        raise ValueError(
            f"speculative adaptive supports speculative_eagle_topk=1 only (got {ns.speculative_eagle_topk})"
        )
    path = ns.speculative_adaptive_config
    return (
        AdaptiveSteps.from_file(path, ns.speculative_num_steps)
        if path
        else AdaptiveSteps(DEFAULT, ns.speculative_num_steps)
    )


class _Bucket:
    def __init__(self, candidates: list[int], entry: dict, initial: int):
        self.candidates = sorted(set(candidates))
        self.alpha = float(entry.get("ema_alpha", 0.2))
        self.interval = max(1, int(entry.get("update_interval", 5)))
        self.warmup = int(entry.get("warmup_batches", 10))
        self.down = float(entry.get("down_hysteresis", -0.25))
        self.up = float(entry.get("up_hysteresis", 0.0))
        self.steps = initial if initial in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def observe(self, drafts_accepted: list[int]) -> None:
        if self.steps > 0 and drafts_accepted:
            self.ema += self.alpha * (sum(drafts_accepted) / len(drafts_accepted) - self.ema)
        self.batches += 1
        if self.batches > self.warmup and (self.batches - self.warmup) % self.interval == 0:
            self._decide()

    def _decide(self) -> None:
        i = self.candidates.index(self.steps)
        if self.steps == 0:  # probe drafting again
            self.steps = self.candidates[min(i + 1, len(self.candidates) - 1)]
            self.ema = max(self.ema, float(self.steps - 1))
            return
        start = i
        while i > 0:
            lower = self.candidates[i - 1]
            if self.ema <= (0.5 if lower == 0 else lower - 0.5) + self.down:
                i -= 1
            else:
                break
        if i == start:
            while i + 1 < len(self.candidates) and self.ema > self.candidates[i] - 0.5 + self.up:
                i += 1
        self.steps = self.candidates[i]


class AdaptiveSteps:
    """Routes a batch to its bucket; ``steps_for`` says the steps in force for that batch size."""

    def __init__(self, config: dict, initial_steps: int):
        load_config(config)
        shared = {k: v for k, v in config.items() if not k.isdigit()}
        self.buckets = {
            int(k): _Bucket(e["candidate_steps"], {**shared, **e}, initial_steps)
            for k, e in config.items()
            if k.isdigit()
        }
        self.keys = sorted(self.buckets)

    @classmethod
    def from_file(cls, path: str, initial_steps: int) -> AdaptiveSteps:
        try:
            with open(path) as f:
                config = json.load(f)
        except OSError as e:
            raise ValueError(f"cannot read the adaptive config {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise ValueError(f"the adaptive config {path} is not JSON: {e}") from None
        return cls(config, initial_steps)

    def bucket(self, bs: int) -> _Bucket:
        i = bisect.bisect_right(self.keys, bs) - 1
        return self.buckets[self.keys[max(0, i)]]

    def steps_for(self, bs: int) -> int:
        return self.bucket(bs).steps

    def observe(self, bs: int, tokens_per_request: list[int]) -> None:
        """One verify of ``bs`` requests, each with its tokens (bonus included)."""
        self.bucket(bs).observe([n - 1 for n in tokens_per_request])
