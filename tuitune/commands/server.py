"""`tuitune launch|stop|status|hold|logs|trust`: one server's life on its target (`hold`: its step count,
live, in a launch prepared to switch), and the SSH trust to reach it.

Exit status as everywhere (0 done, 1 failed, 2 bad input); `status` adds 3 (not running), 4
(running, but not what the preset says: drift, or the preset was edited since the launch) and 5
(running, but tuitune did not start it: watched read-only until `tuitune adopt PRESET`).
"""

from __future__ import annotations

import argparse
import math
import sys

from tuitune.commands.common import (
    CliError,
    any_arg,
    guarded,
    load_preset,
    print_json,
    print_warnings,
    run_async,
    run_signalled,
    with_control,
)


def launch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for ready (default 900)")
    p.add_argument(
        "--health-timeout",
        type=float,
        default=120.0,
        help="seconds /health may take to answer 200 once HTTP is up (default 120)",
    )
    p.add_argument("--no-wait", action="store_true", help="return once the process is started")
    p.add_argument(
        "--keep-on-failure",
        action="store_true",
        help="leave a server that failed to become ready running (to inspect it)",
    )
    any_arg(p)
    p.set_defaults(run=cmd_launch)


def checked(control) -> str:
    """What the launch's checks took, and where the engine's flag listing came from (the target's
    cache, or the engine asked now: 15-30 s of vLLM's ``serve --help=all``)."""
    if control.preflight_s is None:
        return ""
    where = {True: " (flag listing cached on the target)", False: " (flag listing asked of the engine)"}
    flags = where.get(control.help_cached, "")
    return f"checked in {control.preflight_s:.1f}s{flags}"


def cmd_launch(ns) -> int:
    p = load_preset(ns.preset)
    t, control = with_control(p)

    async def started(rec) -> None:
        if said := checked(control):
            print(said, flush=True)
        print(f"started pid {rec.pid}, log {rec.log}", flush=True)

    async def go():
        try:
            rec, res = await control.relaunch(
                ns.timeout,
                wait=not ns.no_wait,
                on_phase=lambda name, el: print(f"  {el:6.1f}s  {name}", flush=True),
                after_start=started,
                on_stopped=lambda msg: print(f"stopped: {msg}"),
                allow_any=ns.any,
                keep_on_failure=ns.keep_on_failure,
                health_timeout_s=ns.health_timeout,
            )
        finally:
            print_warnings(control)
        if res is None:
            return 0
        print(f"ready in {res.elapsed_s:.1f}s")
        said: set[str] = set()
        for i, (node, env) in enumerate(control.nccl_by_node(res)):  # each node's own log
            _print_nccl(node, env, f"node {i} " if p.is_multinode else "", said)
        return 0

    return run_signalled(go, t, "launch", lambda: control.cleanup, control)


def _print_nccl(p, seen: dict, where: str = "", said: set[str] | None = None) -> None:
    """NCCL's own confirmation of the preset's NCCL variables, or why there is none: said for a real
    server only (the simulator applies what it is given) and once (``said``: the nodes of one launch)."""
    from tuitune import preset as P
    from tuitune.machine.readiness import nccl_confirmation, nccl_note

    for name, state, got in nccl_confirmation(p, seen):
        if state == "unconfirmed":
            continue  # the note says why
        print(f"  {where}{name}: {state}" + (f" (NCCL says {got})" if state == "different" else ""))
    note = nccl_note(p, seen)
    said = set() if said is None else said
    if note and p.server.module != P.SIM_MODULE and note not in said:
        said.add(note)
        print(f"warning: {where}{note}", file=sys.stderr)


def stop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--pid", type=int, help="stop this process group instead (a server started by hand)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    any_arg(p)
    p.set_defaults(run=cmd_stop)


def cmd_stop(ns) -> int:
    p = load_preset(ns.preset)
    t, control = with_control(p)

    async def go():
        try:
            print(await control.stop(ns.pid, ns.grace, allow_any=ns.any))
        finally:
            print_warnings(control)
        return 0

    return run_async(guarded(go, t, control))


STATUS_NOT_RUNNING = 3
STATUS_DRIFT = 4
STATUS_NOT_OURS = 5


def _print_drift(drift) -> None:
    if drift:
        print(f"drift: {len(drift)} difference(s) between the running process and the preset")
        for d in drift:
            print(f"  {d}")
    else:
        print("no drift: environment and flags match the preset")


def _print_probe_hint(p, rec) -> None:
    from tuitune.machine.record import probe_hint

    if rec is not None and (hint := probe_hint(p, rec.env)):
        print(f"probe: {hint}")


