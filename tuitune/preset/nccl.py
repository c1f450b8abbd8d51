"""Catalogue of NCCL environment variables (NCCL 2.30 env.rst; FACTS.md §4) and their checks.

``check(name, value)`` returns (errors, warnings) as sentences that name the value and what is
allowed. The catalogue also feeds the TUI's toggles (``kind`` and ``choices``) and help lines.
``NETWORK`` holds the inter-node variables (multi-node servers); they are checked the same way
but not offered as toggles. Their rules are from NCCL's env.rst ("System configuration": socket
and InfiniBand sections) and, for defaults env.rst leaves out, NCCL's net_ib/connect.cc
``NCCL_PARAM`` lines (v2.31).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PROTOS = ("LL", "LL128", "Simple")
ALGOS = ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT")
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "sendrecv", "alltoall")
SUBSYSTEMS = (
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "ALL",
)
REMOVED = {"NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD", "NCCL_SINGLE_RING_THRESHOLD"}
# The seeds' "tuned NCCL", exactly as they ran and measured it (FACTS.md §1). It sets the deprecated
# NCCL_MAX_NCHANNELS; the presets that reproduce the seeds keep it so that they launch what was
# measured, and say so once instead of warning (``seeds_choice``).
SEEDS_TUNED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}


@dataclass(frozen=True, slots=True)
class NcclVar:
    name: str
    kind: str  # protolist | algolist | level | bool | int | enum | subsys | text
    help: str
    default: str
    choices: tuple[str, ...] = ()
    lo: int | None = None
    hi: int | None = None
    multiple_of: int | None = None
    deprecated_by: str | None = None


CATALOGUE: dict[str, NcclVar] = {
    v.name: v
    for v in (
        NcclVar(
            "NCCL_PROTO",
            "protolist",
            "Protocols NCCL may use; LL is lowest latency for small messages (decode all-reduces).",
            "all supported",
            PROTOS,
        ),
        NcclVar(
            "NCCL_ALGO", "algolist", "Collective algorithms NCCL may use; Ring is steady on PCIe.", "automatic", ALGOS
        ),
        NcclVar(
            "NCCL_P2P_LEVEL",
            "level",
            "Largest topology distance at which GPUs use P2P; SYS allows it across the CPU interconnect.",
            "NCCL decides",
            P2P_LEVELS,
        ),
        NcclVar("NCCL_P2P_DISABLE", "bool", "1 disables GPU peer-to-peer transport.", "0", ("0", "1")),
        NcclVar("NCCL_SHM_DISABLE", "bool", "1 disables the shared-memory transport.", "0", ("0", "1")),
        NcclVar("NCCL_IB_DISABLE", "bool", "1 disables InfiniBand/RoCE.", "0", ("0", "1")),
        NcclVar(
            "NCCL_MAX_NCHANNELS",
            "int",
            "Most channels (CTAs) a collective may use.",
            "auto",
            lo=1,
            hi=64,
            deprecated_by="NCCL_MAX_CTAS",
        ),
        NcclVar(
            "NCCL_MIN_NCHANNELS",
            "int",
            "Fewest channels (CTAs) a collective uses.",
            "auto",
            lo=0,
            hi=64,
            deprecated_by="NCCL_MIN_CTAS",
        ),
        NcclVar("NCCL_MAX_CTAS", "int", "Most CTAs (channels) a collective may use.", "auto", lo=1, hi=64),
        NcclVar("NCCL_MIN_CTAS", "int", "Fewest CTAs (channels) a collective uses.", "auto", lo=0, hi=64),
        NcclVar("NCCL_BUFFSIZE", "int", "Buffer size in bytes per channel and peer; a power of two.", "4194304", lo=1),
        NcclVar(
            "NCCL_NTHREADS",
            "int",
            "CUDA threads per CTA: 64, 128, 256 or 512.",
            "512",
            choices=("64", "128", "256", "512"),
            lo=64,
            hi=512,
            multiple_of=32,
        ),
        NcclVar("NCCL_NVLS_ENABLE", "enum", "NVLink SHARP (multicast): 0 off, 1 on, 2 auto.", "2", ("0", "1", "2")),
        NcclVar("NCCL_CUMEM_ENABLE", "enum", "cuMem* host allocations: 0 off, 1 on.", "auto", ("0", "1")),
        NcclVar(
            "NCCL_DEBUG",
            "enum",
            "Log level; INFO echoes every variable NCCL read (proof it took effect).",
            "unset",
            ("VERSION", "WARN", "INFO", "TRACE"),
        ),
        NcclVar("NCCL_DEBUG_SUBSYS", "subsys", "Subsystems logged at INFO, e.g. INIT,ENV,TUNING.", "INIT", SUBSYSTEMS),
        NcclVar(
            "NCCL_SOCKET_IFNAME",
            "iflist",
            "Network interfaces for bootstrap/sockets (prefix, ^ excludes, = exact); per node when names differ.",
            "auto (not lo/docker)",
        ),
        NcclVar(
            "NCCL_IB_HCA",
            "iflist",
            "InfiniBand HCAs to use (prefix, ^ excludes, = exact, :port), e.g. =mlx5_0:1,mlx5_1:1.",
            "auto",
        ),
        NcclVar("NCCL_NET_GDR_LEVEL", "level", "Largest distance for GPU Direct RDMA.", "NCCL decides", P2P_LEVELS),
    )
}

# Inter-node variables: checked like the catalogue's, not shown as TUI toggles.
NETWORK: dict[str, NcclVar] = {
    v.name: v
    for v in (
        NcclVar(
            "NCCL_SOCKET_FAMILY", "enum", "Address family of the socket interface.", "auto", ("AF_INET", "AF_INET6")
        ),
        NcclVar(
            "NCCL_SOCKET_NTHREADS",
            "int",
            "CPU helper threads per socket connection; threads x sockets per thread at most 64.",
            "1 (cloud: 2-4)",
            lo=1,
            hi=16,
        ),
        NcclVar(
            "NCCL_NSOCKS_PERTHREAD",
            "int",
            "Sockets each socket thread opens; threads x sockets at most 64.",
            "1 (cloud: 2-8)",
            lo=1,
            hi=64,
        ),
        NcclVar("NCCL_IB_TIMEOUT", "int", "InfiniBand Verbs timeout exponent: 4.096 us x 2^value.", "20", lo=1, hi=31),
        NcclVar("NCCL_IB_RETRY_CNT", "int", "InfiniBand retries on a transport error.", "7", lo=0, hi=7),
        NcclVar(
            "NCCL_IB_GID_INDEX", "int", "Global ID index for RoCE (per node when tables differ).", "auto", lo=-1, hi=255
        ),
        NcclVar("NCCL_IB_SL", "int", "InfiniBand service level.", "0", lo=0, hi=15),
        NcclVar("NCCL_IB_TC", "int", "InfiniBand traffic class (RoCE DSCP x 4).", "0", lo=0, hi=255),
        NcclVar(
            "NCCL_IB_QPS_PER_CONNECTION",
            "int",
            "Queue pairs per connection; more can help adaptive routing fabrics.",
            "1",
            lo=1,
            hi=128,
        ),
        NcclVar(
            "NCCL_IB_ADAPTIVE_ROUTING", "bool", "1 enables adaptive routing on IB.", "1 on IB, 0 on RoCE", ("0", "1")
        ),
        NcclVar(
            "NCCL_IB_PCI_RELAXED_ORDERING", "enum", "PCI relaxed ordering: 0 off, 1 on, 2 auto.", "2", ("0", "1", "2")
        ),
        NcclVar(
            "NCCL_NET_GDR_READ",
            "bool",
            "1 sends from GPU memory directly (GPU Direct RDMA reads).",
            "1 on NVLink platforms",
            ("0", "1"),
        ),
        NcclVar(
            "NCCL_CROSS_NIC",
            "enum",
            "Rings/trees may use different NICs on each node: 0 no, 1 yes, 2 prefer not.",
            "2",
            ("0", "1", "2"),
        ),
        NcclVar("NCCL_NET", "text", "Network module to use: IB, Socket or a plugin's name.", "auto"),
    )
}
IB_VARS = (
    "NCCL_IB_HCA",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_SL",
    "NCCL_IB_TC",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_ADAPTIVE_ROUTING",
)
MAX_SOCKET_STREAMS = 64


def lookup(name: str) -> NcclVar | None:
    return CATALOGUE.get(name) or NETWORK.get(name)


def is_network_var(name: str) -> bool:
    """Variables that describe one machine's network (may rightly differ between nodes)."""
    return name in NETWORK or name in ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL")


