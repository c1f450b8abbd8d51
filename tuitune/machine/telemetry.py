"""GPU telemetry: one long-lived ``nvidia-smi --query-gpu … -lms PERIOD`` stream over the preset's
transport, turned into ``GpuSample`` events (one per GPU per tick), plus the flags read from them.

Why one stream: a process per sample costs a fork, an SSH channel and nvidia-smi's start-up
(~100 ms of driver calls) every period; ``-lms`` keeps one process that prints a tick per period.
A tick is emitted only once it is complete (every GPU of the previous tick seen, or the next tick
started), so a link drop mid-tick loses that tick instead of publishing half of it; after the
reconnect a new stream starts and ``seq`` keeps counting. nvidia-smi's own ``timestamp`` column
drops any tick not newer than the last one published (no duplicate samples, whatever the link does).
PCIe throughput has no query field: a second stream, ``nvidia-smi dmon -s t``, keeps the latest
receive / transmit rate per GPU, attached to the next tick; where dmon fails, it is left out.
"""

from __future__ import annotations

import asyncio
import shlex
import statistics
import time
from collections.abc import Callable

from tuitune.base import redact
from tuitune.base.aio import cancel_and_wait
from tuitune.base.events import Event, GpuSample, TelemetryState
from tuitune.machine.transport import LinkLost, Transport, TransportError
from tuitune.measure import smi
from tuitune.measure.metrics import GpuStore

DEFAULT_COMMAND = "nvidia-smi"
SAMPLE_KEYS = frozenset(GpuSample.__struct_fields__) - {"seq"}
MAX_PARTIAL = 64 * 1024  # a "line" longer than this is not nvidia-smi output
IDLE_UTIL = 10.0  # % below which a GPU that holds the server's memory counts as idle
HOLDS_MEMORY_MIB = 256.0  # a CUDA context alone takes ~500 MiB: less means no process lives there
STRAGGLER_GAP = 20.0  # utilisation points below the others' median
STRAGGLER_PEERS = 50.0  # … when the others are at least this busy
WINDOW = 6  # ticks averaged for the idle / straggler flags (3 s at 500 ms)
CAPPED_SHARE = 0.2  # a run is marked when capping was on in at least this share of its ticks
STRAGGLER_SHARE = 0.5


def command_prefix(command: str | None, python: str, port: int) -> str:
    """The shell words that stand for nvidia-smi, each quoted; ``{python}`` and ``{port}`` are the
    preset's server interpreter and port (so a simulator preset can run the companion)."""
    from tuitune.preset import shell_path

    words = shlex.split(command or DEFAULT_COMMAND)
    return " ".join(shell_path(w.replace("{python}", python).replace("{port}", str(port))) for w in words)


def for_preset(preset) -> str:
    return command_prefix(preset.telemetry.command, preset.python(), preset.server.port)


# ---- flags ---------------------------------------------------------------------------------------


def recent_util(g) -> float | None:
    vals = g.series["util"].values()[-WINDOW:]
    return sum(vals) / len(vals) if vals else None


def holds_memory(s: GpuSample) -> bool:
    return s.mem_used is not None and s.mem_used >= HOLDS_MEMORY_MIB


def gpu_flags(store: GpuStore, load_on: bool) -> dict[int, list[str]]:
    """Per GPU of the last tick: capping words (from clock event reasons), ``idle under load``
    (holds memory, load on, utilisation near 0), ``straggler`` (well below its busy peers)."""
    cur = store.current()
    last = {g.index: g.last for g in cur if g.last is not None}  # (all of them: current() answered)
    flags: dict[int, list[str]] = {
        i: [
            w
            for w in smi.decode_reasons(s.reasons)
            if w in ("power cap", "power brake", "SW thermal", "HW thermal", "HW slowdown")
        ]
        for i, s in last.items()
    }
    util = {g.index: recent_util(g) for g in cur}
    # GPUs that hold memory, with their utilisation
    used = {i: u for i, s in last.items() if holds_memory(s) and (u := util[i]) is not None}
    if load_on:
        flags.update({i: flags[i] + ["idle under load"] for i, u in used.items() if u < IDLE_UTIL})
    if len(used) >= 2:
        for i, u in used.items():
            peers = statistics.median(v for j, v in used.items() if j != i)
            if peers >= STRAGGLER_PEERS and u < peers - STRAGGLER_GAP:
                flags[i].append("straggler")
    return flags


def _gpu_list(indexes) -> str:
    return ",".join(str(i) for i in sorted(indexes))


