"""Server control on the target: preflight -> stop -> start -> wait ready; status and drift.

State lives on the target in ``~/.cache/tuitune/servers/<port>.json`` (pid = process group =
session, preset name and hash, start time, log path, argv), so that tuitune only ever stops
servers it started, from any machine, and so that ``status`` can compare the running process's
real environment and argv (``/proc/PID/environ``, ``/proc/PID/cmdline``) with the preset: the
seeds lost their NCCL variables silently after a restart; drift makes that visible. The state
file (mode 0600) keeps no secret in clear: secret values of argv and env are sealed (salted
SHA-256, ``redact.seal``); and once a watcher saw the server die, the cause it found (``cause``),
so that ``status`` names it later.

Why one module of this size: preflight, lock, start, stop, readiness and drift share the state
file's format and the lock's discipline; every change of state on the target goes through here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import getpass
import hashlib
import json
import os
import re
import shlex
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Protocol

from tuitune import preset as P
from tuitune.base import redact
from tuitune.base.aio import cancel_and_wait, to_the_end
from tuitune.base.events import Event, NcclEnv, ServerError
from tuitune.engines import CAUSE_ORDER, CAUSE_TEXT
from tuitune.engines.base import draft_misfit, flag_pairs, positionals
from tuitune.machine.tail import LogTail
from tuitune.machine.transport import LinkLost, Transport, TransportError
from tuitune.measure.parse import parse_line
from tuitune.probe import REMOTE_DIR as PROBE_DIR

STATE_DIR = "~/.cache/tuitune"
LOCK_ANSWER_S = 60.0  # the lock helper answers in milliseconds; a python that hangs at start does not
HELPER_EXITED = "ERROR the lock helper exited"
OWN_RELEASE_S = 3.0  # how long a lock this process let go may still read as held (its helper dying)
_HELD: set[tuple[str, str]] = set()  # (target, lock path) this process holds now
HEALTH_TIMEOUT_S = 120.0  # once HTTP answers, the longest wait for /health 200 (a phase limit)
_REMOTE = resources.files("tuitune.machine.remote").joinpath("remote.py").read_text()
# true when process $p exists and is not a zombie (a zombie only waits for its parent to reap it):
# the state is the first letter after the last ") " of /proc/$p/stat. Shell built-ins only (POSIX sh),
# no process of its own: a ready server is checked every WATCH_S, and on a box whose cores the engine
# keeps busy the checker's forks were part of what tuitune's own measurements cost the engine.
LIVE_SH = '{ read -r s < /proc/$p/stat; } 2>/dev/null && s=${s##*) } && s=${s%"${s#?}"} && [ -n "$s" ] && [ "$s" != Z ]'
# file {f} on stdout with built-ins (no cat), a last line without a newline included
_CAT_SH = 'while IFS= read -r l || [ -n "$l" ]; do printf "%s\\n" "$l"; done < {f}'
# exit 0: the module is there; 3: it (or its package: find_spec raises for "sglang.x" without
# sglang) is not installed; 5: its package fails to import, the reason on stderr
FIND_MODULE_PY = """import importlib.util, sys
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except ImportError:
    found = False
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(5)
sys.exit(0 if found else 3)
"""

# The key of a cached flag listing: what the listing depends on, read without importing the engine
# (an import of vLLM is most of the 15-30 s its `serve --help=all` takes): the python, the working
# directory, the module and the listing's own arguments and environment (argv), the versions of the
# distributions that provide the module's top package, and the count and newest modification time of
# that package's .py files (a reinstall or an edited checkout changes them; 2,600 files: ~50 ms).
HELP_KEY_PY = """import hashlib, importlib.util, os, sys
top = sys.argv[1].split(".")[0]
parts = [os.path.realpath(sys.executable), sys.version, os.getcwd()] + sys.argv[1:]
try:
    from importlib import metadata
    try:
        names = sorted(set(metadata.packages_distributions().get(top, [])) | {top})
    except AttributeError:
        names = [top]
    for n in names:
        try:
            parts.append(n + "==" + metadata.version(n))
        except Exception:
            pass
except ImportError:
    pass
try:
    spec = importlib.util.find_spec(top)
except Exception:
    spec = None
roots = []
if spec is not None:
    roots = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
count, newest, stack = 0, 0, list(roots)
while stack:
    d = stack.pop()
    if os.path.isfile(d):
        count, newest = count + 1, max(newest, os.stat(d).st_mtime_ns)
        continue
    try:
        entries = list(os.scandir(d))
    except OSError:
        continue
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                if e.name != "__pycache__":
                    stack.append(e.path)
            elif e.name.endswith(".py"):
                count, newest = count + 1, max(newest, e.stat().st_mtime_ns)
        except OSError:
            pass
parts += [repr(roots), str(count), str(newest)]
print(hashlib.sha256("\\0".join(parts).encode("utf-8", "replace")).hexdigest()[:40])
"""
# `sh -c` body: $1 python, $2 HELP_KEY_PY, $3 module, $4 the environment's hash, then the listing's
# arguments. A listing found under its key is printed as it is; otherwise the engine lists its
# flags, and a successful listing is written to a temporary file and renamed into place (two
# launches at once never read half of one). Where the cache cannot be written, the engine is asked.
HELP_CACHE_SH = r"""py=$1; keypy=$2; mod=$3; envh=$4; shift 4
key=$("$py" -c "$keypy" "$mod" "$envh" "$@" 2>/dev/null)
d="$HOME/.cache/tuitune/flags"
case $key in *[!0-9a-f]*|"") key= ;; esac
if [ -n "$key" ] && [ -s "$d/$key" ]; then echo "tuitune: flags cached" >&2; exec cat -- "$d/$key"; fi
if [ -n "$key" ] && mkdir -p -- "$d" 2>/dev/null && t=$(mktemp "$d/.tmp.XXXXXX" 2>/dev/null); then
  "$py" -m "$mod" "$@" >"$t"; rc=$?
  cat -- "$t"
  if [ "$rc" -eq 0 ]; then mv -f -- "$t" "$d/$key" 2>/dev/null || rm -f -- "$t"; else rm -f -- "$t"; fi
  exit "$rc"
