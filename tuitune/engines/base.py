"""What tuitune knows about one inference engine, behind one small interface.

An engine module is pure knowledge, no I/O: control, bench, the parser, the scraper, advise and
the TUI ask these questions and do the work themselves. Engine methods take the preset as an
argument (duck-typed: this layer sits below ``preset``).

A third engine is one new module in this folder (and its tests); it provides:

* a subclass of ``Engine`` below, filling in every attribute and method it documents: name and
  label, the server module and port, how a preset becomes the server's argv and how to ask the
  server for its flags, the ``server.args`` keys the preset sets elsewhere, the speculative
  algorithms it runs, validation and lint, the speculative configurations it can run (``space``)
  and how a preset asks for one, start-up phases, failure wording, the metric names of its
  ``/metrics`` page, its info endpoints, the flags the TUI offers for editing, its schedule
  format if it has one (``schedule``), and where the probe hooks in;
* its log grammar: ``Engine.log_prefix`` reads its logger's prefix (timestamp, rank), and
  ``Engine.rules`` are its lines: ``Rule(marker, parse, many)``, where ``parse(line, at)`` turns
  a line holding ``marker`` (first found at ``at``) into an event (``tuitune.base.events``) and
  never raises on any input, reading the prefix through ``tuitune.base.logline.prefix``, and the optional
  ``many(lines)`` does the same for many lines at once (equal results, faster);
* one entry in ``ENGINES`` (``engines/__init__.py``), which registers its prefix reader and adds
  its rules to the parser's dispatch, its error wording to the failure causes, its names to
  ``engines.NAMES`` (the preset's ``server.engine``, the command line's ``--engine``).

Also here: what all engines share (failure causes, the resolved speculative settings, the flag
record). The readers of log lines that every grammar uses (``Rule``, numbers as the fast path reads
them, ``name: value`` lines, the logger prefix with its memo) are no engine's: ``tuitune.base.logline``.

This package is the only door to engine knowledge: code outside ``tuitune.engines`` asks an engine
(``engines.get(name)``, ``Preset.engine``) through the methods below, never its module (a contract
in pyproject.toml keeps it so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from tuitune.base.logline import Rule, number

BenchApi = Literal["native", "openai", "chat"]  # SGLang's /generate, the OpenAI /v1/completions or its chat

# Failure causes the parser can tell apart, most telling first (control picks the first present).
CAUSE_ORDER = (
    "oom",
    "nccl",
    "bad_argument",
    "hub_unreachable",
    "model_not_found",
    "port_in_use",
    "engine_died",
    "init_failed",
    "exception",
    "traceback",
)
CAUSE_TEXT = {
    "oom": "out of memory",
    "nccl": "NCCL error",
    "bad_argument": "bad argument",
    "hub_unreachable": "the model is not a directory, and the Hub is unreachable",
    "model_not_found": "model not found",
    "port_in_use": "port in use",
    "engine_died": "an engine process died",
    "init_failed": "initialization failed",
    "exception": "exception",
    "traceback": "exception",
}
# Hugging Face's wording when a model path or id does not resolve (any engine loading through it)
HF_ERRORS = (
    ("is not a local folder and is not a valid model identifier", "model_not_found"),
    ("RepositoryNotFoundError", "model_not_found"),
    # a local path that does not exist reads as a malformed repo id (huggingface_hub's validator;
    # what vLLM 0.32's CPU build printed for a missing model directory)
    ("Repo id must be in the form", "model_not_found"),
    # a model that is no directory, fetched from a Hub that does not answer: the HTTP client's
    # connect error (httpx / httpcore: a name that does not resolve, a refused or silent host;
    # requests: its pool's), or huggingface_hub's and transformers' words for it
    ("ConnectError: ", "hub_unreachable"),
    ("ConnectTimeout: ", "hub_unreachable"),
    ("ConnectionError: HTTPSConnectionPool(", "hub_unreachable"),
    ("ConnectionError: HTTPConnectionPool(", "hub_unreachable"),
    ("We couldn't connect to '", "hub_unreachable"),
    ("LocalEntryNotFoundError", "hub_unreachable"),
    ("OfflineModeIsEnabled", "hub_unreachable"),
)
MAX_STEPS = 8  # the longest draft chain advise and tune consider


@dataclass(frozen=True, slots=True)
class Resolved:
    """A preset's speculative settings as the engine will run them."""

    algorithm: str | None
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    derived: tuple[str, ...] = ()  # names of values tuitune (or the engine) filled in
    adjusted: tuple[str, ...] = ()  # sentences: what the engine would silently change


