"""A preset rendered as the shell command that launches its server: every value quoted."""

from __future__ import annotations

import shlex

from tuitune.preset.model import Preset
from tuitune.probe import REMOTE_DIR as PROBE_DIR


def shell_path(p: str) -> str:
    """Quote a path, keeping a leading ``~`` meaningful (it becomes ``"$HOME"``)."""
    if p == "~":
        return '"$HOME"'
    if p.startswith("~/"):
        return '"$HOME"/' + shlex.quote(p[2:])
    return shlex.quote(p)


def server_argv(preset: Preset, extra_env: dict[str, str] | None = None) -> str:
    """``env K=V … PY -m MODULE --flags``, quoted, without redirections."""
    env = dict(preset.launch_env())
    if extra_env:
        env.update(extra_env)
    # the probe's sitecustomize first on the path, before the preset's own PYTHONPATH (an engine's
    # custom code) or, when the preset sets none, before the one the server would inherit
    own = env.pop("PYTHONPATH", None) if preset.uses_probe else None
    parts = ["env", "--"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
    if preset.uses_probe and own is not None:
        parts.append(f'PYTHONPATH="$HOME/{PROBE_DIR[2:]}"' + (":" + shlex.quote(own) if own else ""))
    elif preset.uses_probe:
        parts.append(f'PYTHONPATH="$HOME/{PROBE_DIR[2:]}${{PYTHONPATH:+:$PYTHONPATH}}"')
    parts += [shell_path(preset.python()), "-m", shlex.quote(preset.server.module)]
    parts += [shlex.quote(a) for a in preset.flags()]
    return " ".join(parts)


def launch_command(preset: Preset, extra_env: dict[str, str] | None = None) -> str:
    """The whole launch script: cd, backgrounded server in its own session, its PID."""
    workdir = preset.server.workdir or "~"
    return (
        f"cd -- {shell_path(workdir)} || exit 1\n"
        f"setsid nohup {server_argv(preset, extra_env)} >{shell_path(preset.server.log)} 2>&1 "
        f"</dev/null &\n"
        f"echo $!"
    )


def launch_script(preset: Preset) -> str:
    """What ``preset show --command`` prints: the launch command, or every node's in turn."""
    if not preset.is_multinode:
        return launch_command(preset)
    return "\n\n".join(
        f"# node {i} on {n.target.label()}{' (rank 0, serves HTTP)' if i == 0 else ''}\n{launch_command(n)}"
        for i, n in enumerate(preset.node_presets())
    )


# What Linux lets one argument or environment entry be (MAX_ARG_STRLEN: 32 pages, 128 KiB, its NUL
# included), and so the longest command a shell may be handed as its one `-c` argument: locally
# (`bash -c`) as over SSH (the remote shell's `-c`). tuitune's own checks wrap a preset's values in
# a few kilobytes of script of their own (the preflight's python, the flags' cache): the launch
# command keeps that much under the limit.
MAX_ARG_STRLEN = 128 * 1024
WRAPPER_BYTES = 16 * 1024


def carry_problem(preset: Preset) -> str | None:
    """Why the target cannot be handed this preset's values (one sentence naming the key and the
    limit), or None. A value over the limit once ended the local launch in a traceback ("Argument
    list too long") and the SSH one in a reset connection (issue 42)."""
    limit = MAX_ARG_STRLEN - 1
    values: list[tuple[str, str]] = [(f"env.{k}", f"{k}={v}") for k, v in preset.env.items()]
    values += [(f"server.{k}", str(getattr(preset.server, k) or "")) for k in ("python", "module", "log", "workdir")]
    flags = preset.flags()
    for i, a in enumerate(flags):
        flag = a if a.startswith("--") else flags[i - 1] if i and flags[i - 1].startswith("--") else None
        name = flag.partition("=")[0].lstrip("-") if flag else None
        key = (
            f"argument {i + 1} of the server's command line"
            if name is None
            else f"speculative (--{name})"
            if name.startswith("speculative")
            else f"server.args.{name}"
        )
        values.append((key, a))
    for key, value in values:
        n = len(value.encode("utf-8", "surrogateescape"))
        if n > limit:
            return (
                f"{key}: {n} bytes, more than one argument may be on Linux ({limit} bytes, "
                f"MAX_ARG_STRLEN of 128 KiB); pass it another way (a file the server reads)"
            )
    most = MAX_ARG_STRLEN - WRAPPER_BYTES
    for node in preset.node_presets() if preset.is_multinode else [preset]:
        n = len(launch_command(node).encode("utf-8", "surrogateescape"))
        if n > most:
            return (
                f"the launch command is {n} bytes, more than a shell may be handed as one command on Linux "
                f"({most} bytes: MAX_ARG_STRLEN of 128 KiB, less {WRAPPER_BYTES // 1024} KiB for tuitune's "
                "checks); shorten the env or server.args values"
            )
    return None
