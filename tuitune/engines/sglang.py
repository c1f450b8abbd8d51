"""SGLang (sgl-project/sglang): flags, speculative rules and configurations, start-up phases,
readiness, metric names, info endpoints (FACTS.md §2, §7); its log lines and request log are
``engines/sglang_log.py``'s, its adaptive-steps schedule ``engines/sglang_schedule.py``'s.

SGLang silently rewrites some speculative combinations at start-up (topk 1 forces draft tokens
= steps + 1) and refuses others (``server_args.py``); ``resolve`` applies the same rules up front
so that the command tuitune shows is the configuration the server will really run.
"""

from __future__ import annotations

import json
import math

from tuitune.base.events import MetricsWindow
from tuitune.engines.base import MAX_STEPS, Engine, Flag, Resolved, mean_gauge
from tuitune.engines.sglang_log import RULES, log_prefix, request_log
from tuitune.engines.sglang_schedule import ADAPTIVE_BUCKETS, SCHEDULE, check_adaptive, read_adaptive, write_adaptive

# ---- speculative rules (server_args.py) ------------------------------------------------------------

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "SUFFIX")
NEEDS_DRAFT_MODEL = ("EAGLE", "EAGLE3", "STANDALONE")
# drafting without a draft model: n-gram lookup in the request's own tokens (prompt lookup), and
# vLLM's suffix decoding (suffix trees over the prompt and earlier outputs)
MODEL_FREE = ("NGRAM", "SUFFIX")
# SGLang's NGRAM defaults (arg_groups/speculative_hook.py _handle_ngram, fields/spec.py, 0.5.23):
# 12 draft tokens; the tree's breadth (its "topk") is --speculative-ngram-max-bfs-breadth, 10
NGRAM_DRAFT_TOKENS = 12
NGRAM_MAX_BFS_BREADTH = 10
NGRAM_MIN_BFS_BREADTH = 1


def resolve(  # noqa: C901
    algorithm: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    draft_model_path: str | None = None,
    ngram_max_bfs_breadth: int | None = None,
    ngram_min_bfs_breadth: int | None = None,
) -> Resolved:
    """Apply the rules; raise ValueError with a sentence for a combination SGLang refuses."""
    if algorithm is None:
        return Resolved(None, None, None, None)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if algorithm == "NGRAM":
        return resolve_ngram(num_steps, eagle_topk, num_draft_tokens, ngram_max_bfs_breadth, ngram_min_bfs_breadth)
    if algorithm == "SUFFIX":
        raise ValueError("algorithm SUFFIX is vLLM's suffix decoding (server.engine: vllm); SGLang has no such drafter")
    if algorithm in NEEDS_DRAFT_MODEL and not draft_model_path:
        raise ValueError(f"draft_model_path is required for {algorithm}")
    if num_steps is None:
        if eagle_topk is not None or num_draft_tokens is not None:
            raise ValueError(
                "num_steps, eagle_topk and num_draft_tokens are all-or-none: set "
                "num_steps too, or leave all three for SGLang to choose"
            )
        return Resolved(algorithm, None, None, None)
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1 (got {num_steps})")
    derived: list[str] = []
    adjusted: list[str] = []
    if eagle_topk is None:
        if num_draft_tokens is not None:
            raise ValueError("num_steps, eagle_topk and num_draft_tokens are all-or-none: eagle_topk is missing")
        eagle_topk = 1
        derived.append("eagle_topk")
    if eagle_topk < 1:
        raise ValueError(f"eagle_topk must be >= 1 (got {eagle_topk})")
    if eagle_topk == 1:
        if num_draft_tokens is None:
            derived.append("num_draft_tokens")
        elif num_draft_tokens != num_steps + 1:
            adjusted.append(
                f"num_draft_tokens {num_draft_tokens} would be adjusted by SGLang to "
                f"num_steps + 1 = {num_steps + 1} because eagle_topk is 1"
            )
        num_draft_tokens = num_steps + 1
    elif num_draft_tokens is None:
        raise ValueError("num_draft_tokens must be set when eagle_topk > 1")
    limit = num_steps * eagle_topk + 1
    if num_draft_tokens > limit:
        raise ValueError(f"num_draft_tokens {num_draft_tokens} is more than num_steps * eagle_topk + 1 = {limit}")
    if num_draft_tokens < 2:
        raise ValueError(f"num_draft_tokens must be >= 2 (got {num_draft_tokens})")
    return Resolved(algorithm, num_steps, eagle_topk, num_draft_tokens, tuple(derived), tuple(adjusted))