def status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--pid", type=int, help="inspect this process (a server started by hand)")
    p.add_argument("--json", action="store_true")
    any_arg(p)
    p.set_defaults(run=cmd_status)


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def cmd_status(ns) -> int:
    p = load_preset(ns.preset)
    t, control = with_control(p)

    async def go():
        st = await control.status(ns.pid)
        print_warnings(control)
        if st.running and st.ours and ns.pid is None and not ns.any and (why := control.foreign(st.record)):
            raise CliError(why, 2)
        code = STATUS_NOT_RUNNING if not st.running else (STATUS_DRIFT if st.drift or st.same_hash is False else 0)
        if st.running and not st.ours:
            code = STATUS_NOT_OURS
        ack = None
        if st.running and st.ours and st.record is not None and st.record.switch is not None:
            from tuitune.machine.switch import Switch

            ack = await Switch(t, st.record.port).state()
        if ns.json:
            d = st.to_dict()
            if ack is not None:
                d["switch"] = {"held": ack.held, "seq": ack.seq}
            print_json(d)
            return code
        for n in st.nodes:
            r = n.status.record
            print(
                f"  node {n.index} on {n.label}: "
                + (f"running, pid {r.pid}" if n.status.running else f"not running ({n.status.note or 'no server'})")
            )
        if not st.running:
            print(f"{p.name}: not running" + (f" ({st.note})" if st.note else ""))
            return code
        rec = st.record
        if not st.ours:
            print(f"{p.name}: {st.note} (pid {rec.pid}, up {_duration(st.uptime_s)}, log {p.server.log})")
            _print_drift(st.drift)
            _print_probe_hint(p, rec)
            return code
        print(
            f"{p.name}: running, pid {rec.pid}, up {_duration(st.uptime_s)}, preset hash "
            f"{rec.preset_hash or '?'}"
            + ("" if st.same_hash in (True, None) else f" (preset now {p.hash()}: edited since launch)")
        )
        _print_drift(st.drift)
        if rec.switch is not None:
            print(_switch_state(p, rec, ack))
        return code

    return run_async(guarded(go, t, control))


def hold_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "steps",
        nargs="?",
        type=int,
        help="the step count to hold (SGLang steps, vLLM K), one of the preset's speculative.switch; "
        "leave it out to print what the server holds",
    )
    p.add_argument("--release", action="store_true", help="give the choice back to the engine's own policy or schedule")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the engine's answer (default 30)")
    any_arg(p)
    p.set_defaults(run=cmd_hold)


def _switch_state(p, rec, ack) -> str:
    """One line: what a launch prepared to switch holds now."""
    e = p.engine
    held = (
        f"holds {e.step_name} {ack.held} (command {ack.seq})"
        if ack is not None and ack.held is not None
        else f"the engine's own {e.own_choice} chooses (nothing held)"
    )
    return f"switch: prepared for {e.step_name} {rec.switch}; {held}"


def cmd_hold(ns) -> int:
    """Hold a step count in a running launch prepared to switch (docs/switch.md), or release it."""
    import time

    from tuitune.machine.session import Session
    from tuitune.machine.switch import Switch

    if ns.release and ns.steps is not None:
        raise CliError("give a step count to hold, or --release, not both", 2)
    if ns.steps is not None and ns.steps < 0:
        raise CliError(f"a step count is 0 or more (got {ns.steps})", 2)
    if not math.isfinite(ns.timeout) or ns.timeout <= 0:
        raise CliError(f"--timeout must be more than 0 s (got {ns.timeout:g})", 2)
    p = load_preset(ns.preset)
    session = Session(p)
    word = p.engine.step_name

    async def go():
        await session.transport.connect()
        if ns.steps is None and not ns.release:  # what it holds now
            st = await session.control.status()
            print_warnings(session.control)
            if not st.running or st.record is None or not st.ours:
                raise CliError(f"{p.name}: {st.note or 'not running'}", 1)
            if st.record.switch is None:
                print(f"{p.name}: not launched prepared for switching (speculative.switch unset when it started)")
                return 0
            print(_switch_state(p, st.record, await Switch(session.transport, st.record.port).state()))
            return 0
        t0 = time.monotonic()
        ack = await session.hold(ns.steps, ns.timeout, ns.any)
        took = time.monotonic() - t0
        if ack.held is None:
            print(
                f"{p.name}: released; the engine's own {p.engine.own_choice} chooses the step count again "
                f"(command {ack.seq}, answered in {took:.1f} s)"
            )
        else:
            print(
                f"{p.name}: holds {word} {ack.held} (command {ack.seq}, answered in {took:.1f} s); "
                f"`tuitune hold {p.name} --release` gives the choice back"
            )
        return 0

    return run_async(guarded(go, session.transport, session.control))


