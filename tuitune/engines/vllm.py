"""vLLM (vllm-project/vllm, V1 engine): flags, readiness, log lines, metric names, info endpoint,
editable flags (FACTS.md §3).

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
import math
import re

from tuitune.base.events import DecodeStats, Event, Malformed, MetricsWindow, VllmSpec
from tuitune.base.logline import NO_PREFIX, Rule
from tuitune.base.numbers import to_float, to_int
from tuitune.engines.base import BenchApi, Engine, Flag, LoggedRequest, Resolved, read_schedule_text

SPEC_MARKER = "SpecDecoding metrics: "
STATS_MARKER = "Avg prompt throughput: "
STARTUP_COMPLETE = "Application startup complete."
METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NGRAM": "ngram", "SUFFIX": "suffix"}
DRAFT_METHODS = ("EAGLE", "EAGLE3")  # the methods that run a draft model (speculative.model)
# SpeculativeConfig.__post_init__: ngram with neither n-gram size set matches 5-grams only
NGRAM_DEFAULT_LOOKUP = 5
SUFFIX_MODULE = "arctic_inference"  # suffix decoding's implementation, imported by the drafter
# the dynamic schedule (K by batch size; its rules: check_dsd below)
DSD_SCHEDULE = "vllm-dsd"  # advise --emit's name for it
DSD_KEY = "num_speculative_tokens_per_batch_size"
# the keys of --speculative-config a preset's speculative section holds under the same name
SPEC_KEYS = ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size")
DSD_LAST_END = 1024  # the last range's end as written (vLLM carries its K on past it anyway)

# Prometheus counter names as declared (the exposition adds ``_total``)
NUM_DRAFTS = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
INFO_PATHS = ("/version",)  # vLLM serves no /server_info

_PREFIX = re.compile(
    r"(?:\(([\w.-]+) pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) \[?[\w.-]+:\d+\] "
)  # older releases: no "["
_RANK = re.compile(r"(?:DP|TP|PP|EP)\d+")

SPEC_FIELDS = {
    "Mean acceptance length": "mean_accept_len",
    "Accepted throughput": "accepted_tok_s",
    "Drafted throughput": "drafted_tok_s",
    "Accepted": "accepted",
    "Drafted": "drafted",
    "Per-position acceptance rate": "per_position",
    "Avg Draft acceptance rate": "draft_acceptance_rate",
    "Draft acceptance rate": "draft_acceptance_rate",
}  # the older line's name
_SPEC_INT = ("accepted", "drafted")
STATS_FIELDS = {"Avg generation throughput": "gen_throughput", "Running": "running_req", "Waiting": "queue_req"}

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
            cfg["num_speculative_tokens"] = s.num_speculative_tokens
        for key in ("prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size"):
            if getattr(s, key) is not None:
                cfg[key] = getattr(s, key)
        table = s.schedule()
        if table is not None:  # the dynamic schedule goes inline: vLLM reads no file for it
            cfg[DSD_KEY] = [list(r) for r in table]
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
        return {"num_speculative_tokens": c.steps, "dynamic_schedule": None}  # a static K: no schedule

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


# ---- its request log (--enable-log-requests) ---------------------------------------------------------
# vLLM 0.32.0, ``entrypoints/serve/utils/request_logger.py`` (RequestLogger.log_inputs): at DEBUG,
# ``Request ID details: prompt: REPR, prompt_token_ids: [...], prompt_embeds shape: …`` (the prompt
# as Python's repr, after the chat template for a chat request; None for a request sent as token ids),
# then at INFO ``Received request ID: params: SamplingParams(…, max_tokens=N, …), lora_request: …``.
_DETAILS = re.compile(r"\bRequest (\S+) details: prompt: ")
_RECEIVED = re.compile(r"\bReceived request (\S+): params: ")
_MAX_TOKENS = re.compile(r"\bmax_tokens=(\d+)")


class RequestLog:
    """vLLM's request log read line by line: a request is complete at its ``Received request`` line,
    its prompt from the ``details`` line before it (a request without one, or sent as token ids, is
    no workload prompt and is skipped)."""

    MAX_PENDING = 4096  # details lines waiting for their Received line (a log cut mid-request)

    def __init__(self) -> None:
        self.prompts: dict[str, str | None] = {}

    def __call__(self, line: str) -> LoggedRequest | None:
        if (m := _DETAILS.search(line)) is not None:
            end = line.rfind(", prompt_token_ids: ")
            if end < m.end():
                return None
            prompt = _string_literal(line[m.end() : end])
            if len(self.prompts) >= self.MAX_PENDING:
                self.prompts.pop(next(iter(self.prompts)))
            self.prompts[m.group(1)] = prompt
            return None
        if (m := _RECEIVED.search(line)) is None:
            return None
        prompt = self.prompts.pop(m.group(1), None)
        if prompt is None:
            return None
        n = _MAX_TOKENS.search(line, m.end())
        return LoggedRequest(prompt, int(n.group(1)) if n else None)


def _string_literal(text: str) -> str | None:
    """A Python string literal (what ``%r`` of a str writes), or None for anything else."""
    import ast

    text = text.strip()
    if len(text) < 2 or text[0] not in "'\"" or text[-1] != text[0]:
        return None
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return v if isinstance(v, str) else None


# ---- the dynamic schedule (SpeculativeConfig.num_speculative_tokens_per_batch_size) ------------------
# vLLM 0.32.0 (the CPU build's release; 0.33.0's is the same): ``config/speculative.py`` declares the
# field as ``list[tuple[int, int, int]] | None`` (line 491), and ``v1/spec_decode/dynamic/utils.py``
# checks and expands it when the scheduler starts (``validate_and_normalize_dynamic_sd_schedule``,
# lines 7-74; ``build_dynamic_sd_schedule_lookup``, lines 77-148; called from
# ``v1/core/sched/scheduler.py`` line 310). Its rules: a non-empty list of (start, end, K) with
# inclusive batch-size ranges; start and end > 0, start <= end, K >= 0 (0 = no drafts that step); sorted
# by start, the ranges must not overlap and the first must start at 1. A batch size in a gap gets the
# K of the range before it, one past the last range the last K, and every K is cut to
# ``num_speculative_tokens`` without a word. The batch size is the number of requests scheduled in
# the step (``len(num_scheduled_tokens)``, scheduler.py line 1487). tuitune refuses what vLLM would
# cut or reorder silently: ranges out of order, and a K above num_speculative_tokens.


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_dsd(table, max_k: int | None = None) -> list[tuple[int, int, int]]:
    """vLLM's rules for a dynamic schedule, and tuitune's two stricter ones (ranges in order; no K
    above ``max_k``, the preset's num_speculative_tokens): the table as (start, end, K) tuples, or
    ValueError (one sentence)."""
    if not isinstance(table, (list, tuple)) or not table:
        raise ValueError(f"a dynamic schedule is a non-empty list of [start, end, K] ranges, got {table!r}")
    out: list[tuple[int, int, int]] = []
    for i, entry in enumerate(table):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(map(_whole, entry)):
            raise ValueError(f"range {i + 1} ({entry!r}) is not [start, end, K] with three integers")
        start, end, k = entry
        if start < 1 or end < start:
            raise ValueError(f"range {i + 1} [{start}, {end}, {k}]: batch sizes run from start >= 1 to end >= start")
        if k < 0:
            raise ValueError(f"range {i + 1} [{start}, {end}, {k}]: K must be >= 0 (0 drafts nothing at those sizes)")
        if max_k is not None and k > max_k:
            raise ValueError(
                f"range {i + 1} [{start}, {end}, {k}]: K {k} is above num_speculative_tokens {max_k} "
                f"(vLLM would cut it to {max_k} without a word); raise num_speculative_tokens or lower K"
            )
        if out and start <= out[-1][1]:
            raise ValueError(
                f"range {i + 1} [{start}, {end}, {k}] starts at or before the end of range {i} ({out[-1][1]}): "
                "the ranges must be in order and must not overlap"
            )
        out.append((start, end, k))
    if out[0][0] != 1:
        raise ValueError(f"the first range starts at {out[0][0]}: vLLM needs it to start at batch size 1")
    return out


def dsd_k(table, batch_size: int, max_k: int) -> int:
    """The K vLLM drafts at ``batch_size`` under this schedule (its carry-forward through gaps and
    past the last range, cut to ``max_k``)."""
    k = 0
    for start, _end, kk in check_dsd(table):
        if start > batch_size:
            break
        k = kk
    return min(k, max_k)


def dsd_gaps(table) -> list[tuple[int, int, int]]:
    """Batch sizes that no range names: (first, last, the K vLLM carries into them)."""
    rows = check_dsd(table)
    return [(a[1] + 1, b[0] - 1, a[2]) for a, b in zip(rows, rows[1:], strict=False) if b[0] > a[1] + 1]


def dsd_document(table) -> dict:
    """The file ``advise --emit vllm-dsd`` writes (and ``speculative.dynamic_schedule`` reads)."""
    return {DSD_KEY: [list(r) for r in check_dsd(table)]}


def dsd_text(table) -> str:
    """The file's text: JSON, one range a line (reads and diffs well)."""
    rows = ",\n".join(f"    {json.dumps(list(r))}" for r in check_dsd(table))
    return f"{{\n  {json.dumps(DSD_KEY)}: [\n{rows}\n  ]\n}}\n"


def parse_dsd(text: str, source: str = "the file") -> list[tuple[int, int, int]]:
    """A schedule file's text (JSON: ``{"num_speculative_tokens_per_batch_size": [[start, end, K],
    ...]}``) as its checked table; ValueError (one sentence) otherwise."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{source} is not JSON ({e})") from None
    if not isinstance(doc, dict) or set(doc) != {DSD_KEY}:
        raise ValueError(f'{source} must be a JSON object with the one key "{DSD_KEY}"')
    try:
        return check_dsd(doc[DSD_KEY])
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def read_dsd(path: str, source: str = "the file") -> list[tuple[int, int, int]]:
    """A schedule file on this machine, checked; ValueError (one sentence, naming it as ``source``)
    when it cannot be read or is not a schedule."""
    return parse_dsd(read_schedule_text(path, source), source)


def write_dsd(path: str, table) -> None:
    """Write the schedule file atomically: a temporary file beside ``path``, flushed, renamed over
    it (a reader sees the old file or the new one, never half of one); OSError when it cannot."""
    import os
    import tempfile

    text = dsd_text(table)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# ---- log lines ------------------------------------------------------------------------------------


def message(line: str) -> str:
    """The line without vLLM's logger prefix (the whole line when it has none)."""
    m = _PREFIX.search(line)
    return line[m.end() :] if m else line


def log_prefix(line: str, end: int) -> tuple[str | None, str | None] | None:
    """Timestamp and rank (TP0, DP0 … from the process name) of vLLM's logger prefix, or None."""
    m = _PREFIX.search(line, 0, end)
    if m is None:
        return None
    rank = " ".join(_RANK.findall(m.group(1) or "")) or None
    return m.group(2), rank


def prefix(line: str, end: int) -> tuple[str | None, str | None]:
    """vLLM's own lines read vLLM's own prefix: (None, None) when there is none."""
    return log_prefix(line, end) or NO_PREFIX


def _items(body: str) -> list[tuple[str, str]]:
    """``Name: value, Name: value`` -> pairs; a part without ``: `` continues the previous value
    (the per-position list and ``KV fetch: 1 waiting to start, 0 in progress, …``)."""
    out: list[tuple[str, list[str]]] = []
    for part in body.split(", "):
        name, sep, value = part.partition(": ")
        if sep:
            out.append((name.strip(), [value.strip()]))
        elif out:
            out[-1][1].append(part.strip())  # (joined once below: growing the text each time was quadratic)
    return [(name, ", ".join(values)) for name, values in out]


def _num(text: str) -> float:
    """A rate, length or percentage: a non-negative number in ASCII, or NaN (vLLM prints ``nan%``
    for the acceptance rate of an interval without drafts); ValueError for anything else (a
    negative figure, ``inf``, a fullwidth digit: no engine writes one)."""
    word = text.split()[0].rstrip("%")
    if word.isascii() and word.lower() in ("nan", "-nan", "+nan"):
        return math.nan
    n = to_float(word)
    if n < 0:
        raise ValueError(f"{word!r} is negative")
    return n


def _count(text: str) -> int:
    """A count (``412 tokens``, ``3 reqs``): exact, a finite number cut to a whole one; ValueError
    (never OverflowError) for ``1e309``, ``inf``, more digits than Python reads, digits of
    another script, or a negative count."""
    n = to_int(text.split()[0].rstrip("%"), integral=False)
    if n < 0:
        raise ValueError(f"{n} is negative")
    return n


def _why(e: Exception) -> str:
    for reason in ("out of range", "negative"):
        if reason in str(e):
            return "is " + reason
    return "is not a number"


def _leading_numbers(texts: list[str]) -> tuple[float, ...]:
    """The run of numbers a list starts with (what follows a non-number is not the list's);
    ValueError when it does not start with one."""
    out = []
    for t in texts:
        try:
            out.append(to_float(t))
        except ValueError:
            break
    if not out:
        raise ValueError(texts[0])
    if not all(0.0 <= x <= 1.0 for x in out):
        raise ValueError(f"{texts[0]!r} is out of range")  # a rate per position lies in 0-1
    return tuple(out)


def spec_line(line: str, at: int) -> Event:
    """A ``SpecDecoding metrics:`` line, newest or older format."""
    ts, rank = prefix(line, at)
    kw: dict = {}
    for name, value in _items(line[at + len(SPEC_MARKER) :].rstrip()):
        key = SPEC_FIELDS.get(name)
        if key is None:
            continue
        try:
            if key == "per_position":
                kw[key] = _leading_numbers(value.split(", "))
            elif key in _SPEC_INT:
                kw[key] = _count(value)
            else:
                n = _num(value)
                kw[key] = n / 100.0 if value.endswith("%") else n
        except (ValueError, IndexError) as e:
            return Malformed("SpecDecoding metrics", f"{name}: {value!r} {_why(e)}", line[:500], ts, rank)
    if not kw:
        return Malformed("SpecDecoding metrics", "no known field", line[:500], ts, rank)
    if kw.get("accepted") is not None and kw.get("drafted") is not None and kw["accepted"] > kw["drafted"]:
        why = f"Accepted: {kw['accepted']} is more than Drafted: {kw['drafted']}"
        return Malformed("SpecDecoding metrics", why, line[:500], ts, rank)
    rate = kw.get("draft_acceptance_rate")
    if rate is not None and rate > 1.0:
        return Malformed("SpecDecoding metrics", f"acceptance rate {rate:.0%} is over 100 %", line[:500], ts, rank)
    return VllmSpec(ts=ts, rank=rank, **kw)


def stats_line(line: str, at: int) -> Event:
    """The periodic ``Avg prompt throughput: …`` line, as decode stats."""
    ts, rank = prefix(line, at)
    kw: dict = {}
    extra: dict = {}
    for name, value in _items(line[at:].rstrip()):
        key = STATS_FIELDS.get(name)
        try:
            if key == "gen_throughput":
                kw[key] = _num(value)
            elif key is not None:
                kw[key] = _count(value)
            elif name.endswith("KV cache usage"):
                kw["token_usage"] = _num(value) / 100.0
            else:
                n = value.split()[0].rstrip("%") if value else ""
                extra[re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")] = (
                    float(n) if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", n) and len(value.split()) <= 2 else value
                )
        except (ValueError, IndexError) as e:
            return Malformed("Avg prompt throughput", f"{name}: {value!r} {_why(e)}", line[:500], ts, rank)
    if "gen_throughput" not in kw:
        return Malformed("Avg prompt throughput", "missing Avg generation throughput", line[:500], ts, rank)
    return DecodeStats(extra=extra, ts=ts, rank=rank, **kw)


VLLM.rules = (  # (set here: the readers are defined above)
    Rule(SPEC_MARKER, spec_line, None, "SpecDecoding metrics"),
    Rule(STATS_MARKER, stats_line, None, "Avg prompt throughput"),
)