def resolve_ngram(
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
    max_breadth: int | None,
    min_breadth: int | None,
) -> Resolved:
    """SGLang's NGRAM: a tree of ``num_draft_tokens`` tokens (the last verified one and the
    drafts looked up in a trie of the request's own tokens) at most ``max_breadth`` wide. SGLang
    overwrites ``speculative_eagle_topk`` with the breadth and derives ``speculative_num_steps``
    from both, so neither is a setting here. In tuitune's terms the configuration is (steps,
    topk, draft tokens) = (draft tokens − 1, breadth, draft tokens): a chain when the breadth is 1."""
    if eagle_topk is not None:
        raise ValueError(
            "eagle_topk: SGLang's NGRAM sets it from ngram_max_bfs_breadth (the tree's breadth); set that instead"
        )
    if num_steps is not None:
        raise ValueError(
            "num_steps: SGLang's NGRAM derives it from num_draft_tokens and the breadth; set num_draft_tokens"
        )
    derived: list[str] = []
    if num_draft_tokens is None:
        num_draft_tokens = NGRAM_DRAFT_TOKENS
        derived.append("num_draft_tokens")
    if max_breadth is None:
        max_breadth = NGRAM_MAX_BFS_BREADTH
        derived.append("ngram_max_bfs_breadth")
    low = NGRAM_MIN_BFS_BREADTH if min_breadth is None else min_breadth
    if low > max_breadth:
        raise ValueError(f"ngram_min_bfs_breadth {low} is more than ngram_max_bfs_breadth {max_breadth}")
    return Resolved("NGRAM", num_draft_tokens - 1, max_breadth, num_draft_tokens, tuple(derived))


# ---- the configurations advise and tune compare ------------------------------------------------------

TOPKS = (1, 2, 4, 8)
TREE_TOKENS = (4, 6, 8, 12, 16, 24, 32, 48, 64)  # draft-token budgets tried for trees (and the full tree)


def configurations(max_steps: int = MAX_STEPS, topks: tuple[int, ...] = TOPKS) -> list[tuple[int, int, int]]:
    """(steps, topk, draft tokens): speculation off (0, 1, 1); steps 1 to ``max_steps``; for topk 1
    draft tokens = steps + 1, for trees the budgets in ``TREE_TOKENS`` that SGLang accepts
    (``steps < draft_tokens <= steps × topk + 1``, more than a chain's) plus the full tree."""
    out = [(0, 1, 1)]
    for steps in range(1, max_steps + 1):
        for k in topks:
            if k == 1:
                out.append((steps, 1, steps + 1))
                continue
            full = steps * k + 1
            budgets = {n for n in TREE_TOKENS if steps + 1 < n <= full}
            if full <= max(TREE_TOKENS):
                budgets.add(full)
            out.extend((steps, k, n) for n in sorted(budgets))
    return out


# ---- /metrics (--enable-metrics: gauges) and info endpoints -------------------------------------------

