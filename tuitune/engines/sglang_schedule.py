"""SGLang's adaptive-steps schedule (``--speculative-adaptive-config``): the loader's rules, and the
file ``advise --emit sglang-adaptive`` writes (text, write, read). The engine (``engines/sglang.py``)
reaches it through ``Engine``'s schedule methods."""

from __future__ import annotations

import json

from tuitune.engines.base import read_schedule_text

# ---- the adaptive-steps schedule (--speculative-adaptive-config) -------------------------------------

SCHEDULE = "sglang-adaptive"
ADAPTIVE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # SGLang's keys are lower bounds of batch-size ranges


def check_adaptive(cfg) -> dict[int, list[int]]:
    """SGLang 0.5.23's loader rules (``adaptive_spec_params._load_adaptive_config``): a JSON object
    whose keys made of digits are batch sizes (others are ignored), each an object with a non-empty
    ``candidate_steps`` list of ints >= 0; at least one such key. Raises ValueError (one sentence)."""
    if not isinstance(cfg, dict):
        raise ValueError(f"an adaptive config must be a JSON object, got {type(cfg).__name__}")
    out: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not isinstance(key, str) or not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"batch size {key}: candidate_steps must be a non-empty list of integers >= 0 (got {steps!r})"
            )
        out[int(key)] = steps
    if not out:
        raise ValueError(
            "an adaptive config needs at least one batch-size key made of digits, "
            'e.g. {"1": {"candidate_steps": [1, 3]}}'
        )
    return out


def adaptive_text(cfg: dict) -> str:
    """The schedule as the file's text: JSON, one batch-size key a line (reads and diffs well)."""
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in cfg.items()) + "\n}\n"


def write_adaptive(path: str, cfg: dict) -> None:
    """Write the schedule file atomically (a temporary file renamed over ``path``)."""
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(adaptive_text(cfg))
    os.replace(tmp, path)


def read_adaptive(path: str, source: str = "the file") -> dict[int, list[int]]:
    """A schedule file on this machine, checked; ValueError (one sentence, naming it as ``source``)
    when it cannot be read or is not an adaptive config."""
    try:
        doc = json.loads(read_schedule_text(path, source))
    except ValueError as e:
        raise ValueError(f"{source} is not JSON ({e})") from None
    try:
        return check_adaptive(doc)
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
