"""Readers of `nvidia-smi` output: query CSV (with or without header and units), the default table,
`topo -m`, `nvlink -s`, `dmon`, `--help-query-gpu`; and the clock event reasons decoded to words.

Pure text in, plain data out (no I/O): the telemetry collector, `tuitune gpus` and `tuitune gpus
--parse` all read through these functions. Values nvidia-smi cannot give (``[N/A]``, ``[Not
Supported]``, ``[GPU is lost]``…) become None, never 0: a missing reading is not an idle GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tuitune.base.errors import TuituneError

# What the collector asks for (FACTS §8), ``timestamp`` first: it tells samples apart across reconnects.
GPU_FIELDS = (
    "index",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.max.sm",
    "clocks.mem",
    "temperature.gpu",
    "clocks_event_reasons.active",
    "pcie.link.gen.current",
    "pcie.link.width.current",
)
STREAM_FIELDS = ("timestamp", *GPU_FIELDS)
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")

# query field -> (key in the parsed row, how to read it)
KEYS: dict[str, tuple[str, str]] = {
    "timestamp": ("stamp", "str"),
    "index": ("index", "int"),
    "name": ("name", "str"),
    "uuid": ("uuid", "str"),
    "utilization.gpu": ("util", "num"),
    "utilization.memory": ("mem_util", "num"),
    "memory.used": ("mem_used", "num"),
    "memory.total": ("mem_total", "num"),
    "power.draw": ("power", "num"),
    "power.limit": ("power_limit", "num"),
    "clocks.sm": ("sm_clock", "num"),
    "clocks.max.sm": ("sm_clock_max", "num"),
    "clocks.mem": ("mem_clock", "num"),
    "temperature.gpu": ("temp", "num"),
    "clocks_event_reasons.active": ("reasons", "hex"),
    "pcie.link.gen.current": ("pcie_gen", "int"),
    "pcie.link.width.current": ("pcie_width", "int"),
    "gpu_uuid": ("gpu_uuid", "str"),
    "pid": ("pid", "int"),
    "process_name": ("process_name", "str"),
    "used_memory": ("used_memory", "num"),
}
# long names nvidia-smi prints in headers (and older drivers' names) -> the names above
ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "used_gpu_memory": "used_memory",
    "gpu_name": "name",
    "gpu_index": "index",
}

# NVML clock event reason bits (nvmlClocksEventReason*), in the words an operator reads.
REASONS = (
    (0x1, "idle"),
    (0x2, "app clocks"),
    (0x4, "power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "power brake"),
    (0x100, "display clocks"),
)
POWER_BITS = 0x4 | 0x80
THERMAL_BITS = 0x20 | 0x40
SLOWDOWN_BITS = 0x8
NUM = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:%|MiB|GiB|W|MHz|C|GB/s|MB/s|KB/s)?\Z")


class SmiParseError(TuituneError, ValueError):
    """Text that is not the nvidia-smi output it was read as (one sentence)."""

    code = 2


def decode_reasons(mask: int | None) -> list[str]:
    """The active clock event reasons as words (``0x4`` -> ``["power cap"]``)."""
    if not mask:
        return []
    words = [w for bit, w in REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in REASONS)
    return words + ([f"0x{rest:x}"] if rest else [])


def capping(mask: int | None) -> str | None:
    """``power``, ``thermal``, ``HW slowdown`` (or a combination) when clocks are held down, else None."""
    if not mask:
        return None
    kinds = [
        name
        for bits, name in ((POWER_BITS, "power"), (THERMAL_BITS, "thermal"), (SLOWDOWN_BITS, "HW slowdown"))
        if mask & bits
    ]
    return "+".join(kinds) or None


def canonical(name: str) -> str:
    """A header cell or query field name -> the query field name used here (units dropped)."""
    name = re.sub(r"\s*\[[^\]]*\]\s*\Z", "", name.strip())
    return ALIASES.get(name, name)


def value(text: str, kind: str):
    """One CSV cell: None for nvidia-smi's bracketed notices, numbers with their unit dropped."""
    text = text.strip()
    if not text or (text.startswith("[") and text.endswith("]")) or text in ("N/A", "Not Supported"):
        return None
    if kind == "str":
        return text
    if kind == "hex":
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return None
    m = NUM.match(text)
    if not m:
        return None
    num = float(m.group(1))
    return int(num) if kind == "int" else num


@dataclass
class QueryTable:
    fields: list[str]
    rows: list[dict] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # lines that are not rows (error messages…)


