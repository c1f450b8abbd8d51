"""``python -m tuitune.sim.nvidia_smi [--sim-* …] NVIDIA-SMI ARGS``: the simulator's GPUs, as nvidia-smi.

Answers the command lines tuitune uses (``--query-gpu`` with ``--format=csv[,noheader][,nounits]``
and ``-lms``/``-l``, ``--query-compute-apps``, ``--help-query-gpu``, ``topo -m``, ``nvlink -s``,
``dmon -s t``, and no argument: the table) in the formats of the real outputs in
shared/data/nvidia-smi (an H200 box; the per-GPU figures below are the ones measured there).
The load comes from the simulator's HTTP ``/server_info`` (``--sim-port``): GPUs of its
tensor-parallel group hold its memory, and are busy while it runs requests. ``--sim-capping``
(or a ``--sim-control`` JSON file, re-read every sample) holds clocks down as a power or thermal
cap does; ``--sim-straggler N`` makes GPU N lag its peers.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

NAME = "NVIDIA H200"
MEM_TOTAL = 143771  # MiB
POWER_LIMIT = 700.0
SM_MAX = 1980
SM_IDLE = 345
MEM_CLOCK = 3201
IDLE_TEMP, BUSY_TEMP, HOT_TEMP = 34.0, 55.0, 88.0
DRIVER, CUDA = "580.159.04", "13.0"
REASON = {"none": 0x0, "idle": 0x1, "power": 0x4, "thermal": 0x20}

# field -> (header name nvidia-smi prints, unit shown without nounits, description)
FIELDS = {
    "timestamp": ("timestamp", "", "When the sample was taken, as YYYY/MM/DD HH:MM:SS.msec."),
    "index": ("index", "", "Zero-based position of the GPU in this enumeration."),
    "name": ("name", "", "Product name of the board."),
    "uuid": ("uuid", "", "Globally unique, immutable identifier of the GPU."),
    "utilization.gpu": ("utilization.gpu", "%", "Share of the past sample period during which kernels ran."),
    "utilization.memory": (
        "utilization.memory",
        "%",
        "Share of the past sample period spent reading or writing memory.",
    ),
    "memory.used": ("memory.used", "MiB", "Memory allocated by active contexts."),
    "memory.total": ("memory.total", "MiB", "Installed memory."),
    "power.draw": ("power.draw", "W", "Last measured power draw of the board."),
    "power.limit": ("power.limit", "W", "Power limit the management algorithm enforces."),
    "clocks.sm": ("clocks.current.sm", "MHz", "Current SM clock (alias clocks.current.sm)."),
    "clocks.max.sm": ("clocks.max.sm", "MHz", "Highest SM clock the board supports."),
    "clocks.mem": ("clocks.current.memory", "MHz", "Current memory clock (alias clocks.current.memory)."),
    "temperature.gpu": ("temperature.gpu", "", "Core temperature in degrees C."),
    "clocks_event_reasons.active": ("clocks_event_reasons.active", "", "Bitmask of reasons that hold clocks down."),
    "pcie.link.gen.current": ("pcie.link.gen.current", "", "Current PCIe link generation."),
    "pcie.link.width.current": ("pcie.link.width.current", "", "Current PCIe link width."),
}
ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
}
APP_FIELDS = {
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "used_memory": ("used_gpu_memory", "MiB"),
    "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", ""),
    "gpu_name": ("gpu_name", ""),
}
USAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


@dataclass
class Load:
    up: bool = False
    tp: int = 0
    mem_fraction: float = 0.88
    running: int = 0
    pid: int | None = None


def server_load(port: int | None) -> Load:
    """The simulator's state, from its HTTP; nothing listening = no server on the GPUs."""
    if port is None:
        return Load()
    for path in ("/server_info", "/sim/state"):  # the vLLM dialect has no /server_info, as vLLM has none
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=0.3) as r:
                info = json.loads(r.read())
            break
        except (urllib.error.URLError, OSError, ValueError):
            continue
    else:
        return Load()
    state = (info.get("internal_states") or [{}])[0]
    return Load(
        True,
        int(info.get("tp_size") or 1),
        float(info.get("mem_fraction_static") or 0.88),
        int(state.get("num_running_reqs") or 0),
        state.get("pid"),
    )