fi
exec "$py" -m "$mod" "$@"
"""


def not_ours(preset: P.Preset) -> str:
    """What every command and view says of a live server on the preset's port that tuitune did not
    start: it is watched read-only until the operator adopts it."""
    return f"running, not started by tuitune: attach read-only, or {preset.adopt_hint()}"


def refuse_not_ours(preset: P.Preset, label: str, pid: int | None = None) -> str:
    """The one sentence that refuses to relaunch or stop a server tuitune did not start."""
    who = f" (pid {pid})" if pid else ""
    other = "" if preset.discovered else f" (or `tuitune stop {preset.name} --pid PID`)"
    return (
        f"port {preset.server.port} on {label} is in use by a server tuitune did not start{who}, watched "
        f"read-only; {preset.adopt_hint()} makes it tuitune's to relaunch or stop{other}"
    )


class ControlError(Exception):
    """One sentence; ``code`` 2 for bad input (preflight refusals), 1 for failed work."""

    def __init__(self, message: str, code: int = 1, log_tail: list[str] | None = None):
        super().__init__(message)
        self.code = code
        self.log_tail = log_tail or []


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


@dataclass
class Status:
    running: bool
    record: ServerRecord | None = None
    uptime_s: float | None = None
    drift: list[Drift] = field(default_factory=list)
    same_hash: bool | None = None
    note: str | None = None
    nodes: list[NodeView] = field(default_factory=list)  # each node of a multi-node server (none on one machine)
    ours: bool = True  # False: a live server tuitune did not start (started by hand): read-only until adopted

    def to_dict(self) -> dict:
        rec = asdict(self.record) if self.record else None
        if rec is not None:
            rec["argv"], rec["env"] = redact.argv(rec["argv"]), redact.env(rec["env"])
            rec["cause"] = redact.text(rec["cause"]) if rec["cause"] else None
        return {
            "running": self.running,
            "ours": self.ours,
            "record": rec,
            "uptime_s": self.uptime_s,
            "same_hash": self.same_hash,
            "note": self.note,
            "drift": [asdict(d.shown()) for d in self.drift],
            **({"nodes": [n.to_dict() for n in self.nodes]} if self.nodes else {}),
        }


@dataclass
class NodeView:
    """One node of a multi-node server as ``status`` sees it."""

    index: int
    label: str
    status: Status

    def to_dict(self) -> dict:
        return {"node": self.index, "target": self.label, **self.status.to_dict()}


@dataclass
class ReadyResult:
    ok: bool
    elapsed_s: float
    phase: str
    cause: str | None = None
    message: str | None = None
    log_tail: list[str] = field(default_factory=list)
    errors: list[ServerError] = field(default_factory=list)
    nccl_env: dict[str, str] = field(default_factory=dict)
    ready_line_at: float | None = None  # monotonic time the ready line was read
    reported_at: float | None = None


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


# a Hugging Face repo id as huggingface_hub validates one: ``name`` or ``org/name``, letters, digits,
# "-", "_", "." (no "--" or ".."; neither end "-" or "."), 96 characters at most
_HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9_](?:[\w.-]{0,94}[\w])?(?:/[A-Za-z0-9_](?:[\w.-]{0,94}[\w])?)?")


def _hub_shaped(v: str) -> bool:
    """A model reference the engine may fetch from the Hub (``name`` or ``org/name``, a valid id),
    not only read from disk: ``/…``, ``~/…``, ``./…`` and deeper paths are paths; anything that
    huggingface_hub would reject as an id is one too, once it is not a directory."""
    return _HUB_ID.fullmatch(v) is not None and v not in (".", "..")


def _not_a_model(v: str) -> str | None:
    """Why a model value cannot name a model at all (checked before asking the target), or None."""
    if not v.strip():
        return "is empty: give the model's directory on the target, or a Hugging Face id (org/name)"
    if v.startswith("-"):
        return "looks like a flag, not a model's directory or id"
    if v != v.strip():
        return "starts or ends with white space"
    return None


def classify(errors: list[ServerError]) -> tuple[str, str] | None:
    """The most telling cause among error events: (category, message)."""
    for cat in CAUSE_ORDER:
        for e in errors:
            if e.category == cat and (cat != "traceback" or len(errors) == 1):
                return cat, e.message
    return None


def _lock_note(line: str) -> dict | None:
    """The holder's note in a BUSY answer (action, preset, client, since), if it is one."""
    try:
        note = json.loads(line[4:]) if line.startswith("BUSY") else None
    except ValueError:
        return None
    return note if isinstance(note, dict) else None


def _lock_answer(head: bytes) -> str | None:
    """The lock helper's answer (LOCKED, BUSY …, ERROR …) among the complete lines received; any
    other line is the remote shell's (a login script's noise: pyenv's rehash racing another
    session printed "rm: cannot remove …" first, and that line was taken for the answer)."""
    for raw in head.split(b"\n")[:-1]:
        text = raw.decode("utf-8", "replace").strip()
        if text.startswith(("LOCKED", "BUSY", "ERROR")):
            return text
    return None


class Controller(Protocol):
    """The control of one server: ``ServerControl`` on one machine, ``ClusterControl``
    (tuitune.machine.cluster) on several in step. The session and the commands hold one of these
    and never ask which: what differs between the two is a member here."""

    t: Transport  # node 0's link (the caller's)
    preset: P.Preset
    state_dir: str
    warnings: list[str]  # what the last relaunch (or status) found worth saying
    cleanup: str | None  # what a failed or cancelled relaunch did with its server
    preflight_s: float | None  # how long the last relaunch's checks took

    @property
    def help_cached(self) -> bool | None:
        """The engine's flag listing came from the target's cache (None: not listed yet)."""
        ...

    @property
    def nodes(self) -> Sequence[ServerControl]:
        """Each node's own control, node 0 first (only itself on one machine)."""
        ...

    def foreign(self, rec: ServerRecord | None, allowed: set[str] | None = None) -> str | None: ...

    def locked(self, action: str) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def relaunch(
        self,
        timeout_s: float = 900.0,
        wait: bool = True,
        on_phase: Callable[[str, float], None] | None = None,
        before_stop: Callable[[], Awaitable[None]] | None = None,
        after_start: Callable[[ServerRecord], Awaitable[None]] | None = None,
        on_stopped: Callable[[str], None] | None = None,
        *,
        allowed: set[str] | None = None,
        allow_any: bool = False,
        keep_on_failure: bool = False,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> tuple[ServerRecord, ReadyResult | None]: ...

    async def stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = False) -> str: ...

    async def status(self, pid: int | None = None) -> Status: ...

    def nccl_by_node(self, res: ReadyResult) -> list[tuple[P.Preset, dict[str, str]]]:
        """Each node's preset with the NCCL variables its log confirmed after ``res``'s start."""
        ...

    async def watch(self) -> ReadyResult | None:
        """While serving: returns when the server failed as a whole (why attached), or None at once
        when there is nothing to watch beyond its one process (which its session polls)."""
        ...

    async def close(self) -> None:
        """Close the links this control opened itself (node 0's belongs to the caller)."""
        ...


