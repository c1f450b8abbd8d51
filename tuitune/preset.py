"""Presets: typed model of the YAML contract (DESIGN.md), load/save, launch command, diff, lint.

A preset renders to exactly one shell command (a three-line script: ``cd``, the backgrounded
launch, ``echo $!``) with every value quoted. Saving writes only what differs from defaults, in
a stable key order, so preset files diff cleanly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from . import engines, nccl, speculative
from .probe import REMOTE_DIR as PROBE_DIR

SIM_MODULE = "tuitune.sim"
FLAG_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ArgValue = bool | int | float | str
LOCAL_HOSTS = ("local", "localhost-local")


class PresetError(ValueError):
    """A preset that cannot be used; the message is one sentence naming file, key and value."""


def _no_control(v: str, what: str = "value") -> str:
    if "\n" in v or "\r" in v or "\x00" in v:
        raise ValueError(f"{what} {v!r} holds a newline or NUL byte, which cannot be passed safely")
    return v


def _env_text(v: Any) -> Any:
    """YAML numbers and booleans in ``env`` as the strings the process will see."""
    if not isinstance(v, dict):
        return v
    out = {}
    for k, val in v.items():
        if isinstance(val, bool):
            val = "1" if val else "0"
        elif isinstance(val, (int, float)):
            val = str(val)
        out[k] = val
    return out


def _env_checked(v: dict[str, str]) -> dict[str, str]:
    for k, val in v.items():
        if not ENV_RE.match(k):
            raise ValueError(f"{k!r} is not an environment variable name")
        _no_control(val, k)
        errors, _ = nccl.check(k, val)
        if errors:
            raise ValueError(f"{k}: {errors[0]}")
    errors, _ = nccl.check_env(v)
    if errors:
        raise ValueError(errors[0])
    return v


# A process environment: YAML numbers/booleans read as strings, NCCL variables checked.
Env = Annotated[dict[str, str], BeforeValidator(_env_text), AfterValidator(_env_checked)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class NodeServer(_Model):
    """What may differ on one node of a multi-node server (default: the preset's ``server``)."""
    python: str | None = None
    workdir: str | None = None
    log: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)

    @field_validator("python", "workdir", "log")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v)


class Node(_Model):
    """One machine of a multi-node server: an SSH target plus its own additions."""
    host: str
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    addr: str | None = None  # how the other nodes reach this one (node 0: --dist-init-addr)
    env: Env = Field(default_factory=dict)
    server: NodeServer = Field(default_factory=NodeServer)

    @field_validator("host", "user", "identity_file", "known_hosts", "addr")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v)


class Target(_Model):
    host: str = "local"
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    nodes: list[Node] | None = None  # a multi-node server: first = rank 0 (serves HTTP)

    @field_validator("host", "user", "identity_file", "known_hosts")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: list[Node] | None) -> list[Node] | None:
        if v is not None and len(v) < 2:
            raise ValueError("a multi-node server needs at least two nodes (use target.host for one)")
        if v and v[0].server.model_dump(exclude_none=True):
            # rank 0 is the server the rest of tuitune talks to (health, bench, tail): one place
            raise ValueError("node 0 serves HTTP: its python, workdir, log and port are server's own; "
                             "only the other nodes take target.nodes[i].server")
        return v

    @model_validator(mode="after")
    def _one_form(self) -> "Target":
        if self.nodes and self.host != Target.model_fields["host"].default:
            raise ValueError("give either target.host or target.nodes, not both")
        return self

    def node_target(self, i: int) -> "Target":
        """Node ``i`` as a single-machine target; target's user/port/keys are the nodes' defaults."""
        n = self.nodes[i]
        keys = ("user", "port", "identity_file", "known_hosts")
        return Target(host=n.host, **{k: getattr(n, k) if getattr(n, k) is not None else getattr(self, k)
                                      for k in keys})

    @property
    def is_local(self) -> bool:
        return (self.nodes[0].host if self.nodes else self.host) in LOCAL_HOSTS

    def label(self) -> str:
        if self.nodes:
            return "+".join(self.node_target(i).label() for i in range(len(self.nodes)))
        if self.is_local:
            return "local"
        who = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{who}{self.host}{port}"


