"""What the command bodies share: loading a preset, printing JSON, the link to a target, running a
command's coroutine (with its clean-up on SIGINT/SIGTERM); and, from where they live, the error they
raise for bad usage (``CliError``: base/errors.py) and the bench flags that bench, ab, sweep, crossover
and tune have in common (experiments/options.py, beside the experiments' options models).

Imports stay lazy (inside the functions): building a command's parser loads no heavy module.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Coroutine, Iterator
from itertools import chain

from tuitune.base import jsonl
from tuitune.base.errors import CliError
from tuitune.experiments.options import any_arg, bench_flags, check_positive, int_list, levels_arg, overrides

__all__ = ("CliError", "any_arg", "bench_flags", "check_positive", "int_list", "levels_arg", "overrides")


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
