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
import hashlib
import os
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

KEEPALIVE_INTERVAL = 15
KEEPALIVE_COUNT = 3


class TransportError(Exception):
    """A one-sentence failure of the link or of a command's plumbing (not its exit status)."""


class LinkLost(TransportError):
    """The connection dropped; ``reconnect()`` may bring it back."""


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

    def _notify(self, state: str, attempt: int = 0, detail: str | None = None) -> None:
        if self.on_link is not None:
            self.on_link(state, attempt, detail)

    async def connect(self) -> None:
        self._notify("connected")

    async def reconnect(self, max_attempts: int = 8) -> None:
        """Local transports never lose their link."""

    async def run(self, command: str, timeout: float | None = 60.0, input: bytes | None = None) -> RunResult:
        try:
            return await asyncio.wait_for(self._run(command, input), timeout)
        except asyncio.TimeoutError:
            from .redact import text
            raise TransportError(f"{self.label}: command timed out after {timeout:.0f} s: "
                                 f"{text(command.splitlines()[0])[:120]}") from None

    async def _run(self, command: str, input: bytes | None) -> RunResult:
        raise NotImplementedError

    async def stream(self, command: str) -> AsyncIterator[bytes]:
        """Raw stdout chunks (stderr merged) of a long-running command; closing the iterator kills it."""
        raise NotImplementedError
        yield b""  # pragma: no cover

    async def upload(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write a file atomically on the target (through ``cat``, so it works on any transport).

        The bytes go to a private temporary file (mode 0600 from the first byte), which replaces
        the target only once its size and SHA-256 match what was sent: a client killed mid-way
        leaves the old file, never an empty or partial one.
        """
        from .preset import shell_path
        target = shell_path(remote_path)
        tmp = shell_path(f"{remote_path}.tuitune-tmp-{secrets.token_hex(6)}")
        digest = hashlib.sha256(data).hexdigest()
        cmd = (f"mkdir -p -- \"$(dirname -- {target})\" && (umask 077 && cat > {tmp}) && "
               f"[ \"$(wc -c < {tmp})\" -eq {len(data)} ] && "
               f"[ \"$(sha256sum < {tmp} | cut -d ' ' -f 1)\" = {digest} ] && "
               f"chmod {mode:o} -- {tmp} && mv -f -- {tmp} {target} || {{ rm -f -- {tmp}; exit 1; }}")
        r = await self.run(cmd, timeout=120, input=data)
        if not r.ok:
            raise TransportError(f"{self.label}: cannot write {remote_path}: "
                                 f"{r.stderr.strip()[:200] or 'the copy on the target was incomplete'}")

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
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await proc.communicate(input)
        except asyncio.CancelledError:
            _killpg(proc.pid)
            await asyncio.shield(proc.wait())  # reap it, so nothing outlives the call
            raise
        return RunResult(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def stream(self, command: str) -> AsyncIterator[bytes]:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", lifeline(command), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            limit=4 * 1024 * 1024)
        try:
            while True:
                data = await proc.stdout.read(256 * 1024)
                if not data:
                    break
                yield data
        finally:
            if proc.stdin and not proc.stdin.is_closing():
                proc.stdin.close()
            _killpg(proc.pid)
            try:
                await asyncio.wait_for(proc.wait(), 2)
            except asyncio.TimeoutError:
                pass

    async def forward_port(self, remote_port: int, remote_host: str = "127.0.0.1") -> int:
        return remote_port


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class SshTarget:
    host: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None

    def label(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}{':' + str(self.port) if self.port else ''}"


def _known_hosts_path(t: SshTarget) -> Path:
    return Path(t.known_hosts or "~/.ssh/known_hosts").expanduser()


def _host_pattern(host: str, port: int | None) -> str:
    return f"[{host}]:{port}" if port and port != 22 else host


async def fetch_host_key(t: SshTarget):
    import asyncssh
    try:
        return await asyncio.wait_for(asyncssh.get_server_host_key(t.host, t.port or ()),
                                      15)
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
        raise TransportError(f"{t.label()}: cannot fetch its host key ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    text = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).strip().rstrip(".")


def known_hosts_has(t: SshTarget) -> bool:
    """Whether known_hosts holds any key for this host (used to tell 'unknown' from 'changed')."""
    import asyncssh
    path = _known_hosts_path(t)
    if not path.exists():
        return False
    try:
        kh = asyncssh.read_known_hosts(str(path))
        trusted, *_ = kh.match(t.host, "", t.port or 22)
        return bool(trusted)
    except (OSError, ValueError, asyncssh.Error):
        return False


def trust_line(t: SshTarget, key) -> str:
    return f"{_host_pattern(t.host, t.port)} {key.export_public_key().decode().strip()}\n"


class SshTransport(Transport):
    def __init__(self, target: SshTarget, connect_timeout: float = 20.0):
        super().__init__()
        self.target = target
        self.label = target.label()
        self.connect_timeout = connect_timeout
        self._conn = None
        self._forwards: dict[tuple[str, int], tuple[int, object]] = {}  # remote -> (local port, listener)
        self._lock = asyncio.Lock()
        self._closed = False

    async def _open(self):
        import asyncssh
        t = self.target
        opts: dict = {"keepalive_interval": KEEPALIVE_INTERVAL, "keepalive_count_max": KEEPALIVE_COUNT,
                      "connect_timeout": self.connect_timeout}
        if t.port:
            opts["port"] = t.port
        if t.user:
            opts["username"] = t.user
        if t.identity_file:
            opts["client_keys"] = [self._identity()]
        if t.known_hosts:
            opts["known_hosts"] = str(Path(t.known_hosts).expanduser())
        try:
            return await asyncssh.connect(t.host, **opts)
        except asyncssh.HostKeyNotVerifiable:
            raise TransportError(await self._host_key_message()) from None
        except asyncssh.PermissionDenied:
            raise TransportError(f"{self.label}: authentication failed (check user, identity_file "
                                 f"or ssh-agent)") from None
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as e:
            raise LinkLost(f"{self.label}: cannot connect ({_reason(e)})") from None

    def _identity(self):
        """The identity_file's private key, or one sentence on why it cannot be used (read here,
        not inside connect, where a bad file would raise a ValueError from deep in asyncssh)."""
        import asyncssh
        path = Path(self.target.identity_file).expanduser()
        try:
            return asyncssh.read_private_key(str(path))
        except OSError as e:
            raise TransportError(f"{self.label}: identity_file {path}: cannot read it ({e.strerror or e})") from None
        except asyncssh.KeyEncryptionError:
            raise TransportError(f"{self.label}: identity_file {path} is protected by a passphrase; "
                                 f"load it into ssh-agent and leave identity_file out") from None
        except (asyncssh.KeyImportError, ValueError) as e:
            hint = " (that is the public key; give the private one, without .pub)" if path.suffix == ".pub" else ""
            raise TransportError(f"{self.label}: identity_file {path} is not a private key we can read "
                                 f"({_reason(e)}){hint}") from None

    async def _host_key_message(self) -> str:
        t = self.target
        try:
            key = await fetch_host_key(t)
            fp = f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"
        except TransportError:
            fp = "fingerprint unavailable"
        if known_hosts_has(t):
            return (f"{self.label}: the host key has CHANGED ({fp}) and does not match "
                    f"{_known_hosts_path(t)}; refusing to connect (possible man-in-the-middle; "
                    f"remove the old entry only if you know why it changed)")
        return (f"{self.label}: host key is not trusted ({fp}); check the fingerprint, then run "
                f"`tuitune trust {t.host}{' --port ' + str(t.port) if t.port else ''}` to add it to "
                f"{_known_hosts_path(t)}")

    async def connect(self) -> None:
        async with self._lock:
            if self._conn is None:
                self._conn = await self._open()
                await self._restore_forwards()
        self._notify("connected")

    async def reconnect(self, max_attempts: int = 8, base_delay: float = 0.25, max_delay: float = 8.0) -> None:
        """Drop the old connection and connect again with exponential backoff.

        Several users (log tail, telemetry) see one drop: when another caller has already put a
        live connection in place, it is kept (aborting it would kill that caller's fresh streams).
        A failed channel forgets only its own connection (``_forget``), so a live one here is new."""
        async with self._lock:
            if self._conn is not None and not self._conn.is_closed():
                return
            old, self._conn = self._conn, None
            if old is not None:
                old.abort()
            delay = base_delay
            for attempt in range(1, max_attempts + 1):
                if self._closed:
                    raise TransportError(f"{self.label}: transport closed")
                self._notify("reconnecting", attempt)
                try:
                    self._conn = await self._open()
                    await self._restore_forwards()
                    break
                except LinkLost as e:
                    if attempt == max_attempts:
                        self._notify("lost", attempt, str(e))
                        raise
                    await asyncio.sleep(delay)
                    delay = min(max_delay, delay * 2)
        self._notify("connected")

    def _forget(self, conn) -> None:
        """Drop a dead connection, unless another caller already replaced it."""
        if self._conn is conn:
            self._conn = None

    async def _connection(self):
        if self._conn is None:
            await self.connect()
        return self._conn

    async def _run(self, command: str, input: bytes | None) -> RunResult:
        import asyncssh
        conn = await self._connection()
        try:
            r = await conn.run(command, input=input, check=False, encoding=None)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError, BrokenPipeError) as e:
            self._forget(conn)
            raise LinkLost(f"{self.label}: connection lost ({_reason(e)})") from None
        except asyncssh.ChannelOpenError as e:
            conn.abort()  # a connection that refuses channels is replaced by the caller's reconnect
            self._forget(conn)
            raise LinkLost(f"{self.label}: cannot open a channel ({_reason(e)})") from None
        status = r.exit_status if r.exit_status is not None else (128 + 9 if r.exit_signal else 255)
        return RunResult(status, (r.stdout or b"").decode("utf-8", "replace"),
                         (r.stderr or b"").decode("utf-8", "replace"))

    async def stream(self, command: str) -> AsyncIterator[bytes]:
        import asyncssh
        conn = await self._connection()
        try:
            proc = await conn.create_process(lifeline(command), encoding=None, stderr=asyncssh.STDOUT)
        except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError) as e:
            self._forget(conn)
            raise LinkLost(f"{self.label}: connection lost ({_reason(e)})") from None
        except asyncssh.ChannelOpenError as e:
            conn.abort()  # a connection that refuses channels is replaced by the caller's reconnect
            self._forget(conn)
            raise LinkLost(f"{self.label}: cannot open a channel ({_reason(e)})") from None
        try:
            while True:
                try:
                    data = await proc.stdout.read(256 * 1024)
                except (asyncssh.ConnectionLost, asyncssh.DisconnectError, OSError, BrokenPipeError) as e:
                    self._forget(conn)
                    raise LinkLost(f"{self.label}: connection lost ({_reason(e)})") from None
                if not data:
                    if conn.is_closed() if hasattr(conn, "is_closed") else False:
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

    async def _restore_forwards(self) -> None:
        """After a reconnect, listen again on the same local ports (URLs stay valid)."""
        for (host, rport), (lport, _) in list(self._forwards.items()):
            try:
                listener = await self._conn.forward_local_port("127.0.0.1", lport, host, rport)
            except OSError:
                listener = await self._conn.forward_local_port("127.0.0.1", 0, host, rport)
            self._forwards[(host, rport)] = (listener.get_port(), listener)

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            try:
                await asyncio.wait_for(self._conn.wait_closed(), 3)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                pass
            self._conn = None
        self._notify("closed")


def for_preset(preset) -> Transport:
    """The transport to the preset's machine (a multi-node preset's: node 0's)."""
    t = preset.target.node_target(0) if preset.target.nodes else preset.target
    if t.is_local:
        return LocalTransport()
    return SshTransport(SshTarget(t.host, t.port, t.user, t.identity_file, t.known_hosts))