class RunWatch:
    """Telemetry seen during one benchmark run: was any GPU capped, or a straggler, for long?"""

    def __init__(self) -> None:
        self.store = GpuStore(capacity=WINDOW)
        self.ticks = 0
        self.capped: dict[str, set[int]] = {}  # capping kind -> GPUs
        self.capped_ticks = 0
        self.straggler: set[int] = set()
        self.straggler_ticks = 0

    def feed(self, events: list[Event]) -> None:
        samples = [e for e in events if isinstance(e, GpuSample)]
        if not samples:
            return
        for s in samples:
            self.store.feed(s)
        self.ticks += 1
        flags = gpu_flags(self.store, load_on=False)
        capped = False
        for g in self.store.current():
            kind = smi.capping(g.last.reasons) if g.last is not None else None
            if kind:
                self.capped.setdefault(kind, set()).add(g.index)
                capped = True
        self.capped_ticks += capped
        lag = {i for i, f in flags.items() if "straggler" in f}
        self.straggler |= lag
        self.straggler_ticks += bool(lag)

    def note(self) -> str | None:
        """A short warning for the runs table and the report, or None when the run looks clean."""
        if not self.ticks:
            return None
        parts = []
        if self.capped_ticks / self.ticks >= CAPPED_SHARE:
            kinds = ", ".join(f"{k} cap GPU {_gpu_list(g)}" for k, g in sorted(self.capped.items()))
            parts.append(f"{kinds} ({self.capped_ticks / self.ticks:.0%} of samples)")
        if self.straggler_ticks / self.ticks >= STRAGGLER_SHARE:
            parts.append(f"straggler GPU {_gpu_list(self.straggler)} ({self.straggler_ticks / self.ticks:.0%})")
        return "; ".join(parts) or None


class CaptureThrottle:
    """Keeps whole telemetry ticks, one every ``every_s`` seconds (captures stay small).

    Kept ticks are scheduled by due time: a tick is kept when it arrives at or after the due time,
    and the next one is due ``every_s`` after that due time, not after the tick's arrival. Ticks
    come at the sampling period with some jitter: timed from the last kept tick's arrival, the
    tick that is due would be dropped whenever it came a hair early, and a capture with
    ``every_s`` twice the period kept ~0.77 ticks a second for 1 (benchmarks/telemetry_size.py
    counts them). Two kept ticks are never closer than ``every_s`` less one sampling period; after
    a gap in the ticks (longer than ``every_s``) the schedule restarts from the next tick, with no
    burst to catch up. The decision is made once a tick (``seq``): a tick is kept or dropped whole.
    """

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self.clock = clock
        self._seq = -1  # the tick the last decision was about
        self._keep = False
        self._due: float | None = None

    def _decide(self) -> bool:
        now = self.clock()
        due = self._due
        if due is not None and now < due:
            return False
        if due is None or now - due >= self.every_s:  # the first tick, or after a gap: restart
            self._due = now + self.every_s
        else:
            self._due = due + self.every_s
        return True

    def filter(self, events: list[Event]) -> list[Event]:
        out = []
        for e in events:
            if isinstance(e, GpuSample):
                if e.seq != self._seq:
                    self._seq, self._keep = e.seq, self._decide()
                if not self._keep:
                    continue
            out.append(e)
        return out


# ---- the collector -------------------------------------------------------------------------------


