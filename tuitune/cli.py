"""Command line. Imports are lazy: `tuitune --help` loads no heavy module, and the headless
commands never import Textual.

Exit status: 0 done, 1 the work failed, 2 bad usage or bad input; `status` adds 3 (not running)
and 4 (running, but not what the preset says: drift, or the preset was edited since the launch).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable

from tuitune import __version__

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


class CliError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def command(name: str, help: str):
    def wrap(fn):
        COMMANDS[name] = (help, fn)
        return fn

    return wrap


def _load_preset(name: str):
    from tuitune import preset as P

    try:
        return P.resolve(name)
    except P.PresetError as e:
        raise CliError(str(e), 2) from None


def _print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


# ---- parse ---------------------------------------------------------------------------------------


@command("parse", "log lines -> events (one JSON object a line with --json)")
def _parse_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a log file, or - for standard input")
    p.add_argument("--json", action="store_true", help="one JSON object per event")
    p.set_defaults(run=cmd_parse)


def _open_lines(path: str):
    """Lines of a file or stdin as text, invalid UTF-8 replaced; very long lines kept whole."""
    if path == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = open(path, "rb")
        except OSError as e:
            raise CliError(f"{path}: cannot open it ({e.strerror or e})", 2) from None
    with stream:
        for raw in stream:
            yield raw.decode("utf-8", "replace").rstrip("\r\n")


def cmd_parse(ns) -> int:
    from tuitune.base.redact import Redactor
    from tuitune.measure.parse import parse_line, summarize

    masked = Redactor().event  # error messages and malformed lines quote the log: mask what looks secret
    events = (masked(ev) for ev in map(parse_line, _open_lines(ns.file)) if ev is not None)
    if ns.json:
        import msgspec

        encode = msgspec.json.Encoder().encode  # NaN becomes null; unset fields are left out
        write = sys.stdout.buffer.write
        for ev in events:
            write(encode(ev) + b"\n")
        return 0
    s = summarize(events)
    if not s["counts"]:
        print("no events (no line matched a known format)")
        return 0
    print(f"{'kind':<12} {'count':>8}")
    for kind, n in sorted(s["counts"].items(), key=lambda kv: -kv[1]):
        print(f"{kind:<12} {n:>8}")
    if s["profile_means"]:
        m = s["profile_means"]
        print("\nprofile means: " + "  ".join(f"{k} {v:.3f}" for k, v in m.items()))
    if s["decode_gen_throughput_mean"] is not None:
        print(f"decode gen throughput mean: {s['decode_gen_throughput_mean']:.2f} tok/s")
    return 0


# ---- preset --------------------------------------------------------------------------------------


@command("preset", "list, show, validate, diff, lint presets; print the JSON Schema")
def _preset_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("list", help="shipped presets and yours (~/.config/tuitune/presets)")
    s.add_argument("--json", action="store_true", help="origin, name, path, description (or error) of each")
    s.set_defaults(run=cmd_preset_list)
    s = sub.add_parser("show", help="the resolved preset (derived values marked), or its command")
    s.add_argument("preset")
    s.add_argument("--command", action="store_true", help="print the launch command only")
    s.add_argument("--json", action="store_true")
    s.add_argument("--reveal", action="store_true", help="show secret values (tokens, keys, passwords) in clear")
    s.set_defaults(run=cmd_preset_show)
    s = sub.add_parser("validate", help="check presets; exit 2 if any is invalid")
    s.add_argument("presets", nargs="+")
    s.add_argument("--json", action="store_true", help="one result per preset: ok, hash, warnings or error")
    s.set_defaults(run=cmd_preset_validate)
    s = sub.add_parser("diff", help="changed keys between two presets")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_preset_diff)
    s = sub.add_parser("lint", help="cross-setting advice")
    s.add_argument("preset")
    s.set_defaults(run=cmd_preset_lint)
    s = sub.add_parser("schema", help="the preset schema as JSON Schema")
    s.set_defaults(run=cmd_preset_schema)


def cmd_preset_list(ns) -> int:
    from tuitune import preset as P

    rows = P.listing()
    if ns.json:
        _print_json(
            [
                {
                    "origin": o,
                    "name": None if n == "(invalid)" else n,
                    "path": str(path),
                    "valid": n != "(invalid)",
                    ("error" if n == "(invalid)" else "description"): d,
                }
                for o, path, n, d in rows
            ]
        )
        return 0
    if not rows:
        print(f"no presets in {P.user_dir()} or {P.shipped_dir()}")
        return 0
    width = max(len(r[2]) for r in rows)
    for origin, _path, name, desc in rows:
        print(f"{origin:<8} {name:<{width}}  {desc}")
    print(f"\nuser presets: {P.user_dir()}")
    return 0


def _fmt(v) -> str:
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def cmd_preset_show(ns) -> int:
    from tuitune import preset as P
    from tuitune.base import redact

    p = _load_preset(ns.preset)
    shown = (lambda text: text) if ns.reveal else redact.Redactor(p)
    if ns.command:
        print(shown(P.launch_script(p)))
        return 0
    flat = P.flatten(p) if ns.reveal else redact.flat(P.flatten(p))
    if ns.json:
        _print_json(
            {
                "name": p.name,
                "hash": p.hash(),
                "resolved": flat,
                "derived": sorted(P.derived_keys(p)),
                "command": shown(P.launch_script(p)),
            }
        )
        return 0
    derived = P.derived_keys(p)
    print(f"# {p.name}  (hash {p.hash()})")
    if p.description:
        print(f"# {p.description}")
    width = max(len(k) for k in flat)
    for k, v in flat.items():
        mark = "   (derived)" if k in derived else ""
        print(f"{k:<{width}}  {_fmt(v)}{mark}")
    for w in P.warnings(p):
        print(f"warning: {w}")
    return 0


def cmd_preset_validate(ns) -> int:
    from tuitune import preset as P

    if ns.json:
        out, bad = [], False
        for name in ns.presets:
            try:
                path = P.find(name)
                p = P.load(path)
                out.append(
                    {
                        "preset": name,
                        "ok": True,
                        "name": p.name,
                        "hash": p.hash(),
                        "warnings": P.warnings(p) + P.file_warnings(path, p),
                    }
                )
            except P.PresetError as e:
                bad = True
                out.append({"preset": name, "ok": False, "error": str(e)})
        _print_json(out)
        return 2 if bad else 0
    bad = 0
    for name in ns.presets:
        try:
            path = P.find(name)
            p = P.load(path)
        except P.PresetError as e:
            print(f"tuitune: {e}", file=sys.stderr)
            bad += 1
            continue
        ws = P.warnings(p) + P.file_warnings(path, p)
        print(f"{name}: ok ({p.name}, hash {p.hash()})" + (f", {len(ws)} warning(s)" if ws else ""))
        for w in ws:
            print(f"  warning: {w}")
    return 2 if bad else 0


def cmd_preset_diff(ns) -> int:
    from tuitune import preset as P
    from tuitune.base import redact

    a, b = _load_preset(ns.a), _load_preset(ns.b)
    changes = P.diff(a, b)
    if ns.json:
        _print_json(
            [
                {"key": k, "a": ra, "b": rb, **({"differ": va != vb} if note else {})}
                for k, va, vb in changes
                for ra, rb, note in [redact.pair(k, va, vb)]
            ]
        )
        return 0
    if not changes:
        print(f"{a.name} and {b.name} launch the same server")
        return 0
    width = max(len(k) for k, _, _ in changes)
    print(f"{'key':<{width}}  {a.name} -> {b.name}")
    for k, va, vb in changes:
        va, vb, note = redact.pair(k, va, vb)
        print(f"{k:<{width}}  {_fmt(va)} -> {_fmt(vb)}{note}")
    return 0


def cmd_preset_lint(ns) -> int:
    from tuitune import preset as P

    p = _load_preset(ns.preset)
    advice = P.lint(p) + P.file_warnings(P.find(ns.preset), p)
    if not advice:
        print(f"{p.name}: no advice")
    for a in advice:
        print(f"- {a}")
    return 0


def cmd_preset_schema(ns) -> int:
    from tuitune import preset as P

    _print_json(P.json_schema())
    return 0


# ---- server control -------------------------------------------------------------------------------


def _run_async(coro):
    import asyncio

    return asyncio.run(coro)


def _errors():
    """Exceptions of the core that become one clear sentence (exit 1 or their own code)."""
    from tuitune.target.control import ControlError
    from tuitune.target.transport import TransportError

    return ControlError, TransportError


def _link_printer(state: str, attempt: int, detail: str | None) -> None:
    if state == "reconnecting":
        print(f"tuitune: link lost, reconnecting ({attempt})", file=sys.stderr)
    elif state == "lost":
        print(f"tuitune: link lost for good: {detail}", file=sys.stderr)


def _with_control(preset):
    from tuitune.target.cluster import control_for
    from tuitune.target.transport import for_preset

    t = for_preset(preset)
    t.on_link = _link_printer
    return t, control_for(t, preset)


@contextlib.contextmanager
def _core_errors():
    """A failed server or link becomes one sentence (and the server log's last lines)."""
    ControlError, TransportError = _errors()
    try:
        yield
    except ControlError as e:
        for line in e.log_tail:
            print(f"  | {line}", file=sys.stderr)
        raise CliError(str(e), e.code) from None
    except TransportError as e:
        raise CliError(str(e), 1) from None


async def _guarded(coro_fn, transport, control=None):
    try:
        with _core_errors():
            return await coro_fn()
    finally:
        if hasattr(control, "close"):  # a multi-node server's links to its other nodes
            await control.close()
        await transport.close()


def _any_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--any", action="store_true", help="act on the server on the preset's port even if another preset started it"
    )


