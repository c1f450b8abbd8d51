"""Server control on the target: preflight -> stop -> start -> wait ready; status and drift.

State lives on the target in ``~/.cache/tuitune/servers/<port>.json`` (pid = process group =
session, preset name and hash, start time, log path, argv), so that tuitune only ever stops
servers it started, from any machine, and so that ``status`` can compare the running process's
real environment and argv (``/proc/PID/environ``, ``/proc/PID/cmdline``) with the preset: the
seeds lost their NCCL variables silently after a restart; drift makes that visible.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

from . import preset as P
from . import redact
from .engines import CAUSE_ORDER, CAUSE_TEXT
from .events import Event, ServerError
from .parse import parse_line
from .tail import LogTail
from .transport import Transport, TransportError

STATE_DIR = "~/.cache/tuitune"
# true when process $p exists and is not a zombie (a zombie only waits for its parent to reap it)
LIVE_SH = "s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -c1); [ -n \"$s\" ] && [ \"$s\" != Z ]"
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

    @property
    def pgid(self) -> int:
        return self.pid  # setsid: the server leads its own session and process group


@dataclass
class Drift:
    key: str
    running: str | None
    preset: str | None

    def shown(self) -> "Drift":
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

    def to_dict(self) -> dict:
        rec = asdict(self.record) if self.record else None
        if rec is not None:
            rec["argv"], rec["env"] = redact.argv(rec["argv"]), redact.env(rec["env"])
        return {"running": self.running, "record": rec,
                "uptime_s": self.uptime_s, "same_hash": self.same_hash, "note": self.note,
                "drift": [asdict(d.shown()) for d in self.drift]}


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


def _flag_pairs(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
                i += 1
            else:
                out[a] = None
        i += 1
    return out


def _positionals(argv: list[str]) -> list[str]:
    """Arguments that are neither flags nor flag values (vLLM's ``serve MODEL``)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--"):
            i += 1 if "=" in argv[i] or i + 1 >= len(argv) or argv[i + 1].startswith("--") else 2
        else:
            out.append(argv[i])
            i += 1
    return out


def compute_drift(preset: P.Preset, argv: list[str], environ: dict[str, str]) -> list[Drift]:
    """What differs between a running process and the preset: env variables and flags."""
    drift: list[Drift] = []
    want_env = preset.launch_env()
    for k, v in want_env.items():
        if environ.get(k) != v:
            drift.append(Drift(f"env.{k}", environ.get(k), v))
    for k, v in sorted(environ.items()):
        if k.startswith("NCCL_") and k not in want_env:
            drift.append(Drift(f"env.{k}", v, None))
    try:
        m = argv.index("-m")
        server_args = argv[m + 2:]
    except ValueError:
        server_args = argv[1:]
    have_pos, want_pos = _positionals(server_args), _positionals(preset.flags())
    if have_pos != want_pos:
        drift.append(Drift("arguments", " ".join(have_pos) or None, " ".join(want_pos) or None))
    have, want = _flag_pairs(server_args), _flag_pairs(preset.flags())
    for k in list(dict.fromkeys([*want, *have])):
        if k not in have:
            drift.append(Drift(f"flag {k}", None, want[k] or "(set)"))
        elif k not in want:
            drift.append(Drift(f"flag {k}", have[k] or "(set)", None))
        elif have[k] != want[k]:
            drift.append(Drift(f"flag {k}", have[k], want[k]))
    return drift


def classify(errors: list[ServerError]) -> tuple[str, str] | None:
    """The most telling cause among error events: (category, message)."""
    for cat in CAUSE_ORDER:
        for e in errors:
            if e.category == cat and (cat != "traceback" or len(errors) == 1):
                return cat, e.message
    return None


class ServerControl:
    def __init__(self, transport: Transport, preset: P.Preset, state_dir: str = STATE_DIR):
        self.t = transport
        self.preset = preset
        self.state_dir = state_dir
        self._help_flags: set[str] | None = None
        self.warnings: list[str] = []

    # ---- state ---------------------------------------------------------------------------
    @property
    def state_path(self) -> str:
        return f"{self.state_dir}/servers/{self.preset.server.port}.json"

    async def read_state(self) -> ServerRecord | None:
        r = await self.t.run(f"cat {P.shell_path(self.state_path)} 2>/dev/null", timeout=30)
        if not r.ok or not r.stdout.strip():
            return None
        try:
            d = json.loads(r.stdout)
            return ServerRecord(**{k: d[k] for k in ServerRecord.__dataclass_fields__ if k in d})
        except (ValueError, TypeError, KeyError):
            return None

    async def write_state(self, rec: ServerRecord) -> None:
        await self.t.upload(json.dumps(asdict(rec), indent=1).encode(), self.state_path, 0o600)

    async def clear_state(self) -> None:
        await self.t.run(f"rm -f {P.shell_path(self.state_path)}", timeout=30)

    async def alive(self, pid: int) -> bool:
        r = await self.t.run(f"p={int(pid)}; {LIVE_SH}", timeout=30)
        return r.ok

    async def port_busy(self, port: int | None = None) -> bool:
        port = port or self.preset.server.port
        r = await self.t.run(f"(exec 3<>/dev/tcp/127.0.0.1/{int(port)}) 2>/dev/null", timeout=30)
        return r.ok

    # ---- preflight -----------------------------------------------------------------------
    async def server_flags(self) -> set[str]:
        if self._help_flags is None:
            py = P.shell_path(self.preset.python())
            helps = " ".join(shlex.quote(a) for a in self.preset.help_args())
            r = await self.t.run(f"{py} -m {shlex.quote(self.preset.server.module)} {helps}", timeout=180)
            if not r.ok:
                raise ControlError(f"{self.t.label}: `{self.preset.python()} -m {self.preset.server.module} "
                                   f"{helps}` failed (exit {r.exit_status}): "
                                   f"{(r.stderr or r.stdout).strip().splitlines()[-1:] or ['no output']}"[:400])
            self._help_flags = set(re.findall(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)", r.stdout))
        return self._help_flags

    async def install_probe(self) -> dict:
        """Upload the probe to the target and check, from SGLang's source, what it can patch."""
        from . import probe
        for name, data in probe.files().items():
            await self.t.upload(data, f"{probe.REMOTE_DIR}/{name}")
        r = await self.t.run(f"{P.shell_path(self.preset.python())} {P.shell_path(probe.REMOTE_DIR + '/eagle3_probe.py')} "
                             "--check " + " ".join(self.preset.engine.probe_check_args()), timeout=60)
        try:
            return json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"ok": False, "error": (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_status}"}

    async def preflight(self, replacing: ServerRecord | None) -> None:
        """Refuse a relaunch that cannot work, before anything running is touched."""
        p = self.preset
        py = P.shell_path(p.python())
        r = await self.t.run(f"command -v {py} >/dev/null || [ -x {py} ] || exit 4; {py} -c "
                             f"{shlex.quote(FIND_MODULE_PY)} {shlex.quote(p.server.module)}", timeout=60)
        if r.exit_status == 4:
            raise ControlError(f"{self.t.label}: server.python {p.python()} does not exist", 2)
        if r.exit_status == 3:
            raise ControlError(f"{self.t.label}: module {p.server.module} is not installed for {p.python()}", 2)
        if r.exit_status == 5:
            why = (r.stderr.strip().splitlines() or ["no message"])[-1][:200]
            raise ControlError(f"{self.t.label}: module {p.server.module} cannot be imported with {p.python()} "
                               f"({why})", 2)
        if not r.ok:
            raise ControlError(f"{self.t.label}: cannot run {p.python()}: {r.stderr.strip()[:200]}", 2)
        known = await self.server_flags()
        unknown = [f for f in p.flag_names() if f not in known]
        if unknown:
            raise ControlError(f"flag {unknown[0]} is not accepted by {p.server.module} on {self.t.label} "
                               f"(not in its --help); refusing to relaunch", 2)
        self.warnings = []
        if p.uses_probe:
            report = await self.install_probe()
            if not report.get("ok"):
                why = report.get("error") or (f"{p.engine.label} {report.get('version') or '?'} lacks "
                                              f"{', '.join(report.get('missing') or ['a phase'])}")
                self.warnings.append(f"profile: the probe cannot time every phase here ({why}); "
                                     "the server will log its own decode lines only")
        if await self.port_busy():
            ours = replacing is not None and replacing.port == p.server.port and await self.alive(replacing.pid)
            if not ours:
                raise ControlError(f"port {p.server.port} on {self.t.label} is in use by a process tuitune "
                                   f"did not start; stop it (or `tuitune stop PRESET --pid PID`) first", 2)

    # ---- start / stop --------------------------------------------------------------------
    async def start(self) -> ServerRecord:
        p = self.preset
        await self.t.run(f"mkdir -p \"$(dirname {P.shell_path(p.server.log)})\"", timeout=30)
        r = await self.t.run(P.launch_command(p), timeout=60)
        pid_text = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else []
        if not r.ok or not pid_text or not pid_text[0].isdigit():
            raise ControlError(f"{self.t.label}: the launch command failed (exit {r.exit_status}): "
                               f"{(r.stderr or r.stdout).strip()[:300]}")
        rec = ServerRecord(pid=int(pid_text[0]), port=p.server.port, preset=p.name, preset_hash=p.hash(),
                           started=time.time(), log=p.server.log, argv=p.flags(), env=p.launch_env())
        await self.write_state(rec)
        return rec

    async def stop(self, pid: int | None = None, grace_s: float = 10.0) -> str:
        """Stop the server tuitune started on this port (or ``pid``): TERM the group, wait, KILL."""
        rec = await self.read_state()
        target = pid if pid is not None else (rec.pid if rec else None)
        if target is None:
            return "no server started by tuitune on this port"
        if pid is None and rec and not await self.alive(rec.pid):
            await self.clear_state()
            return f"server {rec.pid} was not running (state cleared)"
        steps = max(1, int(grace_s / 0.1))
        # a group is alive while any of its members is (LIVE_SH); descendants that left the group
        # (an engine's worker processes may) are listed first, while their parents still hold them
        script = (f"g={int(target)}; tree() {{ for c in $(pgrep -P $1 2>/dev/null); do echo $c; tree $c; done; }}; "
                  f"t=$(tree $g); alive() {{ for p in $(pgrep -g $g 2>/dev/null) $g $t; do "
                  f"{LIVE_SH} && return 0; done; return 1; }}; "
                  f"kill -TERM -- -$g 2>/dev/null || kill -TERM $g 2>/dev/null; kill -TERM $t 2>/dev/null; "
                  f"for i in $(seq {steps}); do alive || exit 0; sleep 0.1; done; "
                  f"kill -KILL -- -$g 2>/dev/null; kill -KILL $g $t 2>/dev/null; "
                  f"for i in $(seq 30); do alive || exit 10; sleep 0.1; done; exit 3")
        r = await self.t.run(script, timeout=grace_s + 30)
        if r.exit_status == 3:
            raise ControlError(f"process group {target} on {self.t.label} survived SIGKILL")
        for _ in range(100):
            if not await self.port_busy():
                break
            await asyncio.sleep(0.1)
        else:
            raise ControlError(f"server {target} stopped but port {self.preset.server.port} is still in use")
        if rec and rec.pid == target:
            await self.clear_state()
        how = "killed after the grace period" if r.exit_status == 10 else "stopped"
        return f"server {target} {how}; port {self.preset.server.port} free"

    # ---- wait ready ----------------------------------------------------------------------
    async def wait_ready(self, rec: ServerRecord, timeout_s: float = 900.0,
                         on_phase: Callable[[str, float], None] | None = None,
                         on_line: Callable[[str, Event | None], None] | None = None) -> ReadyResult:
        """Follow the log and poll /health until ready, dead or timed out."""
        import aiohttp

        t0 = time.monotonic()
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
        tail = LogTail(self.t, rec.log)
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
                        for needle, phase in self.preset.engine.phases:
                            if needle in line:
                                set_phase(phase)
                        continue
                    if ev.kind == "error":
                        res.errors.append(ev)
                    elif ev.kind == "nccl_env":
                        res.nccl_env[ev.name] = ev.value
                    elif ev.kind == "http_up":
                        set_phase("http up")
                        http_up.set()
                    elif ev.kind == "ready":
                        res.ready_line_at = time.monotonic()
                        ready_line.set()

        local_port = await self.t.forward_port(rec.port)
        url = self.t.url(local_port) + "/health"

        async def health(session) -> int | None:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                    return r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return None

        async def watch() -> None:
            async with aiohttp.ClientSession() as session:
                while not done.is_set():
                    waiter = asyncio.ensure_future(ready_line.wait())
                    await asyncio.wait({waiter}, timeout=0.5)
                    waiter.cancel()
                    if ready_line.is_set() or http_up.is_set() or not self.preset.engine.health_needs_log_hint:
                        if await health(session) == 200:
                            res.ok = True
                            return
                    if not await self.alive(rec.pid):
                        await asyncio.sleep(0.3)  # let the last lines of the log arrive
                        return
                    if time.monotonic() - t0 > timeout_s:
                        res.message = f"not ready after {timeout_s:.0f} s (phase: {res.phase})"
                        res.cause = "timeout"
                        return

        follower = asyncio.ensure_future(follow())
        try:
            await watch()
        finally:
            done.set()
            tail.close()
            follower.cancel()
            try:
                await follower
            except (asyncio.CancelledError, TransportError):
                pass
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

    async def relaunch(self, timeout_s: float = 900.0, wait: bool = True,
                       on_phase: Callable[[str, float], None] | None = None,
                       before_stop: Callable[[], Awaitable[None]] | None = None,
                       after_start: Callable[[ServerRecord], Awaitable[None]] | None = None,
                       on_stopped: Callable[[str], None] | None = None) -> tuple[ServerRecord, ReadyResult | None]:
        """Preflight (nothing touched if it refuses), stop what runs, start, wait until ready
        (unless ``wait`` is false: then the result is None once the process is started).

        Raises ControlError when the server does not become ready (the log tail attached); a
        cancellation during the start stops the half-started server before propagating.
        """
        current = await self.read_state()
        await self.preflight(current)
        if before_stop is not None:
            await before_stop()
        if current is not None:
            msg = await self.stop()
            if on_stopped is not None:
                on_stopped(msg)
        rec = await self.start()
        if after_start is not None:
            await after_start(rec)
        if not wait:
            return rec, None
        try:
            res = await self.wait_ready(rec, timeout_s, on_phase=on_phase)
        except asyncio.CancelledError:
            await asyncio.shield(self.stop(grace_s=5))
            raise
        if not res.ok:
            raise ControlError(res.message or "server did not become ready", 1, res.log_tail)
        return rec, res

    # ---- status --------------------------------------------------------------------------
    async def process_view(self, pid: int) -> tuple[list[str], dict[str, str]] | None:
        r = await self.t.run(f"base64 -w0 /proc/{int(pid)}/cmdline && echo && base64 -w0 /proc/{int(pid)}/environ",
                             timeout=30)
        if not r.ok:
            return None
        parts = r.stdout.split("\n")
        try:
            argv = [a.decode("utf-8", "replace") for a in base64.b64decode(parts[0]).split(b"\0") if a]
            env_items = [e.decode("utf-8", "replace") for e in base64.b64decode(parts[1]).split(b"\0") if e]
        except (ValueError, IndexError):
            return None
        return argv, dict(e.split("=", 1) for e in env_items if "=" in e)

    async def status(self, pid: int | None = None) -> Status:
        rec = await self.read_state()
        if pid is not None and (rec is None or rec.pid != pid):
            rec = ServerRecord(pid=pid, port=self.preset.server.port, preset="(by hand)", preset_hash="",
                               started=0.0, log=self.preset.server.log)
        if rec is None:
            busy = await self.port_busy()
            return Status(False, note=f"port {self.preset.server.port} is in use by a server tuitune did not "
                                      f"start" if busy else None)
        if not await self.alive(rec.pid):
            return Status(False, rec, note=f"server {rec.pid} recorded but not running")
        view = await self.process_view(rec.pid)
        st = Status(True, rec, uptime_s=time.time() - rec.started if rec.started else None,
                    same_hash=rec.preset_hash == self.preset.hash() if rec.preset_hash else None)
        if view is not None:
            st.drift = compute_drift(self.preset, *view)
        return st


def nccl_confirmation(preset: P.Preset, seen: dict[str, str]) -> list[tuple[str, str, str | None]]:
    """(variable, applied | missing | different, value NCCL echoed) for each NCCL_* in the preset."""
    out = []
    for k, v in preset.env.items():
        if not k.startswith("NCCL_") or k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"):
            continue
        got = seen.get(k)
        state = "missing" if got is None else ("applied" if got.strip() == v.strip() else "different")
        out.append((k, state, got))
    return out
