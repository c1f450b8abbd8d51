"""The switch: tuitune's side of the control channel that holds a step count inside a running
launch (docs/switch.md; the probe's side is ``eagle3_probe.Switch``).

A launch prepared for switching gets ``TUITUNE_SWITCH_FILE`` and ``TUITUNE_SWITCH_KEY`` in its
environment (``prepare``); the key is also kept on the target, ``<state dir>/switch/<port>.key``
(0600), so that a later tuitune process of the same user can sign. ``hold(K)`` / ``release()``
write a signed command with the next sequence number (atomically, 0600, through the transport)
and wait for the engine's acknowledgement in ``<port>.json.ack``. Nothing listens on the network:
the engine looks at the file from its own scheduling loop, so an idle server acknowledges at its
next step (``nudge``: a coroutine the wait calls, e.g. one short request).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.machine.transport import Transport
from tuitune.preset import shell_path
from tuitune.probe import eagle3_probe

SWITCH_DIR = "~/.cache/tuitune/switch"  # beside servers/ (record.STATE_DIR)
FILE_ENV, KEY_ENV = "TUITUNE_SWITCH_FILE", "TUITUNE_SWITCH_KEY"


class SwitchError(TuituneError):
    """A switch command that could not be given or was not applied (one sentence)."""


class SwitchRefused(SwitchError):
    """The engine read the command and refused it; the sentence is its ``why``."""


class SwitchTimeout(SwitchError):
    """No acknowledgement came in time."""


@dataclass(frozen=True)
class Ack:
    """The engine's answer to one command (its ``.ack`` file)."""

    seq: int | None
    applied: bool
    steps: int | None  # what the command asked to hold (None: release)
    held: int | None  # what the engine holds now (None: its own policy)
    why: str

    @classmethod
    def from_json(cls, text: str) -> Ack | None:
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        seq, steps, held = d.get("seq"), d.get("steps"), d.get("held")
        return cls(
            seq if type(seq) is int else None,
            d.get("applied") is True,
            steps if type(steps) is int else None,
            held if type(held) is int else None,
            str(d.get("why", "")),
        )


def sign(key: bytes, seq: int, steps: int | None) -> dict:
    """The command that holds ``steps`` (None: releases), signed with the launch's key."""
    command: dict = {"v": 1, "seq": seq, "hold": None if steps is None else {"steps": steps}}
    command["mac"] = eagle3_probe.switch_mac(key, command)
    return command


class Switch:
    """The switch of the launch on ``port`` of the target reached by ``transport``."""

    def __init__(self, transport: Transport, port: int):
        self.t = transport
        self.port = int(port)
        self.path = f"{SWITCH_DIR}/{self.port}.json"
        self.key_path = f"{SWITCH_DIR}/{self.port}.key"
        self.ack_path = self.path + ".ack"

    def clear_command(self) -> str:
        """The shell command that removes this port's key, command and acknowledgement (a launch not
        prepared to switch: the last launch's key must sign nothing for it)."""
        files = (self.key_path, self.path, self.ack_path)
        return "rm -f -- " + " ".join(shell_path(f) for f in files)

    async def _home(self) -> str:
        r = await self.t.run('printf %s "$HOME"', timeout=30)
        if not r.ok or not r.stdout.startswith("/"):
            raise SwitchError(f"{self.t.label}: cannot tell the home directory for the switch file")
        return r.stdout

    async def prepare(self) -> dict[str, str]:
        """A new key for the next launch on this port: kept on the target (0600), old commands and
        acknowledgements removed; the environment the engine needs (both variables)."""
        key = secrets.token_hex(32)
        await self.t.upload(key.encode(), self.key_path, 0o600)
        r = await self.t.run(f"rm -f -- {shell_path(self.path)} {shell_path(self.ack_path)}", timeout=30)
        if not r.ok:
            raise SwitchError(f"{self.t.label}: cannot clear the old switch files of port {self.port}")
        home = await self._home()
        return {FILE_ENV: home + self.path.removeprefix("~"), KEY_ENV: key}

    async def _read(self, path: str) -> str | None:
        r = await self.t.run(f"cat -- {shell_path(path)} 2>/dev/null", timeout=30)
        return r.stdout if r.ok else None

    async def _key(self) -> bytes:
        text = await self._read(self.key_path)
        try:
            key = bytes.fromhex((text or "").strip())
        except ValueError:
            key = b""
        if len(key) < 16:
            raise SwitchError(
                f"no switch key for port {self.port} on {self.t.label}: the server was not launched prepared for switching"
            )
        return key

    async def state(self) -> Ack | None:
        """The engine's last acknowledgement (None: it answered none yet)."""
        text = await self._read(self.ack_path)
        return Ack.from_json(text) if text else None

    async def _next_seq(self) -> int:
        seqs = [0]
        for path in (self.path, self.ack_path):
            text = await self._read(path)
            try:
                seq = json.loads(text).get("seq") if text else None
            except (ValueError, AttributeError):
                seq = None
            if type(seq) is int:
                seqs.append(seq)
        return max(seqs) + 1

    async def send(self, steps: int | None) -> int:
        """Write the signed command (hold ``steps``; None: release); its sequence number."""
        if steps is not None and (type(steps) is not int or steps < 0):
            raise SwitchError(f"a step count to hold is an integer >= 0 (got {steps!r})", 2)
        key = await self._key()
        seq = await self._next_seq()
        data = json.dumps(sign(key, seq, steps), sort_keys=True).encode() + b"\n"
        await self.t.upload(data, self.path, 0o600)
        return seq

    async def wait_ack(
        self, seq: int, timeout: float = 30.0, nudge: Callable[[], Awaitable[object]] | None = None
    ) -> Ack:
        """The engine's answer to command ``seq``: its Ack when applied, SwitchRefused when refused,
        SwitchTimeout when none came."""
        end = time.monotonic() + timeout
        nudged = 0.0
        while True:
            ack = await self.state()
            if ack is not None and ack.seq == seq:
                if not ack.applied:
                    raise SwitchRefused(f"the server on port {self.port} refused switch command {seq}: {ack.why}")
                return ack
            if time.monotonic() >= end:
                raise SwitchTimeout(
                    f"no acknowledgement of switch command {seq} from the server on port {self.port} within "
                    f"{timeout:g} s: it was not launched prepared for switching, or the probe is not loaded in it "
                    "(an idle engine answers at its next scheduling step)"
                )
            if nudge is not None and time.monotonic() >= nudged:
                nudged = time.monotonic() + 1.0
                await nudge()
            await asyncio.sleep(0.1)

    async def hold(
        self, steps: int, timeout: float = 30.0, nudge: Callable[[], Awaitable[object]] | None = None
    ) -> Ack:
        """Hold ``steps`` (SGLang steps, vLLM K) until released, through the engine's own switching code."""
        return await self.wait_ack(await self.send(steps), timeout, nudge)

    async def release(self, timeout: float = 30.0, nudge: Callable[[], Awaitable[object]] | None = None) -> Ack:
        """Give the choice back to the engine's own policy or schedule."""
        return await self.wait_ack(await self.send(None), timeout, nudge)