def _run_signalled(go, transport, what: str, cleanup: Callable[[], str | None] = lambda: None, control=None):
    """Run a command whose interruption must clean up: SIGINT and SIGTERM cancel it (the core
    stops what it half-started; ``cleanup`` then says what it did), then it ends in one sentence
    with 130 or 143."""
    import asyncio
    import signal

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        got: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda s=sig: (got.append(s), task.cancel()))
        try:
            return await _guarded(go, transport, control)
        except asyncio.CancelledError:
            if not got:
                raise
            done = cleanup()
            raise CliError(
                f"{what} interrupted by {signal.Signals(got[0]).name}" + (f"; {done}" if done else ""), 128 + got[0]
            ) from None

    return _run_async(main())


@command("launch", "preflight, stop the old server, start, wait until ready")
def _launch_args(p: argparse.ArgumentParser) -> None:
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
    _any_arg(p)
    p.set_defaults(run=cmd_launch)


async def _print_started(rec) -> None:
    print(f"started pid {rec.pid}, log {rec.log}", flush=True)


def cmd_launch(ns) -> int:
    p = _load_preset(ns.preset)
    t, control = _with_control(p)

    async def go():
        try:
            rec, res = await control.relaunch(
                ns.timeout,
                wait=not ns.no_wait,
                on_phase=lambda name, el: print(f"  {el:6.1f}s  {name}", flush=True),
                after_start=_print_started,
                on_stopped=lambda msg: print(f"stopped: {msg}"),
                allow_any=ns.any,
                keep_on_failure=ns.keep_on_failure,
                health_timeout_s=ns.health_timeout,
            )
        finally:
            _print_warnings(control)
        if res is None:
            return 0
        print(f"ready in {res.elapsed_s:.1f}s")
        seen = getattr(control, "node_nccl", None) or [res.nccl_env]  # each node's own log
        for i, (node, env) in enumerate(zip(p.node_presets(), seen, strict=False)):
            _print_nccl(node, env, f"node {i} " if p.is_multinode else "")
        return 0

    return _run_signalled(go, t, "launch", lambda: control.cleanup, control)


def _print_warnings(control) -> None:
    for w in control.warnings:
        print(f"warning: {w}", file=sys.stderr)
    control.warnings = []


def _print_nccl(p, seen: dict, where: str = "") -> None:
    """NCCL's own confirmation of the preset's NCCL variables, or why there is none."""
    from tuitune.target.control import nccl_confirmation, nccl_note

    for name, state, got in nccl_confirmation(p, seen):
        if state == "unconfirmed":
            continue  # the note says why
        print(f"  {where}{name}: {state}" + (f" (NCCL says {got})" if state == "different" else ""))
    note = nccl_note(p, seen)
    if note:
        print(f"warning: {where}{note}", file=sys.stderr)


@command("stop", "stop the server tuitune started for a preset (or --pid)")
def _stop_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--pid", type=int, help="stop this process group instead (a server started by hand)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    _any_arg(p)
    p.set_defaults(run=cmd_stop)


def cmd_stop(ns) -> int:
    p = _load_preset(ns.preset)
    t, control = _with_control(p)

    async def go():
        try:
            print(await control.stop(ns.pid, ns.grace, allow_any=ns.any))
        finally:
            _print_warnings(control)
        return 0

    return _run_async(_guarded(go, t, control))


STATUS_NOT_RUNNING = 3
STATUS_DRIFT = 4


