"""vLLM (vllm-project/vllm, V1 engine): flags, readiness, metric names, info endpoint, editable flags
(FACTS.md §3); its log lines and request log are ``engines/vllm_log.py``'s, its dynamic schedule
``engines/vllm_schedule.py``'s.

Verified against the vLLM 0.33.0 release source (names below are that release's):
- launch: ``vllm serve [model_tag] [options]`` is ``python -m vllm.entrypoints.cli.main serve …``
  (``entrypoints/cli/main.py``, ``cli/serve.py``); ``serve --help=all`` lists every flag group;
  ``--port`` (default 8000) and ``--host`` come from ``FrontendArgs``, ``--speculative-config``
  (``-sc``, JSON) from ``EngineArgs``; ``SpeculativeConfig`` takes ``method`` (``eagle``,
  ``eagle3``, ``ngram``, ``suffix``, …), ``model``, ``num_speculative_tokens`` (> 0),
  ``draft_tensor_parallel_size`` (1 or the target's TP size) and, for ``ngram``,
  ``prompt_lookup_min`` / ``prompt_lookup_max`` (the n-gram sizes matched; one given is copied
  to the other, neither is 5 and 5). EAGLE and ngram in vLLM draft a chain: there is no topk.
  ``suffix`` (suffix decoding) needs the ``arctic-inference`` package and takes
  ``num_speculative_tokens`` as an upper bound (default 24, its tree depth).
- logs (``vllm/logger.py``): ``(PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message``;
  ``v1/metrics/loggers.py`` prints ``Engine 000: Avg prompt throughput: …`` every
  ``VLLM_LOG_STATS_INTERVAL`` seconds, ``v1/spec_decode/metrics.py`` the ``SpecDecoding metrics:``
  line after it.
- ``/metrics`` (``v1/spec_decode/metrics.py``, ``v1/metrics/loggers.py``): counters below,
  labelled ``model_name`` and ``engine``; per position also ``position``.
"""

from __future__ import annotations

import json

from tuitune.base.events import MetricsWindow
from tuitune.engines.base import BenchApi, Engine, Flag, Resolved
from tuitune.engines.vllm_log import RULES, RequestLog, log_prefix
from tuitune.engines.vllm_schedule import (
    DSD_KEY,
    DSD_LAST_END,
    DSD_SCHEDULE,
    check_dsd,
    dsd_document,
    dsd_gaps,
    read_dsd,
    write_dsd,
)

STARTUP_COMPLETE = "Application startup complete."
METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NGRAM": "ngram", "SUFFIX": "suffix"}
DRAFT_METHODS = ("EAGLE", "EAGLE3")  # the methods that run a draft model (speculative.model)
# SpeculativeConfig.__post_init__: ngram with neither n-gram size set matches 5-grams only
NGRAM_DEFAULT_LOOKUP = 5
SUFFIX_MODULE = "arctic_inference"  # suffix decoding's implementation, imported by the drafter
# the keys of --speculative-config a preset's speculative section holds under the same name
SPEC_KEYS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size")

# Prometheus counter names as declared (the exposition adds ``_total``)
NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
INFO_PATHS = ("/version",)  # vLLM serves no /server_info

# (text in a log line, failure cause): vLLM's own wording of its most common start-up failures
ERRORS = (
    ("No available memory for the cache blocks", "oom"),
    ("larger than the available KV cache memory", "oom"),
    ("Invalid repository ID or local directory specified", "model_not_found"),
    ("validation error for SpeculativeConfig", "bad_argument"),
    ("validation errors for SpeculativeConfig", "bad_argument"),
    ("Arctic Inference is required for suffix decoding", "init_failed"),
    # the API server's words once its engine core is gone (killed, crashed), and the engine core's
    # once its worker is (a segfault in a kernel leaves no other line: a draft that does not fit)
    ("EngineDeadError", "engine_died"),
    ("died unexpectedly", "engine_died"),
)