class Server(_Model):
    engine: Literal[engines.NAMES] = "sglang"  # type: ignore[valid-type]
    python: str | None = None  # default: this Python for tuitune.sim on local, else python3
    module: str = "sglang.launch_server"
    workdir: str | None = None
    log: str
    port: int = Field(default=30000, ge=1, le=65535)
    dist_init_port: int = Field(default=5000, ge=1, le=65535)  # node 0's, multi-node only
    args: dict[str, ArgValue] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _engine_defaults(cls, v: Any) -> Any:
        """module and port default to the engine's own (vLLM: its CLI module, port 8000)."""
        if isinstance(v, dict) and v.get("engine") in engines.ENGINES:
            e = engines.get(v["engine"])
            v = {"module": e.default_module, "port": e.default_port, **v}
        return v

    @field_validator("python", "module", "workdir", "log")
    @classmethod
    def _plain(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v)

    @field_validator("log", "workdir")
    @classmethod
    def _absolute(cls, v: str | None, info) -> str | None:
        # The log is written from the workdir and read (tail, stat) from the login directory: a
        # relative path would name two files, and one starting with "-" would read as an option.
        if v is None or v.startswith(("/", "~/")) or (v == "~" and info.field_name == "workdir"):
            return v
        raise ValueError(f"{v!r} is not an absolute path; start it with / or ~/")

    @field_validator("python")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("-")):
            raise ValueError(f"{v!r} is not a command or a path to one")
        return v

    @field_validator("module")
    @classmethod
    def _module(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", v):
            raise ValueError(f"{v!r} is not a Python module name")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict[str, ArgValue], info: ValidationInfo) -> dict[str, ArgValue]:
        reserved = engines.get(info.data.get("engine", "sglang")).reserved_args
        for k, val in v.items():
            if k.startswith("-"):
                raise ValueError(f"flag {k!r}: write it without the leading dashes")
            if not FLAG_RE.match(k):
                raise ValueError(f"flag {k!r} is not a flag name (lower-case letters, digits, dashes)")
            if k in reserved:
                raise ValueError(f"flag {k!r} is set by {reserved[k]}, not in server.args")
            if isinstance(val, str):
                _no_control(val, f"flag {k}")
        return v


class Speculative(_Model):
    algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] | None = None
    draft_model_path: str | None = None
    num_steps: int | None = Field(default=None, ge=1, le=64)
    eagle_topk: int | None = Field(default=None, ge=1, le=64)
    num_draft_tokens: int | None = Field(default=None, ge=2, le=1024)
    # SGLang's adaptive schedule (a JSON file on the target, e.g. from `tuitune advise --emit
    # sglang-adaptive`): rendered as --speculative-adaptive --speculative-adaptive-config PATH
    adaptive_config: str | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)  # vLLM
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1, le=1024)  # vLLM

    @field_validator("algorithm", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v  # vLLM's spelling (eagle3) reads as EAGLE3

    @model_validator(mode="after")
    def _rules(self) -> "Speculative":
        if self.draft_model_path is not None:
            _no_control(self.draft_model_path)
        r = self.resolved()
        if self.adaptive_config is not None:
            _no_control(self.adaptive_config, "adaptive_config")
            if r.algorithm not in ("EAGLE", "EAGLE3"):
                raise ValueError(f"adaptive_config works with EAGLE and EAGLE3 only in SGLang (algorithm is "
                                 f"{r.algorithm})")
            if r.eagle_topk not in (None, 1):
                raise ValueError(f"adaptive_config needs eagle_topk 1 (SGLang adapts chains only; got {r.eagle_topk})")
        return self

    def resolved(self) -> speculative.Resolved:
        if self.num_speculative_tokens is not None:  # vLLM's chain: K drafted, K + 1 verified
            return speculative.Resolved(self.algorithm, self.num_speculative_tokens, 1,
                                        self.num_speculative_tokens + 1)
        return speculative.resolve(self.algorithm, self.num_steps, self.eagle_topk,
                                   self.num_draft_tokens, self.draft_model_path)


class Bench(_Model):
    requests: int = Field(default=10, ge=1, le=100000)
    warmup: int = Field(default=2, ge=0, le=1000)
    max_tokens: int = Field(default=500, ge=2, le=1_000_000)
    concurrency: int = Field(default=1, ge=1, le=1024)
    api: Literal["native", "openai"] = "native"


class Telemetry(_Model):
    """GPU telemetry (tuitune.telemetry): what stands in for ``nvidia-smi`` and how often it samples."""
    command: str | None = None  # default nvidia-smi; {python} and {port} = server.python and server.port
    period_ms: int = Field(default=500, ge=100, le=60000)
    record_every_s: float = Field(default=1.0, ge=0.0, le=3600.0)  # captures keep a tick this often
    enabled: bool = True

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is None:
            return v
        _no_control(v, "command")
        try:
            words = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"command {v!r} is not a list of shell words ({e})") from None
        if not words:
            raise ValueError("command is empty (leave the key out for nvidia-smi)")
        return v


