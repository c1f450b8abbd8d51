"""Preset factories: a simulator preset that starts in a fraction of a second."""

from __future__ import annotations

import sys
from pathlib import Path

from tuitune_support.ports import free_port


def make_preset(
    tmp: Path,
    name: str = "t",
    target=None,
    args: dict | None = None,
    env: dict | None = None,
    spec_steps: int | None = 2,
    port: int | None = None,
    profile: bool = True,
    **bench,
):
    """A simulator preset that starts in a fraction of a second, its log under ``tmp``."""
    from tuitune import preset as P

    data = {
        "name": name,
        "target": target or "local",
        "server": {
            "python": sys.executable,
            "module": "tuitune.sim",
            "log": str(tmp / f"{name}.log"),
            "port": port or free_port(),
            "args": {
                "sim-load-seconds": 0.3,
                "sim-speedup": 10,
                "decode-log-interval": 10,
                "tp-size": 2,
                **(args or {}),
            },
        },
        "env": env or {},
        "profile": profile,
        "bench": {"requests": 3, "warmup": 0, "max_tokens": 60, **bench},
    }
    if spec_steps:
        data["speculative"] = {
            "algorithm": "EAGLE3",
            "draft_model_path": "/d",
            "num_steps": spec_steps,
            "eagle_topk": 1,
        }
    return P.from_dict(data)


def vllm_sim_data(tmp: Path, name: str, port: int, target="local", env: dict | None = None, **spec) -> dict:
    """A simulator playing vLLM (EAGLE-3, K 2 unless ``spec`` says otherwise), as a preset's dict, its log
    under ``tmp``: for the switch's tests (``spec``: e.g. ``switch=[1, 2, 4]``)."""
    return {
        "name": name,
        "target": target,
        "server": {
            "engine": "vllm",
            "module": "tuitune.sim",
            "python": sys.executable,
            "log": str(tmp / f"{name}.log"),
            "port": port,
            "args": {"model": "/m/tiny", "sim-load-seconds": 0.2, "sim-speedup": 10},
        },
        "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_speculative_tokens": 2, **spec},
        "env": env or {"VLLM_LOG_STATS_INTERVAL": "2"},
        "profile": True,
    }


def sim_vllm(tmp: Path, name: str = "v", tokens: int | None = 2, port: int | None = None, **args):
    """The simulator playing vLLM (EAGLE-3 with ``tokens`` drafts, none when 0 or None), its log under
    ``tmp``, ``args`` over its command line: a Preset."""
    from tuitune import preset as P

    data = {
        "name": name,
        "target": "local",
        "server": {
            "engine": "vllm",
            "python": sys.executable,
            "module": "tuitune.sim",
            "log": str(tmp / f"{name}.log"),
            "port": port or free_port(),
            "args": {
                "model": "/shared/m",
                "tensor-parallel-size": 2,
                "sim-load-seconds": 0.3,
                "sim-speedup": 10,
                **args,
            },
        },
        "env": {"VLLM_LOG_STATS_INTERVAL": "1"},
        "profile": True,
        "bench": {"requests": 3, "warmup": 0, "max_tokens": 60},
    }
    if tokens:
        data["speculative"] = {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_speculative_tokens": tokens}
    return P.from_dict(data)