class Flag(NamedTuple):
    """A server flag the TUI's config panel offers for editing (``server.args.<name>``)."""

    name: str
    label: str
    kind: str  # "int", "float" (a text box) or "bool" (a checkbox: set = bare flag, unset = omitted)


class LoggedRequest(NamedTuple):
    """One request as the server's own log names it (``Engine.request_reader``): what was asked,
    read back to replay it as a workload."""

    prompt: str
    max_tokens: int | None  # the output length it got (or asked for); None: the log does not say
    truncated: bool = False  # the log cut the prompt short: not that prompt


class Engine:
    name = ""
    label = ""  # as users write it: "SGLang", "vLLM"
    step_name = "steps"  # what the engine calls the step count the switch holds (vLLM: K)
    step_key = "speculative.num_steps"  # the preset key that sets it
    own_choice = "adaptive policy"  # what chooses the step count when nothing is held
    default_module = ""
    default_port = 0
    # server.args keys the preset sets elsewhere (flag -> preset key that owns it)
    reserved_args: dict[str, str] = {}
    # the speculative algorithms a preset may ask of this engine (preset spelling)
    algorithms: tuple[str, ...] = ()
    # (log text, start-up phase) in the order a start-up passes them
    phases: tuple[tuple[str, str], ...] = ()
    # a phase whose log text comes again names what it is the second time (SGLang's "Load weight begin"
    # comes once for the target, then once for the draft model)
    repeated_phases: dict[str, str] = {}
    # (text in a log line, failure cause) beyond what the parser already tells apart
    errors: tuple[tuple[str, str], ...] = ()
    # its log lines, tried in this order after the probe's EAGLE3_PROFILE line (see Rule)
    rules: tuple[Rule, ...] = ()
    # its /metrics page: counter names (as declared: the page adds "_total") and gauge names,
    # each -> the MetricsWindow field it feeds; per_position_metric: accepted tokens per draft
    # position (a counter labelled "position"), if any
    counters: dict[str, str] = {}
    gauges: dict[str, str] = {}
    per_position_metric: str | None = None
    # paths that answer JSON about the running server (version, internal state), asked in order
    info_paths: tuple[str, ...] = ()
    # server flags the TUI offers for editing
    editable_flags: tuple[Flag, ...] = ()
    # the name of the file format of its speculation schedule (``tuitune advise --emit``), if any
    schedule: str | None = None
    # the batch sizes a schedule of buckets is decided at (the keys of SGLang's adaptive config)
    schedule_buckets: tuple[int, ...] = ()
    # a schedule of batch-size ranges: the last range's end as it writes it (None: no such schedule)
    schedule_last_end: int | None = None
    # the speculative algorithms that draft with no draft model (from the request's own tokens)
    model_free: tuple[str, ...] = ()
    # the simulator's --sim-engine value when it plays this engine (None: its default dialect)
    sim_dialect: str | None = None
    # draft tree widths this engine runs (1 = a chain): the space advise and tune search
    topks: tuple[int, ...] = (1, 2, 4, 8)
    # the server.args key naming the model to serve (a path on the target or a hub id)
    model_arg = ""
    # how a process runs its server: ``python -m MODULE …`` for a module here, or a console script
    # of one of these names (what a hand-started server is recognised by)
    modules: tuple[str, ...] = ()
    scripts: tuple[str, ...] = ()
    # the prefixes of its own environment variables, kept in the preset of a server started by hand
    env_prefixes: tuple[str, ...] = ()

    # how to make its log name every request's prompt and output length, in one sentence (None: it cannot)
    request_logging: str | None = None

    def request_reader(self) -> Callable[[str], LoggedRequest | None] | None:
        """A reader of this engine's log lines, called on each line in order, giving each request the
        line (or lines) that complete it; None when the engine's log cannot name its requests."""
        return None

    @staticmethod
    def log_prefix(line: str, end: int) -> tuple[str | None, str | None] | None:
        """(timestamp, rank) of this engine's logger prefix in ``line[:end]``, or None when the
        line does not start (before ``end``) the way its logger writes. A pure function of
        ``line[:end]``."""
        return None

    def phase(self, line: str, seen: set[str]) -> str | None:
        """The start-up phase a log line begins (None: none), given the phases ``seen`` so far."""
        for needle, phase in self.phases:
            if needle in line:
                return self.repeated_phases.get(phase, phase) if phase in seen else phase
        return None

    def launch_args(self, preset) -> list[str]:
        """The server's argv after ``-m MODULE``."""
        raise NotImplementedError

    def help_args(self, preset) -> list[str]:
        """argv after ``-m MODULE`` that prints every flag the server accepts."""
        raise NotImplementedError

    def validate(self, preset) -> None:
        """Raise ValueError (one sentence starting with the key) for what this engine refuses."""

    def lint(self, preset) -> list[str]:
        """Advice beyond validation, each a sentence starting with the key."""
        return []

    def speculative_view(self, preset) -> dict:
        """The resolved ``speculative.*`` keys of a speculative preset, as this engine spells them."""
        raise NotImplementedError

    def static_config(self, preset) -> tuple[int, int, int] | None:
        """(steps, topk, draft tokens) a speculative preset runs, or None when the engine picks
        them at start (the configurations advise and tune compare; costmodel.Config's fields)."""
        raise NotImplementedError

    def space(self, max_steps: int = MAX_STEPS, topks: tuple[int, ...] | None = None) -> list[tuple[int, int, int]]:
        """Every (steps, topk, draft tokens) advise and tune may compare on this engine, speculation
        off (0, 1, 1) first, trees of the widths ``topks`` (None: ``self.topks``) where it drafts trees;
        the base: chains of 1 to ``max_steps`` steps."""
        return chains(max_steps)

    def resolve(self, spec) -> Resolved | None:
        """A speculative section's settings as this engine runs them; None when the section is not
        written in this engine's own keys (``engines.resolve`` asks each engine). ``spec``: the preset's
        ``speculative`` section, or any object with its keys as attributes (a missing one reads as
        None). ValueError (one sentence) for a combination the engine refuses."""
        return None

    def config_changes(self, c, preset=None) -> dict:
        """The speculative section's keys that make a preset run configuration ``c`` (steps,
        topk, draft_tokens; speculative), as this engine spells them for ``preset``'s algorithm
        (None: a drafting model's). ValueError if it cannot."""
        raise NotImplementedError

    def required_modules(self, preset) -> list[tuple[str, str]]:
        """(Python module, the preset key that needs it) the server imports beyond its own."""
        return []

    def search_topks(self, preset) -> tuple[int, ...]:
        """The draft tree widths advise, tune and the TUI's advisor search for this preset."""
        return self.topks

    def config_label(self, c) -> str:
        """Configuration ``c`` in this engine's words."""
        return c.label

    def schedule_file(self, preset) -> str | None:
        """The path on the target of a schedule file the server reads at start-up (None: none)."""
        return None

    def check_schedule(self, preset, text: str) -> str | None:
        """What is wrong with the schedule file's ``text`` for this preset, in one clause (None: fine)."""
        return None

    # ---- its schedule file (``schedule``): a table (what a preset holds and advise decides) and the
    # document the file holds (JSON)

    def check_schedule_table(self, table):
        """The schedule ``table`` as checked by the engine's loader rules (its normal form); ValueError
        (one sentence) for one the engine would refuse or silently change."""
        raise NotImplementedError(f"{self.label} has no schedule")

    def schedule_document(self, table) -> dict:
        """The JSON object a schedule file holds for ``table`` (checked; ValueError as above)."""
        raise NotImplementedError(f"{self.label} has no schedule")

    def write_schedule(self, path: str, document: dict) -> None:
        """Write a schedule file atomically (``document``: ``schedule_document``'s); OSError when it cannot."""
        raise NotImplementedError(f"{self.label} has no schedule")

    def read_schedule(self, path: str, source: str = "the file"):
        """A schedule file on this machine as its checked table; ValueError (one sentence, naming it as
        ``source``) when it cannot be read or is not such a schedule."""
        raise NotImplementedError(f"{self.label} has no schedule")

    def schedule_allows_off(self, windows) -> bool:
        """Whether an emitted schedule may turn speculation off (0 steps) for a batch size, on the
        server whose profile ``windows`` it was fitted from."""
        return True

    # ---- its /metrics page (``measure.promscrape`` parses it; the names and their meaning are here)

    def metric_families(self) -> tuple[str, ...]:
        """The metric families of its /metrics page tuitune reads (as HELP and TYPE lines name them)."""
        per_position = (self.per_position_metric,) if self.per_position_metric else ()
        return (*self.counters, *self.gauges, *per_position)

    def read_metric(self, snap, name: str, samples) -> bool:
        """Add one family of a page (``name`` without "_total", its prometheus_client ``samples``) to
        ``snap`` (``counters``: sums, ``gauges``: means, ``per_pos``: accepted tokens by draft position);
        False when the family is none of this engine's. The base: ``counters``, ``gauges`` and
        ``per_position_metric`` as declared above."""
        if name == self.per_position_metric:
            for s in _totals(name, samples):
                if s.labels.get("position", "").isdigit():
                    pos = int(s.labels["position"])
                    snap.per_pos[pos] = snap.per_pos.get(pos, 0.0) + s.value
        elif name in self.counters:
            snap.counters[name] = sum(s.value for s in _totals(name, samples) if math.isfinite(s.value))
        elif name in self.gauges:
            mean_gauge(snap, name, samples)
        else:
            return False
        return True

    def on_page(self, snap) -> bool:
        """Whether a page's snapshot holds this engine's metrics (its windows are then this engine's)."""
        return any(k in snap.counters for k in self.counters) or bool(self.gauges.keys() & snap.gauges.keys())

    def metrics_window(self, prev, cur, seconds: float):
        """The ``MetricsWindow`` of what changed between two snapshots of one server ``seconds`` apart;
        None when nothing known changed or the counters went backwards (a restart between the scrapes)."""
        return None

    def served_model(self, preset) -> str | None:
        """The model name the OpenAI API expects in requests (None: the server takes any)."""
        return None

    def model_path(self, preset) -> str | None:
        """The model the preset serves, as its ``server.args`` name it (None: not set)."""
        v = preset.server.args.get(self.model_arg) if self.model_arg else None
        return v if isinstance(v, str) and v else None

    def default_bench_api(self) -> BenchApi:
        return "native"

    def probe_check_args(self) -> list[str]:
        """Arguments of ``eagle3_probe.py --check`` for this engine's source tree."""
        return ["--engine", self.name]

    def derived_flags(self, preset) -> set[str]:
        """The flags the preset writes only with the value the engine itself picks when the flag is
        absent (``Resolved.derived``): a running server without them runs the same."""
        if not preset.is_speculative:
            return set()
        try:
            derived = preset.speculative.resolved().derived
        except ValueError:
            return set()
        return {f"--{flag}" for flag, key in self.reserved_args.items() if key.removeprefix("speculative.") in derived}

    def server_args(self, argv: list[str]) -> tuple[str, list[str]] | None:
        """When a process's ``argv`` (its interpreter first, as /proc shows it) runs this engine's
        server: (the module a preset names for it, the server's own arguments as ``launch_args``
        writes them); None when it runs something else."""
        _, module, rest = interpreter_split(argv)
        if module in self.modules:
            return module, rest
        if module is None and rest and rest[0].rsplit("/", 1)[-1] in self.scripts:
            return self.default_module, rest[1:]
        return None

    def preset_data(self, args: list[str]) -> dict:
        """The inverse of ``launch_args``: a running server's own arguments as a preset's pieces,
        ``{"port": …, "args": {…}, "speculative": {…}, "notes": [sentences]}`` (port None when the
        flags leave it to the engine; a note for what a preset cannot hold, left out). ValueError
        (one sentence) for a server no preset of one machine can describe."""
        out: dict = {"port": None, "args": {}, "speculative": {}, "notes": []}
        self._take_positionals(out, positionals(args))
        for flag, v in flag_pairs(args).items():
            self._take(out, flag[2:], v)
        return out

    def _take_positionals(self, out: dict, pos: list[str]) -> None:
        """The server's arguments that are no flags, into ``preset_data``'s pieces (none, here)."""
        out["notes"] += [f"the argument {p!r} is not one a preset holds: left out" for p in pos]

    def _take(self, out: dict, key: str, v: str | None) -> None:
        """One ``--key v`` of a running server into ``preset_data``'s pieces."""
        owner = self.reserved_args.get(key)
        if owner is None:
            out["args"][key] = True if v is None else literal(v)
        elif owner == "server.port":
            if v is None or not v.isdigit():
                raise ValueError(f"--port {v} is not a port")
            out["port"] = int(v)
        elif owner.startswith("speculative."):
            if v is not None:
                out["speculative"][owner.removeprefix("speculative.")] = literal(v)
        else:
            raise ValueError(f"--{key}: a server of several machines; describe it with a preset ({owner})")

    @staticmethod
    def plain_flags(args: dict, skip: tuple[str, ...] = ()) -> list[str]:
        """``server.args`` as flags: true = bare flag, false/None = omitted."""
        out: list[str] = []
        for k, v in args.items():
            if k in skip or v is False or v is None:
                continue
            out += [f"--{k}"] if v is True else [f"--{k}", str(v)]
        return out


