"""Presets: the YAML contract of DESIGN.md as a typed model (``model``), the launch command it
renders to (``render``), files read and written (``io``), dotted keys and changes (``keys``), the
resolved view, diffs and lint (``lint``), and where presets are found (``find``).

The package's names are re-exported here: callers write ``from tuitune import preset as P`` and
``P.load(...)``; each name is defined once, in the module that owns it.
"""

from __future__ import annotations

from tuitune.preset.find import (
    find,
    json_schema,
    listing,
    resolve,
    shipped_dir,
    user_dir,
)
from tuitune.preset.io import (
    _UNION_MEMBERS,
    _DuplicateKey,
    _format_error,
    _loc,
    _StrictLoader,
    _yaml_type,
    dumps,
    from_dict,
    load,
    loads,
    save,
    to_dict,
)
from tuitune.preset.keys import (
    _section,
    check_key,
    with_changes,
)
from tuitune.preset.lint import (
    derived_keys,
    diff,
    file_warnings,
    flatten,
    lint,
    warnings,
)
from tuitune.preset.model import (
    ENV_RE,
    FLAG_RE,
    LOCAL_HOSTS,
    SIM_MODULE,
    ArgValue,
    Bench,
    Env,
    Node,
    NodeServer,
    Preset,
    PresetError,
    Server,
    Speculative,
    Target,
    Telemetry,
    _env_checked,
    _env_text,
    _Model,
    _no_control,
)
from tuitune.preset.render import (
    launch_command,
    launch_script,
    server_argv,
    shell_path,
)

__all__ = [
    "ArgValue",
    "Bench",
    "ENV_RE",
    "Env",
    "FLAG_RE",
    "LOCAL_HOSTS",
    "Node",
    "NodeServer",
    "Preset",
    "PresetError",
    "SIM_MODULE",
    "Server",
    "Speculative",
    "Target",
    "Telemetry",
    "_Model",
    "_env_checked",
    "_env_text",
    "_no_control",
    "launch_command",
    "launch_script",
    "server_argv",
    "shell_path",
    "_DuplicateKey",
    "_StrictLoader",
    "_UNION_MEMBERS",
    "_format_error",
    "_loc",
    "_yaml_type",
    "dumps",
    "from_dict",
    "load",
    "loads",
    "save",
    "to_dict",
    "_section",
    "check_key",
    "with_changes",
    "derived_keys",
    "diff",
    "file_warnings",
    "flatten",
    "lint",
    "warnings",
    "find",
    "json_schema",
    "listing",
    "resolve",
    "shipped_dir",
    "user_dir",
]