class VLLM(Engine):
    name = "vllm"
    label = "vLLM"
    step_name = "K"
    step_key = "speculative.num_speculative_tokens"
    own_choice = "schedule"
    default_module = "vllm.entrypoints.cli.main"  # what the `vllm` console script runs
    default_port = 8000
    model_arg = "model"
    modules = ("vllm.entrypoints.cli.main",)
    scripts = ("vllm",)
    env_prefixes = ("VLLM_",)
    reserved_args = {"port": "server.port", "speculative-config": "speculative", "sc": "speculative"}
    phases = (
        ("Starting to load model", "loading weights"),
        ("Loading drafter model", "loading draft model"),
        ("Capturing CUDA graphs", "capturing graphs"),
        (STARTUP_COMPLETE, "http up"),
    )  # a hint only
    errors = ERRORS
    rules = RULES  # (engines/vllm_log.py)
    algorithms = tuple(METHODS)
    counters = {
        NUM_DRAFTS: "drafts",
        NUM_DRAFT_TOKENS: "draft_tokens",
        NUM_ACCEPTED: "accepted",
        GENERATION_TOKENS: "gen_tok_s",
    }
    gauges = {RUNNING: "running_req", WAITING: "queue_req"}
    per_position_metric = ACCEPTED_PER_POS
    info_paths = INFO_PATHS
    editable_flags = (
        Flag("gpu-memory-utilization", "gpu memory utilization", "float"),
        Flag("max-num-seqs", "max num seqs", "int"),
        Flag("disable-custom-all-reduce", "disable custom all-reduce", "bool"),
    )
    sim_dialect = "vllm"
    topks = (1,)  # EAGLE on vLLM drafts a chain
    schedule = DSD_SCHEDULE  # K by batch size (speculative.dynamic_schedule)
    schedule_last_end = DSD_LAST_END
    model_free = tuple(m for m in METHODS if m not in DRAFT_METHODS)

    def resolve(self, spec) -> Resolved | None:
        """vLLM's keys: num_speculative_tokens (a chain: K drafted, K + 1 verified), or suffix
        decoding (it picks its length per request)."""
        n = getattr(spec, "num_speculative_tokens", None)
        if n is not None:
            return Resolved(spec.algorithm, n, 1, n + 1)
        if spec.algorithm == "SUFFIX":
            return Resolved(spec.algorithm, None, None, None)
        return None

    def check_schedule_table(self, table) -> list[tuple[int, int, int]]:
        return check_dsd(table)

    def schedule_document(self, table) -> dict:
        return dsd_document(table)

    def write_schedule(self, path: str, document: dict) -> None:
        write_dsd(path, document[DSD_KEY])

    def read_schedule(self, path: str, source: str = "the file") -> list[tuple[int, int, int]]:
        return read_dsd(path, source)

    def metrics_window(self, prev, cur, seconds: float) -> MetricsWindow | None:
        """Counters: acceptance (per draft position too) and rates from their deltas; gauges: last values."""
        delta = {k: cur.counters.get(k, 0.0) - prev.counters.get(k, 0.0) for k in self.counters}
        pos = {i: v - prev.per_pos.get(i, 0.0) for i, v in cur.per_pos.items()}
        if any(v < 0 for v in (*delta.values(), *pos.values())):
            return None
        kw: dict = {self.gauges[k]: int(v) for k, v in cur.gauges.items() if k in self.gauges}
        if GENERATION_TOKENS in cur.counters:
            kw["gen_tok_s"] = delta[GENERATION_TOKENS] / seconds
        drafts = delta[NUM_DRAFTS]
        if drafts > 0:
            kw.update(
                drafts=int(drafts),
                draft_tokens=int(delta[NUM_DRAFT_TOKENS]),
                accepted=int(delta[NUM_ACCEPTED]),
                accept_len=1 + delta[NUM_ACCEPTED] / drafts,
            )
            if delta[NUM_DRAFT_TOKENS] > 0:
                kw["accept_rate"] = delta[NUM_ACCEPTED] / delta[NUM_DRAFT_TOKENS]
            if pos:
                kw["per_position"] = tuple(pos[i] / drafts for i in sorted(pos))
        return MetricsWindow("vllm", seconds, **kw)

    @staticmethod
    def log_prefix(line: str, end: int) -> tuple[str | None, str | None] | None:
        return log_prefix(line, end)

    def launch_args(self, preset) -> list[str]:
        args = preset.server.args
        out = ["serve"] + ([str(args["model"])] if args.get("model") is not None else [])
        out += self.plain_flags(args, skip=("model",)) + ["--port", str(preset.server.port)]
        if preset.is_speculative:
            out += ["--speculative-config", json.dumps(self.speculative_config(preset))]
        return out

    def help_args(self, preset) -> list[str]:
        return ["serve", "--help=all"]

    def _take_positionals(self, out: dict, pos: list[str]) -> None:
        """``serve MODEL``: the subcommand, and the model as ``server.args.model``."""
        if pos[:1] != ["serve"]:
            raise ValueError(f"it runs `vllm {pos[0] if pos else ''}`, not `vllm serve`: no server")
        if len(pos) > 1:
            out["args"]["model"] = pos[1]
        super()._take_positionals(out, pos[2:])

    def _take(self, out: dict, key: str, v: str | None) -> None:
        if self.reserved_args.get(key) != "speculative":
            return super()._take(out, key, v)
        out["speculative"], notes = self._speculative_from(v)
        out["notes"] += notes

    @staticmethod
    def _speculative_from(text: str | None) -> tuple[dict, list[str]]:
        """``--speculative-config``'s JSON as the preset's speculative section (the inverse of
        ``speculative_config``), and a note for each key a preset does not hold."""
        try:
            cfg = json.loads(text or "")
        except ValueError:
            cfg = None
        if not isinstance(cfg, dict):
            raise ValueError(f"--speculative-config {str(text)[:60]!r} is not a JSON object")
        by_method = {m: a for a, m in METHODS.items()}
        method = cfg.get("method")
        if method not in by_method:
            raise ValueError(
                f"--speculative-config: the method {method!r} is not one tuitune knows ({', '.join(METHODS.values())})"
            )
        spec: dict = {"algorithm": by_method[method]}
        notes = []
        for key, v in cfg.items():
            if key == "method":
                continue
            own = {"model": "draft_model_path", DSD_KEY: "dynamic_schedule"}.get(key, key)
            if own in ("draft_model_path", "dynamic_schedule", *SPEC_KEYS):
                spec[own] = v
            else:
                notes.append(f"--speculative-config's {key!r} is not one a preset holds: left out")
        return spec, notes

    @staticmethod
    def speculative_config(preset) -> dict:
        """``--speculative-config``'s JSON: the method, the draft model for EAGLE, the tokens, and
        for ngram the n-gram sizes (those set; vLLM fills in the other)."""
        s = preset.speculative
        cfg: dict = {"method": METHODS[s.algorithm]}
        if s.algorithm in DRAFT_METHODS:
            cfg["model"] = s.draft_model_path
        if s.num_speculative_tokens is not None:
            # prepared to switch (docs/switch.md): vLLM sizes its drafts for the largest K to hold
            cfg["num_speculative_tokens"] = max([s.num_speculative_tokens, *(s.switch or [])])
        for key in ("prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size"):
            if getattr(s, key) is not None:
                cfg[key] = getattr(s, key)
        table = s.schedule()
        if table is not None:  # the dynamic schedule goes inline: vLLM reads no file for it
            cfg[DSD_KEY] = [list(r) for r in table]
        elif s.switch and s.num_speculative_tokens is not None:
            # the switch needs a schedule (vLLM builds its per-step lookup only from one): the preset's
            # own K at every batch size, so the launch runs its K until a hold
            cfg[DSD_KEY] = [[1, DSD_LAST_END, s.num_speculative_tokens]]
        return cfg

    @staticmethod
    def ngram_lookup(s) -> tuple[int, int]:
        """(prompt_lookup_min, prompt_lookup_max) as vLLM resolves them: one given is copied to the
        other; neither given is 5 and 5 (``SpeculativeConfig.__post_init__``)."""
        lo, hi = s.prompt_lookup_min, s.prompt_lookup_max
        if lo is None and hi is None:
            return NGRAM_DEFAULT_LOOKUP, NGRAM_DEFAULT_LOOKUP
        return (hi if lo is None else lo), (lo if hi is None else hi)

    def validate(self, preset) -> None:  # noqa: C901
        if not isinstance(preset.server.args.get("model"), str):
            raise ValueError(
                "server.args.model: vLLM needs the model to serve (a path or a Hugging Face "
                "id; rendered as `serve MODEL`)"
            )
        s = preset.speculative
        if s is None or s.algorithm is None:
            return
        if s.algorithm not in METHODS:
            raise ValueError(
                f"speculative.algorithm: {s.algorithm} is not driven by tuitune on vLLM (use {', '.join(METHODS)})"
            )
        if s.algorithm in DRAFT_METHODS and not s.draft_model_path:
            raise ValueError(f"speculative.draft_model_path is required for {s.algorithm}")
        for key in ("ngram_min_bfs_breadth", "ngram_max_bfs_breadth", "ngram_max_trie_depth"):
            if getattr(s, key) is not None:
                raise ValueError(
                    f"speculative.{key} is SGLang's NGRAM tree; vLLM's ngram drafts a chain "
                    "(set num_speculative_tokens, prompt_lookup_min, prompt_lookup_max)"
                )
        if s.eagle_topk is not None:
            raise ValueError(
                "speculative.eagle_topk: vLLM's EAGLE drafts a chain, one candidate a "
                "position, so topk does not exist there; remove it"
            )
        if s.num_steps is not None:
            raise ValueError("speculative.num_steps is SGLang's; vLLM spells it num_speculative_tokens")
        if s.num_draft_tokens is not None:
            raise ValueError(
                "speculative.num_draft_tokens is SGLang's; vLLM verifies "
                "num_speculative_tokens + 1 tokens, so set num_speculative_tokens only"
            )
        if s.adaptive_config is not None:
            raise ValueError("speculative.adaptive_config is SGLang's adaptive schedule; vLLM has no such flag")
        if s.num_speculative_tokens is None and s.algorithm != "SUFFIX":  # suffix: 24 at most, its own choice
            raise ValueError(
                "speculative.num_speculative_tokens is required on vLLM (how many tokens the draft proposes each step)"
            )
        table = s.schedule()
        if table is not None:
            if s.num_speculative_tokens is None:
                raise ValueError(
                    "speculative.dynamic_schedule needs num_speculative_tokens (the most tokens any "
                    "batch size drafts, at least the schedule's largest K)"
                )
            try:
                check_dsd(table, s.num_speculative_tokens)
            except ValueError as e:
                raise ValueError(f"speculative.dynamic_schedule: {e}") from None
        if s.switch is not None and s.algorithm == "SUFFIX":
            raise ValueError(
                "speculative.switch: suffix decoding chooses each request's draft length itself; there is no K to hold"
            )
        dtp = s.draft_tensor_parallel_size
        if dtp is not None and s.algorithm not in DRAFT_METHODS:
            raise ValueError(f"speculative.draft_tensor_parallel_size: {s.algorithm} runs no draft model")
        if dtp is not None and dtp not in (1, preset.tp_size()):
            raise ValueError(
                f"speculative.draft_tensor_parallel_size: vLLM allows 1 or the target's "
                f"tensor parallel size ({preset.tp_size()}), not {dtp}"
            )

    def lint(self, preset) -> list[str]:
        out = []
        for sglang, vllm in (
            ("model-path", "model"),
            ("mem-fraction-static", "gpu-memory-utilization"),
            ("tp-size", "tensor-parallel-size"),
        ):
            if sglang in preset.server.args:
                out.append(f"server.args.{sglang} is SGLang's flag; vLLM spells it {vllm}")
        s = preset.speculative
        if preset.is_speculative and s.algorithm == "NGRAM" and s.prompt_lookup_min is s.prompt_lookup_max is None:
            out.append(
                "speculative: prompt_lookup_min and prompt_lookup_max unset, vLLM's ngram then matches "
                f"{NGRAM_DEFAULT_LOOKUP}-grams only (its placeholder); set them (e.g. 1 and 3) to match shorter repeats"
            )
        table = s.schedule() if preset.is_speculative else None
        if table is not None:
            for first, last, k in dsd_gaps(table):
                out.append(
                    f"speculative.dynamic_schedule: batch sizes {first}-{last} are in no range; vLLM "
                    f"gives them the K of the range before ({k})"
                )
            if all(k == 0 for _, _, k in table):
                out.append(
                    "speculative.dynamic_schedule: K is 0 at every batch size, so nothing is ever drafted, "
                    "but vLLM still runs its speculative path (K=0 is not off); serve without speculation instead"
                )
        if preset.is_speculative and s.algorithm == "SUFFIX":
            out.append(
                f"speculative: SUFFIX needs the {SUFFIX_MODULE} package beside vLLM on the target "
                "(pip install arctic-inference); num_speculative_tokens is its upper bound"
            )
        return out

    def required_modules(self, preset) -> list[tuple[str, str]]:
        if preset.is_speculative and preset.speculative.algorithm == "SUFFIX":
            return [(SUFFIX_MODULE, "speculative.algorithm SUFFIX (pip install arctic-inference)")]
        return []

    def speculative_view(self, preset) -> dict:
        s = preset.speculative
        view = {"speculative.algorithm": s.algorithm}
        if s.algorithm in DRAFT_METHODS:
            view["speculative.draft_model_path"] = s.draft_model_path
        view["speculative.num_speculative_tokens"] = s.num_speculative_tokens
        if s.algorithm == "NGRAM":
            view["speculative.prompt_lookup_min"], view["speculative.prompt_lookup_max"] = self.ngram_lookup(s)
        if s.draft_tensor_parallel_size is not None:
            view["speculative.draft_tensor_parallel_size"] = s.draft_tensor_parallel_size
        table = s.schedule()
        if table is not None:
            view["speculative.dynamic_schedule"] = [list(r) for r in table]
        if s.switch is not None:
            view["speculative.switch"] = list(s.switch)
        return view

    def static_config(self, preset) -> tuple[int, int, int] | None:
        n = preset.speculative.num_speculative_tokens
        if preset.speculative.algorithm == "SUFFIX":
            return None  # suffix decoding chooses each request's length itself (n is a bound)
        if preset.speculative.schedule() is not None:
            return None  # K follows the batch size (the dynamic schedule): no one configuration
        return None if n is None else (n, 1, n + 1)

    def config_changes(self, c, preset=None) -> dict:
        if c.topk != 1:
            raise ValueError(f"{c.label}: vLLM drafts a chain (topk 1), not a tree")
        out: dict = {"num_speculative_tokens": c.steps, "dynamic_schedule": None}  # a static K: no schedule
        if preset is not None and preset.is_speculative and preset.speculative.switch is not None:
            out["switch"] = None  # nor a launch prepared to switch
        return out

    def config_label(self, c) -> str:
        if not c.speculative or c.topk != 1:
            return c.label
        return f"{c.steps} spec token{'s' if c.steps > 1 else ''} (verify {c.draft_tokens})"

    def served_model(self, preset) -> str | None:
        name = preset.server.args.get("served-model-name") or preset.server.args.get("model")
        return str(name).split()[0] if name else None

    def default_bench_api(self) -> BenchApi:
        return "openai"  # vLLM has no /generate

    request_logging = (
        "start vLLM with --enable-log-requests and VLLM_LOGGING_LEVEL=DEBUG (its prompts are logged at "
        "DEBUG only) and without --max-log-len (which cuts them)"
    )

    def request_reader(self):
        return RequestLog()
