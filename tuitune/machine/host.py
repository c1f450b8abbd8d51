"""The target as one preset's server sees it: its link, the preset, the launch's deadline and
warnings, and the small questions asked of it (is a process alive, is the port busy, who listens
on it, what a process's command line and environment are). Every other part of server control
(lock, record, preflight, readiness, control) asks through one of these."""

from __future__ import annotations

import base64
import json
import shlex
import time
from importlib import resources

from tuitune import preset as P
from tuitune.machine.errors import ControlError
from tuitune.machine.transport import Transport


def script(name: str) -> str:
    """The text of ``machine/remote/NAME`` as it is sent: a shell script without its header of
    comment lines (they document it here; the target needs none of them)."""
    lines = resources.files("tuitune.machine.remote").joinpath(name).read_text().splitlines()
    while lines and lines[0].startswith("#"):
        del lines[0]
    return "\n".join(lines) + "\n"


def shell_arg(a: str) -> str:
    """One value as one word of a remote command: quoted, a leading ``~/`` as ``"$HOME"/``."""
    return P.shell_path(a) if a.startswith("~") else shlex.quote(a)


REMOTE_PY = resources.files("tuitune.machine.remote").joinpath("remote.py").read_text()
# true when process $p exists and is not a zombie (a zombie only waits for its parent to reap it):
# the state is the first letter after the last ") " of /proc/$p/stat. Shell built-ins only (POSIX sh),
# no process of its own: a ready server is checked every WATCH_S, and on a box whose cores the engine
# keeps busy the checker's forks were part of what tuitune's own measurements cost the engine.
LIVE_SH = '{ read -r s < /proc/$p/stat; } 2>/dev/null && s=${s##*) } && s=${s%"${s#?}"} && [ -n "$s" ] && [ "$s" != Z ]'
# file {f} on stdout with built-ins (no cat), a last line without a newline included
CAT_SH = 'while IFS= read -r l || [ -n "$l" ]; do printf "%s\\n" "$l"; done < {f}'


class Host:
    """The target of one preset's server: ``t`` its link, ``preset`` the server's preset."""

    def __init__(self, transport: Transport, preset: P.Preset):
        self.t = transport
        self.preset = preset
        self.warnings: list[str] = []  # what the last relaunch (or status) found worth saying
        self.deadline: float | None = None  # monotonic end of the running launch (``--timeout``)

    def limit(self, seconds: float) -> float:
        """A wait's own limit cut to the launch's deadline (at least a moment, so that it can answer)."""
        if self.deadline is None:
            return seconds
        return max(0.05, min(seconds, self.deadline - time.monotonic()))

    def remote(self, *args: str) -> str:
        """A ``remote.py`` command with the server's python; every argument quoted."""
        return f"{P.shell_path(self.preset.python())} -I -S -c {shlex.quote(REMOTE_PY)} " + " ".join(
            map(shell_arg, args)
        )

    def as_server(self, command: str) -> str:
        """``command`` (a python invocation) where and as the server will run it: in its workdir
        (``python -m`` imports from there) and with the preset's own environment (PYTHONPATH for
        an engine's custom code, a platform variable the engine's parser needs)."""
        p = self.preset
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in p.env.items())
        where = f"cd -- {P.shell_path(p.server.workdir)} 2>/dev/null || exit 6; " if p.server.workdir else ""
        return f"{where}env -- {env} {command}" if env else f"{where}{command}"

    async def alive(self, pid: int) -> bool:
        r = await self.t.run(f"p={int(pid)}; {LIVE_SH}", timeout=30)
        return r.ok

    async def port_busy(self, port: int | None = None) -> bool:
        port = port or self.preset.server.port
        r = await self.t.run(f"(exec 3<>/dev/tcp/127.0.0.1/{int(port)}) 2>/dev/null", timeout=30)
        return r.ok

    async def port_owners(self) -> list[dict]:
        """Processes with a listening socket on the preset's port (pid, sid, ancestors, argv)."""
        r = await self.t.run(self.remote("owner", str(int(self.preset.server.port))), timeout=30)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise ControlError(
                f"{self.t.label}: cannot tell which process listens on port "
                f"{self.preset.server.port}: {(r.stderr or r.stdout).strip()[-200:]}"
            ) from None

    async def owns_port(self, pid: int) -> bool:
        """Whether ``pid`` or a process of its session, or one descended from it, listens on the port."""
        return any(o["pid"] == pid or o["sid"] == pid or pid in o["ancestors"] for o in await self.port_owners())

    async def process_view(self, pid: int) -> tuple[list[str], dict[str, str]] | None:
        r = await self.t.run(
            f"base64 -w0 /proc/{int(pid)}/cmdline && echo && base64 -w0 /proc/{int(pid)}/environ", timeout=30
        )
        if not r.ok:
            return None
        parts = r.stdout.split("\n")
        try:
            argv = [a.decode("utf-8", "replace") for a in base64.b64decode(parts[0]).split(b"\0") if a]
            env_items = [e.decode("utf-8", "replace") for e in base64.b64decode(parts[1]).split(b"\0") if e]
        except (ValueError, IndexError):
            return None
        return argv, dict(e.split("=", 1) for e in env_items if "=" in e)

    async def listener(self) -> tuple[int, list[str], dict[str, str] | None] | None:
        """(pid, argv, environment) of the process that listens on the preset's port: its leading
        one (whose ancestors hold no other listener: an engine's workers may share the socket), as
        /proc shows it (where /proc cannot be read: its argv from the port's owners, environment
        None). None when nothing listens, or the listener cannot be told."""
        try:
            owners = await self.port_owners()
        except ControlError:
            return None
        if not owners:
            return None
        pids = {o["pid"] for o in owners}
        leader = min(owners, key=lambda o: (any(a in pids for a in o["ancestors"]), o["pid"]))
        pid = int(leader["pid"])
        view = await self.process_view(pid)
        if view is None:
            return pid, list(leader.get("argv") or []), None
        return pid, *view