class Preset(_Model):
    name: str
    description: str | None = None
    target: Target = Field(default_factory=Target)
    server: Server
    speculative: Speculative | None = None
    env: Env = Field(default_factory=dict)
    profile: bool = False
    bench: Bench = Field(default_factory=Bench)
    telemetry: Telemetry = Field(default_factory=Telemetry)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError(f"{v!r} is not a preset name (letters, digits, . _ -)")
        return v

    @field_validator("target", mode="before")
    @classmethod
    def _target_shorthand(cls, v: Any) -> Any:
        return {"host": v} if isinstance(v, str) else v

    @field_validator("speculative", mode="before")
    @classmethod
    def _no_algorithm(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("algorithm") is None and not any(
                v.get(k) is not None for k in ("num_steps", "eagle_topk", "num_draft_tokens", "adaptive_config")):
            return None
        return v

    @model_validator(mode="after")
    def _engine_rules(self) -> "Preset":
        self.engine.validate(self)
        want = self.engine.default_bench_api()
        if "api" not in self.bench.model_fields_set and self.bench.api != want:
            self.bench.api = want  # the engine's API unless the preset picks one
        elif self.bench.api == "native" and want != "native":
            raise ValueError(f"bench.api: {self.engine.label} serves only the OpenAI API; set bench.api: openai")
        return self

    @model_validator(mode="after")
    def _nodes_apart(self) -> "Preset":
        """SGLang's multi-node only; two nodes on one machine (local trials) need their own port and log."""
        if not self.is_multinode:
            return self
        if self.server.engine != "sglang":
            raise ValueError(f"target.nodes: multi-node servers are SGLang's (--nnodes); {self.engine.label} "
                             "spreads over machines through Ray, which tuitune does not drive")
        seen: dict[tuple, int] = {}
        for i, n in enumerate(self.node_presets()):
            host = n.target.label()
            for what, key in (("server.port", n.server.port), ("server.log", n.server.log)):
                j = seen.setdefault((host, what, key), i)
                if j != i:
                    raise ValueError(f"target.nodes: nodes {j} and {i} both use {what} {key} on {host}; "
                                     f"give node {i} its own (target.nodes[{i}].server)")
        head = self.node_presets()[0]
        if head.server.port == self.server.dist_init_port:
            raise ValueError(f"server.dist_init_port {self.server.dist_init_port} is node 0's HTTP port too")
        return self

    # ---- derived ------------------------------------------------------------------------
    @property
    def engine(self) -> engines.Engine:
        return engines.get(self.server.engine)

    @property
    def is_multinode(self) -> bool:
        return bool(self.target.nodes)

    def dist_init_addr(self) -> str:
        """Where every node meets node 0 at start-up: its ``addr`` (default its host), the port."""
        head = self.target.nodes[0]
        host = head.addr or ("127.0.0.1" if head.host in LOCAL_HOSTS else head.host)
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self.server.dist_init_port}"

    def node_presets(self) -> list["Preset"]:
        """One single-machine preset per node (all of them are the server): that node's target,
        ``server`` with its overrides, env = the preset's plus the node's, and SGLang's
        ``--nnodes``/``--node-rank``/``--dist-init-addr``. A one-machine preset is its own list."""
        if not self.is_multinode:
            return [self]
        nodes = self.target.nodes
        out = []
        for i, n in enumerate(nodes):
            over = {k: v for k, v in n.server.model_dump().items() if v is not None}
            args = {**self.server.args, "nnodes": len(nodes), "node-rank": i,
                    "dist-init-addr": self.dist_init_addr()}
            # model_copy skips validation: these flags are reserved for exactly this
            server = self.server.model_copy(update={**over, "args": args})
            out.append(self.model_copy(update={"name": f"{self.name}.node{i}", "server": server,
                                               "target": self.target.node_target(i),
                                               "env": {**self.env, **n.env}}))
        return out

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None and self.speculative.algorithm is not None

    def python(self) -> str:
        if self.server.python:
            return self.server.python
        if self.server.module == SIM_MODULE and self.target.is_local:
            return sys.executable
        return "python3"

    def launch_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.profile:
            env["EAGLE3_PROFILE"] = "1"
        return env

    @property
    def uses_probe(self) -> bool:
        """A real SGLang server needs tuitune's probe for profile lines (the simulator prints its own)."""
        return self.profile and self.server.module != SIM_MODULE

    def flags(self) -> list[str]:
        """The server's argv after ``-m MODULE`` (the simulator is told which engine to play)."""
        return self._sim_prefix() + self.engine.launch_args(self)

    def help_args(self) -> list[str]:
        """argv after ``-m MODULE`` that lists every flag the server takes."""
        return self._sim_prefix() + self.engine.help_args(self)

    def _sim_prefix(self) -> list[str]:
        dialect = self.engine.sim_dialect if self.server.module == SIM_MODULE else None
        return ["--sim-engine", dialect] if dialect else []

    def flag_names(self) -> list[str]:
        return [f for f in self.flags() if f.startswith("--")]

    def hash(self) -> str:
        """Identity of what is launched (server, speculative, environment, profile)."""
        if self.is_multinode:
            key = [n.hash() for n in self.node_presets()]
            return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
        key = {"python": self.python(), "module": self.server.module, "argv": self.flags(),
               "env": dict(sorted(self.launch_env().items()))}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def tp_size(self) -> int:
        for k in ("tp-size", "tensor-parallel-size", "tp"):
            v = self.server.args.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return 1


