"""A preset resolved into dotted keys, the diff of two presets, and the warnings and lint advice
`preset validate` and `preset lint` print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuitune.preset import nccl
from tuitune.preset.model import Preset


def flatten(preset: Preset) -> dict[str, Any]:
    """Dotted keys of the resolved preset (derived values filled in)."""
    out: dict[str, Any] = {
        "target": preset.target.label(),
        "server.engine": preset.server.engine,
        "server.python": preset.python(),
        "server.module": preset.server.module,
        "server.workdir": preset.server.workdir or "~",
        "server.log": preset.server.log,
        "server.port": preset.server.port,
    }
    if preset.is_multinode:
        out["server.dist_init_port"] = preset.server.dist_init_port
        for i, (node, n) in enumerate(zip(preset.target.nodes or [], preset.node_presets(), strict=False)):
            out[f"target.nodes.{i}"] = n.target.label()
            for k, v in node.server.model_dump(exclude_none=True).items():
                out[f"target.nodes.{i}.server.{k}"] = v
            for k, v in node.env.items():
                out[f"target.nodes.{i}.env.{k}"] = v
    for k, v in preset.server.args.items():
        out[f"server.args.{k}"] = v
    if preset.is_speculative:
        out.update(preset.engine.speculative_view(preset))
    else:
        out["speculative.algorithm"] = None
    for k, v in preset.env.items():
        out[f"env.{k}"] = v
    out["profile"] = preset.profile
    for k, v in preset.bench.model_dump().items():
        out[f"bench.{k}"] = v
    return out


def derived_keys(preset: Preset) -> set[str]:
    keys = set()
    if preset.speculative is not None and preset.is_speculative:
        keys |= {f"speculative.{k}" for k in preset.speculative.resolved().derived}
    if not preset.server.python:
        keys.add("server.python")
    return keys


def diff(a: Preset, b: Preset, include_bench: bool = True) -> list[tuple[str, Any, Any]]:
    """Changed keys only: (key, value in a or None when unset, value in b or None)."""
    fa, fb = flatten(a), flatten(b)
    keys = list(dict.fromkeys([*fa, *fb]))
    out = []
    for k in keys:
        if not include_bench and k.startswith("bench."):
            continue
        if fa.get(k) != fb.get(k):
            out.append((k, fa.get(k), fb.get(k)))
    return out


def warnings(preset: Preset) -> list[str]:
    """Suspicious settings: each a sentence starting with the key."""
    out = []
    for k, v in preset.env.items():
        for w in nccl.check(k, v)[1]:
            if "deprecated" in w and nccl.seeds_choice(k, preset.env):
                continue  # said once, as a note (``notes``)
            out.append(f"env.{k}: {w}")
    for i, node in enumerate(preset.target.nodes or []):
        for k, v in node.env.items():
            for w in nccl.check(k, v)[1]:
                out.append(f"target.nodes.{i}.env.{k}: {w}")
            if k.startswith("NCCL_") and not nccl.is_network_var(k) and k not in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"):
                out.append(
                    f"target.nodes.{i}.env.{k}: every rank must use the same {k}; set it in env "
                    "for all nodes (per-node env is for the machine's network: interfaces, HCAs)"
                )
    for n in preset.node_presets():
        where = f"{n.name.rsplit('.', 1)[1]} env" if preset.is_multinode else "env"
        out += [f"{where}: {w}" for w in nccl.check_env(n.env)[1]]
    if preset.speculative is not None and preset.is_speculative:
        for s in preset.speculative.resolved().adjusted:
            out.append(f"speculative: {s}")
    return out


def notes(preset: Preset) -> list[str]:
    """Deliberate choices a warning would otherwise flag (the seeds' deprecated NCCL variable): each a
    sentence starting with the key, the same for every preset that makes the choice (said once)."""
    return [f"env.{nccl.seeds_note(k)}" for k in preset.env if nccl.seeds_choice(k, preset.env)]


def file_warnings(path: Path, preset: Preset) -> list[str]:
    """A preset file holding a secret (a token, a key) that other users can read."""
    from tuitune.base.redact import has_secret

    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return []
    if not has_secret(preset) or not mode & 0o077:
        return []
    return [f"{path} holds a secret and other users can read it (mode {mode:o}); chmod 600 it"]


def lint(preset: Preset) -> list[str]:
    """Cross-setting advice, beyond what validation checks."""
    advice = warnings(preset)
    custom_ar = not preset.server.args.get("disable-custom-all-reduce", False)
    ar_vars = [k for k in preset.env if nccl.is_all_reduce_var(k)]
    if ar_vars and custom_ar and preset.tp_size() > 1:
        advice.append(
            f"env: {', '.join(ar_vars)} tune NCCL all-reduce, but custom all-reduce is on: "
            "on NVLink boxes it serves decode all-reduces and these may not apply "
            "(set server.args.disable-custom-all-reduce: true to measure NCCL)"
        )
    algo = preset.env.get("NCCL_ALGO", "")
    if "nvlstree" in algo.lower() and not algo.startswith("^"):
        advice.append(
            "env.NCCL_ALGO: NVLSTree needs several nodes; on a single node AllReduce is left with no algorithm"
        )
    if preset.profile:
        advice.append(
            "profile: the probe is on; benchmark figures include its overhead "
            "(small with sync=event), keep it the same on both sides of an A/B"
        )
    if preset.env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        advice.append(
            "env.NCCL_DEBUG: INFO/TRACE logging slows start-up; use it to confirm settings, not while benchmarking"
        )
    mem = preset.server.args.get("mem-fraction-static")
    if isinstance(mem, (int, float)) and not isinstance(mem, bool) and mem > 0.95:
        advice.append(
            f"server.args.mem-fraction-static: {mem} leaves almost no memory for "
            "activations and CUDA graphs; start-up will likely run out of memory"
        )
    return advice + preset.engine.lint(preset)
