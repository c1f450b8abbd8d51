"""Captures: a recorded event stream, and its replay through the same session interface.

Format (schema 1): JSON Lines, gzip-compressed when the name ends in ``.gz``. The first record is
``{"kind": "meta", "schema": 1, ...}`` (tuitune version, preset and its hash, target, server
version, start time); every other record is an event's JSON (``kind`` and its fields) plus ``t``
(wall-clock seconds) and ``m`` (monotonic seconds since the capture started). Readers skip unknown
kinds and tolerate a truncated last record, so a capture killed mid-write still reads, and newer
files keep reading in older tuitune as far as they can. What was read only in part is said, never
read as if whole (issue 42): a gzip stream cut short or failing its checksum, a record over
MAX_RECORD bytes, a file whose name says .gz and whose content is not (``partial``).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import os
import stat
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeGuard

import msgspec

from tuitune import __version__
from tuitune.base.errors import TuituneError
from tuitune.base.events import Event, LinkState, ServerState, from_dict
from tuitune.base.redact import preset_dict as redacted_preset  # noqa: F401 - record and sweep write it
from tuitune.measure.stream import EventStream

SCHEMA = 1


class CaptureError(TuituneError):
    """A capture that cannot be read at all, or written (one sentence); ``code`` is the exit
    status it means on the command line: 2 for an input that is not a capture, 1 for a failed write."""

    code = 2


def _open_write(path: Path) -> IO[bytes]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        os.fchmod(fd, 0o600)  # the mode above applies only to a new file; an old one may be 0644
    raw = os.fdopen(fd, "wb")
    if path.suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)  # type: ignore[return-value]
    return raw


class CaptureWriter:
    """Appends events in batches; ``close`` (also on Ctrl-C) finishes the file cleanly."""

    def __init__(self, path: str | Path, meta: dict, flush_every: int = 256, flush_s: float = 0.5):
        self.path = Path(path)
        try:
            self._f = _open_write(self.path)
        except OSError as e:
            raise CaptureError(f"{self.path}: cannot create it ({e.strerror or e})", 1) from None
        self._enc = msgspec.json.Encoder()
        self._buf: list[bytes] = []
        self.flush_every = flush_every
        self.flush_s = flush_s
        self._last_flush = time.monotonic()
        self._m0 = time.monotonic()
        self.events = 0
        self.bytes = 0
        header = {"kind": "meta", "schema": SCHEMA, "tuitune": __version__, "started": time.time(), **meta}
        self._write_now(json.dumps(header, default=str).encode() + b"\n")

    def _write_now(self, data: bytes) -> None:
        self._f.write(data)
        self.bytes += len(data)

    def write(self, events: list[Event], t: float | None = None, m: float | None = None) -> None:
        t = time.time() if t is None else t
        m = (time.monotonic() - self._m0) if m is None else m
        stamp = b',"t":%.6f,"m":%.6f}\n' % (t, m)
        enc = self._enc.encode
        for ev in events:
            self._buf.append(enc(ev)[:-1] + stamp)
        self.events += len(events)
        if len(self._buf) >= self.flush_every or time.monotonic() - self._last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._write_now(b"".join(self._buf))
            self._buf.clear()
        self._f.flush()
        if isinstance(self._f, gzip.GzipFile):
            self._f.fileobj.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()
        self._f.close()


@dataclass
class Record:
    t: float
    m: float
    event: Event


@dataclass
class Capture:
    meta: dict
    path: Path
    truncated: bool = False  # the last record was cut short (a killed recorder)
    skipped: int = 0  # records of unknown kinds or unreadable
    records: list[Record] = field(default_factory=list)
    damage: str | None = None  # its gzip stream cut short or corrupt (a sentence, with how much was read)
    note: str | None = None  # compressed or not against what its name says
    oversized: int = 0  # records over MAX_RECORD bytes, passed over


MAX_RECORD = 4 << 20  # bytes of one record; a raw log line (64 KiB of text, escaped) is far below
_GZIP_MAGIC = b"\x1f\x8b"


def _lines(path: Path, stats: dict) -> Iterator[bytes]:
    """The capture's records as raw lines, its integrity checked on the way (issue 42): compressed
    or not by its content, not its name (a mislabelled file is read, and said); a gzip stream cut
    short or failing its checksum, and a record over MAX_RECORD bytes (passed over without holding
    it), are set down in ``stats`` ("damage", "note", "oversized") with how much was read."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise CaptureError(f"{path}: cannot open it ({e.strerror or e})") from None
    with raw:
        try:
            gz = raw.read(2) == _GZIP_MAGIC
            raw.seek(0)
        except OSError as e:
            raise CaptureError(f"{path}: cannot read it ({e.strerror or e})") from None
        if gz != (path.suffix == ".gz"):
            stats["note"] = (
                f"{path.name} is not gzip-compressed though its name ends in .gz: read as plain JSON Lines"
                if not gz
                else f"{path.name} is gzip-compressed though its name does not end in .gz: read decompressed"
            )
        f: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw  # type: ignore[assignment]
        read = 0
        try:
            while True:
                line = f.readline(MAX_RECORD + 1)
                if not line:
                    return
                read += len(line)
                if len(line) > MAX_RECORD and not line.endswith(b"\n"):
                    while line and not line.endswith(b"\n"):  # the rest of it, a block at a time
                        line = f.readline(1 << 20)
                        read += len(line)
                    stats["oversized"] += 1
                    continue
                yield line
        except EOFError:
            stats["damage"] = f"its gzip stream is cut short (no end marker) after {read} bytes of data"
        except (gzip.BadGzipFile, zlib.error, OSError) as e:
            stats["damage"] = f"its gzip data is corrupt after {read} bytes of data ({e})"


