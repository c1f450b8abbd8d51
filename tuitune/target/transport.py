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
import socket
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncssh  # imported where it is used: `tuitune --help` does not load it

KEEPALIVE_INTERVAL = 15
KEEPALIVE_COUNT = 3


RETRY_CAP_S = 8.0  # the longest pause between two reconnect attempts of a follower (``resume``)


class TransportError(Exception):
    """A one-sentence failure of the link or of a command's plumbing (not its exit status)."""


class LinkLost(TransportError):
    """The connection dropped; ``reconnect()`` may bring it back.

    Also what a command whose connection died while it ran raises: its exit status never came
    back, so there is no answer to read (an SSH channel closed without one is not "exit 255",
    which a liveness check would take for "not running")."""


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


@dataclass
class SshTarget:
    host: str
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None

    def label(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}{':' + str(self.port) if self.port else ''}"


# ---- resolving a host the way OpenSSH does ---------------------------------------------------------
# asyncssh reads ~/.ssh/config itself when it connects (HostName, Port, User, HostKeyAlias,
# IdentityFile, ProxyJump), and checks known_hosts under HostKeyAlias or the resolved HostName with
# the resolved Port. tuitune resolves the same way so that what it trusts, names in a message and
# connects through (each ProxyJump hop, opened here so that its key is checked against the same
# known_hosts file and a failure names that hop) is what asyncssh will check.

MAX_HOPS = 8


@dataclass(frozen=True)
class SshHop:
    name: str  # as written: an alias of ~/.ssh/config or a host name
    host: str  # HostName
    port: int
    user: str | None
    key_alias: str | None  # HostKeyAlias

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH looks the key up under: HostKeyAlias as it is, else ``[HostName]:port``
        (bare on port 22)."""
        if self.key_alias:
            return self.key_alias
        return f"[{self.host}]:{self.port}" if self.port != 22 else self.host

    @property
    def known_hosts_patterns(self) -> str:
        """What a known_hosts line is written for: asyncssh also appends the port to a HostKeyAlias,
        so both spellings are listed (one line that OpenSSH and asyncssh both accept)."""
        ours = f"[{self.key_alias}]:{self.port}" if self.key_alias and self.port != 22 else None
        return self.known_hosts_name + (f",{ours}" if ours else "")

    def describe(self) -> str:
        real = f"{self.host}:{self.port}"
        return real if self.name == self.host else f"{self.name} ({real})"


def _ssh_config(host: str, port: int | None, user: str | None):
    import getpass

    import asyncssh
    from asyncssh.config import SSHClientConfig

    path = Path("~/.ssh/config").expanduser()
    paths = [path] if path.is_file() and os.access(path, os.R_OK) else []
    try:
        return SSHClientConfig.load(None, paths, False, False, False, getpass.getuser(), user or (), host, port or ())
    except (OSError, asyncssh.Error, ValueError) as e:
        raise TransportError(f"{path}: cannot read it ({_reason(e)})") from None


def _parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` of a ProxyJump list entry."""
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):  # [v6]:port
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] or None
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    try:
        return user or None, host, int(port) if port else None
    except ValueError:
        raise TransportError(f"ProxyJump {spec!r}: the port is not a number") from None


def ssh_route(target: SshTarget, _depth: int = 0) -> list[SshHop]:
    """The hops to connect through, jump hosts first and the target last (each from ~/.ssh/config)."""
    if _depth > MAX_HOPS:
        raise TransportError(f"{target.host}: ProxyJump chain longer than {MAX_HOPS} hops (a loop?)")
    cfg = _ssh_config(target.host, target.port, target.user)
    hop = SshHop(
        target.host,
        str(cfg.get("Hostname", target.host)),
        int(cfg.get("Port", 22) or 22),
        target.user or cfg.get("User"),
        cfg.get("HostKeyAlias"),
    )
    jump = cfg.get("ProxyJump")
    hops: list[SshHop] = []
    if jump and str(jump).lower() != "none":
        for spec in str(jump).split(","):
            user, host, port = _parse_jump(spec.strip())
            hops.extend(ssh_route(SshTarget(host, port, user), _depth + 1))
    return [*hops, hop]


def reachable(target: SshTarget, timeout: float = 2.0) -> str | None:
    """Why the target cannot be reached from here now, in a few words, or None when the first hop of
    its SSH route (a jump host or the target, resolved as OpenSSH does) accepts a TCP connection.
    Cheap (no SSH handshake, no key): for listings that say where a preset can run."""
    try:
        first = ssh_route(target)[0]
    except TransportError as e:
        return str(e)
    try:
        socket.create_connection((first.host, first.port), timeout).close()
    except socket.gaierror:
        return f"{first.name} is not a known host name" + ("" if first.name == first.host else f" ({first.host})")
    except TimeoutError:
        return f"{first.describe()} does not answer"
    except OSError as e:
        return f"{first.describe()}: {e.strerror or e}"
    return None


def _known_hosts_path(t: SshTarget) -> Path:
    return Path(t.known_hosts or "~/.ssh/known_hosts").expanduser()


