"""The simulator's side of tuitune's switch (docs/switch.md), its own code as the simulator plays a
server: with ``TUITUNE_SWITCH_FILE`` and ``TUITUNE_SWITCH_KEY`` set, the scheduler loop looks at the
command file at most every 50 ms (only while it runs cycles, as the engines' hooks do), checks a
new command (owner, mode, HMAC-SHA256 over ``{"hold","seq","v"}``, a sequence number above the last
one taken, a step count the launch prepared), holds or releases, and answers in ``<file>.ack``.
Also vLLM's ``num_speculative_tokens_per_batch_size`` schedule (K per batch size), which the vLLM
dialect needs to be switched at all."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import time
from collections.abc import Callable

POLL_S = 0.05


class SimSwitch:
    """``hold``: the step count held (None: the engine's own policy)."""

    def __init__(self, path: str, key: bytes, say: Callable[[str], None]):
        self.path, self.key, self.say = path, key, say
        self.last_seq = 0
        self.hold: int | None = None
        self.when = 0.0
        self.mark: tuple | None = None

    @classmethod
    def from_env(cls, say: Callable[[str], None]) -> SimSwitch | None:
        path, key = os.environ.get("TUITUNE_SWITCH_FILE"), os.environ.get("TUITUNE_SWITCH_KEY", "")
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            raw = b""
        return cls(path, raw, say) if path and len(raw) >= 16 else None

    def tick(self, refuse: Callable[[int | None], str | None]) -> bool:
        """Look for a new command; ``refuse(K)`` says why this launch cannot take it (None: it can).
        True when the hold changed."""
        now = time.monotonic()
        if now < self.when:
            return False
        self.when = now + POLL_S
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        if (st.st_mtime_ns, st.st_size, st.st_ino) == self.mark:
            return False
        self.mark = (st.st_mtime_ns, st.st_size, st.st_ino)
        try:
            seq, steps, why = self.check(refuse)
        except OSError as e:  # gone between the look and the read
            seq, steps, why = None, None, f"the command file cannot be read ({e.strerror})"
        if why is None:
            changed, self.hold = self.hold != steps, steps
        else:
            changed = False
        self.acknowledge(seq, steps, why)
        return changed

    def check(self, refuse: Callable[[int | None], str | None]) -> tuple[int | None, int | None, str | None]:
        """(seq, steps, refusal or None) of the file's command."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # a FIFO put there never blocks
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return None, None, "the command file is not a regular file"
            body = f.read(65536)
        if st.st_uid != os.geteuid():
            return None, None, f"the command file is owned by uid {st.st_uid}, not the server's"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, None, "the command file can be written by group or others"
        try:
            cmd = json.loads(body)
            signed = json.dumps({k: cmd.get(k) for k in ("hold", "seq", "v")}, sort_keys=True, separators=(",", ":"))
            mac = cmd["mac"]
        except (ValueError, TypeError, KeyError, AttributeError):
            return None, None, "the command file holds no signed JSON command"
        seq = cmd.get("seq") if type(cmd.get("seq")) is int else None
        want = hmac.new(self.key, signed.encode(), hashlib.sha256).hexdigest()
        if not isinstance(mac, str) or not hmac.compare_digest(mac, want):
            return seq, None, "the mac is not this launch's"
        if cmd.get("v") != 1 or seq is None:
            return seq, None, "the command is not version 1 with an integer seq"
        if seq <= self.last_seq:
            return seq, None, f"seq {seq} was taken already (last {self.last_seq}): a replay"
        self.last_seq = seq
        hold = cmd.get("hold")
        steps = hold.get("steps") if isinstance(hold, dict) else None
        if hold is not None and type(steps) is not int:
            return seq, None, 'hold is neither null nor {"steps": K}'
        return seq, steps, refuse(steps)

    def acknowledge(self, seq: int | None, steps: int | None, why: str | None) -> None:
        ok = why is None
        ack = {"seq": seq, "applied": ok, "steps": steps, "held": self.hold}
        ack["why"] = ("released" if steps is None else f"holding {steps}") + " (simulated)" if ok else why
        tmp = f"{self.path}.ack.{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(ack, f)
            os.replace(tmp, self.path + ".ack")
        except OSError as e:  # the server runs on; its log says so
            why = f"{why or 'applied'}; and the ack could not be written ({e.strerror or e})"
        hold = steps if steps is not None or not ok else "release"
        self.say(f"EAGLE3_SWITCH seq={seq} hold={hold} applied={int(ok)}" + ("" if ok else f" why={why}"))


class DynamicSchedule:
    """vLLM's K per batch size (``num_speculative_tokens_per_batch_size``): the range holding the
    batch size, or the one before a gap, or the last; K cut to ``num_speculative_tokens``."""

    def __init__(self, table, max_k: int):
        if not isinstance(table, list) or not table:
            raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, K]")
        rows = []
        for row in table:
            if not (isinstance(row, list) and len(row) == 3 and all(type(x) is int for x in row)):
                raise ValueError(f"num_speculative_tokens_per_batch_size: {row!r} is not [start, end, K]")
            if row[0] < 1 or row[1] < row[0] or row[2] < 0:
                raise ValueError(f"num_speculative_tokens_per_batch_size: {row!r} needs 1 <= start <= end and K >= 0")
            rows.append(row)
        rows.sort()
        if rows[0][0] != 1:
            raise ValueError("num_speculative_tokens_per_batch_size must start at batch size 1")
        self.rows, self.max_k = rows, max_k

    def steps_for(self, bs: int) -> int:
        k = 0
        for start, _end, kk in self.rows:
            if start > bs:
                break
            k = kk
        return min(k, self.max_k)

    def observe(self, bs: int, tokens_per_request: list[int]) -> None:
        """A schedule does not learn."""