class Box:
    """The simulated GPUs; temperature follows the load with a lag, like a heat sink."""

    def __init__(self, opts: dict):
        self.opts = opts
        self.gpus = opts["gpus"]
        self.rng = random.Random(opts["seed"])
        self.uuids = [f"GPU-{uuid.UUID(int=self.rng.getrandbits(128))}" for _ in range(self.gpus)]
        self.temp: list[float | None] = [None] * self.gpus  # a new process starts at the steady state
        self.last = time.monotonic()

    def control(self) -> dict:
        """--sim-capping / --sim-straggler, overridden by the control file when it exists."""
        ctl = {"capping": self.opts["capping"], "straggler": self.opts["straggler"]}
        path = self.opts["control"]
        if path:
            try:
                with open(path) as f:
                    ctl.update(json.load(f))
            except (OSError, ValueError):
                pass
        return ctl

    def sample(self) -> list[dict]:
        load = server_load(self.opts["port"])
        ctl = self.control()
        now = time.monotonic()
        lag = min(1.0, (now - self.last) / 8.0)  # ~8 s thermal time constant
        self.last = now
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime()) + f".{int(time.time() * 1000) % 1000:03d}"
        out = []
        for i in range(self.gpus):
            r = self.rng.random
            held = load.up and i < load.tp
            busy = held and load.running > 0
            cap = ctl.get("capping") if busy else None
            util = 0.0
            if busy:
                util = 55 + 10 * r() if ctl.get("straggler") == i else min(100.0, 95 + 6 * r())
            power = 75 + 25 * r() if not busy else 300 + 350 * min(1.0, load.running / 16) + 20 * r()
            clock = SM_IDLE if not busy else SM_MAX
            target = BUSY_TEMP if busy else IDLE_TEMP
            reasons = REASON["idle"] if not busy else REASON["none"]
            if cap == "power":
                power, clock, reasons = POWER_LIMIT - 15 * r(), 1440 + 15 * self.rng.randrange(8), REASON["power"]
            elif cap == "thermal":
                clock, target, reasons = 1200 + 15 * self.rng.randrange(12), HOT_TEMP, REASON["thermal"]
            prev = self.temp[i]
            self.temp[i] = target if prev is None else prev + (target - prev) * lag
            out.append(
                {
                    "timestamp": stamp,
                    "index": i,
                    "name": NAME,
                    "uuid": self.uuids[i],
                    "utilization.gpu": round(util),
                    "utilization.memory": round(util * 0.23),
                    "memory.used": int(MEM_TOTAL * load.mem_fraction) if held else 0,
                    "memory.total": MEM_TOTAL,
                    "power.draw": f"{power:.2f}",
                    "power.limit": f"{POWER_LIMIT:.2f}",
                    "clocks.sm": clock,
                    "clocks.max.sm": SM_MAX,
                    "clocks.mem": MEM_CLOCK,
                    "temperature.gpu": round(self.temp[i]),
                    "clocks_event_reasons.active": f"0x{reasons:016x}",
                    "pcie.link.gen.current": 5,
                    "pcie.link.width.current": 16,
                    "_held": held,
                    "_pid": load.pid,
                    "_busy": busy,
                }
            )
        return out


# ---- output formats ------------------------------------------------------------------------------


def _cell(v, unit: str, units: bool) -> str:
    return f"{v} {unit}" if units and unit else str(v)


def _header(table: dict, fields: list[str], units: bool) -> list[str]:
    return [", ".join(table[f][0] + (f" [{table[f][1]}]" if units and table[f][1] else "") for f in fields)]


def query_gpu(box: Box, fields: list[str], header: bool, units: bool) -> str:
    lines = _header(FIELDS, fields, units) if header else []
    for g in box.sample():
        lines.append(", ".join(_cell(g[f], FIELDS[f][1], units) for f in fields))
    return "\n".join(lines) + "\n"


