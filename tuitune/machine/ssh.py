"""SSH as tuitune resolves it: the target and its hops (``~/.ssh/config``: Host, HostName, User,
Port, IdentityFile, ProxyJump), whether a host answers at all, and host-key trust (known_hosts
checked on every connection; ``tuitune trust`` shows a key and adds it). The connection itself and
what runs over it are the transport's (tuitune.machine.transport).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuitune.machine.errors import LinkLost, TransportError

KEEPALIVE_INTERVAL = 15
KEEPALIVE_COUNT = 3
CONNECT_TIMEOUT_S = 20.0  # a hop's TCP connect and SSH handshake, unless ~/.ssh/config's ConnectTimeout says
HOST_KEY_TIMEOUT_S = 15.0  # `tuitune trust`'s fetch of one host key (its --timeout)


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
    connect_timeout: float | None = None  # ConnectTimeout (seconds), as OpenSSH reads it

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
        float(cfg.get("ConnectTimeout") or 0) or None,
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


async def fetch_host_key(hop: SshHop, tunnel=None, timeout: float | None = None):
    """The host key ``hop`` presents, within ``timeout`` seconds (its ConnectTimeout, else
    ``HOST_KEY_TIMEOUT_S``), or one sentence on why not."""
    import asyncssh

    limit = timeout or hop.connect_timeout or HOST_KEY_TIMEOUT_S
    try:
        key = await asyncio.wait_for(asyncssh.get_server_host_key(hop.name, hop.port, tunnel=tunnel), limit)
    except (TimeoutError, OSError, asyncssh.Error) as e:
        raise TransportError(f"{hop.describe()}: cannot fetch its host key ({_reason(e, limit)})") from None
    if key is None:
        raise TransportError(f"{hop.describe()}: it presented no host key")
    return key


def _reason(e: BaseException, timeout: float | None = None) -> str:
    """Why a connection failed, in a few words: the three ways a host is out of reach said plainly
    (refused, a name that does not resolve, no answer within ``timeout``), else the error's own."""
    import errno

    if isinstance(e, asyncio.TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "timed out"
    if isinstance(e, socket.gaierror):
        return f"not a known host name: {e.strerror or e}"
    if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
        return "connection refused: nothing listens on that port"
    text = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e) or type(e).__name__
    return str(text).strip().rstrip(".")


async def connect_hop(
    hop: SshHop,
    tunnel,
    known_hosts: Path,
    trust_hint: str,
    who: str,
    connect_timeout: float | None = None,
    client_keys: list[str] | None = None,
):
    """One asyncssh connection to ``hop`` (through ``tunnel``, None for none), or one sentence.
    ``connect_timeout``: the hop's own ConnectTimeout when it has one, else this, else
    ``CONNECT_TIMEOUT_S``."""
    import asyncssh

    connect_timeout = hop_timeout(hop, connect_timeout)
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
        raise LinkLost(f"{who}: cannot connect ({_reason(e, connect_timeout)})") from None


def hop_timeout(hop: SshHop, default: float | None = None) -> float:
    """How long connecting to ``hop`` may take: its ConnectTimeout, else ``default``, else ours."""
    return hop.connect_timeout or default or CONNECT_TIMEOUT_S


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


async def trust_route(
    target: SshTarget,
    confirm: Callable[[SshHop, object], bool],
    say: Callable[[str], None],
    timeout: float | None = None,
) -> bool:
    """``tuitune trust``: each hop's key (jump hosts first, fetched through the hops before it) is
    shown and, once ``confirm`` agrees, recorded under the name OpenSSH looks it up by. A recorded
    key that differs is never replaced. True when every hop is trusted at the end. ``timeout``:
    seconds each hop may take to answer (None: its ConnectTimeout, else ``HOST_KEY_TIMEOUT_S``)."""
    path = _known_hosts_path(target)
    hops = ssh_route(target)
    conns: list = []
    try:
        for i, hop in enumerate(hops):
            last = i == len(hops) - 1
            tunnel = conns[-1] if conns else None
            key = await fetch_host_key(hop, tunnel, timeout)
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
                conns.append(
                    await connect_hop(hop, tunnel, path, "tuitune trust", f"jump host {hop.describe()}", timeout)
                )
    finally:
        for c in reversed(conns):
            c.abort()
    return True
