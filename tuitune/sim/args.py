"""Command line of the simulator: SGLang's flags that tuitune uses, plus ``--sim-*`` knobs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tuitune.sim import model

DEFAULT_PORT = 30000
FAULTS = ("crash-after", "hang-on-sigterm", "health-hang", "garbage")
TOPK1_WARNING = "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"


def _bool_flag(p: argparse.ArgumentParser, name: str, help: str) -> None:
    p.add_argument(name, action="store_true", help=help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuitune.sim",
        description="tuitune's SGLang emulator: behaves like `python -m sglang.launch_server` "
        "on the seeds' 8-GPU PCIe box, through logs and HTTP, with no GPU.",
    )
    p.add_argument(
        "--model-path", "--model", dest="model_path", default="sim/kimi-k2.5-int4", help="model path (only echoed)"
    )
    p.add_argument("--tokenizer-path", default=None)
    _bool_flag(p, "--trust-remote-code", "accepted for compatibility")
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="what the decode line names: cuda graph, or (cpu) cpu graph (always False: no graphs with speculation)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--num-continuous-decode-steps", type=int, default=1)
    _bool_flag(p, "--disable-custom-all-reduce", "use NCCL for every all-reduce")
    _bool_flag(p, "--enable-nccl-nvls", "accepted for compatibility")
    p.add_argument("--speculative-algorithm", default=None, choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    p.add_argument(
        "--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path", default=None
    )
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-ngram-min-bfs-breadth", type=int, default=1)
    p.add_argument("--speculative-ngram-max-bfs-breadth", type=int, default=10)
    p.add_argument("--speculative-ngram-max-trie-depth", type=int, default=18)
    p.add_argument("--speculative-ngram-match-type", choices=["BFS", "PROB"], default="BFS")
    _bool_flag(p, "--speculative-adaptive", "change the steps while running (SGLang's adaptive mode)")
    p.add_argument("--speculative-adaptive-config", default=None, metavar="FILE.json")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="decode cycles between two streamed chunks of a request (default 1)",
    )
    _bool_flag(p, "--enable-metrics", "serve Prometheus metrics on /metrics")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--served-model-name", default=None)
    # Multi-node (see multinode.py): every node runs the same command with its own rank.
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", default=None, help="node 0's HOST:PORT for start-up")
    p.add_argument(
        "--dist-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every node to join (SGLang: torch's init timeout)",
    )
    # Simulator knobs.
    g = p.add_argument_group("simulator")
    g.add_argument(
        "--sim-load-seconds", type=float, default=3.0, help="simulated weight loading + graph capture time (default 3)"
    )
    g.add_argument(
        "--sim-seed",
        type=int,
        default=None,
        help="random seed (acceptance, jitter, launch speed); default: new every launch",
    )
    g.add_argument(
        "--sim-machine",
        default=None,
        metavar="FILE",
        help="machine file (presets/machines/*.yaml), or a shipped machine's name "
        "(seed-pcie8, h100-llama8b, h200-llama8b); default: seed-pcie8, the seeds' box",
    )
    g.add_argument(
        "--sim-launch-sigma",
        type=float,
        default=None,
        help="log-normal sigma of the per-launch speed factor (default: the machine's)",
    )
    g.add_argument("--sim-topology", choices=["pcie", "nvlink"], default=None, help="override the machine's topology")
    g.add_argument(
        "--sim-acceptance",
        default=None,
        help="override the machine's acceptance: "
        + ", ".join(model.ACCEPTANCE_PROFILES)
        + " or comma-separated per-position rates",
    )
    g.add_argument(
        "--sim-acceptance-shift",
        default=None,
        metavar="SECONDS=ACCEPTANCE",
        help="SECONDS after ready, acceptance becomes ACCEPTANCE (a profile or per-position rates): "
        "a draft that stops matching, as after a deployment change",
    )
    g.add_argument(
        "--sim-context-limit",
        type=int,
        default=None,
        metavar="TOKENS",
        help="past TOKENS of context a request's acceptance falls to a fifth (acceptance that collapses with length)",
    )
    g.add_argument(
        "--sim-fault",
        action="append",
        default=[],
        metavar="FAULT",
        help="crash-after=SECONDS, hang-on-sigterm, health-hang, garbage (repeatable)",
    )
    g.add_argument(
        "--sim-speedup",
        type=float,
        default=1.0,
        help="the simulated clock runs N times faster (rates ×N, latencies ÷N)",
    )
    g.add_argument(
        "--sim-scale",
        type=float,
        default=1.0,
        help="multiply every cost by F (0.95 = a config 5%% faster; for A/B accuracy tests)",
    )
    g.add_argument(
        "--sim-draws",
        choices=["random", "quasi"],
        default="random",
        help="acceptance draws: random (default) or quasi (low-discrepancy: low-noise comparisons)",
    )
    g.add_argument(
        "--sim-jitter", type=float, default=0.02, help="log-normal sigma of per-cycle timing noise (default 0.02)"
    )
    return p


@dataclass
class Faults:
    crash_after: float | None = None
    hang_on_sigterm: bool = False
    health_hang: bool = False
    garbage: bool = False


def parse_faults(p: argparse.ArgumentParser, specs: list[str]) -> Faults:
    f = Faults()
    for spec in specs:
        name, _, value = spec.replace(":", "=").partition("=")
        if name == "crash-after":
            try:
                f.crash_after = float(value)
            except ValueError:
                p.error(f"--sim-fault crash-after needs seconds, e.g. crash-after=5 (got {spec!r})")
        elif name in ("hang-on-sigterm", "health-hang", "garbage") and not value:
            setattr(f, name.replace("-", "_"), True)
        else:
            p.error(f"--sim-fault: unknown fault {spec!r}; choose from {', '.join(FAULTS)}")
    return f


def parse_acceptance(p: argparse.ArgumentParser, spec: str | None) -> tuple[float, ...] | None:
    if spec is None:
        return None
    if spec in model.ACCEPTANCE_PROFILES:
        return model.ACCEPTANCE_PROFILES[spec]
    try:
        rates = tuple(float(x) for x in spec.split(","))
    except ValueError:
        rates = ()
    if not rates or not all(0.0 <= r <= 1.0 for r in rates):
        p.error(
            f"--sim-acceptance: {spec!r} is neither a profile "
            f"({', '.join(model.ACCEPTANCE_PROFILES)}) nor rates in [0, 1]"
        )
    return rates


def parse_acceptance_shift(p: argparse.ArgumentParser, spec: str | None) -> tuple[float, tuple[float, ...]] | None:
    if spec is None:
        return None
    when, sep, what = spec.partition("=")
    try:
        seconds = float(when)
    except ValueError:
        seconds = -1.0
    if not sep or seconds < 0:
        p.error(f"--sim-acceptance-shift: {spec!r} is not SECONDS=ACCEPTANCE (such as 30=0.2,0.1)")
    rates = parse_acceptance(p, what)
    assert rates is not None
    return seconds, rates


def load_machine(p: argparse.ArgumentParser, spec: str | None) -> model.Machine:
    try:
        return model.load_machine(spec)
    except model.MachineError as e:
        p.error(f"--sim-machine: {e}")  # exits with status 2, like any bad flag


class ServerArgsError(ValueError):
    """A combination SGLang's ServerArgs rejects (it raises in __post_init__)."""


