"""The state record of a server tuitune started, kept on the target, and drift.

State lives on the target in ``~/.cache/tuitune/servers/<port>.json`` (pid = process group =
session, preset name and hash, start time, log path, argv), so that tuitune only ever stops
servers it started, from any machine, and so that ``status`` can compare the running process's
real environment and argv (``/proc/PID/environ``, ``/proc/PID/cmdline``) with the preset: the
seeds lost their NCCL variables silently after a restart; drift makes that visible. The state
file (mode 0600) keeps no secret in clear: secret values of argv and env are sealed (salted
SHA-256, ``redact.seal``); and once a watcher saw the server die, the cause it found (``cause``),
so that ``status`` names it later.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from tuitune import preset as P
from tuitune.base import redact
from tuitune.engines.base import flag_pairs, positionals
from tuitune.machine.host import CAT_SH, LIVE_SH, Host
from tuitune.probe import REMOTE_DIR as PROBE_DIR

STATE_DIR = "~/.cache/tuitune"


@dataclass
class ServerRecord:
    pid: int
    port: int
    preset: str
    preset_hash: str
    started: float
    log: str
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cause: str | None = None  # why it exited, as the watcher that saw it die found it
    ready_s: float | None = None  # how long it took to become ready (how long a launch of it takes)
    switch: list[int] | None = None  # launched prepared to hold these step counts (docs/switch.md)

    @property
    def pgid(self) -> int:
        return self.pid  # setsid: the server leads its own session and process group


@dataclass
class Drift:
    key: str
    running: str | None
    preset: str | None

    def shown(self) -> Drift:
        """This difference as it may be printed or written: a secret's values masked."""
        r, p, _ = redact.pair(self.key, self.running, self.preset)
        return Drift(self.key, r, p)

    def __str__(self) -> str:
        r, p, note = redact.pair(self.key, self.running, self.preset)
        r = "(unset)" if r is None else r
        p = "(unset)" if p is None else p
        return f"{self.key}: running {r}, preset {p}{note}"


def _without_probe(preset: P.Preset, environ: dict[str, str]) -> dict[str, str]:
    """The process environment less what tuitune itself added at launch: the probe's directory
    at the head of PYTHONPATH (render.server_argv), so drift is about the preset's own values."""
    path = environ.get("PYTHONPATH")
    if not preset.uses_probe or path is None:
        return environ
    head, sep, rest = path.partition(":")
    if not head.rstrip("/").endswith(PROBE_DIR.removeprefix("~")):
        return environ
    out = dict(environ)
    if sep or "PYTHONPATH" in preset.env:
        out["PYTHONPATH"] = rest
    else:
        del out["PYTHONPATH"]
    return out


def probe_hint(preset: P.Preset, environ: dict[str, str]) -> str | None:
    """For a server started by hand without tuitune's probe: what the probe would add, and the one
    line to put in the server's environment to get it (None for the simulator, which prints its own
    profile lines, and for a server that has it on)."""
    if preset.server.module == P.SIM_MODULE or environ.get("EAGLE3_PROFILE", "") not in ("", "0"):
        return None
    return (
        "the probe is off: per-phase timings (draft, verify, extend) and accept-length histograms need it; "
        f"`tuitune probe install {preset.name}` copies it to {PROBE_DIR}, then start the server with "
        f'EAGLE3_PROFILE=1 PYTHONPATH="$HOME{PROBE_DIR.removeprefix("~")}${{PYTHONPATH:+:$PYTHONPATH}}" in its environment'
    )


def compute_drift(preset: P.Preset, argv: list[str], environ: dict[str, str]) -> list[Drift]:
    """What differs between a running process and the preset: env variables and flags."""
    drift: list[Drift] = []
    environ = _without_probe(preset, environ)
    want_env = preset.launch_env()
    for k, v in want_env.items():
        if environ.get(k) != v:
            drift.append(Drift(f"env.{k}", environ.get(k), v))
    for k, v in sorted(environ.items()):
        if k.startswith("NCCL_") and k not in want_env:
            drift.append(Drift(f"env.{k}", v, None))
    try:
        m = argv.index("-m")
        server_args = argv[m + 2 :]
    except ValueError:
        server_args = argv[1:]
    have_pos, want_pos = positionals(server_args), positionals(preset.flags())
    if have_pos != want_pos:
        drift.append(Drift("arguments", " ".join(have_pos) or None, " ".join(want_pos) or None))
    have, want = flag_pairs(server_args), flag_pairs(preset.flags())
    same_anyway = preset.engine.derived_flags(preset)  # absent, the engine picks the preset's value
    for k in list(dict.fromkeys([*want, *have])):
        if k not in have and k in same_anyway:
            continue
        if k not in have:
            drift.append(Drift(f"flag {k}", None, want[k] or "(set)"))
        elif k not in want:
            drift.append(Drift(f"flag {k}", have[k] or "(set)", None))
        elif have[k] != want[k]:
            drift.append(Drift(f"flag {k}", have[k], want[k]))
    return drift


