"""Command line. Imports are lazy: `tuitune --help` loads no heavy module, and the headless
commands never import Textual.

Exit status: 0 done, 1 the work failed, 2 bad usage or bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from . import __version__

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
    from . import preset as P
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
    from .parse import parse_line, summarize
    events = (ev for ev in map(parse_line, _open_lines(ns.file)) if ev is not None)
    if ns.json:
        out = sys.stdout
        dumps = json.dumps
        for ev in events:
            out.write(dumps(ev.to_dict()) + "\n")
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
    s.set_defaults(run=cmd_preset_list)
    s = sub.add_parser("show", help="the resolved preset (derived values marked), or its command")
    s.add_argument("preset")
    s.add_argument("--command", action="store_true", help="print the launch command only")
    s.add_argument("--json", action="store_true")
    s.set_defaults(run=cmd_preset_show)
    s = sub.add_parser("validate", help="check presets; exit 2 on the first invalid one")
    s.add_argument("presets", nargs="+")
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
    from . import preset as P
    rows = P.listing()
    if not rows:
        print(f"no presets in {P.user_dir()} or {P.shipped_dir()}")
        return 0
    width = max(len(r[2]) for r in rows)
    for origin, path, name, desc in rows:
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
    from . import preset as P
    p = _load_preset(ns.preset)
    if ns.command:
        print(P.launch_command(p))
        return 0
    flat = P.flatten(p)
    if ns.json:
        _print_json({"name": p.name, "hash": p.hash(), "resolved": flat,
                     "derived": sorted(P.derived_keys(p)), "command": P.launch_command(p)})
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
    from . import preset as P
    for name in ns.presets:
        try:
            p = P.resolve(name)
        except P.PresetError as e:
            raise CliError(str(e), 2) from None
        ws = P.warnings(p)
        print(f"{name}: ok ({p.name}, hash {p.hash()})" + (f", {len(ws)} warning(s)" if ws else ""))
        for w in ws:
            print(f"  warning: {w}")
    return 0


def cmd_preset_diff(ns) -> int:
    from . import preset as P
    a, b = _load_preset(ns.a), _load_preset(ns.b)
    changes = P.diff(a, b)
    if ns.json:
        _print_json([{"key": k, "a": va, "b": vb} for k, va, vb in changes])
        return 0
    if not changes:
        print(f"{a.name} and {b.name} launch the same server")
        return 0
    width = max(len(k) for k, _, _ in changes)
    print(f"{'key':<{width}}  {a.name} -> {b.name}")
    for k, va, vb in changes:
        print(f"{k:<{width}}  {_fmt(va)} -> {_fmt(vb)}")
    return 0


def cmd_preset_lint(ns) -> int:
    from . import preset as P
    p = _load_preset(ns.preset)
    advice = P.lint(p)
    if not advice:
        print(f"{p.name}: no advice")
    for a in advice:
        print(f"- {a}")
    return 0


def cmd_preset_schema(ns) -> int:
    from . import preset as P
    _print_json(P.json_schema())
    return 0


# ---- entry ---------------------------------------------------------------------------------------

MAIN_USAGE = """tuitune [PRESET]                 interactive TUI for the preset's server
       tuitune demo                     the TUI against the built-in simulator
       tuitune --record OUT [PRESET]    headless capture of the live event stream
       tuitune COMMAND ...              (see the list below)"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tuitune", usage=MAIN_USAGE,
        description="Live-profile and tune speculative-decoding LLM servers (SGLang EAGLE-3) over SSH.",
        epilog="commands:\n" + "\n".join(f"  {n:<12} {h}" for n, (h, _) in COMMANDS.items())
               + "\n\nRun `tuitune COMMAND --help` for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tuitune {__version__}")
    return p


def build_command_parser(name: str) -> argparse.ArgumentParser:
    help_, fn = COMMANDS[name]
    p = argparse.ArgumentParser(prog=f"tuitune {name}", description=help_)
    fn(p)
    return p


def main(argv: list[str] | None = None) -> int:
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
    p.set_defaults(run=lambda ns: build_parser().print_help() or 0)
    return p


if __name__ == "__main__":
    sys.exit(main())
