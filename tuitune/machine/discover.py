"""Find a server someone started by hand, on this machine or over SSH, and read its preset off its
process: ``tuitune --port P`` / ``--pid PID`` (the TUI and ``--record``) and ``tuitune preset
discover`` watch a server without a preset written first.

The port gives the process that listens on it (its leading one: an engine's workers may share the
socket), or the pid is given; /proc gives its argv, environment, working directory and where its
standard output goes, which is its log unless ``--log`` says otherwise. Nothing on the target
changes: this only reads.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field

from tuitune import preset as P
from tuitune.base.errors import TuituneError
from tuitune.machine.control import ServerControl
from tuitune.machine.errors import ControlError
from tuitune.machine.transport import SshTransport, for_preset
from tuitune.preset.discovered import from_process

_HOST = re.compile(r"(?:(?P<user>[^@\s]+)@)?(?P<host>[^@:\s]+)(?::(?P<port>\d{1,5}))?")


class DiscoverError(TuituneError):
    """One sentence: the server cannot be found, or its process cannot be read."""

    code = 1


@dataclass
class Found:
    preset: P.Preset
    pid: int
    notes: list[str] = field(default_factory=list)


def parse_host(text: str | None) -> str | dict:
    """``--host [USER@]HOST[:SSH_PORT]`` as a preset's target (None: this machine)."""
    if text is None or text in P.LOCAL_HOSTS:
        return "local"
    m = _HOST.fullmatch(text)
    if m is None or (m["port"] and not 1 <= int(m["port"]) <= 65535):
        raise DiscoverError(f"--host {text!r} is not [USER@]HOST[:SSH_PORT]")
    t: dict = {"host": m["host"]}
    if m["user"]:
        t["user"] = m["user"]
    if m["port"]:
        t["port"] = int(m["port"])
    return t


def _probe_preset(target: str | dict, port: int) -> P.Preset:
    """A preset that only says where to look (the port's lock and owner helpers need one)."""
    server: dict = {"log": "/dev/null", "port": port}
    if target == "local":
        server["python"] = sys.executable
    return P.from_dict({"name": "discover", "target": target, "server": server}, "discover")


async def _paths(control: ServerControl, pid: int) -> tuple[str | None, str | None]:
    """(where the process's standard output goes when it is a regular file, its working directory)."""
    fd, cwd = f"/proc/{int(pid)}/fd/1", f"/proc/{int(pid)}/cwd"
    r = await control.t.run(f"readlink {cwd}; if [ -f {fd} ]; then readlink {fd}; fi", timeout=30)
    lines = r.stdout.splitlines()
    out = lines[1] if len(lines) > 1 and lines[1].startswith("/") else None
    return out, (lines[0] if lines and lines[0].startswith("/") else None)


async def discover(
    host: str | None = None,
    *,
    port: int | None = None,
    pid: int | None = None,
    log: str | None = None,
    name: str | None = None,
) -> Found:
    """The server on ``port`` (or process ``pid``) of ``host``, as a preset read off its process."""
    if port is None and pid is None:
        raise DiscoverError("give the server's --port or --pid")
    target = parse_host(host)
    probe = _probe_preset(target, port or 1)
    transport = for_preset(probe)
    if isinstance(transport, SshTransport):
        transport.trust_hint = f"tuitune trust {host}"
    control = ServerControl(transport, probe)
    where = control.t.label
    try:
        if port is not None:
            found = await control.listener()
            if found is None:
                raise DiscoverError(f"nothing listens on port {port} of {where} (or its process is not yours to read)")
            if pid is not None and pid != found[0]:
                raise DiscoverError(f"pid {pid} is not the server on port {port} of {where} (pid {found[0]} is)")
            pid, argv, env = found
            view = None if env is None else (argv, env)
        else:
            assert pid is not None
            view = await control.process_view(pid)
        if view is None:
            raise DiscoverError(f"no process {pid} on {where} (or it is not yours to read)")
        argv, environ = view
        stdout, cwd = await _paths(control, pid)
    except ControlError as e:
        raise DiscoverError(str(e)) from None
    finally:
        await control.t.close()
    typed = log
    if log is None:
        if stdout is None:
            raise DiscoverError(
                f"cannot tell where pid {pid} on {where} writes its log (its output is no file: a terminal "
                "or a pipe); give its log with --log PATH"
            )
        log = stdout
    elif not log.startswith(("/", "~/")):
        raise DiscoverError(f"--log {log!r} is not an absolute path; start it with / or ~/")
    source = f"pid {pid} on {where}"
    preset, notes = from_process(
        argv, environ, name=name or "discovered", target=target, log=log, cwd=cwd, port=port, source=source
    )
    if name is None:
        kind = "sim" if preset.server.module == P.SIM_MODULE else preset.engine.name
        preset = preset.model_copy(update={"name": f"{kind}-{preset.server.port}"})
    # how to find it again, to write it down before adopting it (Preset.adopt_hint)
    again = [("--port", str(preset.server.port)), ("--host", host), ("--log", typed), ("--name", name)]
    preset._discovered = " ".join(
        f"{k} {shlex.quote(v)}" for k, v in again if v and not (k == "--host" and target == "local")
    )
    return Found(preset, pid, notes)
