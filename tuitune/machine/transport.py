"""tuitune's hands on the target: run, stream, upload, forward a port, close.

Two implementations of one protocol: ``LocalTransport`` (asyncio subprocesses) and
``SshTransport`` (asyncssh). Lessons that shaped the SSH side (TESTING.md): output is read as
bytes and decoded with replacement (one bad byte must not drop the link); environment goes on the
command line (sshd filters ``env=``); remote processes are killed by PID/group from a shell, since
OpenSSH ignores signal requests for root; streamed commands get a stdin lifeline so that nothing is
left behind when the channel closes; keepalive turns a dead peer into an error instead of a hang;
host keys are always checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import signal
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuitune.machine.errors import LinkLost, TransportError
from tuitune.machine.ssh import (
    SshTarget,
    _known_hosts_path,
    _reason,
    connect_hop,
    hop_timeout,
    ssh_route,
)

if TYPE_CHECKING:
    import asyncssh  # imported where it is used: `tuitune --help` does not load it


SLOW_CONNECT_S = 1.0  # a first connection that takes longer is said (``on_connecting``)
RETRY_CAP_S = 8.0  # the longest pause between two reconnect attempts of a follower (``resume``)


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


def lifeline(command: str) -> str:
    """Wrap a long-running command so that closing our end kills it and its whole group."""
    return f"{{ {command} ; }} </dev/null & cat >/dev/null; kill 0"


class Transport:
    """Common behaviour; subclasses implement _run, _open_stream, forward_port, close."""

    label = "?"
    is_local = False

    def __init__(self) -> None:
        self.on_link: Callable[[str, int, str | None], None] | None = None  # (state, attempt, detail)
        # (label, seconds it may take): a first connection still under way after SLOW_CONNECT_S
        self.on_connecting: Callable[[str, float], None] | None = None

    def _notify(self, state: str, attempt: int = 0, detail: str | None = None) -> None:
        if self.on_link is not None:
            self.on_link(state, attempt, detail)

    async def connect(self) -> None:
        self._notify("connected")

    async def reconnect(self, max_attempts: int | None = 8, stop: Callable[[], bool] | None = None) -> bool:
        """Local transports never lose their link."""
        return True

    async def resume(self, closed: Callable[[], bool] = lambda: False) -> bool:
        """The reconnect policy of every follower (log tails, telemetry, the watch of a server): a
        lost link is retried without end, with backoff capped at ``RETRY_CAP_S`` between attempts,
        until it is back (True) or ``closed()`` says to stop (False). What retrying cannot fix
        (authentication, a host key, a closed transport) is raised."""
        return await self.reconnect(None, stop=closed)

    async def run(self, command: str, timeout: float | None = 60.0, input: bytes | None = None) -> RunResult:
        try:
            return await asyncio.wait_for(self._run(command, input), timeout)
        except TimeoutError:
            from tuitune.base.redact import text

            raise TransportError(
                f"{self.label}: command timed out after {timeout:.0f} s: {text(command.splitlines()[0])[:120]}"
            ) from None

    async def _run(self, command: str, input: bytes | None) -> RunResult:
        raise NotImplementedError

    async def stream(self, command: str) -> AsyncGenerator[bytes, None]:
        """Raw stdout chunks (stderr merged) of a long-running command; closing the iterator kills it."""
        raise NotImplementedError
        yield b""  # pragma: no cover

    async def upload(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write a file atomically on the target (through ``cat``, so it works on any transport).

        The bytes go to a private temporary file (mode 0600 from the first byte), which replaces
        the target only once its size and SHA-256 match what was sent: a client killed mid-way
        leaves the old file, never an empty or partial one.
        """
        from tuitune.preset import shell_path

        target = shell_path(remote_path)
        tmp = shell_path(f"{remote_path}.tuitune-tmp-{secrets.token_hex(6)}")
        digest = hashlib.sha256(data).hexdigest()
        cmd = (
            f'mkdir -p -- "$(dirname -- {target})" && (umask 077 && cat > {tmp}) && '
            f'[ "$(wc -c < {tmp})" -eq {len(data)} ] && '
            f"[ \"$(sha256sum < {tmp} | cut -d ' ' -f 1)\" = {digest} ] && "
            f"chmod {mode:o} -- {tmp} && mv -f -- {tmp} {target} || {{ rm -f -- {tmp}; exit 1; }}"
        )
        r = await self.run(cmd, timeout=120, input=data)
        if not r.ok:
            raise TransportError(
                f"{self.label}: cannot write {remote_path}: "
                f"{r.stderr.strip()[:200] or 'the copy on the target was incomplete'}"
            )

    async def forward_port(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        raise NotImplementedError

    async def close(self) -> None:
        self._notify("closed")

    def url(self, local_port: int) -> str:
        return f"http://127.0.0.1:{local_port}"


class LocalTransport(Transport):
    label = "local"
    is_local = True

    async def _run(self, command: str, input: bytes | None) -> RunResult:
        proc = await _spawn(
            command,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate(input)
        except asyncio.CancelledError:
            await _end(proc)  # nothing outlives the call
            raise
        assert proc.returncode is not None  # communicate() waited for the exit
        return RunResult(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def stream(self, command: str) -> AsyncGenerator[bytes, None]:
        proc = await _spawn(
            lifeline(command),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            limit=4 * 1024 * 1024,
        )
        assert proc.stdout is not None  # stdout=PIPE
        try:
            while True:
                data = await proc.stdout.read(256 * 1024)
                if not data:
                    break
                yield data
        finally:
            await _end(proc)

    async def forward_port(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        return remote_port


async def _spawn(command: str, **kw) -> asyncio.subprocess.Process:
    """``bash -c command`` in a process group of its own, started whole even when cancelled meanwhile.

    asyncio cannot take a cancel while it connects a new process's pipes: it kills bash alone and
    then waits forever for pipes that bash's children still hold (CPython gh-103847, gh-125502).
    Stopping a tail right after starting it ("follow again", then close) hung that way about once
    in three and left the tailer running. So the start (milliseconds: a local fork) is let finish,
    then the whole group is ended, and the cancel goes on.
    """
    task = asyncio.ensure_future(asyncio.create_subprocess_exec("bash", "-c", command, start_new_session=True, **kw))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _settle(task)
        if not task.cancelled() and task.exception() is None:
            await _end(task.result())
        raise


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the command's whole group and reap it (at most 2 s), even while being cancelled."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    _killpg(proc.pid)
    if await _settle(asyncio.ensure_future(asyncio.wait_for(proc.wait(), 2))):
        raise asyncio.CancelledError  # one that came meanwhile is passed on, not lost


async def _settle(task: asyncio.Future) -> bool:
    """Wait until ``task`` is done (short, bounded clean-up that must not be cut half-way), whatever
    it raised; True when we were cancelled meanwhile."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if not task.cancelled():
        task.exception()  # retrieved: a reap that timed out is not worth a warning
    return cancelled


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class SshTransport(Transport):
    def __init__(self, target: SshTarget, connect_timeout: float | None = None):
        super().__init__()
        self.target = target
        self.label = target.label()
        self.connect_timeout = connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._forwards: dict[tuple[str, int], tuple[int, object]] = {}  # remote -> (local port, listener)
        self._lock = asyncio.Lock()
        self._closed = False
        self._jumps: list = []  # open ProxyJump connections, outermost first
        self.trust_hint = f"tuitune trust {target.label()}"  # for_preset names the preset instead

    async def _open(self, announce: bool = False):
        """Connect hop by hop (ProxyJump hosts first), each checked against the same known_hosts,
        each within its connect timeout (``hop_timeout``). ``announce``: a connection still under
        way after ``SLOW_CONNECT_S`` is said to ``on_connecting``, with how long it may take."""
        t = self.target
        hops = ssh_route(t)
        self._close_jumps()
        conn = None
        notice = None
        if announce and self.on_connecting is not None:
            bound = sum(hop_timeout(h, self.connect_timeout) for h in hops)
            notice = asyncio.get_running_loop().call_later(SLOW_CONNECT_S, self.on_connecting, self.label, bound)
        try:
            for i, hop in enumerate(hops):
                last = i == len(hops) - 1
                keys = [self._identity(t.identity_file)] if last and t.identity_file else None
                conn = await connect_hop(
                    hop,
                    conn,
                    _known_hosts_path(t),
                    self.trust_hint,
                    self.label if last else f"{self.label}: jump host {hop.describe()}",
                    self.connect_timeout,
                    keys,
                )
                if not last:
                    self._jumps.append(conn)
        except TransportError:
            self._close_jumps()
            raise
        finally:
            if notice is not None:
                notice.cancel()
        return conn

    def _close_jumps(self) -> None:
        for c in reversed(self._jumps):
            c.abort()
        self._jumps = []

    def _identity(self, identity_file: str):
        """The identity_file's private key, or one sentence on why it cannot be used (read here,
        not inside connect, where a bad file would raise a ValueError from deep in asyncssh)."""
        import asyncssh

        path = Path(identity_file).expanduser()
        try:
            return asyncssh.read_private_key(str(path))
        except OSError as e:
            raise TransportError(f"{self.label}: identity_file {path}: cannot read it ({e.strerror or e})") from None
        except asyncssh.KeyEncryptionError:
            raise TransportError(
                f"{self.label}: identity_file {path} is protected by a passphrase; "
                f"load it into ssh-agent and leave identity_file out"
            ) from None
        except (asyncssh.KeyImportError, ValueError) as e:
            hint = " (that is the public key; give the private one, without .pub)" if path.suffix == ".pub" else ""
            raise TransportError(
                f"{self.label}: identity_file {path} is not a private key we can read ({_reason(e)}){hint}"
            ) from None

    async def connect(self) -> None:
        async with self._lock:
            if self._conn is None:
                self._conn = await self._open(announce=True)
                await self._restore_forwards(self._conn)
        self._notify("connected")

    async def reconnect(
        self,
        max_attempts: int | None = 8,
        stop: Callable[[], bool] | None = None,
        base_delay: float = 0.25,
        max_delay: float = RETRY_CAP_S,
    ) -> bool:
        """Drop the old connection and connect again with exponential backoff (``max_attempts``
        None: until it works, or until ``stop()``, checked before each attempt, says to give up:
        then False).

        Several users (log tail, telemetry) see one drop: when another caller has already put a
        live connection in place, it is kept (aborting it would kill that caller's fresh streams).
        A failed channel forgets only its own connection (``_forget``), so a live one here is new."""
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return True
            old, self._conn = self._conn, None
            if old is not None:
                old.abort()
            delay = base_delay
            attempt = 0
            while True:
                attempt += 1
                if self._closed:
                    raise TransportError(f"{self.label}: transport closed")
                if stop is not None and stop():
                    return False
                self._notify("reconnecting", attempt)
                try:
                    self._conn = await self._open()
                    await self._restore_forwards(self._conn)
                    break
                except LinkLost as e:
                    self._conn = None
                    if max_attempts is not None and attempt >= max_attempts:
                        self._notify("lost", attempt, str(e))
                        raise
                    await asyncio.sleep(delay)
                    delay = min(max_delay, delay * 2)
        self._notify("connected")
        return True

    def _forget(self, conn) -> None:
        """Drop a dead connection, unless another caller already replaced it."""
        if self._conn is conn:
            self._conn = None

    @contextlib.contextmanager
    def _link_errors(self, conn):
        """A dead link or a refused channel while opening one becomes LinkLost (the caller reconnects)."""
        import asyncssh

        try:
            yield
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError, BrokenPipeError) as e:
            self._forget(conn)
            raise LinkLost(f"{self.label}: connection lost ({_reason(e)})") from None
        except asyncssh.ChannelOpenError as e:
            conn.abort()  # a connection that refuses channels is replaced by the caller's reconnect
            self._forget(conn)
            raise LinkLost(f"{self.label}: cannot open a channel ({_reason(e)})") from None

    async def _connection(self):
        if self._conn is None:
            await self.connect()
        return self._conn

    async def _run(self, command: str, input: bytes | None) -> RunResult:

        conn = await self._connection()
        with self._link_errors(conn):
            proc = await _open_process(conn, command, input=input)
            try:
                r = await proc.wait(check=False)
            except asyncio.CancelledError:
                proc.close()  # its channel, which asyncssh would keep open
                raise
        if r.exit_status is None and not r.exit_signal:
            # the channel closed without an answer: the connection died under the command (its
            # sshd killed, the network gone), whatever the command did; never a "no" from it
            if _closed(conn):
                self._forget(conn)
            raise LinkLost(f"{self.label}: connection lost while a command ran (no exit status came back)")
        status = r.exit_status if r.exit_status is not None else 128 + _signal_number(r.exit_signal[0])
        return RunResult(
            status, (r.stdout or b"").decode("utf-8", "replace"), (r.stderr or b"").decode("utf-8", "replace")
        )

    async def stream(self, command: str) -> AsyncGenerator[bytes, None]:
        import asyncssh

        conn = await self._connection()
        with self._link_errors(conn):
            proc = await _open_process(conn, lifeline(command), stderr=asyncssh.STDOUT)
        try:
            while True:
                try:
                    data = await proc.stdout.read(256 * 1024)
                except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError, BrokenPipeError) as e:
                    self._forget(conn)
                    raise LinkLost(f"{self.label}: connection lost ({_reason(e)})") from None
                if not data:
                    if _closed(conn):
                        self._forget(conn)
                        raise LinkLost(f"{self.label}: connection lost")
                    break
                yield data
        finally:
            try:
                proc.stdin.write_eof()
            except (OSError, asyncssh.Error, BrokenPipeError):
                pass
            proc.close()

    async def forward_port(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        key = (remote_host, remote_port)
        if key in self._forwards:
            return self._forwards[key][0]
        conn = await self._connection()
        listener = await conn.forward_local_port("127.0.0.1", 0, remote_host, remote_port)
        self._forwards[key] = (listener.get_port(), listener)
        return listener.get_port()

    async def _restore_forwards(self, conn: asyncssh.SSHClientConnection) -> None:
        """After a reconnect, listen again on the same local ports (URLs stay valid)."""
        for (host, rport), (lport, _) in list(self._forwards.items()):
            try:
                listener = await conn.forward_local_port("127.0.0.1", lport, host, rport)
            except OSError:
                listener = await conn.forward_local_port("127.0.0.1", 0, host, rport)
            self._forwards[(host, rport)] = (listener.get_port(), listener)

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            try:
                await asyncio.wait_for(self._conn.wait_closed(), 3)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                pass
            self._conn = None
        self._close_jumps()
        self._notify("closed")


def _closed(conn) -> bool:
    return conn.is_closed() if hasattr(conn, "is_closed") else False


def _signal_number(name) -> int:
    """An SSH exit-signal name ("KILL", "TERM") as its number (9 when unknown)."""
    try:
        return int(signal.Signals[f"SIG{str(name).upper().removeprefix('SIG')}"])
    except (KeyError, ValueError):
        return 9


async def _open_process(conn, command: str, **kw):
    """``conn.create_process`` whose channel is closed even when we are cancelled while it opens.

    asyncssh keeps a channel whose open was cancelled: the server confirms it later and nobody
    closes it, so each such cancel (stopping a tail right after starting it) leaked a session with
    its command until sshd's MaxSessions refused every new channel. Waiting for the confirmation
    could take as long as a dead link does, so the channel is closed when it arrives instead.
    """
    task = asyncio.ensure_future(conn.create_process(command, encoding=None, **kw))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(_close_opened)
        raise


def _close_opened(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def for_preset(preset) -> Transport:
    """The transport to the preset's machine (a multi-node preset's: node 0's)."""
    t = preset.target.node_target(0) if preset.target.nodes else preset.target
    if t.is_local:
        return LocalTransport()
    transport = SshTransport(SshTarget(t.host, t.port, t.user, t.identity_file, t.known_hosts))
    transport.trust_hint = f"tuitune trust {preset.name}"
    return transport