def adopt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.set_defaults(run=cmd_adopt)


def cmd_adopt(ns) -> int:
    """Make a server started by hand on the preset's port tuitune's: its drift from the preset first,
    then its record written under the port's lock (relaunch and stop act on it from then on)."""
    from tuitune.machine.control import ServerControl

    p = load_preset(ns.preset)
    t, control = with_control(p)
    if not isinstance(control, ServerControl):
        raise CliError(f"{p.name}: adopt takes a server of one machine, not a multi-node one", 2)

    async def go():
        rec, drift = await control.adopt()
        print_warnings(control)
        _print_drift(drift)
        print(
            f"{p.name}: adopted server {rec.pid} on port {rec.port} (log {rec.log}); "
            "`tuitune launch` and `tuitune stop` now act on it"
        )
        return 0

    return run_async(guarded(go, t, control))


def logs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("-n", "--lines", type=int, default=40)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--node", type=int, default=0, help="a multi-node server's node (default 0, rank 0)")
    p.set_defaults(run=cmd_logs)


def cmd_logs(ns) -> int:
    from tuitune.base.redact import Redactor
    from tuitune.machine.tail import LogTail, file_size
    from tuitune.preset import shell_path

    p = load_preset(ns.preset)
    nodes = p.node_presets()
    if not 0 <= ns.node < len(nodes):
        raise CliError(f"--node {ns.node}: {p.name} has node(s) 0..{len(nodes) - 1}", 2)
    p = nodes[ns.node]
    t, _ = with_control(p)
    shown = Redactor(p)

    async def go():
        r = await t.run(f"tail -n {int(ns.lines)} -- {shell_path(p.server.log)}", timeout=60)
        if not r.ok:
            raise CliError(f"{t.label}: cannot read {p.server.log}: {r.stderr.strip()[:200]}", 1)
        sys.stdout.writelines(shown(line) + "\n" for line in r.stdout.splitlines())
        sys.stdout.flush()
        if ns.follow:
            tail = LogTail(t, p.server.log, offset=await file_size(t, p.server.log), python=p.python())
            async for batch in tail.batches():
                for line in batch.lines:
                    print(shown(line), flush=True)
        return 0

    return run_async(guarded(go, t))


def trust_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="PRESET|HOST", help="a preset, or a host / ~/.ssh/config alias")
    p.add_argument("--port", type=int)
    p.add_argument("--user")
    p.add_argument("--known-hosts", help="file to append to (default: the preset's, else ~/.ssh/known_hosts)")
    p.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="seconds each host may take to answer (default: its ConnectTimeout in ~/.ssh/config, else 15)",
    )
    p.set_defaults(run=cmd_trust)


def _trust_target(ns):
    """The SSH target of a preset of that name or path, else the host as given."""
    from tuitune import preset as P
    from tuitune.machine.ssh import SshTarget

    try:
        path = P.find(ns.target)
    except P.PresetError:
        return SshTarget(ns.target, ns.port, ns.user, None, ns.known_hosts)
    t = load_preset(str(path)).target
    if t.is_local:
        raise CliError(f"{ns.target}: the preset runs on this machine; there is no host key to trust", 2)
    return SshTarget(t.host, ns.port or t.port, ns.user or t.user, None, ns.known_hosts or t.known_hosts)


def cmd_trust(ns) -> int:
    from tuitune.machine.ssh import trust_route

    def confirm(hop, key) -> bool:
        if ns.yes:
            return True
        if not sys.stdin.isatty():
            raise CliError("not a terminal: pass --yes to trust without asking", 2)
        return input(f"  trust it as {hop.known_hosts_name}? [y/N] ").strip().lower() in ("y", "yes")

    if ns.timeout is not None and ns.timeout <= 0:
        raise CliError(f"--timeout must be more than 0 seconds (got {ns.timeout:g})", 2)
    if not run_async(trust_route(_trust_target(ns), confirm, print, ns.timeout)):
        print("not trusted")
        return 1
    return 0


PARSERS = {
    "launch": launch_args,
    "stop": stop_args,
    "status": status_args,
    "hold": hold_args,
    "adopt": adopt_args,
    "logs": logs_args,
    "trust": trust_args,
}