class Collector:
    def __init__(
        self,
        transport: Transport,
        prefix: str,
        publish: Callable[[list[Event]], None],
        period_ms: int = 500,
        fields: tuple[str, ...] = smi.STREAM_FIELDS,
        retry_s: float = 5.0,
    ):
        self.transport = transport
        self.prefix = prefix
        self.publish = publish
        self.period_ms = period_ms
        self.wanted = fields
        self.fields: list[str] = []
        self.retry_s = retry_s
        self.seq = -1
        self.state = "starting"
        self.last_stamp: str | None = None
        self.last_error: str | None = None
        self.duplicates = 0  # ticks dropped as not newer than the last one
        self.malformed = 0
        self.pcie: dict[int, tuple[float | None, float | None]] = {}  # GPU -> (rx, tx) MB/s, from dmon
        self.throughput_error: str | None = None
        self._expected = 0
        self._tick: list[dict] = []
        self._partial = b""
        self._closed = False

    def _set(self, state: str, detail: str | None = None, gpus: int | None = None) -> None:
        self.state = state
        # the detail may quote the telemetry command or its output: masked like every other text
        self.publish([TelemetryState(state, redact.text(detail) if detail else None, gpus)])

    async def run(self) -> None:
        """Probe, then stream until closed; a link that is lost for good ends it with a notice."""
        try:
            if not await self._probe():
                return
            dmon = asyncio.ensure_future(self._throughput())
            try:
                await self._stream()
            finally:
                await cancel_and_wait(dmon)  # let its stream kill the remote process before the loop goes
        except TransportError as e:
            self._set("stopped", str(e))

    async def _probe(self) -> bool:
        """Ask ``--help-query-gpu`` once; keep the fields this nvidia-smi knows."""
        self._set("starting", f"{self.prefix} on {self.transport.label}")
        while True:
            try:
                r = await self.transport.run(f"{self.prefix} --help-query-gpu", timeout=30)
                break
            except LinkLost:
                if not await self.transport.resume(lambda: self._closed):
                    return False
        name = shlex.split(self.prefix)[0] if self.prefix else DEFAULT_COMMAND
        if r.exit_status == 127 or "not found" in r.stderr or "No such file" in r.stderr:
            self._set("unavailable", f"{name} not found on {self.transport.label}: GPU telemetry is off")
            return False
        known = smi.parse_help(r.stdout)
        if not known:
            said = (r.stdout + r.stderr).strip().splitlines()
            self._set(
                "unavailable",
                f"{name} on {self.transport.label} failed: {said[0][:200] if said else f'exit status {r.exit_status}'}",
            )
            return False
        self.fields = smi.supported(self.wanted, known)
        if "index" not in self.fields:
            self._set("unavailable", f"{name} on {self.transport.label} cannot report GPU indexes")
            return False
        have = {smi.ALIASES.get(f, f) for f in self.fields}
        dropped = [f for f in self.wanted if f not in have]
        if dropped:
            self._set("starting", f"this {name} lacks {', '.join(dropped)}: left out")
        return True

    def command(self) -> str:
        return (
            f"{self.prefix} --query-gpu={','.join(self.fields)} --format=csv,noheader,nounits "
            f"-lms {int(self.period_ms)}"
        )

    async def _stream(self) -> None:
        while not self._closed:
            try:
                async for chunk in self.transport.stream(self.command()):
                    self.feed(chunk)
                    if self._closed:
                        return
            except LinkLost:
                if self._closed:
                    return
                self._drop_partial()
                self._set("interrupted", "link lost; resuming")
                if not await self.transport.resume(lambda: self._closed):
                    return
                continue
            if self._closed:
                return
            self._drop_partial()
            self._set("interrupted", f"{self.last_error or 'nvidia-smi exited'}; retrying in {self.retry_s:.0f} s")
            await asyncio.sleep(self.retry_s)

    async def _throughput(self) -> None:
        """``dmon -s t`` (one line per GPU per second) -> ``self.pcie``; given up when it yields no row."""
        cols: list[str] = []
        partial = b""
        while not self._closed:
            rows = 0
            try:
                async for chunk in self.transport.stream(f"{self.prefix} dmon -s t -d 1"):
                    lines = (partial + chunk).split(b"\n")
                    partial = lines.pop()
                    for raw in lines:
                        text = raw.decode("utf-8", "replace")
                        if text.startswith("#"):
                            cols = cols or text.lstrip("#").split()
                            continue
                        cells = text.split()
                        if cols and len(cells) == len(cols) and cells[0].isdigit():
                            r = dict(zip(cols, cells, strict=False))
                            self.pcie[int(cells[0])] = (
                                smi.value(r.get("rxpci", ""), "num"),
                                smi.value(r.get("txpci", ""), "num"),
                            )
                            rows += 1
                        elif text.strip():
                            self.throughput_error = text.strip()[:200]
            except LinkLost:
                await asyncio.sleep(1.0)  # the query stream reconnects the transport
                partial = b""
                continue
            except TransportError as e:
                self.throughput_error = str(e)
                return
            if not rows:
                return  # this nvidia-smi cannot report PCIe throughput
            partial = b""
            await asyncio.sleep(self.retry_s)

    def close(self) -> None:
        self._closed = True

    def _drop_partial(self) -> None:
        """What arrived after the last complete tick is not trusted: the next stream starts afresh."""
        self._partial = b""
        self._tick = []

    def feed(self, chunk: bytes) -> None:
        """Raw stream output -> complete ticks, published as they complete (pure apart from publish)."""
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_PARTIAL:
            self._partial = b""
        n = len(self.fields)
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            cells = smi.split_row(line, n, self.fields)
            r = smi.row(self.fields, cells) if cells is not None else None
            if r is None or r.get("index") is None:
                self.malformed += 1
                self.last_error = line[:200]
                continue
            if any(t["index"] == r["index"] for t in self._tick):
                self._emit()
            self._tick.append(r)
            if self._expected and len(self._tick) >= self._expected:
                self._emit()

    def _emit(self) -> None:
        tick, self._tick = self._tick, []
        if not tick:
            return
        stamp = tick[0].get("stamp")
        if stamp and self.last_stamp and stamp <= self.last_stamp:
            self.duplicates += 1
            return
        self.last_stamp = stamp or self.last_stamp
        self.seq += 1
        self._expected = len(tick)
        events: list[Event] = []
        if self.state != "on":
            self.state = "on"
            events.append(TelemetryState("on", f"{len(tick)} GPU(s), every {self.period_ms} ms", len(tick)))
        for r in tick:
            rx, tx = self.pcie.get(r["index"], (None, None))
            events.append(
                GpuSample(seq=self.seq, pcie_rx=rx, pcie_tx=tx, **{k: v for k, v in r.items() if k in SAMPLE_KEYS})
            )
        self.publish(events)


async def stop(collector: Collector | None, task: asyncio.Task | None) -> None:
    if collector is not None:
        collector.close()
    await cancel_and_wait(task)