class ServerControl:
    def __init__(self, transport: Transport, preset: P.Preset, state_dir: str = STATE_DIR):
        self.t = transport
        self.preset = preset
        self.state_dir = state_dir
        self._help_flags: set[str] | None = None
        self.help_cached: bool | None = None  # the flag listing came from the target's cache (None: not listed)
        self.preflight_s: float | None = None  # how long the last relaunch's checks took
        self.warnings: list[str] = []
        self.cleanup: str | None = None  # what a failed or cancelled relaunch did with its server
        self.deadline: float | None = None  # monotonic end of the running launch (``--timeout``)
        self._python_ok: str | None = None  # the server.python the last check_python accepted

    def _limit(self, seconds: float) -> float:
        """A wait's own limit cut to the launch's deadline (at least a moment, so that it can answer)."""
        if self.deadline is None:
            return seconds
        return max(0.05, min(seconds, self.deadline - time.monotonic()))

    # ---- state ---------------------------------------------------------------------------
    @property
    def state_path(self) -> str:
        return f"{self.state_dir}/servers/{self.preset.server.port}.json"

    def _remote(self, *args: str) -> str:
        """A ``remote.py`` command with the server's python; every argument quoted."""
        return f"{P.shell_path(self.preset.python())} -I -S -c {shlex.quote(_REMOTE)} " + " ".join(
            P.shell_path(a) if a.startswith("~") else shlex.quote(a) for a in args
        )

    async def read_state(self) -> ServerRecord | None:
        """The record of the server tuitune started on this port; an empty or corrupt state file
        (a client killed in the middle of an old, non-atomic write) is recovered from the process
        that listens on the port, and ``warnings`` says so."""
        f = P.shell_path(self.state_path)
        r = await self.t.run(f"[ -e {f} ] || exit 3; " + _CAT_SH.format(f=f), timeout=30)
        return None if r.exit_status == 3 else await self._record(r.stdout)

    async def watch_tick(self, pid: int) -> tuple[ServerRecord | None, bool]:
        """``read_state()`` and ``alive(pid)`` in one command of shell built-ins: what a ready
        server's watch asks every WATCH_S (one process a tick instead of six)."""
        # the answer is in the exit status (stdout is the file alone, as read_state's, whatever a
        # login script prints): 0 alive, 10 not; 3 more where there is no state file
        f = P.shell_path(self.state_path)
        r = await self.t.run(
            f"p={int(pid)}; if {LIVE_SH}; then a=0; else a=10; fi; [ -e {f} ] || exit $((a + 3)); "
            + _CAT_SH.format(f=f)
            + "; exit $a",
            timeout=30,
        )
        alive = r.exit_status in (0, 3)
        return (None if r.exit_status in (3, 13) else await self._record(r.stdout)), alive

    async def _record(self, text: str) -> ServerRecord | None:
        try:
            d = json.loads(text)
            return ServerRecord(**{k: d[k] for k in ServerRecord.__dataclass_fields__ if k in d})
        except (ValueError, TypeError, KeyError):
            return await self._recover(text)

    async def _recover(self, text: str) -> ServerRecord | None:
        what = "empty" if not text.strip() else "corrupt"
        port = self.preset.server.port
        ours = [
            o
            for o in await self.port_owners()
            if "--port" in o["argv"] and str(port) in o["argv"] and self.preset.server.module in o["argv"]
        ]
        if not ours:
            await self.clear_state()
            self.warnings.append(
                f"state file {self.state_path} was {what} and no {self.preset.server.module} "
                f"server listens on port {port}; removed it"
            )
            return None
        leader = min(ours, key=lambda o: (o["pid"] != o["sid"], o["pid"]))
        pid = leader["sid"] if await self.alive(leader["sid"]) else leader["pid"]
        view = await self.process_view(pid)
        argv, env = view if view is not None else (leader["argv"], {})
        same = not compute_drift(self.preset, argv, env)
        flags = argv[argv.index("-m") + 2 :] if "-m" in argv else argv[1:]  # as start() records them
        rec = ServerRecord(
            pid=pid,
            port=port,
            preset=self.preset.name if same else "(recovered)",
            preset_hash=self.preset.hash() if same else "",
            started=time.time(),
            log=self.preset.server.log,
            argv=flags,
            env={k: v for k, v in env.items() if k in self.preset.launch_env()},
        )
        await self.write_state(rec)
        self.warnings.append(
            f"state file {self.state_path} was {what}; recovered server {pid} from port {port} "
            f"and its command line" + ("" if same else " (it does not match this preset)")
        )
        return rec

    async def write_state(self, rec: ServerRecord) -> None:
        """Write the record atomically; what it keeps of argv and env holds no secret in clear."""
        d = asdict(rec)
        d["argv"], d["env"] = redact.sealed_argv(d["argv"]), redact.sealed_env(d["env"])
        await self.t.upload(json.dumps(d, indent=1).encode(), self.state_path, 0o600)

    async def note_exit(self, pid: int, cause: str) -> bool:
        """Keep in the state why server ``pid`` exited (``status`` names it later), if the state
        still records that server and it is gone; under the lock (False when another client
        holds it: its launch or stop rewrites the state anyway)."""
        try:
            async with self.locked("record exit"):
                rec = await self.read_state()
                if rec is None or rec.pid != pid or await self.alive(pid):
                    return False
                rec.cause = redact.text(cause)[:300]
                await self.write_state(rec)
                return True
        except ControlError:
            return False

    async def exit_cause(self, rec: ServerRecord) -> str:
        """Why a recorded server is gone: the cause a watcher kept, else the most telling error
        line of the end of its log, else that none was found."""
        if rec.cause:
            return rec.cause
        r = await self.t.run(f"tail -c 262144 -- {P.shell_path(rec.log)} 2>/dev/null", timeout=30)
        lines = r.stdout.splitlines()[1 if len(r.stdout) >= 262144 else 0 :]  # (the first may be cut)
        errors = [ev for ev in map(parse_line, lines) if isinstance(ev, ServerError)]
        found = classify(errors)
        if found is None:
            return "killed, or exited without an error line in the log"
        return redact.Redactor(self.preset)(f"{CAUSE_TEXT.get(found[0], found[0])}: {found[1]}")[:300]

    async def clear_state(self) -> None:
        await self.t.run(f"rm -f -- {P.shell_path(self.state_path)}", timeout=30)

    async def port_owners(self) -> list[dict]:
        """Processes with a listening socket on the preset's port (pid, sid, ancestors, argv)."""
        r = await self.t.run(self._remote("owner", str(int(self.preset.server.port))), timeout=30)
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

    @contextlib.asynccontextmanager
    async def locked(self, action: str) -> AsyncIterator[None]:
        """Hold the target's lock for this port while changing what runs on it; a second caller
        is told who holds it. The lock lives as long as one remote process (``remote.py lock``),
        so a client that dies or loses its link releases it."""
        client = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
        info = json.dumps(
            {"action": action, "preset": self.preset.name, "client": client, "since": time.strftime("%H:%M:%S")}
        )
        path = f"{self.state_dir}/servers/{self.preset.server.port}.lock"
        key = (self.t.label, path)
        deadline = time.monotonic() + OWN_RELEASE_S
        while True:
            stream, line = await self._ask_lock(path, info)
            if line.startswith("LOCKED"):
                break
            await stream.aclose()
            if line.startswith(HELPER_EXITED):
                await self.check_python()  # a wrong server.python: its own sentence, not the lock's
            # our own lock, let go a moment ago: over SSH its helper dies just after the channel closes
            releasing = (
                (_lock_note(line) or {}).get("client") == client and key not in _HELD and time.monotonic() < deadline
            )
            if not releasing:
                raise ControlError(self._busy_message(line), 1)
            await asyncio.sleep(0.05)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
            await stream.aclose()

    async def _ask_lock(self, path: str, info: str) -> tuple[AsyncGenerator[bytes, None], str]:
        """The lock helper's stream (open: it holds the lock while it runs) and its answer line."""
        # a helper that dies without answering (a wrong server.python) still ends with an answer line:
        # the stream itself stays open (the lifeline) and would be waited on forever
        stream = self.t.stream(self._remote("lock", path, info) + f' || echo "{HELPER_EXITED} ($?)"')
        head, line = b"", None
        try:
            async with asyncio.timeout(self._limit(LOCK_ANSWER_S)):
                async for chunk in stream:
                    head += chunk
                    line = _lock_answer(head)
                    if line is not None:
                        break
        except TimeoutError:
            pass  # said below, with whatever the shell printed
        except BaseException:
            await stream.aclose()
            raise
        said = [
            x.strip()
            for x in head.decode("utf-8", "replace").splitlines()
            if x.strip() and not x.startswith(HELPER_EXITED)
        ]
        if line is None:  # the helper never answered: what the shell said instead
            line = " ".join(said) or f"no answer in {LOCK_ANSWER_S:.0f} s"
        elif line.startswith(HELPER_EXITED) and said:
            line = f"{line}: {said[-1][:200]}"
        return stream, line

    def _busy_message(self, line: str) -> str:
        port = self.preset.server.port
        if not line.startswith("BUSY"):
            return f"{self.t.label}: cannot take the lock for port {port}: {line[-300:] or 'no answer'}"
        try:
            h = _lock_note(line) or {}
            who = f"tuitune {h['action']} of {h['preset']} by {h['client']} (since {h['since']})"
        except KeyError:  # no note, or one without these keys
            who = "another tuitune"
        return f"port {port} on {self.t.label} is busy: {who} holds its lock; try again when it has finished"

    def foreign(self, rec: ServerRecord | None, allowed: set[str] | None = None) -> str | None:
        """Why acting on ``rec`` would act on another preset's server, or None."""
        names = allowed or {self.preset.name}
        if rec is None or rec.preset in names:
            return None
        return (
            f"the server on port {rec.port} of {self.t.label} (pid {rec.pid}) was started by preset "
            f"{rec.preset}, not {self.preset.name}; pass --any to act on it anyway"
        )

    async def alive(self, pid: int) -> bool:
        r = await self.t.run(f"p={int(pid)}; {LIVE_SH}", timeout=30)
        return r.ok

    async def port_busy(self, port: int | None = None) -> bool:
        port = port or self.preset.server.port
        r = await self.t.run(f"(exec 3<>/dev/tcp/127.0.0.1/{int(port)}) 2>/dev/null", timeout=30)
        return r.ok

    # ---- preflight -----------------------------------------------------------------------
    def _as_server(self, command: str) -> str:
        """``command`` (a python invocation) where and as the server will run it: in its workdir
        (``python -m`` imports from there) and with the preset's own environment (PYTHONPATH for
        an engine's custom code, a platform variable the engine's parser needs)."""
        p = self.preset
        env = " ".join(shlex.quote(f"{k}={v}") for k, v in p.env.items())
        where = f"cd -- {P.shell_path(p.server.workdir)} 2>/dev/null || exit 6; " if p.server.workdir else ""
        return f"{where}env -- {env} {command}" if env else f"{where}{command}"

    async def server_flags(self) -> set[str]:
        """The flags the server's own ``--help`` lists, asked once per (python, engine release,
        environment): the listing is cached on the target (HELP_KEY_PY, HELP_CACHE_SH), so that a
        relaunch skips vLLM's 15-30 s ``serve --help=all``."""
        if self._help_flags is None:
            py = P.shell_path(self.preset.python())
            helps = " ".join(shlex.quote(a) for a in self.preset.help_args())
            envh = hashlib.sha256(json.dumps(sorted(self.preset.env.items())).encode()).hexdigest()[:16]
            args = f"{py} {shlex.quote(HELP_KEY_PY)} {shlex.quote(self.preset.server.module)} {envh} {helps}"
            r = await self.t.run(
                self._as_server(f"sh -c {shlex.quote(HELP_CACHE_SH)} sh {args}"), timeout=self._limit(180)
            )
            self.help_cached = r.ok and "tuitune: flags cached" in r.stderr
            if not r.ok:
                raise ControlError(
                    f"{self.t.label}: `{self.preset.python()} -m {self.preset.server.module} "
                    f"{helps}` failed (exit {r.exit_status}): "
                    f"{(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']}"[:400]
                )
            self._help_flags = set(re.findall(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)", r.stdout))
        return self._help_flags

    async def install_probe(self) -> dict:
        """Upload the probe to the target and check, from SGLang's source, what it can patch."""
        from tuitune import probe

        for name, data in probe.files().items():
            await self.t.upload(data, f"{probe.REMOTE_DIR}/{name}")
        r = await self.t.run(
            self._as_server(
                f"{P.shell_path(self.preset.python())} {P.shell_path(probe.REMOTE_DIR + '/eagle3_probe.py')} "
                "--check " + " ".join(self.preset.engine.probe_check_args())
            ),
            timeout=self._limit(60),
        )
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"ok": False, "error": (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_status}"}

    async def check_python(self) -> None:
        """The preflight's first question, asked before anything that needs the server's python
        (the lock helper runs with it): does it run, and does it have the server's module?"""
        p = self.preset
        py = P.shell_path(p.python())
        r = await self.t.run(
            f"command -v -- {py} >/dev/null || [ -x {py} ] || exit 4; "
            + self._as_server(f"{py} -c {shlex.quote(FIND_MODULE_PY)} {shlex.quote(p.server.module)}"),
            timeout=self._limit(60),
        )
        if r.exit_status == 4:
            raise ControlError(f"{self.t.label}: server.python {p.python()} does not exist", 2)
        if r.exit_status == 6:
            raise ControlError(f"{self.t.label}: server.workdir {p.server.workdir} does not exist", 2)
        if r.exit_status == 3:
            raise ControlError(f"{self.t.label}: module {p.server.module} is not installed for {p.python()}", 2)
        if r.exit_status == 5:
            why = (r.stderr.strip().splitlines() or ["no message"])[-1][:200]
            raise ControlError(
                f"{self.t.label}: module {p.server.module} cannot be imported with {p.python()} ({why})", 2
            )
        if not r.ok:
            raise ControlError(f"{self.t.label}: cannot run {p.python()}: {r.stderr.strip()[:200]}", 2)
        self._python_ok = p.python()

    async def preflight(self, replacing: ServerRecord | None) -> None:
        """Refuse a relaunch that cannot work, before anything running is touched."""
        p = self.preset
        if why := P.carry_problem(p):  # (a preset is checked as it is read; one built in code may not be)
            raise ControlError(f"{p.name}: {why}", 2)
        if self._python_ok != p.python():
            await self.check_python()
        py = P.shell_path(p.python())
        await self._check_paths()
        for module, why in p.engine.required_modules(p) if p.server.module != P.SIM_MODULE else []:
            r = await self.t.run(
                self._as_server(f"{py} -c {shlex.quote(FIND_MODULE_PY)} {shlex.quote(module)}"), timeout=self._limit(60)
            )
            if r.exit_status != 0:
                raise ControlError(
                    f"{self.t.label}: {why} needs the {module} module, not installed for {p.python()}", 2
                )
        await self._check_draft_fits()
        await self._check_schedule()
        known = await self.server_flags()
        unknown = [f for f in p.flag_names() if f not in known]
        if unknown:
            raise ControlError(
                f"flag {unknown[0]} is not accepted by {p.server.module} on {self.t.label} "
                f"(not in its --help); refusing to relaunch",
                2,
            )
        if p.uses_probe:
            report = await self.install_probe()
            if not report.get("ok"):
                why = report.get("error") or (
                    f"{p.engine.label} {report.get('version') or '?'} lacks "
                    f"{', '.join(report.get('missing') or ['a phase'])}"
                )
                self.warnings.append(
                    f"profile: the probe cannot time every phase here ({why}); "
                    "the server will log its own decode lines only"
                )
        if await self.port_busy():
            ours = replacing is not None and replacing.port == p.server.port and await self.alive(replacing.pid)
            if not ours:
                hand = await self.hand_started()
                raise ControlError(refuse_not_ours(p, self.t.label, hand.pid if hand else None), 2)

    def model_paths(self) -> list[tuple[str, str]]:
        """(preset key, value) of the model and draft the server loads: a directory on the target
        (relative to server.workdir, else the home directory, as the launch runs), or a Hugging Face
        id the engine fetches. None for the simulator, which loads no weights."""
        p = self.preset
        if p.server.module == P.SIM_MODULE:
            return []
        out = [(f"server.args.{k}", v) for k in ("model-path", "model") if isinstance(v := p.server.args.get(k), str)]
        draft = p.speculative.draft_model_path if p.speculative else None
        if draft is not None:
            out.append(("speculative.draft_model_path", draft))
        return out

    async def _check_paths(self) -> None:
        """Refuse a model or draft the engine cannot load, before it spends its start-up on it: an
        empty value or one that reads as a flag; a path (``/…``, ``~/…``, ``./…``, more slashes
        than an id) that is not on the target, or is a plain file (a .gguf excepted); and a value
        shaped like a Hugging Face id (``name``, ``org/name``) that is no directory there, is not
        in the Hub cache, and cannot be fetched (the Hub does not answer from the target)."""
        paths = self.model_paths()
        for key, v in paths:
            if why := _not_a_model(v):
                raise ControlError(f"{key} {v!r} {why}; refusing to launch", 2)
        if not paths:
            return
        specs = [("H:" if _hub_shaped(v) else "") + v for _, v in paths]
        home = f"cd -- {P.shell_path(self.preset.server.workdir or '~')} 2>/dev/null; "
        r = await self.t.run(home + self._as_server(self._remote("models", *specs)), timeout=self._limit(60))
        try:
            seen = json.loads(r.stdout.strip().splitlines()[-1])
            kinds, hub = seen["paths"], seen["hub"]
        except (ValueError, IndexError, KeyError, TypeError):
            self.warnings.append(f"the model paths were not checked ({(r.stderr or r.stdout).strip()[-200:]})")
            return
        where = self.preset.server.workdir or "the home directory"
        fetched = []  # what the engine would fetch from the Hub: said after what is wrong on disk
        for (key, v), got in zip(paths, kinds, strict=False):
            if got["kind"] == "file" and not v.endswith(".gguf"):
                raise ControlError(
                    f"{key} {v} is a file on {self.t.label}, not a directory: give the directory that "
                    f"holds the model's config.json; refusing to launch",
                    2,
                )
            if got["kind"] != "none" or got["cached"]:
                continue
            if not _hub_shaped(v):
                raise ControlError(
                    f"{key} {v} does not exist on {self.t.label}: give the local directory the "
                    f"server loads (a Hugging Face id is written org/name); refusing to launch",
                    2,
                )
            fetched.append((key, v))
        if fetched and hub != "ok":
            key, v = fetched[0]
            raise ControlError(
                f"{key} {v} is not a directory under {where} on {self.t.label}, and as a Hugging "
                f"Face id it is not in the Hub cache and cannot be fetched: the Hub is unreachable "
                f"from {self.t.label} ({hub}); give the model's directory; refusing to launch",
                2,
            )

    async def _check_draft_fits(self) -> None:
        """An EAGLE / EAGLE-3 draft whose hidden size is not the target's, both local directories
        on the target: refused with both sizes (unreadable configs, hub ids: not checked here)."""
        p = self.preset
        s = p.speculative
        model = p.engine.model_path(p)
        if s is None or s.algorithm not in ("EAGLE", "EAGLE3") or not s.draft_model_path or not model:
            return
        configs: list[dict] = []
        for d in (model, s.draft_model_path):
            r = await self.t.run(f"cat -- {P.shell_path(d.rstrip('/') + '/config.json')}", timeout=30)
            try:
                c = json.loads(r.stdout) if r.ok else None
            except ValueError:
                c = None
            if not isinstance(c, dict):
                return
            configs.append(c)
        why = draft_misfit(configs[0], configs[1])
        if why:
            raise ControlError(
                f"speculative.draft_model_path {s.draft_model_path} does not fit the model {model} on "
                f"{self.t.label}: {why}; refusing to relaunch",
                2,
            )

    async def _check_schedule(self) -> None:
        """A schedule file the server reads at start-up (SGLang's adaptive config): missing, unreadable
        or at odds with the preset, refused before launching (the engine would refuse it only after
        loading the model)."""
        p = self.preset
        path = p.engine.schedule_file(p)
        if not path or p.server.module == P.SIM_MODULE:
            return
        where = f"cd -- {P.shell_path(p.server.workdir or '~')} 2>/dev/null; "
        r = await self.t.run(where + f"head -c 1048576 -- {P.shell_path(path)}", timeout=30)
        if not r.ok:
            raise ControlError(
                f"speculative.adaptive_config {path} cannot be read on {self.t.label}: "
                f"{(r.stderr or '').strip()[:200] or 'no such file'}; refusing to launch",
                2,
            )
        why = p.engine.check_schedule(p, r.stdout)
        if why:
            raise ControlError(f"speculative.adaptive_config {path} on {self.t.label}: {why}; refusing to launch", 2)

    # ---- start / stop --------------------------------------------------------------------
    async def start(self) -> ServerRecord:
        p = self.preset
        log = P.shell_path(p.server.log)
        # the log is the server's own and may hold a secret it prints (vLLM's api-key at start-up):
        # created private (0600), and made so when it is there already (a device such as /dev/null
        # refuses chmod: that is left as it is)
        await self.t.run(
            f'mkdir -p -- "$(dirname -- {log})" && (umask 077 && : >>{log}); chmod 600 -- {log} 2>/dev/null; true',
            timeout=30,
        )
        r = await self.t.run(P.launch_command(p), timeout=60)
        pid_text = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else []
        if not r.ok or not pid_text or not pid_text[0].isdigit():
            raise ControlError(
                f"{self.t.label}: the launch command failed (exit {r.exit_status}): "
                f"{(r.stderr or r.stdout).strip()[:300]}"
            )
        rec = ServerRecord(
            pid=int(pid_text[0]),
            port=p.server.port,
            preset=p.name,
            preset_hash=p.hash(),
            started=time.time(),
            log=p.server.log,
            argv=p.flags(),
            env=p.launch_env(),
        )
        await self.write_state(rec)
        return rec

    async def stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = False) -> str:
        """Stop the server tuitune started on this port for this preset (or ``pid``), under the lock."""
        async with self.locked("stop"):
            return await self._stop(pid, grace_s, allow_any)

    async def _stop(self, pid: int | None = None, grace_s: float = 10.0, allow_any: bool = True) -> str:
        """TERM the group, wait, KILL; refuses another preset's server unless ``allow_any``."""
        rec = await self.read_state()
        if (
            pid is None
            and not allow_any
            and rec is not None
            and (why := self.foreign(rec))
            and await self.alive(rec.pid)
        ):
            raise ControlError(why, 2)
        target = pid if pid is not None else (rec.pid if rec else None)
        if pid is None and (rec is None or not await self.alive(rec.pid)) and await self.port_busy():
            hand = await self.hand_started()
            raise ControlError(refuse_not_ours(self.preset, self.t.label, hand.pid if hand else None), 2)
        if target is None:
            return "no server started by tuitune on this port"
        if pid is None and rec and not await self.alive(rec.pid):
            await self.clear_state()
            return f"server {rec.pid} was not running (state cleared)"
        if pid is None and rec and not await self.still_ours(rec):
            await self.clear_state()
            return f"server {rec.pid} is gone and its pid now runs another program (state cleared, nothing stopped)"
        steps = max(1, int(grace_s / 0.1))
        port = int(self.preset.server.port)
        clear = f"rm -f -- {P.shell_path(self.state_path)}; " if rec and rec.pid == target else ""
        # one round trip: TERM, wait, KILL, wait for the port, clear the state. A group is alive
        # while any of its members is (LIVE_SH), and so are descendants that left the group (an
        # engine's workers may), listed first, while their parents still hold them; exit 0
        # stopped, 10 killed, 3 survived, 4 port busy
        script = (
            f"g={int(target)}; tree() {{ for c in $(pgrep -P $1 2>/dev/null); do echo $c; tree $c; done; }}; "
            f"t=$(tree $g); alive() {{ for p in $(pgrep -g $g 2>/dev/null) $g $t; do "
            f"{LIVE_SH} && return 0; done; return 1; }}; "
            f"free() {{ ! (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; }}; how=0; "
            f"kill -TERM -- -$g 2>/dev/null || kill -TERM $g 2>/dev/null; kill -TERM $t 2>/dev/null; "
            f"for i in $(seq {steps}); do alive || break; sleep 0.1; done; "
            f"if alive; then how=10; kill -KILL -- -$g 2>/dev/null; kill -KILL $g $t 2>/dev/null; "
            f"for i in $(seq 30); do alive || break; sleep 0.1; done; alive && exit 3; fi; "
            f"for i in $(seq 100); do free && break; sleep 0.1; done; free || exit 4; "
            f"{clear}exit $how"
        )
        r = await self.t.run(script, timeout=grace_s + 30)
        if r.exit_status == 3:
            raise ControlError(f"process group {target} on {self.t.label} survived SIGKILL")
        if r.exit_status == 4:
            raise ControlError(f"server {target} stopped but port {port} is still in use")
        how = "killed after the grace period" if r.exit_status == 10 else "stopped"
        return f"server {target} {how}; port {self.preset.server.port} free"

    # ---- wait ready ----------------------------------------------------------------------
    async def wait_ready(
        self,
        rec: ServerRecord,
        timeout_s: float = 900.0,
        on_phase: Callable[[str, float], None] | None = None,
        on_line: Callable[[str, Event | None], None] | None = None,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        deadline: float | None = None,
    ) -> ReadyResult:
        """Poll /health until ready, dead or timed out; the log only names phases and causes.

        Ready means /health answers 200 *and* the port's listening socket belongs to ``rec.pid``
        or one of its children (a 200 from another server on the port proves nothing). Once
        HTTP is up (the socket is ours, or /health answers at all), /health must turn 200
        within ``health_timeout_s``.

        ``timeout_s`` (counted from ``deadline - timeout_s`` when a launch passes its deadline)
        and the phase limit are deadlines for every wait inside: a /health request that hangs
        and the checks on the target are cut to them, so the answer comes on time. A link lost
        meanwhile is not a death: the polls go on (the transport reconnects) until the deadline.
        """
        import aiohttp

        t0 = time.monotonic()
        end = t0 + timeout_s if deadline is None else deadline
        res = ReadyResult(ok=False, elapsed_s=0.0, phase="starting")
        lines: list[str] = []
        http_up = asyncio.Event()
        ready_line = asyncio.Event()
        done = asyncio.Event()

        def set_phase(name: str) -> None:
            res.phase = name
            if on_phase:
                on_phase(name, time.monotonic() - t0)

        set_phase("starting")
        seen: set[str] = set()
        tail = LogTail(self.t, rec.log, python=self.preset.python())
        shown = redact.Redactor(self.preset)

        async def follow() -> None:
            async for batch in tail.batches():
                for line in batch.lines:
                    lines.append(shown(line))
                    if len(lines) > 200:
                        del lines[:100]
                    ev = parse_line(line)
                    if on_line:
                        on_line(line, ev)
                    if ev is None:
                        if (phase := self.preset.engine.phase(line, seen)) is not None:
                            seen.add(phase)
                            set_phase(phase)
                        continue
                    if isinstance(ev, ServerError):
                        res.errors.append(ev)
                    elif isinstance(ev, NcclEnv):
                        res.nccl_env[ev.name] = ev.value
                    elif ev.kind == "http_up":
                        set_phase("http up")
                        http_up.set()
                    elif ev.kind == "ready":
                        res.ready_line_at = time.monotonic()
                        ready_line.set()

        local_port = await self.t.forward_port(rec.port)
        url = self.t.url(local_port) + "/health"

        async def health(session, limit: float) -> int | None:
            left = limit - time.monotonic()
            if left <= 0:
                return None
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=min(5.0, left))) as r:
                    return r.status
            except (TimeoutError, aiohttp.ClientError, OSError):
                return None

        async def watch() -> None:
            http_since: float | None = None
            last: int | None = None
            owned = False  # a listening socket on the port belongs to rec.pid or its children
            loop = asyncio.get_running_loop()

            def limit() -> float:
                return end if http_since is None else min(end, http_since + health_timeout_s)

            def over() -> bool:
                """Whether a deadline has passed; then ``res`` says which."""
                now = time.monotonic()
                if http_since is not None and now >= http_since + health_timeout_s:
                    res.message = (
                        f"HTTP has been up for {now - http_since:.0f} s but /health never answered "
                        f"200 (last answer: {last or 'none'}; phase limit {health_timeout_s:.0f} s)"
                    )
                    res.cause = "unhealthy"
                    return True
                if now >= end:
                    res.message = f"not ready after {timeout_s:.0f} s (phase: {res.phase})"
                    res.cause = "timeout"
                    return True
                return False

            async with aiohttp.ClientSession() as session:
                while not done.is_set():
                    if over():
                        return
                    waiter = asyncio.ensure_future(ready_line.wait())
                    await asyncio.wait({waiter}, timeout=max(0.0, min(0.5, limit() - time.monotonic())))
                    waiter.cancel()
                    if over():
                        return
                    cut = limit()
                    try:
                        # every wait of this poll ends by the deadline (loop time is monotonic time)
                        async with asyncio.timeout_at(loop.time() + (cut - time.monotonic())):
                            if owned:  # our process holds the listening socket: only /health is left
                                status = await health(session, cut)
                                if status == 200:
                                    res.ok = True
                                    return
                                living = await self.alive(rec.pid)
                            else:  # one round trip per poll: the checks on the target run side by side
                                status, owned, living = await asyncio.gather(
                                    health(session, cut), self.owns_port(rec.pid), self.alive(rec.pid)
                                )
                                if status == 200 and owned:
                                    res.ok = True
                                    return
                    except TimeoutError:
                        continue  # the deadline came during the poll: said at the top
                    except LinkLost:
                        await asyncio.sleep(min(0.5, max(0.0, limit() - time.monotonic())))
                        continue  # no answer is not "dead": ask again once the link is back
                    last = status if status is not None else last
                    if http_since is None and (status is not None or http_up.is_set() or owned):
                        http_since = time.monotonic()
                        if res.phase != "http up":
                            set_phase("http up")
                    if not living:
                        await asyncio.sleep(0.3)  # let the last lines of the log arrive
                        return

        follower = asyncio.ensure_future(follow())
        try:
            await watch()
        finally:
            done.set()
            tail.close()
            await cancel_and_wait(follower, ignore=(TransportError,))
        res.elapsed_s = time.monotonic() - t0
        res.log_tail = lines[-40:]
        if res.ok:
            res.reported_at = time.monotonic()
            set_phase("ready")
        elif res.cause is None:
            found = classify(res.errors)
            res.cause, detail = found if found else ("exited", "the process exited without an error line")
            res.message = shown(f"server exited during start ({CAUSE_TEXT.get(res.cause, res.cause)}): {detail}")[:400]
            set_phase("failed")
        return res

    async def relaunch(
        self,
        timeout_s: float = 900.0,
        wait: bool = True,
        on_phase: Callable[[str, float], None] | None = None,
        before_stop: Callable[[], Awaitable[None]] | None = None,
        after_start: Callable[[ServerRecord], Awaitable[None]] | None = None,
        on_stopped: Callable[[str], None] | None = None,
        *,
        allowed: set[str] | None = None,
        allow_any: bool = False,
        keep_on_failure: bool = False,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> tuple[ServerRecord, ReadyResult | None]:
        """Under the port's lock: preflight (nothing touched if it refuses), stop what runs, start,
        wait until ready (unless ``wait`` is false: then the result is None once the process is
        started).

        Refuses to replace a server that a preset outside ``allowed`` (default: this one) started,
        unless ``allow_any``. Raises ControlError when the server does not become ready (the log
        tail attached); that failure, and a cancellation (Ctrl-C, SIGTERM), stop the half-started
        server first unless ``keep_on_failure``. ``cleanup`` says what happened to it.
        """
        self.warnings = []
        self.cleanup = None
        self.deadline = deadline = time.monotonic() + timeout_s  # every wait of the launch ends by it
        try:
            await self.check_python()  # before the lock: its helper runs with that python
            async with self.locked("launch"):
                current = await self.read_state()
                if (
                    not allow_any
                    and current is not None
                    and (why := self.foreign(current, allowed))
                    and await self.alive(current.pid)
                ):
                    raise ControlError(why, 2)
                t_check = time.monotonic()
                await self.preflight(current)
                self.preflight_s = time.monotonic() - t_check
                if before_stop is not None:
                    await before_stop()
                if current is not None:
                    # stopped to the end, and started and recorded to the end, even under a Ctrl-C:
                    # cut half-way, either would leave a server that nothing tracks
                    msg, cut = await to_the_end(self._stop())
                    if cut:
                        self.cleanup = f"the server it was replacing ({current.preset}, pid {current.pid}) was stopped"
                        raise asyncio.CancelledError
                    if on_stopped is not None:
                        on_stopped(msg)
                rec, cut = await to_the_end(self.start())
                if cut:
                    await to_the_end(self._after_failure(rec, keep_on_failure))
                    raise asyncio.CancelledError
                try:
                    if after_start is not None:
                        await after_start(rec)
                    if not wait:
                        return rec, None
                    res = await self.wait_ready(
                        rec, timeout_s, on_phase=on_phase, health_timeout_s=health_timeout_s, deadline=deadline
                    )
                except asyncio.CancelledError:
                    await to_the_end(self._after_failure(rec, keep_on_failure))
                    raise
                if not res.ok:
                    await self._after_failure(rec, keep_on_failure)
                    raise ControlError(
                        f"{res.message or 'server did not become ready'}; {self.cleanup}", 1, res.log_tail
                    )
                rec.ready_s = round(res.elapsed_s, 2)  # kept: what the next launch of it may take
                await self.write_state(rec)
                return rec, res
        finally:
            self.deadline = None

    async def _after_failure(self, rec: ServerRecord, keep: bool) -> None:
        """Never leave a half-started server behind unknowingly: stop it, or say that it was kept."""
        if keep:
            self.cleanup = f"server {rec.pid} left running (--keep-on-failure)"
            return
        try:
            # the grace before SIGKILL is a wait of the launch too: cut to what is left of its
            # deadline (the whole group and its descendants go either way)
            await self._stop(grace_s=max(0.2, self._limit(5.0)))
            self.cleanup = f"the half-started server {rec.pid} was stopped"
        except (ControlError, TransportError) as e:
            self.cleanup = f"stopping the half-started server {rec.pid} failed: {e}"

    # ---- status --------------------------------------------------------------------------
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

    async def still_ours(self, rec: ServerRecord) -> bool:
        """Whether ``rec.pid`` still runs a server for ``rec.port`` (a pid can be reused after the
        server died unseen; stopping that pid's group would kill an unrelated program)."""
        view = await self.process_view(rec.pid)
        if view is None:
            return True  # not readable (another user's process): the alive check has to do
        argv = view[0]
        return any(
            a == f"--port={rec.port}" or (a == "--port" and argv[i + 1 : i + 2] == [str(rec.port)])
            for i, a in enumerate(argv)
        )

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

    async def hand_started(self) -> ServerRecord | None:
        """The server that listens on the preset's port without tuitune having started it, as a
        record (preset "(by hand)"): its leading process (the one whose ancestors hold no other
        listener: an engine's workers may share the socket), flags and environment as /proc shows
        them, and its start time. None when nothing listens, or the listener cannot be read."""
        found = await self.listener()
        if found is None:
            return None
        pid, argv, env = found
        env = env or {}
        flags = argv[argv.index("-m") + 2 :] if "-m" in argv else argv[1:]
        r = await self.t.run(f"ps -o etimes= -p {pid}", timeout=30)
        up = r.stdout.strip()
        keep = set(self.preset.launch_env()) | {"EAGLE3_PROFILE", "PYTHONPATH"}
        return ServerRecord(
            pid=pid,
            port=self.preset.server.port,
            preset="(by hand)",
            preset_hash="",
            started=time.time() - int(up) if up.isdigit() else 0.0,
            log=self.preset.server.log,
            argv=flags,
            env={k: v for k, v in env.items() if k in keep or k.startswith("NCCL_")},
        )

    async def adopt(self) -> tuple[ServerRecord, list[Drift]]:
        """Record the server that listens on the preset's port, started by hand, as tuitune's (under
        the port's lock, atomically as a launch writes its record): from then on relaunch and stop
        act on it. Returns the record and the drift between it and the preset; refuses when
        nothing listens, or tuitune already runs a server there."""
        async with self.locked("adopt"):
            rec = await self.read_state()
            if rec is not None and await self.alive(rec.pid) and await self.still_ours(rec):
                raise ControlError(
                    f"the server on port {rec.port} of {self.t.label} (pid {rec.pid}) is tuitune's already "
                    f"(preset {rec.preset}); nothing to adopt",
                    2,
                )
            hand = await self.hand_started()
            if hand is None:
                raise ControlError(
                    f"no server listens on port {self.preset.server.port} of {self.t.label}; nothing to adopt", 1
                )
            view = await self.process_view(hand.pid)
            drift = compute_drift(self.preset, *view) if view is not None else []
            hand.preset = self.preset.name
            hand.preset_hash = "" if drift else self.preset.hash()
            await self.write_state(hand)
            return hand, drift

    # ---- as a Controller: one machine is a server of one node ------------------------------
    @property
    def nodes(self) -> list[ServerControl]:
        return [self]

    def nccl_by_node(self, res: ReadyResult) -> list[tuple[P.Preset, dict[str, str]]]:
        return [(self.preset, res.nccl_env)]

    async def watch(self) -> ReadyResult | None:
        return None  # one process, no nodes to keep in step: the session polls it and reads its log

    async def close(self) -> None:
        return None  # it opens no link of its own

    async def status(self, pid: int | None = None) -> Status:
        rec = await self.read_state()
        if pid is not None and (rec is None or rec.pid != pid):
            rec = ServerRecord(
                pid=pid,
                port=self.preset.server.port,
                preset="(by hand)",
                preset_hash="",
                started=0.0,
                log=self.preset.server.log,
            )
        if (rec is None or (pid is None and not await self.alive(rec.pid))) and await self.port_busy():
            hand = await self.hand_started()
            if hand is not None:
                st = Status(
                    True,
                    hand,
                    uptime_s=time.time() - hand.started if hand.started else None,
                    note=not_ours(self.preset),
                    ours=False,
                )
                if (view := await self.process_view(hand.pid)) is not None:
                    st.drift = compute_drift(self.preset, *view)
                return st
            if rec is None:
                return Status(False, note=f"port {self.preset.server.port} is in use by a program tuitune cannot read")
        if rec is None:
            return Status(False)
        if not await self.alive(rec.pid):
            cause = await self.exit_cause(rec)
            return Status(False, rec, note=f"server {rec.pid} recorded but not running; it exited: {cause}")
        if pid is None and not await self.still_ours(rec):
            return Status(False, rec, note=f"server {rec.pid} recorded, but that pid now runs another program")
        view = await self.process_view(rec.pid)
        st = Status(
            True,
            rec,
            uptime_s=time.time() - rec.started if rec.started else None,
            same_hash=rec.preset_hash == self.preset.hash() if rec.preset_hash else None,
        )
        if view is not None:
            st.drift = compute_drift(self.preset, *view)
        return st


NCCL_ECHO_LEVELS = ("INFO", "TRACE")  # NCCL prints the variables it applied only at these levels


def _nccl_vars(preset: P.Preset) -> dict[str, str]:
    return {
        k: v for k, v in preset.env.items() if k.startswith("NCCL_") and k not in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS")
    }


def nccl_confirmation(preset: P.Preset, seen: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """(variable, applied | missing | different | unconfirmed, value NCCL echoed) for each NCCL_*
    in the preset; "unconfirmed" when NCCL_DEBUG is not INFO, since NCCL then echoes nothing."""
    echoes = str(preset.env.get("NCCL_DEBUG", "")).upper() in NCCL_ECHO_LEVELS
    out = []
    for k, v in _nccl_vars(preset).items():
        got = seen.get(k)
        if not echoes:
            state = "unconfirmed"
        else:
            state = "missing" if got is None else ("applied" if got.strip() == v.strip() else "different")
        out.append((k, state, got))
    return out


def nccl_note(preset: P.Preset, seen: dict[str, str]) -> str | None:
    """One sentence when NCCL's confirmation is impossible or suspiciously absent, else None."""
    want = _nccl_vars(preset)
    if not want:
        return None
    if str(preset.env.get("NCCL_DEBUG", "")).upper() not in NCCL_ECHO_LEVELS:
        return (
            f"NCCL_DEBUG=INFO is needed to confirm that NCCL applied the preset's {len(want)} NCCL "
            f"variable(s); add it to the preset's env"
        )
    if not seen:
        return (
            f"NCCL echoed none of the preset's {len(want)} NCCL variable(s) although NCCL_DEBUG=INFO is "
            f"set: they may not have reached the server (see `tuitune status` for drift), or no NCCL "
            f"communicator was created"
        )
    return None