def split_row(line: str, n: int, fields: list[str]) -> list[str] | None:
    """Cells of one CSV line; a process or GPU name holding ", " is joined back together."""
    cells = line.split(", ")
    if len(cells) > n:
        extra = len(cells) - n
        for i, f in enumerate(fields):
            if KEYS.get(f, ("", ""))[1] == "str" and f not in ("timestamp", "uuid", "gpu_uuid"):
                cells[i : i + extra + 1] = [", ".join(cells[i : i + extra + 1])]
                break
    return cells if len(cells) == n else None


def row(fields: list[str], cells: list[str]) -> dict:
    out = {}
    for f, cell in zip(fields, cells, strict=False):
        key, kind = KEYS.get(ALIASES.get(f, f), (f, "str"))
        out[key] = value(cell, kind)
    return out


def is_header(line: str) -> bool:
    first = canonical(line.split(",")[0])
    return first in KEYS or first in ALIASES.values()


def parse_query(text: str, fields: list[str] | tuple[str, ...] | None = None) -> QueryTable:
    """``--query-gpu`` / ``--query-compute-apps`` CSV, with or without header and units.

    Without a header, ``fields`` names the columns (what was asked for). Lines that do not have
    that many cells (an error message, a line cut by a dropped link) are kept in ``malformed``.
    """
    lines = [ln.rstrip("\r") for ln in text.splitlines() if ln.strip()]
    if lines and is_header(lines[0]):
        fields = [canonical(c) for c in lines[0].split(",")]
        lines = lines[1:]
    if fields is None:
        raise SmiParseError("query CSV without a header: name its columns (--fields)")
    table = QueryTable(list(fields))
    for ln in lines:
        cells = split_row(ln, len(table.fields), table.fields)
        if cells is None:
            table.malformed.append(ln)
        else:
            table.rows.append(row(table.fields, cells))
    return table


def supported(fields, known: set[str]) -> list[str]:
    """The fields a driver knows, each under the name it knows (an older driver's alias if need be)."""
    out = []
    for f in fields:
        names = [f] + [a for a, c in ALIASES.items() if c == f]
        out += [n for n in names if n in known][:1]
    return out


def parse_help(text: str) -> set[str]:
    """Field names ``--help-query-gpu`` lists (each quoted at the start of its line, aliases with ``or``)."""
    names: set[str] = set()
    for ln in text.splitlines():
        if ln.startswith('"'):
            names.update(re.findall(r'"([A-Za-z0-9_.]+)"', ln))
    return names


# ---- the default `nvidia-smi` table ------------------------------------------------------------

_VERSION = re.compile(r"NVIDIA-SMI\s+(\S+)\s+Driver Version:\s+(\S+)\s+CUDA Version:\s+(\S+)")
_GPU1 = re.compile(r"\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(\S+)\s+\|\s+(.+?)\s+\|")
_GPU2 = re.compile(
    r"\|\s*(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*/\s*(\S+)\s+\|\s+(\S+)\s*/\s*(\S+)\s+\|"
    r"\s+(\S+)\s+(.+?)\s+\|"
)
_PROC = re.compile(r"\|\s+(\d+)\s+(\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(.+?)\s+(\S+)\s+\|")


@dataclass
class SmiTable:
    smi_version: str | None = None
    driver: str | None = None
    cuda: str | None = None
    stamp: str | None = None
    gpus: list[dict] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)


def parse_table(text: str) -> SmiTable:
    """The table plain ``nvidia-smi`` prints: one block of three lines per GPU, then processes."""
    out = SmiTable()
    lines = text.splitlines()
    if lines and not lines[0].startswith(("+", "|")):
        out.stamp = lines[0].strip() or None
    in_procs = False
    pending: dict | None = None
    for ln in lines:
        if (m := _VERSION.search(ln)) is not None:
            out.smi_version, out.driver, out.cuda = m.groups()
            continue
        if "Processes:" in ln:
            in_procs = True
            continue
        if in_procs:
            if (m := _PROC.match(ln)) is not None:
                gpu, gi, ci, pid, typ, name, mem = m.groups()
                out.processes.append(
                    {
                        "gpu": int(gpu),
                        "gi": value(gi, "str"),
                        "ci": value(ci, "str"),
                        "pid": int(pid),
                        "type": typ,
                        "process_name": name,
                        "used_memory": value(mem, "num"),
                    }
                )
            continue
        if pending is None and (m := _GPU1.match(ln)) is not None:
            idx, name, persist, bus, disp, ecc = m.groups()
            pending = {
                "index": int(idx),
                "name": name,
                "persistence": persist,
                "bus_id": bus,
                "display": disp,
                "ecc_errors": value(ecc, "int"),
            }
            continue
        if pending is not None and (m := _GPU2.match(ln)) is not None:
            fan, temp, perf, pw, cap, used, total, util, mode = m.groups()
            pending.update(
                fan=value(fan, "num"),
                temp=value(temp, "num"),
                perf=perf,
                power=value(pw, "num"),
                power_limit=value(cap, "num"),
                mem_used=value(used, "num"),
                mem_total=value(total, "num"),
                util=value(util, "num"),
                compute_mode=mode,
            )
            out.gpus.append(pending)
            pending = None
            continue
        if out.gpus and (m := re.match(r"\|\s+\|\s+\|\s+(\S.*?)\s+\|", ln)) and "mig" not in out.gpus[-1]:
            out.gpus[-1]["mig"] = m.group(1)
    if out.driver is None:
        raise SmiParseError("not an nvidia-smi table (no 'Driver Version' line)")
    return out


