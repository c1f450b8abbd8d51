"""`tuitune completion`: the shell code for tab completion, and what it completes (presets, grid keys)."""

from __future__ import annotations

import argparse
import sys


def completion_args(p: argparse.ArgumentParser) -> None:
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


def add_completers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Preset names and grid keys completed wherever a command takes them (for argcomplete)."""
    for action in _walk_actions(parser):
        if action.dest in ("preset", "a", "b", "baseline", "presets", "target"):
            action.completer = _complete_presets
        elif action.dest == "grid":
            action.completer = _complete_grid
    return parser


def _walk_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _walk_actions(sub)


PARSERS = {"completion": completion_args}
