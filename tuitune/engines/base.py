"""What tuitune needs to know about one inference engine, behind one small interface.

An engine module is pure knowledge: how a preset becomes the server's argv, which flags the
preset must not set by hand, how to ask the server for its flags, which log lines mark start-up
phases, whether readiness needs a log hint, how its failures read, where its probe hooks in.
No I/O here: control, bench and the parser ask these questions and do the work themselves.
Engine methods take the preset as an argument (duck-typed: this layer sits below ``preset``).
"""

from __future__ import annotations

# Failure causes the parser can tell apart, most telling first (control picks the first present).
CAUSE_ORDER = (
    "oom",
    "nccl",
    "bad_argument",
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
)


class Engine:
    name = ""
    label = ""  # as users write it: "SGLang", "vLLM"
    default_module = ""
    default_port = 0
    # server.args keys the preset sets elsewhere (flag -> preset key that owns it)
    reserved_args: dict[str, str] = {}
    # (log text, start-up phase) in the order a start-up passes them
    phases: tuple[tuple[str, str], ...] = ()
    # (text in a log line, failure cause) beyond what the parser already tells apart
    errors: tuple[tuple[str, str], ...] = ()
    # the simulator's --sim-engine value when it plays this engine (None: its default dialect)
    sim_dialect: str | None = None
    # draft tree widths this engine runs (1 = a chain): the space advise and tune search
    topks: tuple[int, ...] = (1, 2, 4, 8)
    # the server.args key naming the model to serve (a path on the target or a hub id)
    model_arg = ""

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

    def config_changes(self, c) -> dict:
        """The speculative section's keys that make a preset run configuration ``c`` (steps,
        topk, draft_tokens; speculative), as this engine spells them. ValueError if it cannot."""
        raise NotImplementedError

    def config_label(self, c) -> str:
        """Configuration ``c`` in this engine's words."""
        return c.label

    def served_model(self, preset) -> str | None:
        """The model name the OpenAI API expects in requests (None: the server takes any)."""
        return None

    def model_path(self, preset) -> str | None:
        """The model the preset serves, as its ``server.args`` name it (None: not set)."""
        v = preset.server.args.get(self.model_arg) if self.model_arg else None
        return v if isinstance(v, str) and v else None

    def default_bench_api(self) -> str:
        return "native"

    def probe_check_args(self) -> list[str]:
        """Arguments of ``eagle3_probe.py --check`` for this engine's source tree."""
        return ["--engine", self.name]

    @staticmethod
    def plain_flags(args: dict, skip: tuple[str, ...] = ()) -> list[str]:
        """``server.args`` as flags: true = bare flag, false/None = omitted."""
        out: list[str] = []
        for k, v in args.items():
            if k in skip or v is False or v is None:
                continue
            out += [f"--{k}"] if v is True else [f"--{k}", str(v)]
        return out
