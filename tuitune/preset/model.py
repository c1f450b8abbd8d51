"""The preset's typed model: the YAML contract of DESIGN.md as pydantic models, with the checks
that make a bad file a one-sentence error."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from tuitune import engines
from tuitune.base.errors import TuituneError
from tuitune.engines.base import Resolved
from tuitune.preset import nccl

SIM_MODULE = "tuitune.sim"
_DSD = engines.get("vllm")  # speculative.dynamic_schedule is vLLM's schedule (its rules and file format)
FLAG_RE = re.compile(r"[a-z0-9][a-z0-9-]*\Z")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
ArgValue = bool | int | float | str
LOCAL_HOSTS = ("local", "localhost-local")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a preset's name


class PresetError(TuituneError, ValueError):
    """A preset that cannot be used; the message is one sentence naming file, key and value."""

    code = 2


def _no_control(v: str, what: str = "value") -> str:
    if "\n" in v or "\r" in v or "\x00" in v:
        raise ValueError(f"{what} {v!r} holds a newline or NUL byte, which cannot be passed safely")
    return v


def _absolute_path(v: str, key: str) -> str:
    """A path tuitune reads on this machine (a schedule, a prompt file): plain, and absolute or ~/."""
    _no_control(v, key)
    if not v.startswith(("/", "~/")):
        raise ValueError(f"{v!r} is not an absolute path; start it with / or ~/")
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
            raise ValueError(
                "node 0 serves HTTP: its python, workdir, log and port are server's own; "
                "only the other nodes take target.nodes[i].server"
            )
        return v

    @model_validator(mode="after")
    def _one_form(self) -> Target:
        if self.nodes and self.host != Target.model_fields["host"].default:
            raise ValueError("give either target.host or target.nodes, not both")
        return self

    def node_target(self, i: int) -> Target:
        """Node ``i`` as a single-machine target; target's user/port/keys are the nodes' defaults."""
        if not self.nodes:
            raise ValueError(f"target {self.host} is one machine: it has no node {i}")
        n = self.nodes[i]
        keys = ("user", "port", "identity_file", "known_hosts")
        return Target(
            host=n.host, **{k: getattr(n, k) if getattr(n, k) is not None else getattr(self, k) for k in keys}
        )

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
    algorithm: Literal["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "SUFFIX"] | None = None
    draft_model_path: str | None = None
    num_steps: int | None = Field(default=None, ge=1, le=64)
    eagle_topk: int | None = Field(default=None, ge=1, le=64)
    num_draft_tokens: int | None = Field(default=None, ge=2, le=1024)
    # SGLang's adaptive schedule (a JSON file on the target, e.g. from `tuitune advise --emit
    # sglang-adaptive`): rendered as --speculative-adaptive --speculative-adaptive-config PATH
    adaptive_config: str | None = None
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)  # vLLM
    # vLLM's dynamic schedule (K by batch size): [[start, end, K], ...] inline, or the path (on this
    # machine) of a file `tuitune advise --emit vllm-dsd` wrote; read when the preset loads and
    # rendered inside --speculative-config as num_speculative_tokens_per_batch_size
    dynamic_schedule: str | list | None = None
    _schedule: list[tuple[int, int, int]] | None = PrivateAttr(default=None)
    draft_tensor_parallel_size: int | None = Field(default=None, ge=1, le=1024)  # vLLM
    # vLLM's ngram (prompt lookup): the n-gram sizes matched against the request's tokens
    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    # SGLang's NGRAM: the draft tree's breadth bounds and the trie's depth
    ngram_min_bfs_breadth: int | None = Field(default=None, ge=1, le=64)
    ngram_max_bfs_breadth: int | None = Field(default=None, ge=1, le=64)
    ngram_max_trie_depth: int | None = Field(default=None, ge=1, le=1024)
    # the switch (docs/switch.md): the step counts (SGLang steps, vLLM K) this launch is prepared to
    # hold while it runs (`tuitune hold`), through the engine's own switching code; the engine renders
    # what that needs (vLLM: the largest K and a schedule; SGLang: its adaptive config must hold them)
    switch: list[int] | None = None

    @field_validator("switch")
    @classmethod
    def _switch(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("switch: list the step counts to hold (e.g. [1, 2, 3]), or leave the key out")
        if any(k < 0 or k > 64 for k in v):
            raise ValueError(f"switch: step counts run from 0 to 64 (got {v})")
        return sorted(set(v))

    @field_validator("algorithm", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v  # vLLM's spelling (eagle3) reads as EAGLE3

    @field_validator("dynamic_schedule", mode="before")
    @classmethod
    def _schedule_shape(cls, v: Any) -> Any:
        if v is None or isinstance(v, list):
            return v
        if not isinstance(v, str):
            raise ValueError(
                f"expected a list of [start, end, K] ranges or the path of a schedule file, not {type(v).__name__}"
            )
        return _absolute_path(v, "dynamic_schedule")

    @field_validator("dynamic_schedule", mode="after")
    @classmethod
    def _schedule_checked(cls, v: str | list | None) -> str | list | None:
        if v is not None:  # vLLM's rules (the K bound is the engine's check: it needs the preset)
            _DSD.read_schedule(v) if isinstance(v, str) else _DSD.check_schedule_table(v)
        return v

    @model_validator(mode="after")
    def _schedule_rules(self) -> Speculative:
        v = self.dynamic_schedule
        try:  # a file is read once, here: what renders is what was checked
            self._schedule = (
                None if v is None else _DSD.read_schedule(v) if isinstance(v, str) else _DSD.check_schedule_table(v)
            )
        except ValueError as e:
            raise ValueError(f"dynamic_schedule: {e}") from None
        if v is not None and self.algorithm is None:
            raise ValueError("dynamic_schedule needs a speculative algorithm (it schedules its K by batch size)")
        return self

    def schedule(self) -> list[tuple[int, int, int]] | None:
        """The dynamic schedule's ranges (start, end, K) as checked when the preset loaded (its
        file read then); None when there is none."""
        return self._schedule

    @model_validator(mode="after")
    def _rules(self) -> Speculative:
        if self.draft_model_path is not None:
            _no_control(self.draft_model_path)
        if self.algorithm in engines.MODEL_FREE and self.draft_model_path is not None:
            raise ValueError(
                f"draft_model_path: {self.algorithm} drafts from the request's own tokens, with no draft model; remove it"
            )
        if self.algorithm != "NGRAM":
            for key in ("prompt_lookup_min", "prompt_lookup_max", *NGRAM_TREE_KEYS):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is an NGRAM setting (algorithm is {self.algorithm})")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"prompt_lookup_min {lo} is more than prompt_lookup_max {hi}")
        r = self.resolved()
        if self.adaptive_config is not None:
            _no_control(self.adaptive_config, "adaptive_config")
            if r.algorithm not in ("EAGLE", "EAGLE3"):
                raise ValueError(
                    f"adaptive_config works with EAGLE and EAGLE3 only in SGLang (algorithm is {r.algorithm})"
                )
            if r.eagle_topk not in (None, 1):
                raise ValueError(f"adaptive_config needs eagle_topk 1 (SGLang adapts chains only; got {r.eagle_topk})")
        if self.switch is not None and self.algorithm is None:
            raise ValueError("switch needs a speculative algorithm (it holds the step count of its drafts)")
        return self

    def resolved(self) -> Resolved:
        # the engine whose keys the section uses (vLLM's chain, suffix decoding), else SGLang's rules
        return engines.resolve(self)


NGRAM_TREE_KEYS = ("ngram_min_bfs_breadth", "ngram_max_bfs_breadth", "ngram_max_trie_depth")


class Bench(_Model):
    requests: int = Field(default=10, ge=1, le=100000)
    warmup: int = Field(default=2, ge=0, le=1000)
    max_tokens: int = Field(default=500, ge=2, le=1_000_000)
    concurrency: int = Field(default=1, ge=1, le=1024)
    api: Literal["native", "openai", "chat"] = "native"
    # the operator's own prompts: a file on this machine (text, JSONL, ShareGPT JSON;
    # measure/workload.py), read when a benchmark runs; unset: tuitune's built-in twelve
    prompts: str | None = None

    @field_validator("prompts")
    @classmethod
    def _prompts_path(cls, v: str | None) -> str | None:
        return None if v is None else _absolute_path(v, "prompts")


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
    # read off a running server (preset/discovered.py), not from a file: the flags that found it
    # (``--port 30000 --host gpu-box``), which say how to write it down before adopting it
    _discovered: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a preset name (letters, digits, . _ -)")
        return v

    @field_validator("target", mode="before")
    @classmethod
    def _target_shorthand(cls, v: Any) -> Any:
        return {"host": v} if isinstance(v, str) else v

    @field_validator("speculative", mode="before")
    @classmethod
    def _no_algorithm(cls, v: Any) -> Any:
        if (
            isinstance(v, dict)
            and v.get("algorithm") is None
            and not any(
                v.get(k) is not None
                for k in (
                    "num_steps",
                    "eagle_topk",
                    "num_draft_tokens",
                    "adaptive_config",
                    "dynamic_schedule",
                    "switch",
                )
            )
        ):
            return None
        return v

    @model_validator(mode="after")
    def _engine_rules(self) -> Preset:
        self.engine.validate(self)
        from tuitune.preset.render import carry_problem  # (render builds on this module)

        if why := carry_problem(self):
            raise ValueError(why)
        want = self.engine.default_bench_api()
        if "api" not in self.bench.model_fields_set and self.bench.api != want:
            self.bench.api = want  # the engine's API unless the preset picks one
        elif self.bench.api == "native" and want != "native":
            raise ValueError(f"bench.api: {self.engine.label} serves only the OpenAI API; set bench.api: openai")
        return self

    @model_validator(mode="after")
    def _nodes_apart(self) -> Preset:
        """SGLang's multi-node only; two nodes on one machine (local trials) need their own port and log."""
        if not self.is_multinode:
            return self
        if self.server.engine != "sglang":
            raise ValueError(
                f"target.nodes: multi-node servers are SGLang's (--nnodes); {self.engine.label} "
                "spreads over machines through Ray, which tuitune does not drive"
            )
        seen: dict[tuple, int] = {}
        for i, n in enumerate(self.node_presets()):
            host = n.target.label()
            for what, key in (("server.port", n.server.port), ("server.log", n.server.log)):
                j = seen.setdefault((host, what, key), i)
                if j != i:
                    raise ValueError(
                        f"target.nodes: nodes {j} and {i} both use {what} {key} on {host}; "
                        f"give node {i} its own (target.nodes[{i}].server)"
                    )
        if self.speculative is not None and self.speculative.switch is not None:
            raise ValueError(
                "speculative.switch: every node of a multi-node server runs its own scheduler, and a step count "
                "held on one of them alone would part the ranks; switch a one-machine server, or relaunch"
            )
        head = self.node_presets()[0]
        if head.server.port == self.server.dist_init_port:
            raise ValueError(f"server.dist_init_port {self.server.dist_init_port} is node 0's HTTP port too")
        return self

    # ---- derived ------------------------------------------------------------------------
    @property
    def discovered(self) -> str | None:
        """The flags that read this preset off a running server (``--port 30000 --host gpu-box``),
        None for a preset from a file."""
        return self._discovered

    def adopt_hint(self) -> str:
        """The command(s), quoted, that make a server on this preset's port tuitune's."""
        if self._discovered is None:
            return f"`tuitune adopt {self.name}`"
        return f"`tuitune preset discover {self._discovered} --save`, then `tuitune adopt {self.name}`"

    @property
    def engine(self) -> engines.Engine:
        return engines.get(self.server.engine)

    @property
    def is_multinode(self) -> bool:
        return bool(self.target.nodes)

    def dist_init_addr(self) -> str:
        """Where every node meets node 0 at start-up: its ``addr`` (default its host), the port."""
        if not self.target.nodes:
            raise ValueError("only a multi-node server has a --dist-init-addr")
        head = self.target.nodes[0]
        host = head.addr or ("127.0.0.1" if head.host in LOCAL_HOSTS else head.host)
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{self.server.dist_init_port}"

    def node_presets(self) -> list[Preset]:
        """One single-machine preset per node (all of them are the server): that node's target,
        ``server`` with its overrides, env = the preset's plus the node's, and SGLang's
        ``--nnodes``/``--node-rank``/``--dist-init-addr``. A one-machine preset is its own list."""
        nodes = self.target.nodes
        if not nodes:  # (not is_multinode)
            return [self]
        out = []
        for i, n in enumerate(nodes):
            over = {k: v for k, v in n.server.model_dump().items() if v is not None}
            args = {**self.server.args, "nnodes": len(nodes), "node-rank": i, "dist-init-addr": self.dist_init_addr()}
            # model_copy skips validation: these flags are reserved for exactly this
            server = self.server.model_copy(update={**over, "args": args})
            out.append(
                self.model_copy(
                    update={
                        "name": f"{self.name}.node{i}",
                        "server": server,
                        "target": self.target.node_target(i),
                        "env": {**self.env, **n.env},
                    }
                )
            )
        return out

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None and self.speculative.algorithm is not None

    @property
    def switch_steps(self) -> list[int] | None:
        """The step counts a launch of this preset is prepared to hold (speculative.switch), or None."""
        s = self.speculative
        return list(s.switch) if s is not None and s.algorithm is not None and s.switch else None

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
            hashes = [n.hash() for n in self.node_presets()]
            return hashlib.sha256(json.dumps(hashes).encode()).hexdigest()[:12]
        key: dict[str, object] = {
            "python": self.python(),
            "module": self.server.module,
            "argv": self.flags(),
            "env": dict(sorted(self.launch_env().items())),
        }
        if self.switch_steps is not None:  # prepared to switch: the engine gets the switch's variables
            key["switch"] = self.switch_steps
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]

    def tp_size(self) -> int:
        for k in ("tp-size", "tensor-parallel-size", "tp"):
            v = self.server.args.get(k)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
        return 1