def _is_number(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def iter_capture(path: str | Path) -> tuple[dict, Iterator[Record], dict]:
    """(meta, records, stats) without loading the whole file; stats fills in as it is read."""
    path = Path(path)
    stats: dict = {"truncated": False, "skipped": 0, "oversized": 0, "damage": None, "note": None, "records": 0}
    lines = _lines(path, stats)
    first = next(lines, None)
    if first is None:
        if stats["damage"]:
            raise CaptureError(f"{path}: not a readable capture: {stats['damage']}")
        raise CaptureError(f"{path}: empty file, not a tuitune capture")
    try:
        meta = json.loads(first)
    except ValueError:
        raise CaptureError(f"{path}: not a tuitune capture (first line is not JSON)") from None
    if not isinstance(meta, dict) or meta.get("kind") != "meta":
        raise CaptureError(f"{path}: not a tuitune capture (no metadata record)")
    if not isinstance(meta.get("schema"), int) or meta["schema"] > SCHEMA:
        raise CaptureError(
            f"{path}: capture schema {meta.get('schema')!r} is newer than this tuitune "
            f"reads ({SCHEMA}); upgrade tuitune"
        )
    dec = msgspec.json.Decoder()

    def records() -> Iterator[Record]:
        for raw in lines:
            if not raw.endswith(b"\n"):
                stats["truncated"] = True
                return
            try:
                d = dec.decode(raw)
            except msgspec.DecodeError:
                stats["skipped"] += 1
                continue
            ev = from_dict(d) if isinstance(d, dict) else None
            t, m = (d.get("t", 0.0), d.get("m", 0.0)) if ev is not None else (None, None)
            if ev is None or not (_is_number(t) and _is_number(m)):  # "t": null or "t": "x" from a damaged file
                stats["skipped"] += 1
                continue
            stats["records"] += 1
            yield Record(float(t), float(m), ev)

    return meta, records(), stats


def read_capture(path: str | Path) -> Capture:
    meta, recs, stats = iter_capture(path)
    cap = Capture(meta, Path(path))
    cap.records = list(recs)
    cap.truncated, cap.skipped = stats["truncated"], stats["skipped"]
    cap.damage, cap.note, cap.oversized = stats["damage"], stats["note"], stats["oversized"]
    return cap


def partial(path: str | Path, stats: dict) -> str | None:
    """One sentence when a capture was read only in part (its gzip stream cut short or corrupt, a
    record over the size cap, its last record cut short), with how much was read; None when whole.
    ``stats``: iter_capture's, once read (or a Capture's fields)."""
    why = []
    if stats.get("damage"):
        why.append(stats["damage"])
    if stats.get("oversized"):
        why.append(f"{stats['oversized']} record(s) over {MAX_RECORD >> 20} MiB passed over")
    if stats.get("truncated") and not stats.get("damage"):
        why.append("its last record is cut short")
    if not why:
        return None
    return (
        f"{path}: read in part: {'; '.join(why)}; {stats.get('records', 0)} record(s) read, what follows rests on them"
    )


def capture_stats(cap: Capture) -> dict:
    """A Capture's reading, in iter_capture's terms (for ``partial``)."""
    return {
        "damage": cap.damage,
        "oversized": cap.oversized,
        "truncated": cap.truncated,
        "records": len(cap.records),
        "note": cap.note,
    }


class Replay(EventStream):
    """A capture played back through the session interface the TUI uses (no controls)."""

    def __init__(self, capture: Capture, speed: float = 1.0, play: bool = True):
        from tuitune import preset as P

        super().__init__()
        self.capture = capture
        self.speed = speed
        self.play = play
        self.paused = False
        self.position = 0  # index of the next record
        part = " (read in part)" if partial(capture.path, capture_stats(capture)) else ""
        self.state = ServerState("replay", detail=f"{capture.path}{part}")
        self.link = LinkState("replay")
        self.url = None
        try:
            self.preset: P.Preset | None = P.from_dict(capture.meta.get("preset") or {}, str(capture.path))
        except P.PresetError:
            self.preset = None
        self.running_preset = self.preset
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    @property
    def label(self) -> str:
        return f"replay {self.capture.path.name}"

    @property
    def duration(self) -> float:
        return self.capture.records[-1].m if self.capture.records else 0.0

    @property
    def now(self) -> float:
        recs = self.capture.records
        return recs[self.position - 1].m if 0 < self.position <= len(recs) else 0.0

    def publish(self, events: list[Event]) -> None:
        for ev in events:  # a live session sets these itself; a replay learns them from the record
            if isinstance(ev, ServerState):
                self.state = ev
            elif isinstance(ev, LinkState):
                self.link = ev
        super().publish(events)

    def publish_until(self, m: float) -> None:
        """Publish every record up to capture time ``m`` at once (used by seek and by tests)."""
        recs = self.capture.records
        batch = []
        while self.position < len(recs) and recs[self.position].m <= m:
            batch.append(recs[self.position].event)
            self.position += 1
        if batch:
            self.publish(batch)

    def seek(self, m: float) -> None:
        """Jump to capture time ``m`` (rebuilding the metrics from the start when going back)."""
        if m < self.now:
            self.position = 0
            self.store.clear()
        self.publish_until(max(0.0, m))
        self._wake.set()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._wake.set()

    async def connect(self) -> None:
        if self.play:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        recs = self.capture.records
        anchor_wall, anchor_m = loop.time(), self.now
        while self.position < len(recs):
            self._wake.clear()
            if self.paused:
                await self._wake.wait()
                anchor_wall, anchor_m = loop.time(), self.now
                continue
            target = anchor_m + (loop.time() - anchor_wall) * self.speed
            self.publish_until(target)
            if self.position >= len(recs):
                break
            delay = (recs[self.position].m - target) / self.speed
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=min(max(delay, 0.01), 0.1))
                anchor_wall, anchor_m = loop.time(), self.now
            except TimeoutError:
                pass
        self.publish([ServerState("replay", "end", f"end of {self.capture.path.name}")])

    async def close(self, stop_server: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
