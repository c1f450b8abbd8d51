"""Command line: the parser, the table of commands, and the one mapping of errors to exit statuses.

The commands' bodies live in tuitune.commands (one module per family), imported only when their
command runs: `tuitune --help` loads no heavy module, and the headless commands never import
Textual.

Exit status: 0 done, 1 the work failed, 2 bad usage or bad input; `status` adds 3 (not running)
4 (running, but not what the preset says: drift, or the preset was edited since the launch) and 5
(running, but tuitune did not start it: read-only until `tuitune adopt PRESET`);
130 / 143 interrupted by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from tuitune import __version__
from tuitune.base.errors import TuituneError

# name: (what it does, the module of tuitune.commands that holds its parser and body)
COMMANDS: dict[str, tuple[str, str]] = {
    "parse": ("log lines -> events (one JSON object a line with --json)", "measure"),
    "preset": ("list, show, validate, diff, lint presets; print the JSON Schema", "preset"),
    "launch": ("preflight, stop the old server, start, wait until ready", "server"),
    "stop": ("stop the server tuitune started for a preset (or --pid)", "server"),
    "status": (
        "is the server running, and does it run what the preset says (drift); "
        "exit 0 yes, 3 not running, 4 running but differs, 5 running but not started by tuitune",
        "server",
    ),
    "adopt": (
        "make a running server tuitune did not start its own (shows the drift first), so that launch and stop act on it",
        "server",
    ),
    "hold": (
        "hold a step count (SGLang steps, vLLM K) in a running launch prepared to switch, live; --release gives "
        "the choice back",
        "server",
    ),
    "logs": ("print the server's log (-f follows it)", "server"),
    "trust": (
        "fetch the SSH host keys of a preset's target (and its jump hosts), show them, add them to known_hosts",
        "server",
    ),
    "watch": (
        "the acceptance guard on a running server: say when acceptance collapses or speculation goes off; "
        "exit 1 on an alarm",
        "measure",
    ),
    "bench": ("benchmark a running server (through the SSH forward for remote presets)", "measure"),
    "ab": ("interleaved relaunch + bench of two presets (A B A B …), with a verdict", "experiments"),
    "crossover": ("speculation on vs off over concurrency levels: where it stops paying", "experiments"),
    "nccl-bench": ("rank NCCL settings with an all-reduce micro-benchmark at decode sizes", "experiments"),
    "workload": ("describe a prompt file, or record one from the requests a server logged (from-log)", "workload"),
    "report": ("summaries of captures (phase times, accept length, tok/s), side by side with deltas", "measure"),
    "sweep": ("relaunch, bench and record every configuration of a grid, against a baseline", "experiments"),
    "advise": (
        "predict every configuration's goodput from a running server or captures; the best, the next measurement",
        "advise",
    ),
    "tune": ("closed loop: measure, fit, relaunch the predicted best, repeat; prove it with an A/B", "experiments"),
    "probe": ("the EAGLE3_PROFILE probe: which phases it can patch in an SGLang or vLLM release", "probe"),
    "gpus": ("every GPU of the target, live (like gpustat); --parse reads saved nvidia-smi output", "measure"),
    "demo": ("the TUI against the built-in simulator (presets/demo.yaml), load on", "tui"),
    "replay": ("the TUI, fed from a capture (space pauses, ←/→ seek, --speed)", "tui"),
    "completion": ("print the shell code that completes tuitune's commands, presets and grid keys", "completion"),
}


def exit_status(e: BaseException) -> int | None:
    """The one mapping of errors to exit statuses, for every command: the sentence on stderr
    (after a failed server's last log lines) and the status, the error's ``code`` (a TuituneError:
    tuitune/base/errors.py); None for an error that is no sentence (a bug: its traceback is wanted)."""
    if not isinstance(e, TuituneError):
        return None
    for line in getattr(e, "log_tail", None) or []:  # a server that failed: what it said last
        print(f"  | {line}", file=sys.stderr)
    print(f"tuitune: {e}", file=sys.stderr)
    return e.code


# ---- parsers ------------------------------------------------------------------------------------

MAIN_USAGE = """tuitune [PRESET]                 interactive TUI for the preset's server
       tuitune demo                     the TUI against the built-in simulator
       tuitune --record OUT [PRESET]    headless capture of the live event stream
       tuitune --port P [--host H]      either, for a server started by hand (no preset)
       tuitune COMMAND ...              (see the list below)"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tuitune",
        usage=MAIN_USAGE,
        description="Live-profile and tune speculative-decoding LLM servers (SGLang and vLLM: EAGLE-3, "
        "n-gram, …) over SSH.",
        epilog="commands:\n"
        + "\n".join(f"  {n:<12} {h}" for n, (h, _) in COMMANDS.items())
        + "\n\nRun `tuitune COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"tuitune {__version__}")
    return p


def add_command_args(name: str, p: argparse.ArgumentParser) -> None:
    """A command's own flags (and its body, as ``run``), from its module in tuitune.commands."""
    module = importlib.import_module(f"tuitune.commands.{COMMANDS[name][1]}")
    module.PARSERS[name](p)


def build_command_parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"tuitune {name}", description=COMMANDS[name][0])
    add_command_args(name, p)
    return p


def build_main_parser() -> argparse.ArgumentParser:
    from tuitune.commands.tui import cmd_main
    from tuitune.experiments.options import RecordOptions

    p = build_parser()
    p.add_argument("preset", nargs="?", help=argparse.SUPPRESS)
    RecordOptions.add_cli_args(p.add_argument_group("headless capture (--record)"))
    p.add_argument(
        "--against",
        metavar="CAPTURE",
        help="the acceptance guard compares with this capture of a good run (default: the launch's first cycles)",
    )
    from tuitune.commands.common import add_discover_args

    add_discover_args(
        p.add_argument_group(
            "a server started by hand, instead of a PRESET (read off its process; `tuitune preset discover` "
            "writes it down)"
        )
    )
    p.set_defaults(run=cmd_main, show_help=lambda: build_parser().print_help())
    return p


def completion_parser() -> argparse.ArgumentParser:
    """One parser with every command, for argcomplete (main() parses a command's own parser)."""
    from tuitune.commands.completion import add_completers

    p = build_parser()  # not the main parser: its optional PRESET positional would take the command word
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_, _) in COMMANDS.items():
        add_command_args(name, sub.add_parser(name, help=help_))
    return add_completers(p)


# ---- entry --------------------------------------------------------------------------------------


def _dump_tasks(*_) -> None:
    from tuitune.base.aio import dump_tasks  # asyncio: only when asked, not at every start

    dump_tasks()


def main(argv: list[str] | None = None) -> int:
    import os

    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions: answer and exit
        import argcomplete

        argcomplete.autocomplete(completion_parser())
    if argv is None and hasattr(signal, "SIGUSR1"):  # the process's own: `kill -USR1` says where it waits
        signal.signal(signal.SIGUSR1, _dump_tasks)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            ns = build_command_parser(argv[0]).parse_args(argv[1:])
        else:
            ns = build_main_parser().parse_args(argv)
        ns.argv = argv  # as typed: a command that stops early names the one that resumes it
        return int(ns.run(ns) or 0)
    except KeyboardInterrupt:
        print("tuitune: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:
        code = exit_status(e)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