@command(
    "status",
    "is the server running, and does it run what the preset says (drift); "
    "exit 0 yes, 3 not running, 4 running but differs",
)
def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--pid", type=int, help="inspect this process (a server started by hand)")
    p.add_argument("--json", action="store_true")
    _any_arg(p)
    p.set_defaults(run=cmd_status)


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def cmd_status(ns) -> int:
    p = _load_preset(ns.preset)
    t, control = _with_control(p)

    async def go():
        st = await control.status(ns.pid)
        _print_warnings(control)
        if st.running and ns.pid is None and not ns.any and (why := control.foreign(st.record)):
            raise CliError(why, 2)
        code = STATUS_NOT_RUNNING if not st.running else (STATUS_DRIFT if st.drift or st.same_hash is False else 0)
        if ns.json:
            _print_json(st.to_dict())
            return code
        for n in getattr(st, "nodes", []):
            r = n.status.record
            print(
                f"  node {n.index} on {n.label}: "
                + (f"running, pid {r.pid}" if n.status.running else f"not running ({n.status.note or 'no server'})")
            )
        if not st.running:
            print(f"{p.name}: not running" + (f" ({st.note})" if st.note else ""))
            return code
        rec = st.record
        print(
            f"{p.name}: running, pid {rec.pid}, up {_duration(st.uptime_s)}, preset hash "
            f"{rec.preset_hash or '?'}"
            + ("" if st.same_hash in (True, None) else f" (preset now {p.hash()}: edited since launch)")
        )
        if st.drift:
            print(f"drift: {len(st.drift)} difference(s) between the running process and the preset")
            for d in st.drift:
                print(f"  {d}")
        else:
            print("no drift: environment and flags match the preset")
        return code

    return _run_async(_guarded(go, t, control))


@command("logs", "print the server's log (-f follows it)")
def _logs_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("-n", "--lines", type=int, default=40)
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument("--node", type=int, default=0, help="a multi-node server's node (default 0, rank 0)")
    p.set_defaults(run=cmd_logs)


def cmd_logs(ns) -> int:
    from tuitune.base.redact import Redactor
    from tuitune.preset import shell_path
    from tuitune.target.tail import LogTail, file_size

    p = _load_preset(ns.preset)
    nodes = p.node_presets()
    if not 0 <= ns.node < len(nodes):
        raise CliError(f"--node {ns.node}: {p.name} has node(s) 0..{len(nodes) - 1}", 2)
    p = nodes[ns.node]
    t, _ = _with_control(p)
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

    return _run_async(_guarded(go, t))


@command(
    "trust", "fetch the SSH host keys of a preset's target (and its jump hosts), show them, add them to known_hosts"
)
def _trust_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="PRESET|HOST", help="a preset, or a host / ~/.ssh/config alias")
    p.add_argument("--port", type=int)
    p.add_argument("--user")
    p.add_argument("--known-hosts", help="file to append to (default: the preset's, else ~/.ssh/known_hosts)")
    p.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    p.set_defaults(run=cmd_trust)


def _trust_target(ns):
    """The SSH target of a preset of that name or path, else the host as given."""
    from tuitune import preset as P
    from tuitune.target.transport import SshTarget

    try:
        path = P.find(ns.target)
    except P.PresetError:
        return SshTarget(ns.target, ns.port, ns.user, None, ns.known_hosts)
    t = _load_preset(str(path)).target
    if t.is_local:
        raise CliError(f"{ns.target}: the preset runs on this machine; there is no host key to trust", 2)
    return SshTarget(t.host, ns.port or t.port, ns.user or t.user, None, ns.known_hosts or t.known_hosts)


def cmd_trust(ns) -> int:
    from tuitune.target.transport import TransportError, trust_route

    def confirm(hop, key) -> bool:
        if ns.yes:
            return True
        if not sys.stdin.isatty():
            raise CliError("not a terminal: pass --yes to trust without asking", 2)
        return input(f"  trust it as {hop.known_hosts_name}? [y/N] ").strip().lower() in ("y", "yes")

    t = _trust_target(ns)
    try:
        ok = _run_async(trust_route(t, confirm, print))
    except TransportError as e:
        raise CliError(str(e), 1) from None
    if not ok:
        print("not trusted")
        return 1
    return 0


# ---- bench / ab ---------------------------------------------------------------------------------


def _levels(text: str) -> list[int]:
    """``1,4,16,64`` -> [1, 4, 16, 64] (argparse turns the ValueError into a usage error)."""
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or any(c < 1 or c > 1024 for c in levels) or len(set(levels)) != len(levels):
        raise ValueError(text)
    return levels


_levels.__name__ = "concurrency list (distinct integers 1..1024, e.g. 1,4,16,64)"