# ---- shell rendering ---------------------------------------------------------------------------


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
    parts = ["env", "--"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
    if preset.uses_probe:  # the probe's sitecustomize first on the path, any existing path kept
        parts.append(f'PYTHONPATH="$HOME/{PROBE_DIR[2:]}${{PYTHONPATH:+:$PYTHONPATH}}"')
    parts += [shell_path(preset.python()), "-m", shlex.quote(preset.server.module)]
    parts += [shlex.quote(a) for a in preset.flags()]
    return " ".join(parts)


def launch_command(preset: Preset, extra_env: dict[str, str] | None = None) -> str:
    """The whole launch script: cd, backgrounded server in its own session, its PID."""
    workdir = preset.server.workdir or "~"
    return (f"cd -- {shell_path(workdir)} || exit 1\n"
            f"setsid nohup {server_argv(preset, extra_env)} >{shell_path(preset.server.log)} 2>&1 "
            f"</dev/null &\n"
            f"echo $!")


def launch_script(preset: Preset) -> str:
    """What ``preset show --command`` prints: the launch command, or every node's in turn."""
    if not preset.is_multinode:
        return launch_command(preset)
    return "\n\n".join(f"# node {i} on {n.target.label()}{' (rank 0, serves HTTP)' if i == 0 else ''}\n"
                       f"{launch_command(n)}" for i, n in enumerate(preset.node_presets()))


# ---- load / save -------------------------------------------------------------------------------


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if not (isinstance(p, str) and p.startswith("function-")))


_UNION_MEMBERS = ("bool", "int", "float", "str")  # pydantic names the member of ArgValue that failed


def _yaml_type(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "text", list: "a list",
            dict: "a mapping", type(None): "null"}.get(type(v), type(v).__name__)


