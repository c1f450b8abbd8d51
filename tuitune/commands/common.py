"""What the command bodies share: the error they raise for bad usage, loading a preset, printing
JSON, the link to a target, running a command's coroutine (with its clean-up on SIGINT/SIGTERM),
and the bench flags that bench, ab, sweep, crossover and tune have in common.

Imports stay lazy (inside the functions): building a command's parser loads no heavy module.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Coroutine, Iterator
from itertools import chain

from tuitune.base import jsonl
from tuitune.base.errors import TuituneError


class CliError(TuituneError):
    """Bad usage or failed work, in one sentence; ``code`` is the exit status."""


def load_preset(name: str):
    from tuitune import preset as P

    return P.resolve(name)  # a PresetError is the mapper's: exit 2


# ---- a server started by hand, found without a preset (target/discover.py) ---------------------
HAND_FLAGS = ("port", "pid", "log", "host")


def add_discover_args(g, required: bool = False) -> None:
    """--port / --pid / --log / --host: the server to read a preset off (``required``: one of the first two)."""
    which = g.add_mutually_exclusive_group(required=required) if required else g
    which.add_argument("--port", type=int, metavar="P", help="the server that listens on port P")
    which.add_argument("--pid", type=int, metavar="PID", help="the server that process PID runs")
    g.add_argument("--log", metavar="PATH", help="its log (default: the file its output goes to)")
    g.add_argument("--host", metavar="[USER@]HOST[:SSH_PORT]", help="the machine it runs on (default: this one)")


def wants_discovery(ns) -> bool:
    return any(getattr(ns, k, None) is not None for k in HAND_FLAGS)


def discovered_preset(ns, name: str | None = None):
    """The preset read off the server ``--port`` / ``--pid`` name, its notes said on stderr."""
    from tuitune.machine.discover import DiscoverError, discover

    if ns.port is None and ns.pid is None:
        raise CliError("give the server's --port or --pid (--log and --host only say where it is)", 2)
    for flag in ("port", "pid"):
        v = getattr(ns, flag)
        if v is not None and not (1 <= v <= (65535 if flag == "port" else 2**22)):
            raise CliError(f"--{flag} {v} is not a {'port' if flag == 'port' else 'process id'}", 2)
    try:
        found = run_async(discover(ns.host, port=ns.port, pid=ns.pid, log=ns.log, name=name))
    except DiscoverError as e:
        raise CliError(str(e), e.code) from None
    for note in found.notes:
        print(f"tuitune: note: {note}", file=sys.stderr)
    return found.preset


def print_json(obj) -> None:
    """Strict JSON (no NaN or Infinity: an unknown figure is null) on standard output."""
    sys.stdout.write(jsonl.dumps(obj, indent=2) + "\n")


def write_json(path: str, obj) -> None:
    """Strict JSON (``print_json``), atomically to a file, or to standard output for ``-``."""
    import os

    if path == "-":
        sys.stdout.write(jsonl.dumps(obj, indent=1) + "\n")
        return
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(jsonl.dumps(obj, indent=1))
        os.replace(tmp, path)
    except OSError as e:
        raise CliError(f"{path}: cannot write it ({e.strerror or e})", 1) from None


def open_lines(path: str) -> Iterator[str]:
    """Lines of a file or stdin as text, invalid UTF-8 replaced; very long lines kept whole.

    Read in blocks of what is there (``read1``: a pipe's lines come through as they arrive),
    each block cut after its last newline, decoded and split at once: the lines are those of
    iterating the binary stream, without their line ends (``\\n``, and any ``\\r`` before it)."""
    if path == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = open(path, "rb")
        except OSError as e:
            raise CliError(f"{path}: cannot open it ({e.strerror or e})", 2) from None
    return chain.from_iterable(_blocks(stream))


def _split(data: bytes) -> list[str]:
    text = data.decode("utf-8", "replace")
    lines = text.split("\n")
    return [line.rstrip("\r") for line in lines] if "\r" in text else lines


def _blocks(stream) -> Iterator[list[str]]:
    with stream:
        pending: list[bytes] = []  # a line not ended yet (kept in pieces: joining once is linear)
        while block := stream.read1(1 << 20):
            cut = block.rfind(b"\n")
            if cut < 0:
                pending.append(block)
                continue
            if pending:
                pending.append(block[:cut])
                yield _split(b"".join(pending))
            else:
                yield _split(block[:cut])
            pending = [block[cut + 1 :]] if cut + 1 < len(block) else []
        if pending:
            yield _split(b"".join(pending))


def run_async(coro, what: str | None = None, cleanup: Callable[[], str | None] = lambda: None):
    """Run a command's coroutine. SIGINT and SIGTERM cancel it, so that its ``finally`` clauses
    clean up (a capture closed, a half-started server stopped), then it ends in one sentence with
    130 or 143 (``cleanup`` says what it did). Both are taken even when this process was started
    with SIGINT ignored (a shell's background job): a command that cleans up is stopped with Ctrl-C
    or ``kill -INT`` like any other, instead of running on unseen."""
    import asyncio
    import signal

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None  # main() runs as asyncio.run's task
        got: list[int] = []

        def interrupted(sig: int) -> None:
            got.append(sig)
            task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(sig, interrupted, sig)
        try:
            return await coro
        except asyncio.CancelledError:
            if not got:
                raise
            done = cleanup()
            said = f"{what} interrupted" if what else "interrupted"  # printed after "tuitune: "
            raise CliError(
                f"{said} by {signal.Signals(got[0]).name}" + (f"; {done}" if done else ""), 128 + got[0]
            ) from None

    return asyncio.run(main())


def run_experiment(what: str, experiment: Callable[[Callable[[str], None]], Coroutine]):
    """Run an experiment (ab, sweep, crossover, tune): ``experiment(on_cleanup)`` makes its coroutine;
    interrupted, it stops the server it started and hands the sentence to ``on_cleanup``, which ends
    the command's one line ("sweep interrupted by SIGINT; the server it started (…) was stopped")."""
    said: list[str] = []
    return run_async(experiment(said.append), what, lambda: "; ".join(said))


def check_positive(ns, *flags: str) -> None:
    """Each of ``flags`` given is above 0, or a usage error naming it."""
    for flag in flags:
        v = getattr(ns, flag.replace("-", "_"))
        if v is not None and v <= 0:
            raise CliError(f"--{flag} must be positive (got {v})", 2)


def say(msg: str) -> None:
    """An experiment's progress, on stdout as it happens."""
    print(msg, flush=True)


# ---- the target ---------------------------------------------------------------------------------


def link_printer(state: str, attempt: int, detail: str | None) -> None:
    if state == "reconnecting":
        print(f"tuitune: link lost, reconnecting ({attempt})", file=sys.stderr)
    elif state == "lost":
        print(f"tuitune: link lost for good: {detail}", file=sys.stderr)


def connecting_printer(label: str, limit_s: float) -> None:
    print(f"tuitune: connecting to {label}… (gives up after {limit_s:g} s)", file=sys.stderr, flush=True)


def watch_link(transport):
    """A transport whose slow first connection and link losses are said on stderr."""
    transport.on_link = link_printer
    transport.on_connecting = connecting_printer
    return transport


def with_control(preset):
    """The preset's transport (a slow connection and link losses said on stderr) and its server's
    control."""
    from tuitune.machine.cluster import control_for
    from tuitune.machine.transport import for_preset

    t = watch_link(for_preset(preset))
    return t, control_for(t, preset)


async def guarded(coro_fn, transport, control=None):
    """Run ``coro_fn()``, then close the control's own links and the transport, whatever happens."""
    try:
        return await coro_fn()
    finally:
        if control is not None:
            await control.close()  # a multi-node server's links to its other nodes
        await transport.close()


def run_signalled(go, transport, what: str, cleanup: Callable[[], str | None] = lambda: None, control=None):
    """Run a command whose interruption must clean up on its target (``run_async``, the link and the
    control closed at the end: ``guarded``)."""
    return run_async(guarded(go, transport, control), what, cleanup)


def print_warnings(control) -> None:
    for w in control.warnings:
        print(f"warning: {w}", file=sys.stderr)
    control.warnings = []


def any_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--any", action="store_true", help="act on the server on the preset's port even if another preset started it"
    )


# ---- bench flags --------------------------------------------------------------------------------


def levels_arg(text: str) -> list[int]:
    """``1,4,16,64`` -> [1, 4, 16, 64] (argparse turns the ValueError into a usage error)."""
    from tuitune.measure.levels import parse_levels

    return parse_levels(text)


levels_arg.__name__ = "concurrency list (distinct integers 1..1024, e.g. 1,4,16,64)"


def bench_flags(p: argparse.ArgumentParser, levels: bool = False) -> None:
    p.add_argument("--requests", type=int, help="measured requests (at least 2 per stream at concurrency > 1)")
    p.add_argument("--warmup", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument(
        "--concurrency",
        type=levels_arg,
        metavar="C,C,..." if levels else "C",
        help="concurrent request streams; a list measures each level in turn (goodput curve)"
        if levels
        else "concurrent request streams",
    )
    p.add_argument(
        "--api",
        choices=["native", "openai", "chat"],
        help="native (SGLang's /generate), openai (/v1/completions) or chat (/v1/chat/completions, the model's chat template)",
    )
    p.add_argument(
        "--prompts",
        metavar="FILE",
        help="your own prompts (one a line, JSONL, or ShareGPT JSON; overrides bench.prompts; default: the built-in twelve)",
    )


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


def overrides(ns, level: int | None = None) -> dict:
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
            ("prompts", _prompt_file(getattr(ns, "prompts", None))),
        )
        if v is not None
    }
    for k, v in ov.items():
        least = 0 if k == "warmup" else (2 if k == "max_tokens" else 1)
        if isinstance(v, int) and v < least:
            raise CliError(f"--{k.replace('_', '-')} must be at least {least} (got {v})", 2)
    return ov


def _prompt_file(path: str | None) -> str | None:
    """``--prompts FILE`` as an absolute path, checked now (one sentence, before any launch)."""
    if path is None:
        return None
    import os

    from tuitune.measure.workload import WorkloadError
    from tuitune.measure.workload import load as load_workload

    try:
        load_workload(path)
    except WorkloadError as e:
        raise CliError(f"--prompts: {e}", 2) from None
    return os.path.abspath(os.path.expanduser(path))


def int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise CliError(f"{flag} {text!r}: expected positive integers, comma-separated (e.g. 1,8,32)", 2)
    return sorted(set(vals))