def _bench_overrides(p: argparse.ArgumentParser, levels: bool = False) -> None:
    p.add_argument("--requests", type=int, help="measured requests (at least 2 per stream at concurrency > 1)")
    p.add_argument("--warmup", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument(
        "--concurrency",
        type=_levels,
        metavar="C,C,..." if levels else "C",
        help="concurrent request streams; a list measures each level in turn (goodput curve)"
        if levels
        else "concurrent request streams",
    )
    p.add_argument("--api", choices=["native", "openai"])


def _one_level(ns) -> int | None:
    if ns.concurrency is None:
        return None
    if len(ns.concurrency) > 1:
        raise CliError(
            f"--concurrency takes one level here (got {len(ns.concurrency)}); "
            "`tuitune bench` and `tuitune crossover` measure several",
            2,
        )
    return ns.concurrency[0]


def _overrides(ns, level: int | None = None) -> dict:
    """The bench flags given on the command line, checked (bench, ab and sweep share them)."""
    level = _one_level(ns) if level is None else level
    ov = {
        k: v
        for k, v in (
            ("requests", ns.requests),
            ("warmup", ns.warmup),
            ("max_tokens", ns.max_tokens),
            ("concurrency", level),
            ("api", ns.api),
        )
        if v is not None
    }
    for k, v in ov.items():
        least = 0 if k == "warmup" else (2 if k == "max_tokens" else 1)
        if isinstance(v, int) and v < least:
            raise CliError(f"--{k.replace('_', '-')} must be at least {least} (got {v})", 2)
    return ov


@command("bench", "benchmark a running server (through the SSH forward for remote presets)")
def _bench_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("preset", nargs="?")
    g.add_argument("--url", help="benchmark this server URL instead of a preset's")
    _bench_overrides(p, levels=True)
    p.add_argument(
        "--json",
        metavar="OUT",
        help="write every request and the summary (per level) as JSON (- for "
        "standard output; the human summary then goes to standard error)",
    )
    _any_arg(p)
    p.set_defaults(run=cmd_bench)


def _write_json(path: str, obj) -> None:
    """Atomically to a file, or to standard output for ``-``."""
    import os

    if path == "-":
        json.dump(obj, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, default=str)
        os.replace(tmp, path)
    except OSError as e:
        raise CliError(f"{path}: cannot write it ({e.strerror or e})", 1) from None


def _bench_url(url: str) -> str:
    """``host:port`` means http://host:port (what people paste from a server's log)."""
    from urllib.parse import urlsplit

    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(f"--url {url!r}: expected http://HOST:PORT (or HOST:PORT)", 2)
    return url


class _BenchProgress:
    """Requests done / total and the median rate so far, on standard error: one line rewritten on
    a terminal, a line every few requests otherwise (logs stay short)."""

    def __init__(self, total: int):
        self.total, self.done, self.rates = total, 0, []
        self.tty = sys.stderr.isatty()

    def __call__(self, _i, r) -> None:
        self.done += 1
        if r.ok and r.decode_tok_s is not None:
            self.rates.append(r.decode_tok_s)
        med = sorted(self.rates)[len(self.rates) // 2] if self.rates else None
        line = f"bench: {self.done}/{self.total} requests" + (f" · {med:.1f} tok/s median so far" if med else "")
        if self.tty:
            print(f"\r{line}\x1b[K", end="" if self.done < self.total else "\n", file=sys.stderr, flush=True)
        elif self.done == self.total or self.done % max(1, self.total // 5) == 0:
            print(line, file=sys.stderr, flush=True)


def cmd_bench(ns) -> int:
    from tuitune.measure.bench import BenchConfig, format_levels, format_summary, level_row, run_bench

    levels = ns.concurrency or [None]
    _overrides(ns, level=levels[0])  # checks the other flags before anything starts

    def report(runs):
        summaries = [r.summary() for r in runs]
        human = format_summary(summaries[0]) if len(runs) == 1 else format_levels(summaries)
        print(human, file=sys.stderr if ns.json == "-" else sys.stdout)
        if ns.json:
            _write_json(
                ns.json,
                runs[0].to_dict()
                if len(runs) == 1
                else {"levels": [r.to_dict() for r in runs], "curve": [level_row(s) for s in summaries]},
            )
        return 0 if all(r.ok and not r.failed for r in runs) else 1

    def progress(c) -> None:
        if len(levels) > 1:
            print(f"concurrency {c}…", file=sys.stderr, flush=True)

    if ns.url:

        async def go_url():
            runs = []
            for c in levels:
                progress(c)
                cfg = BenchConfig(_bench_url(ns.url), **_overrides(ns, level=c))
                cfg = cfg.at_level(cfg.concurrency)
                print(f"bench: {cfg.warmup} warm-up + {cfg.requests} requests against {cfg.url}…", file=sys.stderr)
                runs.append(await run_bench(cfg, _BenchProgress(cfg.requests)))
            return runs

        return report(_run_async(go_url()))
    p = _load_preset(ns.preset)
    from tuitune.target.session import Session

    session = Session(p)
    session.transport.on_link = _link_printer

    async def go():
        st = await session.connect()  # follows the server's log: the batch sizes it reports
        _print_warnings(session.control)
        if st.running and not ns.any and (why := session.control.foreign(st.record)):
            raise CliError(why, 2)
        runs = []
        for c in levels:
            conc = c or p.bench.concurrency
            progress(conc)
            ov = _overrides(ns, level=c)
            n = BenchConfig.for_preset("", p, ov).requests  # at least two requests per stream
            print(
                f"bench: {ov.get('warmup', p.bench.warmup)} warm-up + {n} requests on {session.label}…", file=sys.stderr
            )
            runs.append(await session.bench(on_result=_BenchProgress(n), **ov))
        return runs

    return report(_run_async(_guarded(go, session.transport)))


@command("ab", "interleaved relaunch + bench of two presets (A B A B …), with a verdict")
def _ab_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="baseline preset")
    p.add_argument("b", help="candidate preset")
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="launches per preset (default 4; 4 is the "
        "fewest with which the exact Mann-Whitney test can reach p < 0.05)",
    )
    p.add_argument("--min-effect", type=float, default=0.01, help="smallest ratio change that counts (0.01 = 1%%)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for each launch")
    _bench_overrides(p)
    p.add_argument("--json", metavar="OUT", help="write the launches, medians and verdict as JSON")
    _any_arg(p)
    p.set_defaults(run=cmd_ab)


def cmd_ab(ns) -> int:
    from tuitune.experiments.ab import ab_notes, format_ab, run_ab

    a, b = _load_preset(ns.a), _load_preset(ns.b)
    if a.target.label() != b.target.label():
        raise CliError(f"{a.name} and {b.name} must run on the same target to be interleaved", 2)
    if ns.rounds < 1:
        raise CliError(f"--rounds must be at least 1 (got {ns.rounds})", 2)
    for note in ab_notes(a, b, ns.rounds):
        print(f"note: {note}", file=sys.stderr)
    ov = _overrides(ns)
    api_a, api_b = (ov.get("api", p.bench.api) for p in (a, b))
    if api_a != api_b:  # /generate and /v1/completions are timed differently (ITL spread evenly)
        raise CliError(
            f"{a.name} is benchmarked through the {api_a} API and {b.name} through the {api_b} "
            "API, which is not comparable; set bench.api: openai in both (or pass --api openai)",
            2,
        )
    t, _ = _with_control(a)

    async def go():
        return await run_ab(
            t,
            a,
            b,
            ns.rounds,
            ov,
            ns.min_effect,
            ns.timeout,
            progress=lambda msg: print(msg, flush=True),
            allow_any=ns.any,
        )

    result = _run_async(_guarded(go, t))
    print(format_ab(result))
    if ns.json:
        _write_json(ns.json, result)
    return 0 if result["verdict"]["verdict"] != "not comparable" else 1


# ---- crossover ----------------------------------------------------------------------------------


@command("crossover", "speculation on vs off over concurrency levels: where it stops paying")
def _crossover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset", help="a preset with speculation on; its twin has it off")
    _bench_overrides(p, levels=True)
    p.add_argument("--rounds", type=int, default=1, help="times each level is measured per arm (default 1)")
    p.add_argument(
        "--min-effect", type=float, default=0.02, help="smallest speedup change that counts (0.02 = 2%%, default)"
    )
    p.add_argument("--plot", metavar="OUT.png|OUT.svg", help="also write the plot to a file")
    p.add_argument("--no-plot", action="store_true", help="leave out the terminal plot")
    p.add_argument("--json", metavar="OUT", help="write the levels, speedups and verdict as JSON")
    p.set_defaults(run=cmd_crossover)


def cmd_crossover(ns) -> int:
    from pathlib import Path

    from tuitune.experiments.crossover import CrossoverError, crossover, format_result, plot_text, write_plot

    p = _load_preset(ns.preset)
    levels = ns.concurrency or [1, 4, 16, 64]
    if ns.rounds < 1 or not 0 <= ns.min_effect < 1:
        raise CliError("--rounds must be at least 1 and --min-effect in [0, 1)", 2)
    if ns.plot and Path(ns.plot).suffix.lower() not in (".png", ".svg"):
        raise CliError(f"--plot {ns.plot}: the file must end in .png or .svg", 2)
    ov = _overrides(ns, level=levels[0])
    ov.pop("concurrency", None)
    try:
        with _core_errors():
            result = _run_async(
                crossover(
                    p,
                    sorted(levels),
                    ov,
                    rounds=ns.rounds,
                    min_effect=ns.min_effect,
                    progress=lambda m: print(m, flush=True),
                )
            )
    except CrossoverError as e:
        raise CliError(str(e), 2) from None
    print()
    print(format_result(result))
    if not ns.no_plot:
        import shutil

        print()
        chart = plot_text(result, width=min(shutil.get_terminal_size((100, 24)).columns, 120))
        print(chart if sys.stdout.isatty() else re.sub(r"\x1b\[[0-9;]*m", "", chart))  # no colour codes in files
    if ns.json:
        _write_json(ns.json, result)
    if ns.plot:
        try:
            write_plot(result, Path(ns.plot))
        except CrossoverError as e:
            raise CliError(str(e), 1) from None
        print(f"plot written to {ns.plot}")
    return 0 if result["comparable"] else 1


# ---- nccl-bench ---------------------------------------------------------------------------------


@command("nccl-bench", "rank NCCL settings with an all-reduce micro-benchmark at decode sizes")
def _ncclbench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="env.VAR=V1,V2,...",
        help="a grid axis (repeatable); 'unset' leaves the variable out",
    )
    p.add_argument(
        "--sizes",
        help="message sizes in bytes, comma-separated (default: decode all-reduces from the model's hidden size)",
    )
    p.add_argument("--hidden-size", type=int, help="the model's hidden size when config.json is not readable")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--graph",
        action="store_true",
        default=True,
        help="replay the all-reduces in a CUDA graph, as SGLang decode does (the default)",
    )
    mode.add_argument(
        "--eager",
        dest="graph",
        action="store_false",
        help="time eager all-reduces instead (they can rank protocols differently from decode)",
    )
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--world-size", type=int, help="processes (default: the preset's tp-size)")
    p.add_argument(
        "--backend",
        choices=["nccl", "gloo"],
        default="nccl",
        help="gloo: CPU, for trying the tool out (NCCL variables are not exercised)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    p.add_argument("--json", metavar="OUT")
    p.set_defaults(run=cmd_ncclbench)


def cmd_ncclbench(ns) -> int:
    from tuitune.experiments import grid as G
    from tuitune.experiments import ncclbench as NB

    p = _load_preset(ns.preset)
    try:
        grid = G.parse(ns.grid)
        NB.validate_grid(grid)
        sizes = [int(x) for x in ns.sizes.split(",")] if ns.sizes else None
    except G.GridError as e:
        raise CliError(str(e), 2) from None
    except NB.NcclBenchError as e:
        raise CliError(str(e), e.code) from None
    except ValueError:
        raise CliError(f"--sizes {ns.sizes!r}: expected bytes, comma-separated (e.g. 14336,43008)", 2) from None
    for flag in ("iters", "hidden_size", "world_size"):
        v = getattr(ns, flag)
        if v is not None and v < 1:
            raise CliError(f"--{flag.replace('_', '-')} must be at least 1 (got {v})", 2)
    t, _ = _with_control(p)

    async def go():
        try:
            return await NB.run(
                t,
                p,
                grid,
                sizes=sizes,
                hidden_size=ns.hidden_size,
                graph=ns.graph,
                iters=ns.iters,
                warmup=ns.warmup,
                world_size=ns.world_size,
                backend=ns.backend,
                timeout_s=ns.timeout,
                progress=lambda m: print(m, file=sys.stderr, flush=True),
            )
        except NB.NcclBenchError as e:
            raise CliError(str(e), e.code) from None

    report = _run_async(_guarded(go, t))
    print(NB.format_table(report))
    if ns.json:
        _write_json(ns.json, report)
    return 0 if report["ranking"] else 1


# ---- report / sweep -----------------------------------------------------------------------------


@command("report", "summaries of captures (phase times, accept length, tok/s), side by side with deltas")
def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("captures", nargs="+")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-chart", action="store_true", help="leave out the terminal chart")
    p.set_defaults(run=cmd_report)


def cmd_report(ns) -> int:
    from tuitune.measure.capture import CaptureError
    from tuitune.measure.report import chart, colour_wanted, format_report, summarize_capture

    try:
        reports = [summarize_capture(c) for c in ns.captures]
    except CaptureError as e:
        raise CliError(str(e), 2) from None
    if ns.json:
        _print_json([{k: v for k, v in r.items() if not k.startswith("_")} for r in reports])
        return 0
    print(format_report(reports))
    if not ns.no_chart:
        import shutil

        cols = shutil.get_terminal_size((100, 24)).columns
        print()
        print(chart(reports, width=min(cols, 120), colour=colour_wanted()))
    return 0


@command("sweep", "relaunch, bench and record every configuration of a grid, against a baseline")
def _sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2,...",
        help="a preset path and its values (repeatable): speculative.num_steps=1,2,3, "
        "env.NCCL_PROTO=LL,unset, env=@tuned-preset,@untuned-preset",
    )
    p.add_argument("--baseline", help="baseline preset (default: PRESET itself)")
    p.add_argument("--repeats", type=int, default=1, help="launches per configuration (default 1)")
    p.add_argument("--baseline-every", type=int, default=4, help="re-measure the baseline every N trials")
    p.add_argument("--out", default="sweep-out", help="directory for results and captures (default sweep-out)")
    p.add_argument("--resume", action="store_true", help="skip the trials already in OUT/results.jsonl")
    _bench_overrides(p)
    p.add_argument("--no-plot", action="store_true")
    p.set_defaults(run=cmd_sweep)


def cmd_sweep(ns) -> int:
    from pathlib import Path

    from tuitune.experiments import grid as G
    from tuitune.experiments.sweep import SweepError, format_table, plot, sweep
    from tuitune.measure.report import colour_wanted

    base = _load_preset(ns.preset)
    baseline = _load_preset(ns.baseline) if ns.baseline else None
    if ns.repeats < 1 or ns.baseline_every < 0:
        raise CliError("--repeats must be at least 1 and --baseline-every at least 0", 2)
    try:
        grid = G.parse(ns.grid)
    except G.GridError as e:
        raise CliError(str(e), 2) from None
    ControlError, TransportError = _errors()
    try:
        result = _run_async(
            sweep(
                base,
                grid,
                Path(ns.out),
                baseline=baseline,
                repeats=ns.repeats,
                baseline_every=ns.baseline_every,
                resume=ns.resume,
                overrides=_overrides(ns),
                progress=lambda m: print(m, flush=True),
            )
        )
    except SweepError as e:
        raise CliError(str(e), 2) from None
    except (ControlError, TransportError) as e:
        raise CliError(str(e), 1) from None
    print()
    print(format_table(result))
    if not ns.no_plot:
        chart = plot(result, colour=colour_wanted())
        if chart:
            print()
            print(chart)
    return 0 if result.get("best") else 1


# ---- advise / tune ------------------------------------------------------------------------------


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise CliError(f"{flag} {text!r}: expected positive integers, comma-separated (e.g. 1,8,32)", 2)
    return sorted(set(vals))


@command(
    "advise", "predict every configuration's goodput from a running server or captures; the best, the next measurement"
)
def _advise_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="PRESET|CAPTURE",
        help="a preset (its running server's log is read) or captures (one launch each)",
    )
    p.add_argument(
        "--concurrency",
        help="concurrencies to advise for, comma-separated (default: the load the "
        "windows were measured at, or the preset's bench.concurrency)",
    )
    p.add_argument("--top", type=int, default=5, help="configurations shown per concurrency (default 5)")
    p.add_argument("--json", action="store_true", help="everything (model, all predictions) as JSON")
    p.add_argument(
        "--emit",
        nargs=2,
        metavar=("FORMAT", "FILE"),
        help="write an engine schedule: sglang-adaptive FILE.json (SGLang --speculative-adaptive-config)",
    )
    p.add_argument("--buckets", help="batch-size keys of the emitted schedule (default 1,2,4,8,16,32,64)")
    p.set_defaults(run=cmd_advise)