class StateFile:
    """The record of the server tuitune started on the preset's port, on the target."""

    def __init__(self, host: Host, state_dir: str = STATE_DIR):
        self.host = host
        self.state_dir = state_dir

    @property
    def path(self) -> str:
        return f"{self.state_dir}/servers/{self.host.preset.server.port}.json"

    async def read(self) -> ServerRecord | None:
        """The record of the server tuitune started on this port; an empty or corrupt state file
        (a client killed in the middle of an old, non-atomic write) is recovered from the process
        that listens on the port, and the host's ``warnings`` say so."""
        f = P.shell_path(self.path)
        r = await self.host.t.run(f"[ -e {f} ] || exit 3; " + CAT_SH.format(f=f), timeout=30)
        return None if r.exit_status == 3 else await self._parse(r.stdout)

    async def watch_tick(self, pid: int) -> tuple[ServerRecord | None, bool]:
        """``read()`` and ``alive(pid)`` in one command of shell built-ins: what a ready
        server's watch asks every WATCH_S (one process a tick instead of six)."""
        # the answer is in the exit status (stdout is the file alone, as read's, whatever a
        # login script prints): 0 alive, 10 not; 3 more where there is no state file
        f = P.shell_path(self.path)
        r = await self.host.t.run(
            f"p={int(pid)}; if {LIVE_SH}; then a=0; else a=10; fi; [ -e {f} ] || exit $((a + 3)); "
            + CAT_SH.format(f=f)
            + "; exit $a",
            timeout=30,
        )
        alive = r.exit_status in (0, 3)
        return (None if r.exit_status in (3, 13) else await self._parse(r.stdout)), alive

    async def _parse(self, text: str) -> ServerRecord | None:
        try:
            d = json.loads(text)
            return ServerRecord(**{k: d[k] for k in ServerRecord.__dataclass_fields__ if k in d})
        except (ValueError, TypeError, KeyError):
            return await self._recover(text)

    async def _recover(self, text: str) -> ServerRecord | None:
        h, preset = self.host, self.host.preset
        what = "empty" if not text.strip() else "corrupt"
        port = preset.server.port
        ours = [
            o
            for o in await h.port_owners()
            if "--port" in o["argv"] and str(port) in o["argv"] and preset.server.module in o["argv"]
        ]
        if not ours:
            await self.clear()
            h.warnings.append(
                f"state file {self.path} was {what} and no {preset.server.module} "
                f"server listens on port {port}; removed it"
            )
            return None
        leader = min(ours, key=lambda o: (o["pid"] != o["sid"], o["pid"]))
        pid = leader["sid"] if await h.alive(leader["sid"]) else leader["pid"]
        view = await h.process_view(pid)
        argv, env = view if view is not None else (leader["argv"], {})
        same = not compute_drift(preset, argv, env)
        flags = argv[argv.index("-m") + 2 :] if "-m" in argv else argv[1:]  # as start() records them
        rec = ServerRecord(
            pid=pid,
            port=port,
            preset=preset.name if same else "(recovered)",
            preset_hash=preset.hash() if same else "",
            started=time.time(),
            log=preset.server.log,
            argv=flags,
            env={k: v for k, v in env.items() if k in preset.launch_env()},
        )
        await self.write(rec)
        h.warnings.append(
            f"state file {self.path} was {what}; recovered server {pid} from port {port} "
            f"and its command line" + ("" if same else " (it does not match this preset)")
        )
        return rec

    async def write(self, rec: ServerRecord) -> None:
        """Write the record atomically; what it keeps of argv and env holds no secret in clear."""
        d = asdict(rec)
        d["argv"], d["env"] = redact.sealed_argv(d["argv"]), redact.sealed_env(d["env"])
        await self.host.t.upload(json.dumps(d, indent=1).encode(), self.path, 0o600)

    async def clear(self) -> None:
        await self.host.t.run(f"rm -f -- {P.shell_path(self.path)}", timeout=30)


async def still_ours(host: Host, rec: ServerRecord) -> bool:
    """Whether ``rec.pid`` still runs a server for ``rec.port`` (a pid can be reused after the
    server died unseen; stopping that pid's group would kill an unrelated program)."""
    view = await host.process_view(rec.pid)
    if view is None:
        return True  # not readable (another user's process): the alive check has to do
    argv = view[0]
    return any(
        a == f"--port={rec.port}" or (a == "--port" and argv[i + 1 : i + 2] == [str(rec.port)])
        for i, a in enumerate(argv)
    )


async def hand_started(host: Host) -> ServerRecord | None:
    """The server that listens on the preset's port without tuitune having started it, as a
    record (preset "(by hand)"): its leading process (the one whose ancestors hold no other
    listener: an engine's workers may share the socket), flags and environment as /proc shows
    them, and its start time. None when nothing listens, or the listener cannot be read."""
    found = await host.listener()
    if found is None:
        return None
    pid, argv, env = found
    env = env or {}
    preset = host.preset
    flags = argv[argv.index("-m") + 2 :] if "-m" in argv else argv[1:]
    r = await host.t.run(f"ps -o etimes= -p {pid}", timeout=30)
    up = r.stdout.strip()
    keep = set(preset.launch_env()) | {"EAGLE3_PROFILE", "PYTHONPATH"}
    return ServerRecord(
        pid=pid,
        port=preset.server.port,
        preset="(by hand)",
        preset_hash="",
        started=time.time() - int(up) if up.isdigit() else 0.0,
        log=preset.server.log,
        argv=flags,
        env={k: v for k, v in env.items() if k in keep or k.startswith("NCCL_")},
    )