def _format_error(source: str, err: ValidationError) -> str:
    e = err.errors()[0]
    parts = e["loc"]
    if len(parts) == 4 and parts[:2] == ("server", "args") and parts[3] in _UNION_MEMBERS:
        # a flag value that is none of bool | int | float | str: say so, not "should be a valid boolean"
        return (f"{source}: server.args.{parts[2]}: expected true/false, a number or text, "
                f"not {_yaml_type(e.get('input'))}")
    loc = _loc(parts)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] in ("model_type", "dict_type"):
        return f"{source}: {loc}: expected a mapping (a YAML section of keys), not {_yaml_type(e.get('input'))}"
    if e["type"] == "extra_forbidden":
        return f"{source}: {loc}: unknown key (allowed keys are listed by `tuitune preset schema`)"
    if e["type"] == "missing":
        return f"{source}: {loc}: required key is missing"
    if loc == "env" and ": " in msg:
        key, msg = msg.split(": ", 1)
        loc = f"env.{key}"
    inp = e.get("input")
    shown = "" if isinstance(inp, (dict, list)) or "is not" in msg or "holds" in msg else f"{inp!r}: "
    return f"{source}: {loc + ': ' if loc else ''}{shown}{msg}"


def from_dict(data: Any, source: str = "<preset>") -> Preset:
    if not isinstance(data, dict):
        raise PresetError(f"{source}: a preset is a YAML mapping (got {type(data).__name__})")
    try:
        return Preset.model_validate(data)
    except ValidationError as e:
        raise PresetError(_format_error(source, e)) from None
    except RecursionError:
        raise PresetError(f"{source}: nested too deeply to be a preset") from None


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} appears twice (lines {first} and {second}); keep one")


class _StrictLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error (PyYAML keeps the
    last one silently: a preset that sets a variable twice would run with the second value)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark.line + 1)
                except TypeError:  # an unhashable key: construct_mapping says so below
                    continue
                if first != key_node.start_mark.line + 1:
                    raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep)


def loads(text: str, source: str = "<preset>") -> Preset:
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _DuplicateKey as e:
        raise PresetError(f"{source}: {e}") from None
    except RecursionError:
        raise PresetError(f"{source}: YAML nested too deeply to be a preset") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PresetError(f"{source}: YAML syntax error{where}: {problem}") from None
    return from_dict(data, source)


def load(path: str | Path) -> Preset:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PresetError(f"{path}: no such preset file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PresetError(f"{path}: cannot read it ({e.__class__.__name__}: {e})") from None
    return loads(text, str(path))


def to_dict(preset: Preset) -> dict:
    """Minimal form: defaults left out, ``target: local`` shorthand, field order kept."""
    d = preset.model_dump(exclude_defaults=True, exclude_none=True)
    if preset.target.is_local and set(d.get("target", {})) <= {"host"}:
        d["target"] = "local"
    engine = preset.engine
    for key, default in (("module", engine.default_module), ("port", engine.default_port)):
        if d["server"].get(key) == default:  # the engine's default (SGLang's are the fields' own)
            d["server"].pop(key)
    if d.get("bench", {}).get("api") == engine.default_bench_api():
        d["bench"].pop("api")
        if not d["bench"]:
            d.pop("bench")
    if "env" in d:  # numbers read back as numbers: 16777216, not '16777216'
        d["env"] = {k: int(v) if re.fullmatch(r"-?[1-9]\d*|0", v) else v for k, v in d["env"].items()}
    order = ["name", "description", "target", "server", "speculative", "env", "profile", "bench", "telemetry"]
    return {k: d[k] for k in order if k in d}


def dumps(preset: Preset) -> str:
    return yaml.safe_dump(to_dict(preset), sort_keys=False, allow_unicode=True, width=100)


def save(preset: Preset, path: str | Path) -> Path:
    """Write atomically; a preset that holds a secret (a token, a key) is mode 0600."""
    from .redact import has_secret
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    secret = has_secret(preset)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o666)
    if secret:
        os.fchmod(fd, 0o600)  # a .tmp left by an interrupted save may be older and wider
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(dumps(preset))
    os.replace(tmp, path)
    return path