def flag_pairs(argv: Sequence[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` / a bare ``--flag`` (None) of an argv, in order."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
                i += 1
            else:
                out[a] = None
        i += 1
    return out


def positionals(argv: Sequence[str]) -> list[str]:
    """Arguments that are neither flags nor flag values (vLLM's ``serve MODEL``)."""
    out, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--"):
            i += 1 if "=" in argv[i] or i + 1 >= len(argv) or argv[i + 1].startswith("--") else 2
        else:
            out.append(argv[i])
            i += 1
    return out


def interpreter_split(argv: Sequence[str]) -> tuple[str | None, str | None, list[str]]:
    """A Python process's argv as (interpreter, module, the rest): ``python -u -m MOD a b`` is
    (python, MOD, [a, b]); ``python /bin/tool a`` is (python, None, [/bin/tool, a])."""
    if not argv:
        return None, None, []
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 2 if argv[i] in ("-X", "-W") else 1  # the interpreter's own options
    if i + 1 < len(argv) and argv[i] == "-m":
        return argv[0], argv[i + 1], list(argv[i + 2 :])
    return argv[0], None, list(argv[i:])


def literal(text: str) -> int | float | str:
    """A flag's value as a preset writes it back unchanged: a number where it prints the same."""
    n = number(text)
    return n if n is not None and str(n) == text else text


def _totals(name: str, samples) -> list:
    """A counter family's samples (without a TYPE line the family keeps the "_total" name)."""
    return [s for s in samples if s.name == name + "_total"]


def mean_gauge(snap, name: str, samples) -> None:
    """A gauge's mean over its label sets (data-parallel engines), its non-finite values left out."""
    values = [s.value for s in samples if math.isfinite(s.value)]
    if values:
        snap.gauges[name] = sum(values) / len(values)


def read_schedule_text(path: str, source: str = "the file") -> str:
    """A schedule file's text, on this machine; ValueError (one sentence, naming it as ``source``) when
    it cannot be read or is over 1 MB."""
    import os

    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read(1_000_001)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{source} cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if len(text) > 1_000_000:
        raise ValueError(f"{source} is over 1 MB, too large to be a schedule")
    return text


def chains(max_steps: int = MAX_STEPS) -> list[tuple[int, int, int]]:
    """Speculation off, then chains of 1 to ``max_steps`` steps (draft tokens = steps + 1)."""
    return [(0, 1, 1)] + [(s, 1, s + 1) for s in range(1, max_steps + 1)]


# ---- drafts and targets --------------------------------------------------------------------------


def hidden_size(config: dict) -> int | None:
    """A model's hidden size from its config.json (a multimodal wrapper's text model's)."""
    text = config.get("text_config")
    v = (text if isinstance(text, dict) else config).get("hidden_size")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def draft_misfit(target_config: dict, draft_config: dict) -> str | None:
    """Why an EAGLE / EAGLE-3 draft cannot run on a target, from the two config.json files, or None.

    The draft's first layer reads the target's hidden states: it expects them of size
    ``target_hidden_size`` (its own ``hidden_size`` when absent; SGLang's and vLLM's llama_eagle3
    read it so), and the target produces its ``hidden_size``. A mismatch is not caught at load time
    (vLLM 0.32 reports ready, then its worker dies at the first decode)."""
    target = hidden_size(target_config)
    key = "target_hidden_size" if isinstance(draft_config.get("target_hidden_size"), int) else "hidden_size"
    expects = draft_config.get(key)
    if target is None or not isinstance(expects, int) or expects == target:
        return None
    return (
        f"the draft expects the target's hidden size to be {expects} (its config.json {key}), the target's is {target}"
    )
