"""A preset read off a running server's process: what `tuitune --port P` / `--pid PID` and
`tuitune preset discover` build for a server someone started by hand, so that it can be watched
without writing a preset first.

The process's argv names the engine (``python -m sglang.launch_server …``, ``vllm serve …``,
``python -m tuitune.sim …``); the engine turns its own flags back into the preset's server
arguments and speculative section (``Engine.preset_data``, the inverse of ``launch_args``); the
environment gives the variables tuitune tunes and the engine's own, and whether the probe is on.
Built from the process, the preset shows no drift from it; what a preset cannot hold is left out
and said in a note.
"""

from __future__ import annotations

from tuitune import engines
from tuitune.engines.base import interpreter_split
from tuitune.preset.io import from_dict
from tuitune.preset.model import SIM_MODULE, Preset, PresetError
from tuitune.probe import REMOTE_DIR as PROBE_DIR

# environment variables a server's preset keeps beside the engine's own (Engine.env_prefixes):
# NCCL's (what tuitune tunes) and the other communication libraries', the devices, the Hub's and
# its tokenizers', torch's and the CPU thread pools' (and any *_THREADS); not the login's (HOME,
# PATH, SSH_*, …)
KEEP_ENV = (
    "NCCL_",
    "GLOO_",
    "NVSHMEM_",
    "UCX_",
    "CUDA_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "NUMBA_",
)


def _sim_engine(args: list[str]) -> tuple[engines.Engine, list[str]]:
    """The engine the simulator plays (``--sim-engine``), and its arguments without that flag."""
    dialect, rest, i = None, [], 0
    while i < len(args):
        if args[i] == "--sim-engine" and i + 1 < len(args):
            dialect, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--sim-engine="):
            dialect = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    for e in engines.ENGINES.values():
        if e.sim_dialect == dialect:
            return e, rest
    raise PresetError(f"the simulator plays an engine tuitune does not know (--sim-engine {dialect})")


def _engine_of(argv: list[str]) -> tuple[engines.Engine, str, list[str]]:
    """(engine, module, the server's own arguments) of a process's argv."""
    _, module, rest = interpreter_split(argv)
    if module == SIM_MODULE:
        e, rest = _sim_engine(rest)
        return e, SIM_MODULE, rest
    for e in engines.ENGINES.values():
        found = e.server_args(argv)
        if found is not None:
            return e, found[0], found[1]
    shown = " ".join(argv[:4])[:120]
    known = ", ".join(f"{e.label} ({e.modules[0]})" for e in engines.ENGINES.values())
    raise PresetError(f"the process runs `{shown}`, which is no server tuitune knows: {known}, or its simulator")


def _env(environ: dict[str, str], engine: engines.Engine) -> dict[str, str]:
    keep = KEEP_ENV + engine.env_prefixes
    env = {k: v for k, v in sorted(environ.items()) if (k.startswith(keep) or k.endswith("_THREADS")) and v}
    path = environ.get("PYTHONPATH")
    if path:  # the server's own, less the probe tuitune's launch (or its hint) put first
        parts = [p for p in path.split(":") if p and not p.rstrip("/").endswith(PROBE_DIR.removeprefix("~"))]
        if parts:
            env["PYTHONPATH"] = ":".join(parts)
    return env


def from_process(
    argv: list[str],
    environ: dict[str, str],
    *,
    name: str,
    target: str | dict,
    log: str,
    cwd: str | None = None,
    port: int | None = None,
    source: str = "the server",
) -> tuple[Preset, list[str]]:
    """The preset of the server a process runs, and notes (sentences) on what it leaves out.
    ``port``: the port it listens on, when known (else its flag's, else the engine's default).
    PresetError (one sentence) when the process is no server a preset can describe."""
    engine, module, args = _engine_of(argv)
    try:
        data = engine.preset_data(args)
    except ValueError as e:
        raise PresetError(f"{source}: {e}") from None
    python = interpreter_split(argv)[0]
    server: dict = {"engine": engine.name, "module": module, "log": log, "args": data["args"]}
    if python:
        server["python"] = python
    if cwd and cwd.startswith("/"):
        server["workdir"] = cwd  # a relative model path, or a schedule file, is read from there
    if port or data["port"]:
        server["port"] = port or data["port"]
    preset = {
        "name": name,
        "description": f"read off {source} (started by hand): watched read-only until `tuitune adopt`",
        "target": target,
        "server": server,
        "env": _env(environ, engine),
        "profile": environ.get("EAGLE3_PROFILE", "") not in ("", "0"),
    }
    if data["speculative"]:
        preset["speculative"] = data["speculative"]
    try:
        return from_dict(preset, source), list(data["notes"])
    except PresetError as e:
        raise PresetError(f"{source}'s flags make no valid preset: {e}") from None