GAUGES = {
    "sglang:gen_throughput": "gen_tok_s",
    "sglang:spec_accept_length": "accept_len",
    "sglang:spec_accept_rate": "accept_rate",
    "sglang:num_running_reqs": "running_req",
    "sglang:num_queue_reqs": "queue_req",
}
# counters (deltas over a window): SGLang's own count of request-verifies and tokens, a second source for
# the probe's cycles and accept length (SGLang 0.5.18: accept length = generation tokens / verify calls,
# what a request's meta_info says); with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (CUDA events: GPUs only),
# forward time by category, a second source for the probe's phases
VERIFY_CALLS = "sglang:spec_verify_calls_total"
GEN_TOKENS = "sglang:generation_tokens_total"
FORWARD_SECONDS = "sglang:forward_execution_seconds_total"
COUNTERS = {VERIFY_CALLS: "verify_calls", GEN_TOKENS: "gen_tokens"}
FORWARD_CATEGORIES = {"eagle_draft": "draft_s", "target_verify": "verify_s", "eagle_draft_extend": "extend_s"}
STEP_GAUGES = {"sglang:spec_num_steps": "num_steps", "sglang:spec_num_draft_tokens": "num_draft_tokens"}
DEVICE_TIMER = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"
INFO_PATHS = ("/server_info", "/get_server_info")  # the newer name first