def _section(annotation: Any) -> Any:
    """The model a field holds (``Speculative | None`` -> Speculative), ``dict`` for env and
    server.args (any name, one level), or None for a plain value."""
    import typing
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
        if t is dict or typing.get_origin(t) is dict:
            return dict
    return None


def check_key(key: str) -> None:
    """Raise PresetError unless ``key`` is a dotted path a preset has (``server.args.tp-size``,
    ``env.NCCL_PROTO``, ``speculative.num_steps``): --grid and edits name keys this way."""
    node: Any = Preset
    parts = key.split(".")
    for i, part in enumerate(parts):
        if node is None or node is dict and i < len(parts) - 1:
            raise PresetError(f"{key}: {'.'.join(parts[:i + (node is dict)])} is a value, not a section")
        if node is dict:
            return
        field = node.model_fields.get(part)
        if field is None or not part:
            raise PresetError(f"{key}: unknown key {'.'.join(parts[:i + 1])} "
                              f"(allowed keys are listed by `tuitune preset schema`)")
        node = _section(field.annotation)


def with_changes(preset: Preset, changes: dict[str, Any]) -> Preset:
    """A copy with dotted-path changes applied (``env.NCCL_PROTO``, ``speculative.num_steps``,
    ``server.args.tp-size``); the value ``None`` removes a key. Validated like a loaded file."""
    data = preset.model_dump(exclude_none=False)
    for key, value in changes.items():
        check_key(key)
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if node.get(p) is None:
                node[p] = {}
            node = node[p]
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return from_dict(data, f"{preset.name} (edited)")


# ---- resolved view, diff, lint -----------------------------------------------------------------


def flatten(preset: Preset) -> dict[str, Any]:
    """Dotted keys of the resolved preset (derived values filled in)."""
    out: dict[str, Any] = {"target": preset.target.label(), "server.engine": preset.server.engine,
                           "server.python": preset.python(),
                           "server.module": preset.server.module,
                           "server.workdir": preset.server.workdir or "~",
                           "server.log": preset.server.log, "server.port": preset.server.port}
    if preset.is_multinode:
        out["server.dist_init_port"] = preset.server.dist_init_port
        for i, (node, n) in enumerate(zip(preset.target.nodes, preset.node_presets())):
            out[f"target.nodes.{i}"] = n.target.label()
            for k, v in node.server.model_dump(exclude_none=True).items():
                out[f"target.nodes.{i}.server.{k}"] = v
            for k, v in node.env.items():
                out[f"target.nodes.{i}.env.{k}"] = v
    for k, v in preset.server.args.items():
        out[f"server.args.{k}"] = v
    if preset.is_speculative:
        out.update(preset.engine.speculative_view(preset))
    else:
        out["speculative.algorithm"] = None
    for k, v in preset.env.items():
        out[f"env.{k}"] = v
    out["profile"] = preset.profile
    for k, v in preset.bench.model_dump().items():
        out[f"bench.{k}"] = v
    return out


def derived_keys(preset: Preset) -> set[str]:
    keys = set()
    if preset.is_speculative:
        keys |= {f"speculative.{k}" for k in preset.speculative.resolved().derived}
    if not preset.server.python:
        keys.add("server.python")
    return keys


def diff(a: Preset, b: Preset, include_bench: bool = True) -> list[tuple[str, Any, Any]]:
    """Changed keys only: (key, value in a or None when unset, value in b or None)."""
    fa, fb = flatten(a), flatten(b)
    keys = list(dict.fromkeys([*fa, *fb]))
    out = []
    for k in keys:
        if not include_bench and k.startswith("bench."):
            continue
        if fa.get(k) != fb.get(k):
            out.append((k, fa.get(k), fb.get(k)))
    return out