# ---- topo -m, nvlink -s, dmon ---------------------------------------------------------------------


@dataclass
class Topology:
    devices: list[str]  # GPU0, GPU1, … (and NICs), in the matrix's order
    links: dict[str, dict[str, str]]  # row device -> column device -> X / NV18 / PIX / PXB / PHB / NODE / SYS
    affinity: dict[str, dict[str, str]]  # row device -> CPU Affinity / NUMA Affinity / GPU NUMA ID


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _plain(text: str) -> str:
    """Text without terminal escapes: ``topo -m`` underlines its header even into a file or pipe."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def parse_topo(text: str) -> Topology:
    """``nvidia-smi topo -m``: a tab-separated matrix, then a legend (ignored)."""
    lines = [ln.rstrip() for ln in _plain(text).splitlines()]
    head = next((ln for ln in lines if re.match(r"\s+GPU0\b", ln)), None)
    if head is None:
        raise SmiParseError("not `nvidia-smi topo -m` output (no header line naming GPU0)")
    cols = [c.strip() for c in head.strip().split("\t") if c.strip()]
    devices = [c for c in cols if re.fullmatch(r"(GPU|NIC)\d+", c)]
    topo = Topology(devices, {}, {})
    for ln in lines[lines.index(head) + 1 :]:
        if not ln.strip() or ln.startswith("Legend"):
            break
        cells = [c.strip() for c in ln.split("\t")]
        name, cells = cells[0], cells[1:]
        if name not in devices:
            continue
        n = len(devices)
        topo.links[name] = dict(zip(devices, cells[:n], strict=False))
        # affinity columns: nvidia-smi pads some with an extra tab, so empty cells are not columns
        topo.affinity[name] = dict(zip(cols[n:], [c for c in cells[n:] if c], strict=False))
    return topo


def parse_nvlink(text: str) -> dict[int, dict]:
    """``nvidia-smi nvlink -s``: per GPU, each link's speed in GB/s (None when inactive)."""
    gpus: dict[int, dict] = {}
    cur = None
    for ln in text.splitlines():
        if (m := re.match(r"GPU (\d+): (.+?) \(UUID: (\S+)\)", ln)) is not None:
            cur = gpus.setdefault(int(m.group(1)), {"name": m.group(2), "uuid": m.group(3), "links": {}})
        elif cur is not None and (m := re.match(r"\s+Link (\d+): (.+)", ln)) is not None:
            cur["links"][int(m.group(1))] = value(m.group(2), "num")
    if not gpus:
        raise SmiParseError("not `nvidia-smi nvlink -s` output (no 'GPU N: … (UUID: …)' line)")
    return gpus


def parse_dmon(text: str) -> list[dict]:
    """``nvidia-smi dmon``: ``#`` header names the columns, ``-`` where a value is unsupported."""
    cols: list[str] | None = None
    rows = []
    for ln in text.splitlines():
        if ln.startswith("#"):
            if cols is None:
                cols = ln.lstrip("#").split()
            continue
        cells = ln.split()
        if cols is None or len(cells) != len(cols):
            continue
        rows.append(
            {c: (v if c == "gpu" and not v.isdigit() else value(v, "num")) for c, v in zip(cols, cells, strict=False)}
        )
    if cols is None:
        raise SmiParseError("not `nvidia-smi dmon` output (no '# gpu …' header)")
    return rows


def detect(text: str) -> str:
    """Which nvidia-smi output this is: table, topo, nvlink, dmon, help or csv."""
    text = _plain(text)
    if "Driver Version:" in text and "NVIDIA-SMI" in text:
        return "table"
    if re.search(r"^\s+GPU0\b", text, re.M) and ("Legend" in text or "\tGPU0" in text):
        return "topo"
    if re.search(r"^GPU \d+: .*\(UUID: ", text, re.M):
        return "nvlink"
    if text.lstrip().startswith("# gpu"):
        return "dmon"
    if "List of valid properties to query" in text:  # real: 'for the switch "--query-gpu":'
        return "help"
    return "csv"