class SGLang(Engine):
    name = "sglang"
    label = "SGLang"
    default_module = "sglang.launch_server"
    default_port = 30000
    model_arg = "model-path"
    modules = ("sglang.launch_server",)
    env_prefixes = ("SGLANG_", "SGL_")
    reserved_args = {
        "port": "server.port",
        "speculative-algorithm": "speculative.algorithm",
        "speculative-draft-model-path": "speculative.draft_model_path",
        "speculative-draft-model": "speculative.draft_model_path",
        "speculative-num-steps": "speculative.num_steps",
        "speculative-eagle-topk": "speculative.eagle_topk",
        "speculative-num-draft-tokens": "speculative.num_draft_tokens",
        "speculative-adaptive": "speculative.adaptive_config",
        "speculative-adaptive-config": "speculative.adaptive_config",
        "speculative-ngram-min-bfs-breadth": "speculative.ngram_min_bfs_breadth",
        "speculative-ngram-max-bfs-breadth": "speculative.ngram_max_bfs_breadth",
        "speculative-ngram-max-trie-depth": "speculative.ngram_max_trie_depth",
        # multi-node: rendered per node from target.nodes (Preset.node_presets)
        "nnodes": "target.nodes",
        "node-rank": "target.nodes",
        "dist-init-addr": "target.nodes and server.dist_init_port",
    }
    algorithms = ALGORITHMS
    phases = (
        ("Load weight begin", "loading weights"),
        ("Capture cuda graph begin", "capturing graphs"),
        ("Capture draft cuda graph begin", "capturing draft graphs"),
    )
    repeated_phases = {"loading weights": "loading draft model"}
    errors = (
        # the HTTP server's words when its scheduler (or detokenizer) is gone: killed, or crashed without a
        # traceback of its own (seen on SGLang 0.5.18: "Subprocess scheduler_0 (pid=26022) crashed with
        # exit code -9. Triggering SIGQUIT for cleanup...")
        ("crashed with exit code", "engine_died"),
    )
    rules = RULES  # (engines/sglang_log.py)
    gauges = GAUGES
    info_paths = INFO_PATHS
    editable_flags = (
        Flag("num-continuous-decode-steps", "cont. decode steps", "int"),
        Flag("mem-fraction-static", "mem fraction static", "float"),
        Flag("disable-custom-all-reduce", "disable custom all-reduce", "bool"),
    )
    schedule = SCHEDULE
    schedule_buckets = ADAPTIVE_BUCKETS
    topks = TOPKS
    model_free = MODEL_FREE
    log_prefix = staticmethod(log_prefix)

    def resolve(self, spec) -> Resolved:
        """SGLang's rules (``resolve`` above); it answers any section (SUFFIX and vLLM's keys it refuses)."""
        return resolve(
            spec.algorithm,
            getattr(spec, "num_steps", None),
            getattr(spec, "eagle_topk", None),
            getattr(spec, "num_draft_tokens", None),
            getattr(spec, "draft_model_path", None),
            getattr(spec, "ngram_max_bfs_breadth", None),
            getattr(spec, "ngram_min_bfs_breadth", None),
        )

    # ---- the adaptive config (--speculative-adaptive-config): its table is the file's JSON object

    def check_schedule_table(self, table) -> dict[int, list[int]]:
        return check_adaptive(table)

    def schedule_document(self, table) -> dict:
        check_adaptive(table)
        return table

    def write_schedule(self, path: str, document: dict) -> None:
        write_adaptive(path, document)

    def read_schedule(self, path: str, source: str = "the file") -> dict[int, list[int]]:
        return read_adaptive(path, source)

    # ---- /metrics: gauges (last values), counters (deltas), forward time by category

    def metric_families(self) -> tuple[str, ...]:
        return (*GAUGES, *STEP_GAUGES, *COUNTERS, FORWARD_SECONDS)

    def read_metric(self, snap, name: str, samples) -> bool:
        total = name + "_total"  # its counters are kept under the page's name
        if total in COUNTERS:
            snap.counters[total] = sum(s.value for s in samples if s.name == total and math.isfinite(s.value))
        elif total == FORWARD_SECONDS:
            for s in samples:
                key = FORWARD_CATEGORIES.get(s.labels.get("category", ""))
                if s.name == total and key and math.isfinite(s.value):
                    snap.counters[key] = snap.counters.get(key, 0.0) + s.value
        elif name in GAUGES or name in STEP_GAUGES:
            mean_gauge(snap, name, samples)
        else:
            return False
        return True

    def on_page(self, snap) -> bool:
        return any(k in snap.counters for k in (*COUNTERS, *FORWARD_CATEGORIES.values())) or any(
            k in snap.gauges for k in (*GAUGES, *STEP_GAUGES)
        )

    def metrics_window(self, prev, cur, seconds: float) -> MetricsWindow | None:
        """Gauges: their last values; counters: deltas (accept length = generation tokens / verify calls,
        SGLang's own definition, meta_info's)."""
        kw: dict = {}
        for name, key in (*GAUGES.items(), *STEP_GAUGES.items()):
            if name in cur.gauges:
                v = cur.gauges[name]
                kw[key] = int(v) if key.endswith("_req") else v
        delta = {k: cur.counters[k] - prev.counters[k] for k in cur.counters if k in prev.counters}
        if any(v < 0 for v in delta.values()):
            return None  # a restart between the scrapes
        for name, key in COUNTERS.items():
            if name in delta:
                kw[key] = int(delta[name])
        for key in FORWARD_CATEGORIES.values():
            if key in delta:
                kw[key] = delta[key]
        if kw.get("verify_calls") and kw.get("gen_tokens"):
            kw["accept_len"] = kw["gen_tokens"] / kw["verify_calls"]
        return MetricsWindow("sglang", seconds, **kw) if kw else None

    def launch_args(self, preset) -> list[str]:
        out = self.plain_flags(preset.server.args) + ["--port", str(preset.server.port)]
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            out += ["--speculative-algorithm", "NGRAM"] + self._ngram_flags(preset.speculative)
        elif preset.is_speculative:
            r = preset.speculative.resolved()
            out += ["--speculative-algorithm", r.algorithm]
            if preset.speculative.draft_model_path:
                out += ["--speculative-draft-model-path", preset.speculative.draft_model_path]
            if r.num_steps is not None:
                out += [
                    "--speculative-num-steps",
                    str(r.num_steps),
                    "--speculative-eagle-topk",
                    str(r.eagle_topk),
                    "--speculative-num-draft-tokens",
                    str(r.num_draft_tokens),
                ]
            if preset.speculative.adaptive_config:
                out += ["--speculative-adaptive", "--speculative-adaptive-config", preset.speculative.adaptive_config]
        return out

    @staticmethod
    def _ngram_flags(s) -> list[str]:
        """SGLang's NGRAM: the draft token budget and the tree's bounds, each only when set (SGLang
        fills in 12 tokens and breadth 1-10 itself and logs that it did)."""
        out: list[str] = []
        for key, flag in (
            ("num_draft_tokens", "--speculative-num-draft-tokens"),
            ("ngram_min_bfs_breadth", "--speculative-ngram-min-bfs-breadth"),
            ("ngram_max_bfs_breadth", "--speculative-ngram-max-bfs-breadth"),
            ("ngram_max_trie_depth", "--speculative-ngram-max-trie-depth"),
        ):
            if getattr(s, key) is not None:
                out += [flag, str(getattr(s, key))]
        return out

    def help_args(self, preset) -> list[str]:
        return ["--help"]

    def validate(self, preset) -> None:
        if str(preset.env.get(DEVICE_TIMER, "")).lower() in ("1", "true") and preset.server.args.get("device") == "cpu":
            raise ValueError(
                f"env.{DEVICE_TIMER}: SGLang's forward timer uses CUDA events and crashes the server on a CPU "
                "before it is ready (seen with 0.5.18); leave it out there (the probe times the phases)"
            )
        s = preset.speculative
        if s is None:
            return
        if s.algorithm == "SUFFIX":
            raise ValueError(
                "speculative.algorithm: SUFFIX is vLLM's suffix decoding (server.engine: vllm); SGLang's "
                "model-free drafter is NGRAM"
            )
        if s.dynamic_schedule is not None:
            raise ValueError(
                "speculative.dynamic_schedule is vLLM's schedule (server.engine: vllm); SGLang's is "
                "speculative.adaptive_config (tuitune advise --emit sglang-adaptive)"
            )
        if s.switch is not None:
            self._validate_switch(preset)
        ngram = s.algorithm == "NGRAM"
        for key, sglang_key in (
            ("num_speculative_tokens", "num_draft_tokens (drafts + 1)" if ngram else "num_steps"),
            ("draft_tensor_parallel_size", None),
            ("prompt_lookup_min", None),
            ("prompt_lookup_max", None),
        ):
            if getattr(s, key) is not None:
                instead = f"; SGLang spells it speculative.{sglang_key}" if sglang_key else ""
                raise ValueError(f"speculative: {key} is a vLLM setting (server.engine: vllm){instead}")

    @staticmethod
    def _validate_switch(preset) -> None:
        """SGLang switches steps through its adaptive runtime (docs/switch.md): a runtime state per
        candidate step count, built at start-up from the adaptive config, which must hold the switch's."""
        s = preset.speculative
        if s.algorithm not in ("EAGLE", "EAGLE3"):
            raise ValueError(
                f"speculative.switch: SGLang switches the steps of EAGLE and EAGLE3 chains only (its adaptive "
                f"runtime); {s.algorithm}'s settings need a relaunch"
            )
        if s.adaptive_config is None:
            raise ValueError(
                f"speculative.switch: SGLang holds a step count through its adaptive runtime, which has a state only "
                f"for its config's candidate steps; set speculative.adaptive_config to a file on the target such as "
                f'{{"1": {{"candidate_steps": {list(s.switch)}}}}}'
            )
        if 0 in s.switch and preset.server.args.get("device") == "cpu":
            raise ValueError(
                "speculative.switch: steps 0 crashes SGLang's adaptive runtime on a CPU (0.5.18: "
                "`CHECK_EQ(candidates.scalar_type(), index_dtype)`); switch among steps of 1 and more"
            )

    def lint(self, preset) -> list[str]:
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            if preset.speculative.num_draft_tokens is None:
                return [
                    "speculative: num_draft_tokens unset, SGLang's NGRAM verifies 12 tokens a cycle at "
                    "breadth up to 10; set num_draft_tokens (and ngram_max_bfs_breadth) to make runs comparable"
                ]
            return []
        if preset.is_speculative and preset.speculative.num_steps is None:
            return [
                "speculative: num_steps unset, SGLang picks steps/topk/draft tokens per model; "
                "set them to make runs comparable"
            ]
        return []

    def static_config(self, preset) -> tuple[int, int, int] | None:
        r = preset.speculative.resolved()
        return None if r.num_steps is None else (r.num_steps, r.eagle_topk, r.num_draft_tokens)

    def schedule_file(self, preset) -> str | None:
        s = preset.speculative
        return s.adaptive_config if s is not None else None

    def check_schedule(self, preset, text: str) -> str | None:
        """SGLang 0.5.18 refuses to start when --speculative-num-steps is not one of the config's
        candidate steps (``_init_adaptive_speculative_params``: "--speculative-num-steps=2 is not in
        the adaptive config candidate_steps [1]", seen on its CPU build), after its model load."""
        try:
            cfg = check_adaptive(json.loads(text))
        except ValueError as e:
            return f"it is not an adaptive config SGLang loads ({e})"
        steps = preset.speculative.resolved().num_steps
        union = sorted({s for v in cfg.values() for s in v})
        if steps is not None and steps not in union:
            return (
                f"speculative.num_steps {steps} is not one of its candidate steps {union}, and SGLang refuses "
                f"to start then; set num_steps to one of them"
            )
        missing = [k for k in preset.speculative.switch or [] if k not in union]
        if missing:
            return (
                f"speculative.switch holds steps {missing}, which are not among its candidate steps {union}: SGLang "
                "builds a runtime state only for those; add them to candidate_steps"
            )
        return None

    def schedule_allows_off(self, windows) -> bool:
        # SGLang 0.5.18's adaptive runtime on a CPU (the probe's windows say sync=cpu there) crashes
        # at a 0-step candidate (`CHECK_EQ(candidates.scalar_type(), index_dtype) failed. Int vs Long`,
        # ../shared/sglang-cpu/README.md): a schedule for such a server keeps at least one step
        return not any(getattr(w, "sync", None) == "cpu" for w in windows)

    def search_topks(self, preset) -> tuple[int, ...]:
        # NGRAM's trees are looked up, not drafted: the rank model of EAGLE trees says nothing of
        # them, so its search walks chains (breadth 1) of every length, its start included
        if preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            return (1,)
        return self.topks

    def space(self, max_steps: int = MAX_STEPS, topks: tuple[int, ...] | None = None) -> list[tuple[int, int, int]]:
        return configurations(max_steps, self.topks if topks is None else topks)

    def config_changes(self, c, preset=None) -> dict:
        if preset is not None and preset.is_speculative and preset.speculative.algorithm == "NGRAM":
            if c.steps != c.draft_tokens - 1:
                raise ValueError(
                    f"{c.label}: SGLang's NGRAM tree is num_draft_tokens deep at most; its configurations are "
                    "draft tokens and breadth, not steps"
                )
            return {"num_draft_tokens": c.draft_tokens, "ngram_max_bfs_breadth": c.topk, "ngram_min_bfs_breadth": None}
        # a static configuration: any adaptive schedule is dropped (and with it a launch prepared to switch)
        out = {"num_steps": c.steps, "eagle_topk": c.topk, "num_draft_tokens": c.draft_tokens, "adaptive_config": None}
        if preset is not None and preset.is_speculative and preset.speculative.switch is not None:
            out["switch"] = None
        return out

    def speculative_view(self, preset) -> dict:
        r = preset.speculative.resolved()
        if r.algorithm == "NGRAM":
            s = preset.speculative
            return {
                "speculative.algorithm": "NGRAM",
                "speculative.num_draft_tokens": r.num_draft_tokens,
                "speculative.ngram_max_bfs_breadth": r.eagle_topk,
                "speculative.ngram_min_bfs_breadth": s.ngram_min_bfs_breadth or 1,
                **({"speculative.ngram_max_trie_depth": s.ngram_max_trie_depth} if s.ngram_max_trie_depth else {}),
            }
        return {
            "speculative.algorithm": r.algorithm,
            "speculative.draft_model_path": preset.speculative.draft_model_path,
            "speculative.num_steps": r.num_steps,
            "speculative.eagle_topk": r.eagle_topk,
            "speculative.num_draft_tokens": r.num_draft_tokens,
            **(
                {"speculative.adaptive_config": preset.speculative.adaptive_config}
                if preset.speculative.adaptive_config
                else {}
            ),
            **({"speculative.switch": list(preset.speculative.switch)} if preset.speculative.switch else {}),
        }

    request_logging = (
        "start SGLang with --log-requests --log-requests-level 3 --log-requests-format json (level 3 logs "
        "whole prompts; level 2 cuts those over 2,048 characters)"
    )

    def request_reader(self):
        return request_log