def cmd_advise(ns) -> int:
    from tuitune import engines
    from tuitune.decide import advise as A
    from tuitune.decide.costmodel import FitError, fit
    from tuitune.experiments.observe import ObserveError, launches_from

    if ns.emit and ns.emit[0] != "sglang-adaptive":
        raise CliError(f"--emit {ns.emit[0]!r}: the only format is sglang-adaptive", 2)
    if ns.top < 1:
        raise CliError(f"--top must be at least 1 (got {ns.top})", 2)
    buckets = _int_list(ns.buckets, "--buckets") if ns.buckets else list(A.ADAPTIVE_BUCKETS)
    wanted = _int_list(ns.concurrency, "--concurrency") if ns.concurrency else None
    ControlError, TransportError = _errors()
    try:
        launches, running, load = _run_async(launches_from(ns.sources))
    except ObserveError as e:
        raise CliError(str(e), e.code) from None
    except (ControlError, TransportError) as e:
        raise CliError(str(e), 1) from None
    engine = engines.get(launches[-1].engine)
    if ns.emit and engine.name != "sglang":
        raise CliError(
            f"--emit sglang-adaptive is SGLang's schedule; {engine.label} has no adaptive speculation to load it", 2
        )
    levels = wanted or [load]
    try:
        model = fit(launches)
    except FitError as e:
        raise CliError(f"cannot fit a cost model: {e}", 1) from None
    space = A.space(topks=engine.topks)
    advices = [A.advise(model, c, running, space) for c in levels]
    schedule = None
    if ns.emit:
        schedule, why = A.adaptive_schedule(model, tuple(buckets))
        try:
            A.write_adaptive(ns.emit[1], schedule)
        except OSError as e:
            raise CliError(f"{ns.emit[1]}: cannot write it ({e.strerror or e})", 1) from None
    if ns.json:
        out = {"model": model.summary(), "advice": [a.to_dict() for a in advices]}
        if schedule is not None:
            out["sglang_adaptive"] = {"file": ns.emit[1], "config": schedule, "buckets": why}
        _print_json(out)
        return 0
    print(A.format_advice(model, advices, top=ns.top, describe=engine.config_label))
    if schedule is not None:
        print(
            f"\nwrote {ns.emit[1]} (SGLang --speculative-adaptive-config; candidates within "
            f"{A.TOLERANCE:.0%} of each bucket's best):"
        )
        for w in why:
            print(f"  batch size >= {w['key']:<4} (judged at {w['batch_size']}): candidate_steps {w['candidates']}")
        print("  use it: speculative.adaptive_config: /path/on/the/target.json in the preset (eagle_topk 1)")
    return 0


