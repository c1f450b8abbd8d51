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
