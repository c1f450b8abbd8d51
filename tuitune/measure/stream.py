"""An event stream: what the TUI and the recorder subscribe to, live (Session) or replayed (Replay)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tuitune.base.events import Event
from tuitune.measure.guard import AcceptanceGuard
from tuitune.measure.metrics import MetricsStore

Subscriber = Callable[[list[Event]], None]


class ServerInfo(Protocol):
    """What readers of a stream see of the server it follows (a live stream's target.control.ServerRecord)."""

    pid: int
    started: float


@dataclass
class LoadState:
    """A live stream's background load."""

    on: bool = False
    concurrency: int = 1
    requests: int = 0
    failed: int = 0
    last_error: str | None = None


class EventStream:
    live = False  # a live stream can relaunch, benchmark and load its server
    record: ServerInfo | None = None  # the running server's record, when there is one
    load: LoadState | None = None  # background load state, for live streams
    # the acceptance guard (live streams; a replay shows the alarms its capture holds) and whether
    # it reads without alarming (a log's history, read when attaching)
    guard: AcceptanceGuard | None = None
    guard_quiet = False

    def __init__(self) -> None:
        self.store = MetricsStore()
        self.subscribers: list[Subscriber] = []

    @property
    def label(self) -> str:
        """Where the events come from, for the header."""
        return "?"

    def node_labels(self) -> list[str]:
        """Each node's machine, for a stream with a server behind it (none for a replay)."""
        return []

    def subscribe(self, fn: Subscriber) -> None:
        self.subscribers.append(fn)

    def publish(self, events: list[Event]) -> None:
        """Feed the acceptance guard (its alarms join the batch as markers), the metrics store, then
        every subscriber (one call per batch, never per event)."""
        now = time.monotonic()
        if self.guard is not None:
            events = [*events, *self.guard.feed(events, now, quiet=self.guard_quiet)]
        for ev in events:
            self.store.feed(ev, now)
        for fn in list(self.subscribers):
            fn(events)