@dataclass
class HoldState:
    """What a session knows of the hold in its launch: the step count held (None: none) and what the
    launch was launched from while a hold is in force (the session's running preset is then the hold's)."""

    held: int | None = None
    unheld: P.Preset | None = None

    def applied(self, ack: Ack, running, preset=None):
        """After an acknowledged command: the session's running preset (the hold's ``preset``, or the
        launch's own again on release)."""
        if ack.held is None:
            running, self.unheld, self.held = self.unheld or running, None, None
            return running
        if self.held is None:
            self.unheld = running
        self.held = ack.held
        return preset or running

    def reset(self) -> None:
        """Another launch (here or elsewhere), or none: nothing held."""
        self.held = self.unheld = None


class Nudge:
    """Keeps an idle engine stepping while a command waits: one short request at a time, in the
    background (the engine reads the command file only from its scheduling loop)."""

    def __init__(self, url: str, api: str, model: str | None):
        from tuitune.measure.benchconfig import BenchConfig

        self.cfg = BenchConfig(url, max_tokens=4, api=api, model=model, timeout_s=20.0)
        self.task: asyncio.Task | None = None

    async def __call__(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._one())

    async def _one(self) -> None:
        from tuitune.measure.request import client_session, run_request

        async with client_session() as session:
            await run_request(session, self.cfg, "Count from one to ten.")

    async def close(self) -> None:
        from tuitune.base.aio import cancel_and_wait

        await cancel_and_wait(self.task)
        self.task = None


def not_holdable(rec, port: int, label: str, steps: int | None, word: str = "steps") -> SwitchError | None:
    """Why the running server of this record cannot take this command (one sentence), or None."""
    if rec.switch is None:
        return SwitchError(
            f"the server on port {port} of {label} (pid {rec.pid}) was not launched prepared for switching: set "
            "speculative.switch in its preset to the step counts to hold and relaunch it (docs/switch.md)",
            2,
        )
    if steps is not None and steps not in rec.switch:
        return SwitchError(
            f"{word} {steps} is not one this launch was prepared to hold ({rec.switch}): add it to speculative.switch "
            "and relaunch",
            2,
        )
    return None


async def hold_running(
    control, steps: int | None, nudge: Nudge | None = None, timeout: float = 30.0, allow_any: bool = False
) -> Ack:
    """Hold ``steps`` (None: release) in the server tuitune launched for the control's preset, under
    the port's lock; refused, with a sentence, when none runs, it is another preset's (unless
    ``allow_any``) or a person's, or it was not prepared for this step count."""
    p = control.preset
    async with control.locked("hold" if steps is not None else "release"):
        st = await control.status()
        if not st.running or st.record is None:
            raise SwitchError(f"{p.name}: no server is running on port {p.server.port} of {control.t.label}")
        if not st.ours:
            raise SwitchError(f"{p.name}: {st.note}; tuitune switches only a server it launched prepared for it", 2)
        if not allow_any and (why := control.foreign(st.record)):
            raise SwitchError(why, 2)
        if (why := not_holdable(st.record, p.server.port, control.t.label, steps, p.engine.step_name)) is not None:
            raise why
        sw = Switch(control.t, p.server.port)
        try:
            seq = await sw.send(steps)
            try:
                return await sw.wait_ack(seq, timeout, nudge)
            except SwitchTimeout as e:
                # withdrawn, so that the engine does not take it later while tuitune says it failed
                await control.t.run(f"rm -f -- {shell_path(sw.path)}", timeout=30)
                ack = await sw.state()
                if ack is not None and ack.seq == seq and ack.applied:
                    return ack  # it answered while the command was being withdrawn
                said = str(e).replace(f"within {timeout:g} s:", f"within {timeout:g} s (the command is withdrawn):", 1)
                raise SwitchTimeout(said) from None
        finally:
            if nudge is not None:
                await nudge.close()