@command("tune", "closed loop: measure, fit, relaunch the predicted best, repeat; prove it with an A/B")
def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("preset")
    p.add_argument("--budget", type=int, required=True, help="relaunches the search may spend (the A/B comes on top)")
    p.add_argument("--concurrency", type=int, help="the load to tune for (default: the preset's bench.concurrency)")
    p.add_argument("--out", default="tune-out", help="directory for the log, captures and best.yaml (default tune-out)")
    p.add_argument("--resume", action="store_true", help="continue the run logged in OUT/tune.jsonl")
    p.add_argument(
        "--levels", help="load levels benchmarked per launch (default: concurrency/4, concurrency, 2 x concurrency)"
    )
    p.add_argument("--ab-rounds", type=int, default=4, help="launches per arm of the final A/B (default 4)")
    p.add_argument(
        "--nccl",
        action="store_true",
        help="first rank NCCL settings with nccl-bench (seconds) and measure the start with the winner (one relaunch)",
    )
    p.add_argument(
        "--nccl-grid",
        action="append",
        default=[],
        metavar="env.VAR=V1,V2,...",
        help="the NCCL settings --nccl ranks (repeatable; default NCCL_PROTO x NCCL_ALGO)",
    )
    p.add_argument("--nccl-backend", choices=["nccl", "gloo"], default="nccl", help="gloo: CPU, for trying it out")
    p.add_argument(
        "--hidden-size", type=int, help="the model's hidden size for --nccl when config.json is not readable"
    )
    p.add_argument("--requests", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--json", metavar="OUT", help="write the result as JSON")
    p.set_defaults(run=cmd_tune)


def cmd_tune(ns) -> int:
    from pathlib import Path

    from tuitune.experiments.tune import TuneError, format_result, tune

    base = _load_preset(ns.preset)
    if ns.budget < 0:
        raise CliError(f"--budget must be at least 0 (got {ns.budget})", 2)
    if ns.ab_rounds < 1:
        raise CliError(f"--ab-rounds must be at least 1 (got {ns.ab_rounds})", 2)
    conc = ns.concurrency if ns.concurrency is not None else base.bench.concurrency
    if conc < 1:
        raise CliError(f"--concurrency must be at least 1 (got {conc})", 2)
    levels = _int_list(ns.levels, "--levels") if ns.levels else None
    ns.concurrency, ns.api = None, None
    ov = _overrides(ns)
    ControlError, TransportError = _errors()
    try:
        result = _run_async(
            tune(
                base,
                ns.budget,
                conc,
                Path(ns.out),
                resume=ns.resume,
                levels=levels,
                overrides=ov,
                ab_rounds=ns.ab_rounds,
                nccl=ns.nccl or bool(ns.nccl_grid),
                nccl_backend=ns.nccl_backend,
                nccl_grid=ns.nccl_grid,
                hidden_size=ns.hidden_size,
                progress=lambda m: print(m, flush=True),
            )
        )
    except TuneError as e:
        raise CliError(str(e), e.code) from None
    except (ControlError, TransportError) as e:
        raise CliError(str(e), 1) from None
    print()
    print(format_result(result))
    if ns.json:
        _write_json(ns.json, result)
    return 0 if result["verdict"].get("verdict") != "not comparable" else 1


# ---- probe --------------------------------------------------------------------------------------


@command("probe", "the EAGLE3_PROFILE probe: which phases it can patch in an SGLang or vLLM release")
def _probe_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = sub.add_parser("check", help="read SGLang's source (ast, no import, no GPU) and report the patchable phases")
    s.add_argument("--sglang-path", help="the sglang package directory (default: the one this python finds)")
    s.add_argument("--vllm-path", help="check a vLLM tree instead: the vllm package directory")
    s.add_argument(
        "--engine",
        choices=["sglang", "vllm"],
        help="the engine installed for this python to check (default sglang, or vllm with --vllm-path)",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_probe_check)


def cmd_probe_check(ns) -> int:
    import os

    from tuitune.probe import check

    engine = ns.engine or ("vllm" if ns.vllm_path else "sglang")
    path = ns.vllm_path or ns.sglang_path
    label = {"sglang": "SGLang", "vllm": "vLLM"}[engine]
    if path and not os.path.isdir(path):
        raise CliError(f"{path}: not a directory (give the {engine} package directory)", 2)
    try:
        report = check(path, engine)
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {label}'s source: {e}", 1) from None
    if ns.json:
        _print_json(report)
        return 0 if report.get("ok") else 1
    if report.get("error"):
        raise CliError(report["error"], 1)
    print(f"{label} {report.get('version') or '(version unknown)'} at {report['sglang']}")
    if not report["modules"]:
        print(
            "  no EAGLE module found"
            + (
                " (neither v1 eagle_worker.py nor v2 eagle_worker_v2.py)"
                if engine == "sglang"
                else " (no V1 model runner or proposer)"
            )
        )
    for module, entries in report["modules"].items():
        print(f"  {module}")
        for name, e in entries.items():
            print(f"    {'ok     ' if e['found'] else 'MISSING'} {name} ({e['phase']})")
    print(
        "patchable phases: "
        + (", ".join(report["phases"]) or "none")
        + ("" if report["ok"] else "  -> the server would run unprofiled")
    )
    return 0 if report["ok"] else 1


# ---- gpus ---------------------------------------------------------------------------------------


@command("gpus", "every GPU of the target, live (like gpustat); --parse reads saved nvidia-smi output")
def _gpus_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("preset", nargs="?")
    g.add_argument(
        "--parse",
        metavar="FILE",
        help="saved nvidia-smi output (query CSV, the table, topo -m, nvlink -s, dmon), or - for standard input",
    )
    p.add_argument("--json", action="store_true", help="JSON (with --watch: one object per sample)")
    p.add_argument("--watch", action="store_true", help="keep refreshing from one nvidia-smi stream")
    p.add_argument("--fields", help="with --parse: the columns of a CSV saved without its header")
    p.set_defaults(run=cmd_gpus)


def cmd_gpus(ns) -> int:
    from tuitune.measure.smi import SmiParseError
    from tuitune.target import gpus as G

    if ns.parse:
        if ns.watch:
            raise CliError("--watch does not apply with --parse", 2)
        text = "\n".join(_open_lines(ns.parse))
        try:
            parsed = G.parse_file(text, ns.fields.split(",") if ns.fields else None)
        except SmiParseError as e:
            raise CliError(f"{ns.parse}: {e}", 2) from None
        if ns.json:
            _print_json(parsed)
        else:
            print(G.format_parsed(parsed))
        return 0
    if ns.fields:
        raise CliError("--fields only applies with --parse", 2)
    from tuitune.target.telemetry import for_preset

    p = _load_preset(ns.preset)
    t, _ = _with_control(p)
    prefix = for_preset(p)

    async def go():
        try:
            if ns.watch:
                await _watch_gpus(t, prefix, p.telemetry.period_ms, ns.json)
                return 0
            snap = await G.snapshot(t, prefix)
        except G.GpusError as e:
            raise CliError(str(e), 1) from None
        if ns.json:
            _print_json(snap)
        else:
            print(G.format_snapshot(snap))
        return 0

    return _run_async(_guarded(go, t))


async def _watch_gpus(t, prefix: str, period_ms: int, as_json: bool) -> None:
    """Redraw on every tick of one long-lived stream; processes re-read every few seconds."""
    import asyncio
    import time

    import msgspec

    from tuitune.base.events import GpuSample, TelemetryState
    from tuitune.measure.metrics import GpuStore
    from tuitune.target import gpus as G
    from tuitune.target.telemetry import Collector, gpu_flags

    known = await G.known_fields(t, prefix)
    snap = await G.snapshot(t, prefix, known)
    store = GpuStore()
    procs = {"rows": snap["processes"], "at": time.monotonic()}
    topo = G.format_topology(snap.get("topology"))
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    def on(events) -> None:
        for ev in events:
            if isinstance(ev, TelemetryState) and ev.state in ("unavailable", "stopped", "interrupted"):
                print(f"tuitune: telemetry {ev.state}: {ev.detail}", file=sys.stderr)
            elif isinstance(ev, GpuSample):
                store.feed(ev)
        if not any(isinstance(ev, GpuSample) for ev in events):
            return
        rows = [msgspec.structs.asdict(g.last) for g in store.current()]
        if as_json:
            sys.stdout.write(json.dumps({"seq": store.seq, "gpus": rows}) + "\n")
        else:
            sys.stdout.write(
                clear
                + G.format_gpus(rows, procs["rows"], gpu_flags(store, False))
                + (f"\n\n{topo}" if topo else "")
                + "\n"
            )
        sys.stdout.flush()

    async def refresh_procs() -> None:
        while True:
            await asyncio.sleep(5)
            procs["rows"] = await G.processes(t, prefix, snap["gpus"])

    task = asyncio.ensure_future(refresh_procs())
    try:
        await Collector(t, prefix, on, period_ms).run()
    finally:
        task.cancel()


# ---- TUI ----------------------------------------------------------------------------------------


def _run_tui(session, **kw) -> int:
    from tuitune.tui.app import TuituneApp

    app = TuituneApp(session, **kw)
    app.run()
    return 0


@command("demo", "the TUI against the built-in simulator (presets/demo.yaml), load on")
def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--port",
        type=int,
        help="serve the simulator on this port instead of the preset's 30123 (two demos side by side; tests)",
    )
    p.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        default="sim",
        help="vllm: a real vLLM on this machine's CPU (presets/vllm-cpu-demo.yaml; `make demo-vllm` builds it)",
    )
    p.set_defaults(run=cmd_demo)