def check_env(env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Rules between variables of one process's environment (each variable's own via check)."""
    errors: list[str] = []
    warnings: list[str] = []
    try:
        streams = int(env.get("NCCL_SOCKET_NTHREADS", "1")) * int(env.get("NCCL_NSOCKS_PERTHREAD", "1"))
    except ValueError:
        streams = 0
    if streams > MAX_SOCKET_STREAMS:
        errors.append(
            f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD is {streams}; NCCL allows at most {MAX_SOCKET_STREAMS}"
        )
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        dead = [k for k in IB_VARS if k in env]
        if dead:
            verb = "has" if len(dead) == 1 else "have"
            warnings.append(f"NCCL_IB_DISABLE=1, so {', '.join(dead)} {verb} no effect")
    return errors, warnings


def _iflist_check(value: str, ports: bool) -> str | None:
    """None if ``value`` is a valid interface/HCA filter, else what is wrong with it. Names are
    not checked further: NCCL matches them as text, and one that names nothing is for the node
    to say (the simulator fails init as NCCL does)."""
    body = value.removeprefix("^").removeprefix("=")
    names = [t.strip() for t in body.split(",")]
    if not body or any(not t for t in names):
        return "is an empty list or has an empty entry"
    for t in names:
        _, sep, port = t.partition(":")
        if ports and sep and not port.isdigit():
            return f"has {t!r}: a port after ':' is a number (mlx5_0:1)"
    return None


def _list_check(value: str, allowed: tuple[str, ...], case_sensitive: bool = False) -> str | None:
    """First bad token of a `^`-able comma list, optionally per collective (`a;coll:b`)."""
    norm = {a if case_sensitive else a.lower() for a in allowed}
    parts = [p.strip() for p in value.split(";")]
    if not any(parts):
        return value
    for part in parts:
        if not part:
            continue
        if ":" in part:
            coll, _, part = part.partition(":")
            if coll.strip().lower() not in COLLECTIVES:
                return coll
        body = part.strip()
        if body.startswith("^"):
            body = body[1:]
        toks = [t.strip() for t in body.split(",")]
        for t in toks:
            key = t if case_sensitive else t.lower()
            if key not in norm:
                return t
    return None


def check(name: str, value: str) -> tuple[list[str], list[str]]:  # noqa: C901
    """Errors and warnings for one variable. Unknown NCCL_* names are a warning, not an error."""
    errors: list[str] = []
    warnings: list[str] = []
    if name in REMOVED:
        warnings.append(f"{name} was removed from NCCL and is ignored")
        return errors, warnings
    var = lookup(name)
    if var is None:
        if name.startswith("NCCL_"):
            warnings.append(f"{name} is not in tuitune's NCCL catalogue (typo?); it is passed through")
        return errors, warnings
    v = value.strip()
    if var.deprecated_by:
        warnings.append(f"{name} is deprecated since NCCL 2.17; use {var.deprecated_by}")
    if var.kind == "protolist":
        bad = _list_check(v, PROTOS)
        if bad is not None:
            errors.append(f"{v!r} is not one of {', '.join(PROTOS)} (optionally ^-prefixed or per collective)")
        elif "ll128" in v.lower() and not v.startswith("^"):
            warnings.append("forcing LL128 where the hardware does not support it can corrupt data")
    elif var.kind == "algolist":
        bad = _list_check(v, ALGOS)
        if bad is not None:
            errors.append(f"{v!r} is not one of {', '.join(ALGOS)} (optionally ^-prefixed or per collective)")
    elif var.kind == "level":
        if v.isdigit():
            if int(v) > 4:
                warnings.append(f"legacy level {v} is treated as SYS")
        elif v not in var.choices:
            errors.append(f"{v!r} is not one of {', '.join(var.choices)} (case-sensitive) or a legacy integer 0-4")
    elif var.kind in ("bool", "enum"):
        allowed = var.choices
        ok = v in allowed if var.kind == "bool" or v.isdigit() else v.upper() in allowed
        if not ok:
            errors.append(f"{v!r} is not one of {', '.join(allowed)}")
    elif var.kind == "subsys":
        bad = _list_check(v.upper(), var.choices, case_sensitive=True)
        if bad is not None:
            errors.append(f"{v!r} is not a comma list of {', '.join(var.choices)}")
    elif var.kind == "iflist":
        bad = _iflist_check(v, ports=name == "NCCL_IB_HCA")
        if bad is not None:
            errors.append(f"{v!r} {bad}; use prefixes, =exact names or ^ to exclude, comma-separated")
    elif var.kind == "int":
        if not re.fullmatch(r"-?\d+", v):
            errors.append(f"{v!r} is not an integer")
        else:
            n = int(v)
            if var.lo is not None and n < var.lo or var.hi is not None and n > var.hi:
                hi = var.hi if var.hi is not None else "∞"
                errors.append(f"{n} is outside [{var.lo}, {hi}]")
            elif var.multiple_of and n % var.multiple_of:
                errors.append(f"{n} is not a multiple of {var.multiple_of} in [{var.lo}, {var.hi}]")
            elif name == "NCCL_BUFFSIZE" and n & (n - 1):
                warnings.append(f"{n} is not a power of two")
    return errors, warnings


def seeds_choice(name: str, env: dict[str, str]) -> bool:
    """``name`` is deprecated but set as the seeds set it, in an environment holding their whole
    tuned NCCL: a reproduction of what they measured, not a slip."""
    var = lookup(name)
    return (
        var is not None
        and var.deprecated_by is not None
        and name in SEEDS_TUNED
        and all(str(env.get(k, "")).strip() == v for k, v in SEEDS_TUNED.items())
    )


def seeds_note(name: str) -> str:
    var = lookup(name)
    new = var.deprecated_by if var else "its successor"
    return (
        f"{name}={SEEDS_TUNED[name]} is the seeds' choice (their tuned NCCL, kept as they measured it); "
        f"NCCL 2.17 deprecated it for {new}, which a preset of your own should set"
    )


def is_all_reduce_var(name: str) -> bool:
    """Variables that only matter when NCCL carries the all-reduce (not custom all-reduce)."""
    return name in (
        "NCCL_PROTO",
        "NCCL_ALGO",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_CTAS",
        "NCCL_MIN_CTAS",
        "NCCL_BUFFSIZE",
        "NCCL_NTHREADS",
        "NCCL_P2P_LEVEL",
    )