def known_key_state(path: Path, hop: SshHop, key) -> str:
    """'trusted', 'changed' (other keys recorded for this name) or 'unknown'."""
    import asyncssh

    if not path.exists():
        return "unknown"
    try:
        kh = asyncssh.read_known_hosts(str(path))
        trusted, *_ = kh.match(hop.key_alias or hop.host, "", hop.port)
    except (OSError, ValueError, asyncssh.Error):
        return "unknown"
    if key is not None and any(k.public_data == key.public_data for k in trusted):
        return "trusted"
    return "changed" if trusted else "unknown"


def trust_line(hop: SshHop, key) -> str:
    return f"{hop.known_hosts_patterns} {key.export_public_key().decode().strip()}\n"


def _fingerprint(key) -> str:
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


async def fetch_host_key(hop: SshHop, tunnel=None):
    import asyncssh

    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(hop.name, hop.port, tunnel=tunnel), 15)
    except (TimeoutError, OSError, asyncssh.Error) as e:
        raise TransportError(f"{hop.describe()}: cannot fetch its host key ({_reason(e)})") from None
    if key is None:
        raise TransportError(f"{hop.describe()}: it presented no host key")
    return key


def _reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    text = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).strip().rstrip(".")


async def connect_hop(
    hop: SshHop,
    tunnel,
    known_hosts: Path,
    trust_hint: str,
    who: str,
    connect_timeout: float = 20.0,
    client_keys: list[str] | None = None,
):
    """One asyncssh connection to ``hop`` (through ``tunnel``, None for none), or one sentence."""
    import asyncssh

    opts: dict = {
        "keepalive_interval": KEEPALIVE_INTERVAL,
        "keepalive_count_max": KEEPALIVE_COUNT,
        "connect_timeout": connect_timeout,
        "port": hop.port,
        # a missing file trusts nothing (as OpenSSH); None, not (): the route holds the ProxyJump
        "known_hosts": str(known_hosts) if known_hosts.exists() else b"",
        "tunnel": tunnel,
    }
    if hop.user:
        opts["username"] = hop.user
    if client_keys:
        opts["client_keys"] = client_keys
    try:
        return await asyncssh.connect(hop.name, **opts)
    except asyncssh.HostKeyNotVerifiable:
        raise TransportError(await _host_key_message(who, hop, tunnel, known_hosts, trust_hint)) from None
    except asyncssh.PermissionDenied:
        raise TransportError(f"{who}: authentication failed (check user, identity_file or ssh-agent)") from None
    except (TimeoutError, OSError, asyncssh.Error) as e:
        raise LinkLost(f"{who}: cannot connect ({_reason(e)})") from None


async def _host_key_message(who: str, hop: SshHop, tunnel, path: Path, trust_hint: str) -> str:
    try:
        key = await fetch_host_key(hop, tunnel)
        fp, state = _fingerprint(key), known_key_state(path, hop, key)
    except TransportError:
        fp, state = "fingerprint unavailable", known_key_state(path, hop, None)
    if state == "changed":
        return (
            f"{who}: the host key has CHANGED ({fp}) and does not match {hop.known_hosts_name} "
            f"in {path}; refusing to connect (possible man-in-the-middle; remove the old "
            f"entry only if you know why it changed)"
        )
    return (
        f"{who}: host key is not trusted ({fp}); check the fingerprint, then run "
        f"`{trust_hint}` to add it to {path} as {hop.known_hosts_name}"
    )


async def trust_route(target: SshTarget, confirm: Callable[[SshHop, object], bool], say: Callable[[str], None]) -> bool:
    """``tuitune trust``: each hop's key (jump hosts first, fetched through the hops before it) is
    shown and, once ``confirm`` agrees, recorded under the name OpenSSH looks it up by. A recorded
    key that differs is never replaced. True when every hop is trusted at the end."""
    path = _known_hosts_path(target)
    hops = ssh_route(target)
    conns: list = []
    try:
        for i, hop in enumerate(hops):
            last = i == len(hops) - 1
            tunnel = conns[-1] if conns else None
            key = await fetch_host_key(hop, tunnel)
            say(f"{'' if last else 'jump host '}{hop.describe()} presents {_fingerprint(key)}")
            state = known_key_state(path, hop, key)
            if state == "changed":
                raise TransportError(
                    f"{path} already has a different key for {hop.known_hosts_name}; if it "
                    f"changed, remove the old line yourself after checking why (tuitune "
                    f"never replaces a key)"
                )
            if state == "trusted":
                say(f"  already trusted as {hop.known_hosts_name} in {path}")
            elif not confirm(hop, key):
                return False
            else:
                if not path.parent.is_dir():  # as ssh wants ~/.ssh: 0700 whatever the umask
                    path.parent.mkdir(parents=True, exist_ok=True)
                    os.chmod(path.parent, 0o700)
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a") as f:
                    f.write(trust_line(hop, key))
                say(f"  added to {path} as {hop.known_hosts_name}")
            if not last:
                conns.append(await connect_hop(hop, tunnel, path, "tuitune trust", f"jump host {hop.describe()}"))
    finally:
        for c in reversed(conns):
            c.abort()
    return True


class SshTransport(Transport):
    def __init__(self, target: SshTarget, connect_timeout: float = 20.0):
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

    async def _open(self):
        """Connect hop by hop (ProxyJump hosts first), each checked against the same known_hosts."""
        t = self.target
        hops = ssh_route(t)
        self._close_jumps()
        conn = None
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
                self._conn = await self._open()
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