def cmd_demo(ns) -> int:
    from pathlib import Path

    from tuitune import preset as P
    from tuitune.target.session import Session

    name = "vllm-cpu-demo" if ns.engine == "vllm" else "demo"
    path = P.shipped_dir() / f"{name}.yaml"
    preset = _load_preset(str(path))
    if ns.engine == "vllm" and not Path(preset.python()).expanduser().exists():
        raise CliError(
            f"the vLLM CPU engine is not built here ({preset.python()} does not exist): run `make demo-vllm` "
            "in a clone of tuitune (it builds it once, about 3.4 GB and a few minutes, then opens this demo)",
            2,
        )
    if ns.port is not None:
        if not 1 <= ns.port <= 65535:
            raise CliError(f"--port must be between 1 and 65535 (got {ns.port})", 2)
        preset = P.with_changes(
            preset, {"server.port": ns.port, "server.log": f"~/.cache/tuitune/logs/{name}-{ns.port}.log"}
        )
    # the demo owns the simulator it starts: quitting stops it unless asked otherwise
    return _run_tui(
        Session(preset), autostart="launch-if-stopped", load_on_start=True, preset_path=path, stop_on_quit=True
    )


def cmd_tui(ns) -> int:
    from tuitune import preset as P
    from tuitune.target.session import Session

    if ns.preset is None:
        build_parser().print_help()
        return 0
    try:
        path = P.find(ns.preset)
    except P.PresetError as e:
        raise CliError(str(e), 2) from None
    preset = _load_preset(str(path))
    return _run_tui(Session(preset), autostart="attach", preset_path=path)