def resolve_speculative(ns: argparse.Namespace) -> list[str]:
    """Apply SGLang's speculative rules in place; return warning lines. Raises ServerArgsError."""
    warnings: list[str] = []
    algo = ns.speculative_algorithm
    if algo == "NEXTN":
        ns.speculative_algorithm = algo = "EAGLE"
    if algo is None:
        return warnings
    if algo == "NGRAM":
        return _resolve_ngram(ns)
    if algo in ("EAGLE", "EAGLE3") and not ns.speculative_draft_model_path:
        raise ServerArgsError(f"--speculative-draft-model-path is required for {algo}")
    if ns.speculative_num_steps is None:
        if ns.speculative_eagle_topk is not None or ns.speculative_num_draft_tokens is not None:
            raise ServerArgsError(
                "speculative_eagle_topk and speculative_num_draft_tokens must be unset "
                "when speculative_num_steps is unset (they are chosen automatically)"
            )
        ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens = 3, 1, 4
        warnings.append(
            "speculative_num_steps, speculative_eagle_topk and "
            "speculative_num_draft_tokens are automatically set to 3, 1, 4"
        )
    if ns.speculative_eagle_topk is None:
        ns.speculative_eagle_topk = 1
    if ns.speculative_num_steps < 1 or ns.speculative_eagle_topk < 1:
        raise ServerArgsError("speculative_num_steps and speculative_eagle_topk must be >= 1")
    if ns.speculative_eagle_topk == 1:
        if ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1:
            warnings.append(TOPK1_WARNING)
        ns.speculative_num_draft_tokens = ns.speculative_num_steps + 1
    elif ns.speculative_num_draft_tokens is None:
        raise ServerArgsError("speculative_num_draft_tokens must be set when speculative_eagle_topk > 1")
    limit = ns.speculative_num_steps * ns.speculative_eagle_topk + 1
    if ns.speculative_num_draft_tokens > limit:
        raise ServerArgsError(
            f"speculative_num_draft_tokens ({ns.speculative_num_draft_tokens}) must be <= "
            f"speculative_num_steps * speculative_eagle_topk + 1 ({limit})"
        )
    return warnings


def _resolve_ngram(ns: argparse.Namespace) -> list[str]:
    """SGLang 0.5.23's _handle_ngram: the breadth overwrites topk, 12 draft tokens by default,
    mixed chunked prefill off. The simulator's tree is as deep as its budget allows (draft tokens
    − 1), which is also the depth tuitune's probe reports for an NGRAM cycle."""
    warnings: list[str] = []
    lo, hi = ns.speculative_ngram_min_bfs_breadth, ns.speculative_ngram_max_bfs_breadth
    if lo < 1 or hi < lo:
        raise ServerArgsError(f"speculative_ngram_min_bfs_breadth ({lo}) must be >= 1 and <= max_bfs_breadth ({hi})")
    if ns.max_running_requests is None:
        ns.max_running_requests = 48
        warnings.append(
            "Max running requests is reset to 48 for speculative decoding. You can override this by "
            "explicitly setting --max-running-requests."
        )
    ns.speculative_eagle_topk = hi
    if ns.speculative_num_draft_tokens is None:
        ns.speculative_num_draft_tokens = 12
        warnings.append(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens."
        )
    if ns.speculative_num_draft_tokens < 2:
        raise ServerArgsError("speculative_num_draft_tokens must be >= 2 for ngram speculative decoding")
    ns.speculative_num_steps = ns.speculative_num_draft_tokens - 1
    warnings.append("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    return warnings