def warnings(preset: Preset) -> list[str]:
    """Suspicious settings: each a sentence starting with the key."""
    out = []
    for k, v in preset.env.items():
        for w in nccl.check(k, v)[1]:
            out.append(f"env.{k}: {w}")
    for i, node in enumerate(preset.target.nodes or []):
        for k, v in node.env.items():
            for w in nccl.check(k, v)[1]:
                out.append(f"target.nodes.{i}.env.{k}: {w}")
            if k.startswith("NCCL_") and not nccl.is_network_var(k) and k not in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"):
                out.append(f"target.nodes.{i}.env.{k}: every rank must use the same {k}; set it in env "
                           "for all nodes (per-node env is for the machine's network: interfaces, HCAs)")
    for n in preset.node_presets():
        where = f"{n.name.rsplit('.', 1)[1]} env" if preset.is_multinode else "env"
        out += [f"{where}: {w}" for w in nccl.check_env(n.env)[1]]
    if preset.is_speculative:
        for s in preset.speculative.resolved().adjusted:
            out.append(f"speculative: {s}")
    return out


def file_warnings(path: Path, preset: Preset) -> list[str]:
    """A preset file holding a secret (a token, a key) that other users can read."""
    from .redact import has_secret
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return []
    if not has_secret(preset) or not mode & 0o077:
        return []
    return [f"{path} holds a secret and other users can read it (mode {mode:o}); chmod 600 it"]


def lint(preset: Preset) -> list[str]:
    """Cross-setting advice, beyond what validation checks."""
    advice = warnings(preset)
    custom_ar = not preset.server.args.get("disable-custom-all-reduce", False)
    ar_vars = [k for k in preset.env if nccl.is_all_reduce_var(k)]
    if ar_vars and custom_ar and preset.tp_size() > 1:
        advice.append(f"env: {', '.join(ar_vars)} tune NCCL all-reduce, but custom all-reduce is on: "
                      "on NVLink boxes it serves decode all-reduces and these may not apply "
                      "(set server.args.disable-custom-all-reduce: true to measure NCCL)")
    algo = preset.env.get("NCCL_ALGO", "")
    if "nvlstree" in algo.lower() and not algo.startswith("^"):
        advice.append("env.NCCL_ALGO: NVLSTree needs several nodes; on a single node AllReduce is "
                      "left with no algorithm")
    if preset.profile:
        advice.append("profile: the probe is on; benchmark figures include its overhead "
                      "(small with sync=event), keep it the same on both sides of an A/B")
    if preset.env.get("NCCL_DEBUG", "").upper() in ("INFO", "TRACE"):
        advice.append("env.NCCL_DEBUG: INFO/TRACE logging slows start-up; use it to confirm settings, "
                      "not while benchmarking")
    mem = preset.server.args.get("mem-fraction-static")
    if isinstance(mem, (int, float)) and not isinstance(mem, bool) and mem > 0.95:
        advice.append(f"server.args.mem-fraction-static: {mem} leaves almost no memory for "
                      "activations and CUDA graphs; start-up will likely run out of memory")
    return advice + preset.engine.lint(preset)


# ---- finding presets ---------------------------------------------------------------------------


def shipped_dir() -> Path:
    """An installed package holds the presets as tuitune/presets; a source checkout at the top level."""
    here = Path(__file__).resolve().parent
    installed = here / "presets"
    return installed if installed.is_dir() else here.parent / "presets"


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "tuitune" / "presets"


def find(name_or_path: str) -> Path:
    """A preset file from a path or a name in the user's or the shipped directory."""
    p = Path(name_or_path).expanduser()
    if p.suffix in (".yaml", ".yml") and p.exists() or p.is_file():
        return p
    for d in (user_dir(), shipped_dir()):
        for ext in (".yaml", ".yml"):
            cand = d / f"{name_or_path}{ext}"
            if cand.is_file():
                return cand
    raise PresetError(f"{name_or_path}: no such preset file, and no preset of that name in "
                      f"{user_dir()} or {shipped_dir()} (see `tuitune preset list`)")


def resolve(name_or_path: str) -> Preset:
    return load(find(name_or_path))


def listing() -> list[tuple[str, Path, str, str]]:
    """(origin, path, name, description or error) of every preset in the user's and the shipped directory."""
    out = []
    for origin, d in (("user", user_dir()), ("shipped", shipped_dir())):
        if not d.is_dir():
            continue
        for path in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
            try:
                p = load(path)
                out.append((origin, path, p.name, p.description or ""))
            except PresetError as e:
                out.append((origin, path, "(invalid)", str(e)))
    return out


def json_schema() -> dict:
    schema = Preset.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tuitune preset"
    return schema