@command("replay", "the TUI, fed from a capture (space pauses, ←/→ seek, --speed)")
def _replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("capture")
    p.add_argument("--speed", type=float, default=1.0, help="playback speed (default 1; 10 = ten times faster)")
    p.set_defaults(run=cmd_replay)


def cmd_replay(ns) -> int:
    from tuitune.measure.capture import CaptureError, Replay, read_capture

    if ns.speed <= 0:
        raise CliError(f"--speed must be positive (got {ns.speed})", 2)
    try:
        cap = read_capture(ns.capture)
    except CaptureError as e:
        raise CliError(str(e), 2) from None
    return _run_tui(Replay(cap, ns.speed))


# ---- shell completion ---------------------------------------------------------------------------


@command("completion", "print the shell code that completes tuitune's commands, presets and grid keys")
def _completion_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", nargs="?", default="bash", choices=["bash", "zsh", "fish", "tcsh"])
    p.set_defaults(run=cmd_completion)


def cmd_completion(ns) -> int:
    import argcomplete

    sys.stdout.write(argcomplete.shellcode(["tuitune"], shell=ns.shell))
    return 0


def _complete_presets(prefix, **_):
    from tuitune import preset as P

    return sorted({name for _, _, name, _ in P.listing() if name != "(invalid)" and name.startswith(prefix)})


def _complete_grid(prefix, **_):
    """``KEY=`` for the settable preset paths (flattened keys of the demo preset, plus env.NCCL_*)."""
    from tuitune import preset as P
    from tuitune.preset import nccl

    if "=" in prefix:
        return []
    keys = set(P.flatten(P.load(P.shipped_dir() / "demo.yaml")))
    keys |= {f"env.{name}" for name in nccl.CATALOGUE}
    keys |= {"speculative.num_steps", "speculative.eagle_topk", "speculative.num_draft_tokens", "env"}
    return sorted(f"{k}=" for k in keys if k.startswith(prefix))


def _completion_parser() -> argparse.ArgumentParser:
    """One parser with every command, for argcomplete (main() parses a command's own parser)."""
    p = build_parser()  # not the main parser: its optional PRESET positional would take the command word
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_, fn) in COMMANDS.items():
        fn(sub.add_parser(name, help=help_))
    for action in _walk_actions(p):
        if action.dest in ("preset", "a", "b", "baseline", "presets", "target"):
            action.completer = _complete_presets
        elif action.dest == "grid":
            action.completer = _complete_grid
    return p


def _walk_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _walk_actions(sub)


# ---- entry ---------------------------------------------------------------------------------------

MAIN_USAGE = """tuitune [PRESET]                 interactive TUI for the preset's server
       tuitune demo                     the TUI against the built-in simulator
       tuitune --record OUT [PRESET]    headless capture of the live event stream
       tuitune COMMAND ...              (see the list below)"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tuitune",
        usage=MAIN_USAGE,
        description="Live-profile and tune speculative-decoding LLM servers (SGLang EAGLE-3) over SSH.",
        epilog="commands:\n"
        + "\n".join(f"  {n:<12} {h}" for n, (h, _) in COMMANDS.items())
        + "\n\nRun `tuitune COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"tuitune {__version__}")
    return p


def build_command_parser(name: str) -> argparse.ArgumentParser:
    help_, fn = COMMANDS[name]
    p = argparse.ArgumentParser(prog=f"tuitune {name}", description=help_)
    fn(p)
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answer and exit
        import argcomplete

        argcomplete.autocomplete(_completion_parser())
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            ns = build_command_parser(argv[0]).parse_args(argv[1:])
        else:
            ns = build_main_parser().parse_args(argv)
        return int(ns.run(ns) or 0)
    except CliError as e:
        print(f"tuitune: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("tuitune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def build_main_parser() -> argparse.ArgumentParser:
    p = build_parser()
    p.add_argument("preset", nargs="?", help=argparse.SUPPRESS)
    g = p.add_argument_group("headless capture (--record)")
    g.add_argument("--record", metavar="OUT", help="capture the live event stream to OUT (.jsonl or .jsonl.gz)")
    stop = g.add_mutually_exclusive_group()
    stop.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    stop.add_argument("--cycles", type=int, metavar="N", help="stop after N profiled cycles")
    g.add_argument("--relaunch", action="store_true", help="relaunch the server first")
    g.add_argument(
        "--load",
        type=int,
        nargs="?",
        const=1,
        metavar="C",
        help="keep C concurrent request streams running (default 1)",
    )
    g.add_argument("--bench", type=int, metavar="N", help="run a benchmark of N requests at the start")
    g.add_argument("--raw", action="store_true", help="keep the raw log lines too")
    g.add_argument(
        "--from-start",
        action="store_true",
        help="on a running server, record its whole log so far too (default: from now on)",
    )
    p.set_defaults(run=cmd_main)
    return p


def cmd_main(ns) -> int:
    if ns.record:
        return cmd_record(ns)
    for flag in ("duration", "cycles", "load", "bench"):
        if getattr(ns, flag) is not None:
            raise CliError(f"--{flag} only applies with --record OUT", 2)
    if ns.relaunch or ns.raw or ns.from_start:
        raise CliError("--relaunch, --raw and --from-start only apply with --record OUT", 2)
    return cmd_tui(ns)


def cmd_record(ns) -> int:
    from tuitune.experiments.record import RecordError, record
    from tuitune.measure.capture import CaptureError

    if ns.preset is None:
        raise CliError("--record needs a PRESET", 2)
    for flag in ("duration", "cycles", "load", "bench"):
        v = getattr(ns, flag)
        if v is not None and v <= 0:
            raise CliError(f"--{flag} must be positive (got {v})", 2)
    p = _load_preset(ns.preset)
    ControlError, TransportError = _errors()
    try:
        stats = _run_async(
            record(
                p,
                ns.record,
                duration=ns.duration,
                cycles=ns.cycles,
                relaunch=ns.relaunch,
                load=ns.load,
                bench=ns.bench,
                raw=ns.raw,
                progress=sys.stderr.isatty(),
                from_start=ns.from_start,
            )
        )
    except (RecordError, CaptureError, TransportError) as e:
        raise CliError(str(e), 1) from None
    except ControlError as e:
        for line in e.log_tail:
            print(f"  | {line}", file=sys.stderr)
        raise CliError(str(e), e.code) from None
    if sys.stderr.isatty():
        print(
            f"{ns.record}: {stats['events']} events, {stats['bytes']} bytes, {stats['seconds']:.1f} s", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