def query_apps(box: Box, fields: list[str], header: bool, units: bool) -> str:
    lines = _header(APP_FIELDS, fields, units) if header else []
    for g in box.sample():
        if not g["_held"]:
            continue
        vals = {
            "pid": g["_pid"] or 0,
            "process_name": "python3",
            "used_memory": g["memory.used"] - 500,
            "used_gpu_memory": g["memory.used"] - 500,
            "gpu_uuid": g["uuid"],
            "gpu_name": g["name"],
        }
        lines.append(", ".join(_cell(vals[f], APP_FIELDS[f][1], units) for f in fields))
    return "\n".join(lines) + ("\n" if lines else "")


def table(box: Box) -> str:
    """The default ``nvidia-smi`` screen, column for column as driver 580 prints it."""
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y") + "       ",
        "+" + "-" * 89 + "+",
        f"| NVIDIA-SMI {DRIVER}             Driver Version: {DRIVER}     CUDA Version: {CUDA}     |",
        bar,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    samples = box.sample()
    for g in samples:
        bus = f"00000000:00:{6 + g['index']:02X}.0"
        out.append(f"| {g['index']:>3}  {g['name']:<31}On  | {bus:>18} Off | {0:>20} |")
        out.append(
            f"| N/A  {g['temperature.gpu']:>3}C    P0 {round(float(g['power.draw'])):>14}W / "
            f"{round(float(g['power.limit'])):>4}W | {str(g['memory.used']) + 'MiB':>10} / "
            f"{str(g['memory.total']) + 'MiB':>9} | {str(g['utilization.gpu']) + '%':>7}      Default |"
        )
        out.append(f"|{'':41}|{'':24}|{'Disabled':>21} |")
        out.append(bar)
    out += [
        "",
        "+" + "-" * 89 + "+",
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    procs = [g for g in samples if g["_held"]]
    if not procs:
        out.append("|  No running processes found" + " " * 61 + "|")
    for g in procs:
        mem = f"{g['memory.used'] - 500}MiB"
        out.append(f"|  {g['index']:>3}   N/A  N/A  {g['_pid'] or 0:>15}      C   {'python3':<33}{mem:>13} |")
    out.append("+" + "-" * 89 + "+")
    return "\n".join(out) + "\n"


def topo(box: Box, nvlink: bool) -> str:
    n = box.gpus
    cols = [f"GPU{i}" for i in range(n)]
    lines = ["\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    half = max(1, n // 2)
    for i in range(n):
        cells = []
        for j in range(n):
            if i == j:
                cells.append(" X ")
            elif nvlink:
                cells.append("NV18")
            else:
                cells.append("NODE" if i // half == j // half else "SYS")
        node = i // half
        lines.append(f"GPU{i}\t" + "\t".join(cells) + f"\t{node * 48}-{node * 48 + 47}\t{node}\t\tN/A")
    lines += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = PCIe path that also crosses the link between NUMA nodes",
        "  NODE = PCIe path through host bridges of one NUMA node",
        "  PHB  = PCIe path through a host bridge (the CPU)",
        "  PXB  = PCIe path through several bridges, not the host bridge",
        "  PIX  = PCIe path through at most one bridge",
        "  NV#  = a bonded set of # NVLinks",
        "",
    ]
    return "\n".join(lines)


def nvlink_status(box: Box, nvlink: bool) -> str:
    lines = []
    for i in range(box.gpus):
        lines.append(f"GPU {i}: {NAME} (UUID: {box.uuids[i]})")
        if nvlink:
            lines += [f"\t Link {k}: 26.562 GB/s" for k in range(18)]
    return "\n".join(lines) + "\n"


def help_query() -> str:
    lines = ['List of valid properties to query for the switch "--query-gpu=":', ""]
    long_names = {v: k for k, v in ALIASES.items()}
    for f, (_, _, desc) in FIELDS.items():
        alias = long_names.get(f)
        lines.append(f'"{f}"' + (f' or "{alias}"' if alias else ""))
        lines.append(desc)
        lines.append("")
    return "\n".join(lines)


# ---- command line --------------------------------------------------------------------------------


def split_args(argv: list[str]) -> tuple[dict, list[str]]:
    """The companion's own --sim-* options, then nvidia-smi's arguments."""
    opts = {"port": None, "gpus": 8, "capping": None, "straggler": None, "control": None, "seed": 0, "topology": "pcie"}
    rest = []
    it = iter(argv)
    for a in it:
        key, _, val = a.partition("=")
        if key.startswith("--sim-"):
            name = key[6:]
            if name not in opts:
                raise SystemExit(f"nvidia_smi: unknown option {key}")
            val = val or next(it, "")
            opts[name] = val if name in ("capping", "control", "topology") else int(val)
        else:
            rest.append(a)
    return opts, rest


def loop_period(args: list[str]) -> float | None:
    for i, a in enumerate(args):
        for flag, scale in (("-lms", 0.001), ("--loop-ms", 0.001), ("-l", 1.0), ("--loop", 1.0)):
            if a == flag and i + 1 < len(args):
                return float(args[i + 1]) * scale
            if a.startswith(flag + "="):
                return float(a.split("=", 1)[1]) * scale
    return None


def option(args: list[str], name: str) -> str | None:
    for a in args:
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def run(argv: list[str], write=sys.stdout.write, flush=sys.stdout.flush) -> int:
    opts, args = split_args(argv)
    box = Box(opts)
    nvl = opts["topology"] == "nvlink"
    if not args:
        write(table(box))
        return 0
    if args[0] == "--help-query-gpu":
        write(help_query())
        return 0
    if args[:2] == ["topo", "-m"]:
        write(topo(box, nvl))
        return 0
    if args[:2] == ["nvlink", "-s"]:
        write(nvlink_status(box, nvl))
        return 0
    if args[0] == "dmon":
        return dmon(box, args, write, flush)
    fmt = (option(args, "--format") or "").split(",")
    header, units = "noheader" not in fmt, "nounits" not in fmt
    if "csv" not in fmt:
        write(USAGE)
        return 2
    gpu_q, app_q = option(args, "--query-gpu"), option(args, "--query-compute-apps")
    if app_q is not None:
        fields = app_q.split(",")
        bad = [f for f in fields if f not in APP_FIELDS]
        if bad:
            write(f'Field "{bad[0]}" is not a valid field to query.\n\n')
            return 2
        write(query_apps(box, fields, header, units))
        return 0
    if gpu_q is None:
        write(USAGE)
        return 2
    fields = [ALIASES.get(f, f) for f in gpu_q.split(",")]
    bad = [f for f in fields if f not in FIELDS]
    if bad:
        write(f'Field "{bad[0]}" is not a valid field to query.\n\n')
        return 2
    period = loop_period(args)
    first = True
    next_at = time.monotonic()
    while True:
        write(query_gpu(box, fields, header and first, units))
        flush()
        first = False
        if period is None:
            return 0
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))


def dmon(box: Box, args: list[str], write, flush) -> int:
    """``dmon -s t``: PCIe receive / transmit throughput per GPU, MB/s, every ``-d`` seconds."""
    delay = float(args[args.index("-d") + 1]) if "-d" in args else 1.0
    count = int(args[args.index("-c") + 1]) if "-c" in args else None
    write("# gpu  rxpci  txpci \n# Idx   MB/s   MB/s \n")
    n = 0
    while count is None or n < count:
        for g in box.sample():
            rx = int(900 + 300 * box.rng.random()) if g["_busy"] else 0
            write(f"{g['index']:>5} {rx:>6} {rx // 3:>6} \n")
        flush()
        n += 1
        if count is None or n < count:
            time.sleep(delay)
    return 0


def main() -> int:
    try:
        return run(sys.argv[1:])
    except (BrokenPipeError, KeyboardInterrupt):
        # the reader went away (the stream was closed): leave quietly, as nvidia-smi does
        try:
            os.close(1)
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
