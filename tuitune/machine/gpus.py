"""`tuitune gpus`: what every GPU of the target is doing, as a table (like gpustat) or JSON, once or
live (``watch``); and `tuitune gpus --parse FILE` for saved nvidia-smi output. Reads through
tuitune.smi, as the collector.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import msgspec

from tuitune.base.aio import cancel_and_wait
from tuitune.base.errors import TuituneError
from tuitune.base.events import GpuSample, TelemetryState
from tuitune.machine.telemetry import SAMPLE_KEYS, Collector, gpu_flags
from tuitune.machine.transport import LinkLost, Transport
from tuitune.measure import smi
from tuitune.measure.metrics import GpuStore

SNAPSHOT_FIELDS = (*smi.GPU_FIELDS, "uuid")


class GpusError(TuituneError):
    """nvidia-smi missing or failing on the target (one sentence)."""


async def _run(t: Transport, command: str):
    try:
        return await t.run(command, timeout=30)
    except LinkLost:
        await t.reconnect()
        return await t.run(command, timeout=30)


async def known_fields(t: Transport, prefix: str) -> set[str]:
    r = await _run(t, f"{prefix} --help-query-gpu")
    name = shlex.split(prefix)[0]
    if r.exit_status == 127 or "not found" in r.stderr or "No such file" in r.stderr:
        raise GpusError(f"{name} not found on {t.label}: no GPU telemetry there")
    known = smi.parse_help(r.stdout)
    if not known:
        said = (r.stdout + r.stderr).strip().splitlines()
        raise GpusError(f"{name} on {t.label} failed: {said[0][:200] if said else f'exit status {r.exit_status}'}")
    return known


async def snapshot(t: Transport, prefix: str, known: set[str] | None = None, with_topology: bool = True) -> dict:
    """One query of every GPU, the compute processes on them and (once) the link matrix."""
    known = known if known is not None else await known_fields(t, prefix)
    fields = smi.supported(SNAPSHOT_FIELDS, known)
    r = await _run(t, f"{prefix} --query-gpu={','.join(fields)} --format=csv,noheader,nounits")
    table = smi.parse_query(r.stdout, fields)
    if not r.ok or not table.rows:
        said = (table.malformed or (r.stderr.strip() or f"exit status {r.exit_status}").splitlines())[0]
        raise GpusError(f"{shlex.split(prefix)[0]} on {t.label} gave no GPU: {said[:200]}")
    r = await _run(t, f"{prefix} dmon -s t -c 1")  # PCIe throughput: no query field reports it
    try:
        pcie = {row["gpu"]: row for row in smi.parse_dmon(r.stdout)} if r.ok else {}
    except smi.SmiParseError:
        pcie = {}
    for g in table.rows:
        if g["index"] in pcie:
            g["pcie_rx"], g["pcie_tx"] = pcie[g["index"]].get("rxpci"), pcie[g["index"]].get("txpci")
    have = {smi.ALIASES.get(f, f) for f in fields}
    store = GpuStore()
    for g in table.rows:
        store.feed(GpuSample(seq=0, **{k: v for k, v in g.items() if k in SAMPLE_KEYS}))
    out = {
        "gpus": table.rows,
        "dropped_fields": [f for f in SNAPSHOT_FIELDS if f not in have],
        "flags": {str(i): f for i, f in gpu_flags(store, load_on=False).items() if f},
        "processes": await processes(t, prefix, table.rows),
    }
    if with_topology:
        r = await _run(t, f"{prefix} topo -m")
        try:
            out["topology"] = asdict(smi.parse_topo(r.stdout)) if r.ok else None
        except smi.SmiParseError:
            out["topology"] = None
    return out


async def processes(t: Transport, prefix: str, gpus: list[dict]) -> list[dict]:
    r = await _run(t, f"{prefix} --query-compute-apps={','.join(smi.APP_FIELDS)} --format=csv,noheader,nounits")
    if not r.ok:
        return []
    by_uuid = {g.get("uuid"): g["index"] for g in gpus}
    apps = smi.parse_query(r.stdout, smi.APP_FIELDS).rows
    for a in apps:
        a["gpu"] = by_uuid.get(a.get("gpu_uuid"))
    return apps


PROCESSES_EVERY_S = 5.0  # how often `gpus --watch` re-reads the compute processes


async def watch(
    t: Transport,
    prefix: str,
    period_ms: int,
    on_frame: Callable[[dict], None],
    on_trouble: Callable[[str], None],
) -> None:
    """`gpus --watch`: one long-lived nvidia-smi stream (the collector's); every tick that brings
    samples gives ``on_frame`` a frame: ``seq``, ``gpus`` (the last sample of each), ``processes``
    (re-read every few seconds), ``flags`` and ``topology`` (read once). When the stream becomes
    unavailable, stops or is interrupted, ``on_trouble`` gets one sentence. Runs until cancelled
    or the stream ends."""
    known = await known_fields(t, prefix)
    snap = await snapshot(t, prefix, known)
    store = GpuStore()
    procs = {"rows": snap["processes"]}

    def on(events) -> None:
        for ev in events:
            if isinstance(ev, TelemetryState) and ev.state in ("unavailable", "stopped", "interrupted"):
                on_trouble(f"telemetry {ev.state}: {ev.detail}")
            elif isinstance(ev, GpuSample):
                store.feed(ev)
        if not any(isinstance(ev, GpuSample) for ev in events):
            return
        on_frame(
            {
                "seq": store.seq,
                "gpus": [msgspec.structs.asdict(g.last) for g in store.current() if g.last is not None],
                "processes": procs["rows"],
                "flags": gpu_flags(store, False),
                "topology": snap.get("topology"),
            }
        )

    async def refresh_procs() -> None:
        while True:
            await asyncio.sleep(PROCESSES_EVERY_S)
            procs["rows"] = await processes(t, prefix, snap["gpus"])

    task = asyncio.ensure_future(refresh_procs())
    try:
        await Collector(t, prefix, on, period_ms).run()
    finally:
        await cancel_and_wait(task)


# ---- text --------------------------------------------------------------------------------------


def _n(v, fmt: str = "{:.0f}") -> str:
    return "—" if v is None else fmt.format(v)


def format_gpus(gpus: list[dict], procs: list[dict] | None = None, flags: dict[int, list[str]] | None = None) -> str:
    """One row per GPU: utilisation, memory, power, SM clock, temperature, PCIe, reasons, processes."""
    rxtx = any(g.get("pcie_rx") is not None for g in gpus)
    head = (
        f"{'gpu':<3} {'name':<20} {'util':>5} {'memory used/total':>19} {'power/limit':>13} "
        f"{'SM/max MHz':>11} {'temp':>5} {'PCIe':>5}" + (f" {'rx/tx MB/s':>11}" if rxtx else "") + "  flags / processes"
    )
    lines = [head]
    for g in gpus:
        mem = (
            f"{_n(g.get('mem_used') and g['mem_used'] / 1024, '{:.1f}')}/"
            f"{_n(g.get('mem_total') and g['mem_total'] / 1024, '{:.1f}')} GiB"
        )
        pw = f"{_n(g.get('power'))}/{_n(g.get('power_limit'))} W"
        clk = f"{_n(g.get('sm_clock'))}/{_n(g.get('sm_clock_max'))}"
        pcie = f"{_n(g.get('pcie_gen'))}x{_n(g.get('pcie_width'))}" if g.get("pcie_gen") is not None else "—"
        words = [w for w in smi.decode_reasons(g.get("reasons")) if w != "idle"]
        index = g.get("index")
        words += (flags or {}).get(index, []) if index is not None else []
        apps = [
            f"{p['process_name']}/{p['pid']}({_n(p.get('used_memory') and p['used_memory'] / 1024, '{:.1f}')}G)"
            for p in procs or []
            if p.get("gpu") == g.get("index")
        ]
        name = (g.get("name") or "?")[:20]
        temp = f"{_n(g.get('temp'))}C"
        util = f"{_n(g.get('util'))}%"
        pcie = f"{pcie:>5}" + (f" {_n(g.get('pcie_rx')) + '/' + _n(g.get('pcie_tx')):>11}" if rxtx else "")
        lines.append(
            f"{_n(g.get('index'), '{}'):<3} {name:<20} {util:>5} {mem:>19} {pw:>13} {clk:>11} "
            f"{temp:>5} {pcie}  {' '.join(['[' + ', '.join(dict.fromkeys(words)) + ']'] if words else [])}"
            f"{' ' if words and apps else ''}{' '.join(apps)}".rstrip()
        )
    unplaced = [p for p in procs or [] if p.get("gpu") is None]
    for p in unplaced:
        lines.append(
            f"    process {p.get('pid')} {p.get('process_name')} "
            f"{_n(p.get('used_memory'), '{:.0f}')} MiB (GPU not reported)"
        )
    return "\n".join(lines)


def format_topology(topo: dict | None) -> str:
    if not topo:
        return ""
    devs = topo["devices"]
    w = max(5, *(len(d) for d in devs))
    lines = ["links: " + " ".join(f"{d:>{w}}" for d in devs) + "  CPU affinity"]
    for d in devs:
        row = topo["links"].get(d, {})
        aff = topo["affinity"].get(d, {}).get("CPU Affinity", "")
        lines.append(f"{d:>6} " + " ".join(f"{row.get(c, ''):>{w}}" for c in devs) + f"  {aff}")
    return "\n".join(lines)


def format_snapshot(snap: dict) -> str:
    flags = {int(i): f for i, f in snap.get("flags", {}).items()}
    out = [format_gpus(snap["gpus"], snap.get("processes"), flags)]
    if snap.get("dropped_fields"):
        out.append(f"(this nvidia-smi lacks {', '.join(snap['dropped_fields'])})")
    topo = format_topology(snap.get("topology"))
    if topo:
        out += ["", topo]
    return "\n".join(out)


# ---- --parse FILE ------------------------------------------------------------------------------


def parse_file(text: str, fields: list[str] | None = None, name: str | None = None) -> dict:
    """Any saved nvidia-smi output -> ``{"kind": …, …}`` (the same readers the collector uses);
    an error names the file (``name``) it was read from."""
    try:
        return _parse_file(text, fields)
    except smi.SmiParseError as e:
        if name is None:
            raise
        raise smi.SmiParseError(f"{name}: {e}") from None


def _parse_file(text: str, fields: list[str] | None) -> dict:
    kind = smi.detect(text)
    if kind == "table":
        return {"kind": kind, **asdict(smi.parse_table(text))}
    if kind == "topo":
        return {"kind": kind, **asdict(smi.parse_topo(text))}
    if kind == "nvlink":
        return {"kind": kind, "gpus": smi.parse_nvlink(text)}
    if kind == "dmon":
        return {"kind": kind, "rows": smi.parse_dmon(text)}
    if kind == "help":
        return {"kind": kind, "fields": sorted(smi.parse_help(text))}
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    if not first:
        raise smi.SmiParseError("empty file")
    if fields is None and not smi.is_header(first):
        n = len(first.split(", "))
        fields = next((list(f) for f in (smi.GPU_FIELDS, smi.STREAM_FIELDS) if len(f) == n), None)
        if fields is None:
            raise smi.SmiParseError(
                f"CSV without a header and {n} columns: name them with --fields "
                f"(e.g. --fields {','.join(smi.GPU_FIELDS[:3])},…)"
            )
    table = smi.parse_query(text, fields)
    if not table.rows:
        raise smi.SmiParseError("no nvidia-smi output recognised (not a table, topo -m, nvlink -s, dmon or query CSV)")
    return {
        "kind": "apps" if "pid" in table.fields else "query",
        "fields": table.fields,
        "rows": table.rows,
        "malformed": table.malformed,
    }


def format_parsed(p: dict) -> str:
    kind = p["kind"]
    if kind == "table":
        head = f"nvidia-smi {p['smi_version']}, driver {p['driver']}, CUDA {p['cuda']}" + (
            f", {p['stamp']}" if p.get("stamp") else ""
        )
        procs = [{**q, "gpu": q["gpu"]} for q in p["processes"]]
        return head + "\n" + format_gpus(p["gpus"], procs) + ("" if procs else "\n(no running processes)")
    if kind == "topo":
        return format_topology(p)
    if kind == "nvlink":
        return "\n".join(
            f"GPU {i} {g['name']}: {len(g['links'])} link(s), "
            f"{sum(v or 0 for v in g['links'].values()):.1f} GB/s in all"
            for i, g in p["gpus"].items()
        )
    if kind == "dmon":
        cols = list(p["rows"][0]) if p["rows"] else []
        return "\n".join(
            [" ".join(f"{c:>8}" for c in cols)] + [" ".join(f"{_n(r[c], '{:g}'):>8}" for c in cols) for r in p["rows"]]
        )
    if kind == "help":
        return f"{len(p['fields'])} queryable fields: " + ", ".join(p["fields"])
    if kind == "apps":
        return "\n".join(
            [f"{'pid':>8} {'process':<24} {'memory':>10}"]
            + [
                f"{_n(r.get('pid'), '{}'):>8} {(r.get('process_name') or '?'):<24} "
                f"{_n(r.get('used_memory'), '{:.0f}'):>6} MiB"
                for r in p["rows"]
            ]
        )
    ticks: dict[Any, int] = {}  # GPU index (as the row has it) -> rows
    for r in p["rows"]:
        ticks[r.get("index")] = ticks.get(r.get("index"), 0) + 1
    n = max(ticks.values()) if ticks else 0
    last = list({r.get("index"): r for r in p["rows"]}.values())
    return (
        f"{len(p['rows'])} row(s), {len(ticks)} GPU(s)"
        + (f", {n} samples each; the last:" if n > 1 else "")
        + "\n"
        + format_gpus(last)
        + (f"\n{len(p['malformed'])} line(s) not understood" if p["malformed"] else "")
    )
