"""The simulator's vLLM dialect: ``python -m tuitune.sim --sim-engine vllm serve MODEL [flags]``.

Same machine model and scheduler as the SGLang dialect (``server.Simulator``); what differs is
what an operator sees of a vLLM 0.33 server (FACTS.md §3):
- the command line: ``serve [model_tag]`` and the flags tuitune renders (``--speculative-config``
  JSON with ``method``, ``model``, ``num_speculative_tokens``, ``draft_tensor_parallel_size``),
  checked as vLLM checks them; ``serve --help=all`` lists every flag;
- log lines with vLLM's prefix ``(PROCESS pid=N) LEVEL MM-DD HH:MM:SS [file.py:line]``, the
  start-up sequence, and every ``VLLM_LOG_STATS_INTERVAL`` seconds (simulated) the throughput
  line and the ``SpecDecoding metrics:`` line; SGLang's batch lines are not printed;
- HTTP: ``/health`` (200 once the API server is up: vLLM starts HTTP only after the engine is
  ready), ``/v1/models``, ``/v1/completions`` (404 for a model name it does not serve),
  ``/version``, and ``/metrics`` always on, written by prometheus_client with vLLM's metric
  names, spec-decode counters per position included;
- an engine-core process started beside the API server, outside its process group (the worst
  case a stop must handle: a process tree, not only a group).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from http import HTTPStatus

from aiohttp import web

from tuitune.sim import args as sim_args
from tuitune.sim.server import Log, Simulator
from tuitune.sim.switch import DynamicSchedule

VERSION = "0.33.0"
KV_TOKENS = 1_062_144  # the KV cache's capacity in tokens, as the SGLang dialect reports it
ROUTES = (
    ("GET", "/health", "h_health"),
    ("GET", "/metrics", "h_metrics"),
    ("GET", "/version", "h_version"),
    ("GET", "/v1/models", "h_models"),
    ("POST", "/v1/completions", "h_completions"),
    ("POST", "/v1/chat/completions", "h_chat"),
)
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50, "trace": 5}


class VllmLog(Log):
    """vLLM's log prefix; the SGLang-only lines the shared scheduler prints are left out."""

    SGLANG_ONLY = (
        "Prefill batch",
        "Decode batch",
        "EAGLE3_PROFILE",
        "The server is fired up",
        "Adaptive speculative steps",  # the SGLang dialect's word for a change of steps
        "INFO:     Uvicorn running on",
    )  # vLLM serves on a socket it bound itself

    def __init__(self, level: str):
        super().__init__(level)
        self.process = "APIServer"
        self.where = "api_server.py:1"
        self.pids = {"APIServer": os.getpid()}  # EngineCore_DP0: the engine-core child's

    def prefix(self, rank: str | None = "TP0") -> str:
        stamp = time.strftime("%m-%d %H:%M:%S")
        return f"({self.process} pid={self.pids.get(self.process, os.getpid())}) INFO {stamp} [{self.where}] "

    def line(self, msg: str, rank: str | None = "TP0", force: bool = False) -> None:
        if msg.startswith(self.SGLANG_ONLY):
            return
        if msg.startswith("INFO:     "):  # uvicorn's own lines carry only the process part
            return self.plain(f"({self.process} pid={os.getpid()}) {msg}")
        super().line(msg, rank, force)

    def at(self, process: str, where: str, msg: str, force: bool = False) -> None:
        self.process, self.where = process, where
        Log.line(self, msg, force=force)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm", description="tuitune's vLLM emulator (vLLM 0.33 dialect)")
    p.add_argument("--sim-engine", choices=["sglang", "vllm"], default="vllm", help="which engine the simulator plays")
    sub = p.add_subparsers(dest="subparser", required=True)
    s = sub.add_parser(
        "serve", usage="vllm serve [model_tag] [options]", help="Launch a local OpenAI-compatible API server"
    )
    s.add_argument("model_tag", nargs="?", default="Qwen/Qwen3-0.6B")
    s.add_argument(
        "--sim-engine",
        choices=["sglang", "vllm"],
        default="vllm",
        help="which engine the simulator plays (given before `serve`)",
    )
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    s.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument("--max-num-seqs", type=int, default=None)
    s.add_argument("--max-num-batched-tokens", type=int, default=None)
    s.add_argument("--served-model-name", nargs="+", default=None)
    s.add_argument("--trust-remote-code", action="store_true")
    s.add_argument("--disable-custom-all-reduce", action="store_true")
    s.add_argument("--enforce-eager", action="store_true")
    s.add_argument("--dtype", default="auto")
    s.add_argument("--quantization", "-q", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--disable-log-stats", action="store_true")
    s.add_argument("--enable-log-requests", action="store_true")
    s.add_argument("--uvicorn-log-level", default="info", choices=list(LEVELS))
    s.add_argument("--speculative-config", "-sc", type=json.loads, default=None)
    s.add_argument("--help=all", dest="help_all", action="help", help="show every flag and exit")
    # the simulator's own knobs, shared with the SGLang dialect (argparse has no public way to
    # copy a group from one parser to another, so its actions are re-added)
    group = s.add_argument_group("simulator")
    shared = next(g for g in sim_args.build_parser()._action_groups if g.title == "simulator")
    for action in shared._group_actions:
        group._add_action(action)
    return p


def speculative(ns, tp: int) -> tuple[str | None, int, str | None]:
    """(algorithm, tokens, draft model) from --speculative-config, checked as SpeculativeConfig does;
    raises ValueError with vLLM's kind of message."""
    cfg = ns.speculative_config
    if cfg is None:
        return None, 0, None
    if not isinstance(cfg, dict):
        raise ValueError("speculative_config must be a JSON object")
    unknown = sorted(
        set(cfg)
        - {
            "method",
            "model",
            "num_speculative_tokens",
            "draft_tensor_parallel_size",
            "quantization",
            "max_model_len",
            "enforce_eager",
            "prompt_lookup_max",
            "prompt_lookup_min",
            "num_speculative_tokens_per_batch_size",
        }
    )
    if unknown:
        raise ValueError(f"1 validation error for SpeculativeConfig\n{unknown[0]}\n  Unexpected keyword argument")
    method = cfg.get("method")
    if method == "suffix":  # the drafter imports Arctic Inference, which this machine does not have
        raise ImportError(
            "Arctic Inference is required for suffix decoding. Install via `pip install arctic-inference==0.1.1`."
        )
    if method not in ("eagle", "eagle3", "ngram"):
        raise ValueError(
            f"1 validation error for SpeculativeConfig\nmethod\n  the simulator plays eagle, eagle3 "
            f"and ngram (got {method!r})"
        )
    k = cfg.get("num_speculative_tokens")
    if not isinstance(k, int) or k <= 0:
        raise ValueError(
            "1 validation error for SpeculativeConfig\nnum_speculative_tokens\n  Input should be greater than 0"
        )
    if method == "ngram":
        lo, hi = cfg.get("prompt_lookup_min"), cfg.get("prompt_lookup_max")
        for name, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(
                    f"1 validation error for SpeculativeConfig\n{name}\n  Input should be greater than or equal to 1"
                )
        lo, hi = (lo or hi or 5), (hi or lo or 5)  # one copied to the other; neither: 5 and 5
        if lo > hi:
            raise ValueError(f"prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
        return "NGRAM", k, None
    if not cfg.get("model"):
        raise ValueError("num_speculative_tokens was provided but without speculative model.")
    dtp = cfg.get("draft_tensor_parallel_size")
    if dtp not in (None, 1, tp):
        raise ValueError(
            f"draft_tensor_parallel_size={dtp} cannot be other value than 1 or target model tensor_parallel_size={tp}"
        )
    return method.upper(), k, cfg["model"]


def sglang_namespace(ns) -> argparse.Namespace:
    """The shared simulator reads SGLang's argument names: translate vLLM's."""
    out = sim_args.build_parser().parse_args([])
    for k, v in vars(ns).items():
        if k.startswith("sim_"):
            setattr(out, k, v)
    algo, k, draft = speculative(ns, ns.tensor_parallel_size)
    name = ns.served_model_name[0] if ns.served_model_name else ns.model_tag
    out.__dict__.update(
        model_path=ns.model_tag,
        served_model_name=name,
        host=ns.host or "0.0.0.0",
        port=ns.port,
        tp_size=ns.tensor_parallel_size,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        speculative_algorithm=algo,
        speculative_draft_model_path=draft,
        speculative_num_steps=k or None,
        speculative_eagle_topk=1 if k else None,
        speculative_num_draft_tokens=k + 1 if k else None,
        max_running_requests=ns.max_num_seqs,
        context_length=ns.max_model_len,
        enable_metrics=True,
        decode_log_interval=1,
        mem_fraction_static=ns.gpu_memory_utilization,
        log_level="warning" if ns.uvicorn_log_level in ("warning", "error", "critical") else "info",
    )
    return out


class VllmSimulator(Simulator):
    # as the real vLLM 0.32 streams (seen on its CPU build): no "usage" key in a text chunk, and a
    # stream that ends in tokens the detokenizer holds back ends on chunks with an empty text
    USAGE_NULL = False
    HOLD_BACK, HOLD_BACK_EVERY = 3, 4

    def __init__(self, ns, vns, faults, machine, acceptance, non_default: dict):
        super().__init__(ns, faults, machine, acceptance, [])
        self.vns = vns
        self.non_default = non_default
        self.log = VllmLog(ns.log_level)
        self.interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))
        k = self.cfg.steps if self.cfg.speculative else 0
        self.k = k
        self.acc = self._zero()
        self.prof = self._zero()  # the probe's window: closed on a change of K or hold, else with the stats
        self.prompt_tokens = 0
        self.metrics = Metrics(ns.served_model_name, k)

    def refuse_hold(self, steps: int | None) -> str | None:
        """vLLM holds K by its schedule's lookup: a launch without a schedule cannot switch."""
        if self.adaptive is None:
            return (
                "this launch has no num_speculative_tokens_per_batch_size schedule: add one to "
                "--speculative-config and relaunch to switch K in it"
            )
        if steps is not None and not 0 <= steps <= self.k:
            return f"K={steps} is outside 0..{self.k}, the num_speculative_tokens this launch was started with"
        return None

    def adapt_steps(self, win, bs: int, now: float):
        """A schedule's (or a hold's) K for this step; the probe's line closes when it changes."""
        win = super().adapt_steps(win, bs, now)
        key = (self.cfg.steps, win.held)
        if self.prof["cycles"] and self.prof["key"] != key and self.profile:
            self.log_profile(self.prof)
        if self.prof["key"] != key:
            self.prof = self._zero()
        self.prof["key"] = key
        return win

    def _zero(self) -> dict:
        return {
            "key": (self.cfg.steps, None),  # (K, held) of the probe's window
            "drafted": 0,
            "drafts": 0,
            "accepted": 0,
            "per_pos": [0] * self.k,
            "gen": 0,
            "t0": time.monotonic(),
            "cycles": 0,
            "draft": 0.0,
            "verify": 0.0,
            "verifies": [],
            "hist": Counter(),
        }

    # ---- start-up ------------------------------------------------------------------------
    async def startup(self) -> bool:
        ns, log = self.ns, self.log
        load = max(0.0, ns.sim_load_seconds)
        log.at("APIServer", "utils.py:253", f"vLLM API server version {VERSION} (tuitune.sim)")
        log.at("APIServer", "utils.py:253", f"non-default args: {self.non_default}")
        if self.cfg.model_free:  # as vLLM 0.32's CPU build said, serving ngram
            log.at(
                "APIServer",
                "vllm.py:1605",
                "Async scheduling not supported with ngram-based speculative decoding and will be disabled.",
            )
        self.spawn_engine_core()
        if not self.nccl_init():
            return False
        where = "gpu_model_runner.py:4979"
        log.at(
            "EngineCore_DP0",
            "core.py:95",
            f"Initializing a V1 LLM engine (v{VERSION}) with config: "
            f"model={ns.model_path!r}, tensor_parallel_size={ns.tp_size}, speculative_config="
            f"{self.vns.speculative_config!r}",
        )
        if self.vns.gpu_memory_utilization < 0.2:
            await self.sleep_sim(load * 0.4)
            self.engine_failure(
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
            return False
        log.at("EngineCore_DP0", where, f"Starting to load model {ns.model_path}...")
        await self.sleep_sim(load * 0.45)
        if self.cfg.speculative:  # ngram too: the runner loads "the drafter" whatever it is (seen on 0.32)
            log.at("EngineCore_DP0", "gpu_model_runner.py:5010", "Loading drafter model...")
            await self.sleep_sim(load * 0.1)
        log.at(
            "EngineCore_DP0",
            "gpu_model_runner.py:5089",
            f"Model loading took 71.21 GiB memory and {load * 0.55:.6f} seconds",
        )
        log.at("EngineCore_DP0", "gpu_worker.py:773", "Available KV cache memory: 16.04 GiB")
        log.plain("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67")
        await self.sleep_sim(load * 0.35)
        log.at(
            "EngineCore_DP0",
            "gpu_model_runner.py:6517",
            f"Graph capturing finished in {max(1, round(load * 0.35))} secs, took 0.52 GiB",
        )
        log.at(
            "EngineCore_DP0", "core.py:413", f"init engine (profile, create kv cache, warmup model) took {load:.2f} s"
        )
        log.at("APIServer", "launcher.py:188", "Available routes are:")
        for method, path, _ in ROUTES:
            log.at("APIServer", "launcher.py:197", f"Route: {path}, Methods: {method}")
        asyncio.ensure_future(self.stats_logger())
        return True

    def spawn_engine_core(self) -> None:
        """EngineCore (and, past TP 1, workers): children that leave the server's process group."""
        code = "import os,sys,time\nos.setpgid(0, 0)\np=int(sys.argv[1])\nwhile os.getppid()==p: time.sleep(0.2)\n"
        for _ in range(1 + min(1, self.ns.tp_size - 1)):
            self.children.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.log.pids["EngineCore_DP0"] = self.children[0].pid

    def engine_failure(self, final: str) -> None:
        self.log.at("EngineCore_DP0", "core.py:1036", "EngineCore failed to start.", force=True)
        self.log.plain("Traceback (most recent call last):")
        self.log.plain('  File "/usr/lib/python3/dist-packages/vllm/v1/engine/core.py", line 1027, in run_engine_core')
        self.log.plain(final)

    def traceback(self, final: str) -> None:
        self.engine_failure(final)

    async def warmup(self) -> None:
        self.ready = True  # vLLM warms up before HTTP starts: /health answers 200 from the start

    # ---- statistics ----------------------------------------------------------------------
    def emit(self, r, n: int) -> int:
        seen = getattr(r, "vllm_verifies", 0)
        k = self.cfg.steps  # this step's K (a schedule's or a hold's), at most self.k
        if k and r.verify_ct > seen:  # a verify step (not the prefill's first token)
            r.vllm_verifies = r.verify_ct
            accepted = min(max(0, n - 1), k)
            for a in (self.acc, self.prof):
                a["drafts"] += 1
                a["drafted"] += k
                a["accepted"] += accepted
                a["hist"][accepted + 1] += 1  # tokens this verify kept, the bonus token included
            for i in range(accepted):
                self.acc["per_pos"][i] += 1
            self.metrics.observe_draft(k, accepted)
        out = super().emit(r, n)
        self.acc["gen"] += out
        self.metrics.generation.inc(out)
        return out

    def submit(self, prompt_tokens: int, max_tokens: int):
        r = super().submit(prompt_tokens, max_tokens)
        self.prompt_tokens += r.prompt_tokens
        self.metrics.prompt.inc(r.prompt_tokens)
        return r

    def report_window(self, win, now: float) -> None:
        # the shared scheduler closes a window every cycle here (decode_log_interval 1); vLLM logs
        # on a clock, so the window is only added up (the drafter's extend belongs to its propose)
        for a in (self.acc, self.prof):
            a["cycles"] += win.cycles
            a["draft"] += win.sums["draft"] + win.sums["extend"]
            a["verify"] += win.sums["verify"] + win.sums["other"]
            a["verifies"] += win.verify_samples
        self.last_gen_throughput = win.tokens / max(now - win.start, 1e-9)

    async def stats_logger(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.interval / self.speedup))
            if self.acc["gen"] or self.running or self.waiting:
                self.log_stats()

    def log_stats(self) -> None:
        a, self.acc = self.acc, self._zero()
        elapsed = max(time.monotonic() - a["t0"], 1e-9)
        prompt, self.prompt_tokens = self.prompt_tokens, 0
        in_cache = sum(r.prompt_tokens + r.produced for r in self.running)
        usage = min(100.0, in_cache / KV_TOKENS * 100)
        where = "loggers.py:257"
        self.log.at(
            "APIServer",
            where,
            f"Engine 000: Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {a['gen'] / elapsed:.1f} tokens/s, Running: {len(self.running)} "
            f"reqs, Waiting: {len(self.waiting)} reqs, GPU KV cache usage: {usage:.1f}%, "
            f"Prefix cache hit rate: 0.0%",
        )
        if a["drafts"]:
            drafted = a["drafted"]
            rates = ", ".join(f"{c / a['drafts']:.3f}" for c in a["per_pos"])
            self.log.at(
                "APIServer",
                "metrics.py:142",
                f"SpecDecoding metrics: Mean acceptance length: {1 + a['accepted'] / a['drafts']:.2f}, "
                f"Accepted throughput: {a['accepted'] / elapsed:.2f} tokens/s, "
                f"Drafted throughput: {drafted / elapsed:.2f} tokens/s, Accepted: {a['accepted']} tokens, "
                f"Drafted: {drafted} tokens, Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {a['accepted'] / drafted * 100:.1f}%",
            )
        if self.profile and self.cfg.speculative and self.prof["cycles"]:
            self.log_profile(self.prof)
            self.prof = {**self._zero(), "key": self.prof["key"]}  # the setting runs on

    def log_profile(self, a: dict) -> None:
        """What tuitune's probe prints from inside vLLM's engine core (a process of its own)."""
        n = a["cycles"]
        k, held = a["key"]
        d, v = a["draft"] / n, a["verify"] / n
        s = sorted(a["verifies"])
        accept = 1 + a["accepted"] / max(1, a["drafts"])
        bs = max(1, round(a["drafts"] / n)) if k else 1
        hist = ",".join(f"{k}:{c}" for k, c in sorted(a["hist"].items()))
        self.log.at(
            "EngineCore_DP0",
            "gpu_model_runner.py:3906",
            f"EAGLE3_PROFILE v=2 cycles={n} bs={bs} steps={k} topk=1 draft_tokens={k + 1} "
            + ("drafter=ngram " if self.cfg.model_free else "")
            + ("" if held is None else f"held={held} ")
            + f"verify_tokens={bs * (k + 1)} draft_ms={d:.3f} verify_ms={v:.3f} extend_ms=0.000 "
            f"cycle_ms={d + v:.3f} accept_len={accept:.3f} accept_hist={hist} "
            f"eff_tok_s={accept * bs / (d + v) * 1000:.2f} "
            f"p50_verify_ms={s[len(s) // 2]:.3f} p90_verify_ms={s[min(len(s) - 1, int(len(s) * 0.9))]:.3f} "
            f"max_verify_ms={s[-1]:.3f} sync=sim",
        )

    # ---- HTTP ----------------------------------------------------------------------------
    async def h_completions(self, request: web.Request, chat: bool = False) -> web.StreamResponse:
        body = await self._json(request)
        if body.get("model") not in (None, self.ns.served_model_name):
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
                status=404,
            )
        return await super().h_completions(request, chat)

    async def h_models(self, request: web.Request) -> web.Response:
        name = self.ns.served_model_name
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": self.ns.model_path,
                        "parent": None,
                        "max_model_len": self.ns.context_length or 262144,
                    }
                ],
            }
        )

    async def h_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def h_metrics(self, request: web.Request) -> web.Response:
        self.metrics.running.set(len(self.running))
        self.metrics.waiting.set(len(self.waiting))
        return web.Response(body=self.metrics.exposition(), content_type="text/plain", charset="utf-8")

    @web.middleware
    async def access_log(self, request: web.Request, handler):
        """uvicorn's access log, on by default in vLLM: one line a request, through the API
        server's prefix (``(APIServer pid=N) INFO:     127.0.0.1:PORT - "GET /metrics HTTP/1.1"
        200 OK``), off at ``--uvicorn-log-level warning`` and above."""
        status = 500  # what uvicorn logs for a handler that raised
        try:
            resp = await handler(request)
            status = resp.status
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            if LEVELS.get(self.vns.uvicorn_log_level, 20) <= LEVELS["info"]:
                peer = request.transport.get_extra_info("peername") if request.transport else None
                who = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "127.0.0.1:0"
                phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
                self.log.plain(
                    f"(APIServer pid={os.getpid()}) "
                    f'INFO:     {who} - "{request.method} {request.path_qs} HTTP/{request.version.major}.'
                    f'{request.version.minor}" {status} {phrase}'.rstrip()
                )
        return resp

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024, middlewares=[self.access_log])
        for method, path, handler in ROUTES:
            app.router.add_route(method, path, getattr(self, handler))
        app.router.add_get("/sim/state", self.h_server_info)  # sim-only: the load, for sim.nvidia_smi
        return app


class Metrics:
    """vLLM's Prometheus metrics, kept by prometheus_client as vLLM keeps them, under the names vLLM
    0.33.0 declares (spelled here: the simulator plays the server and reads nothing of tuitune)."""

    def __init__(self, model_name: str, k: int):
        import prometheus_client as pc

        self.pc = pc
        self.registry = pc.CollectorRegistry()
        labels, values = ["model_name", "engine"], [model_name, "0"]

        def counter(name: str, doc: str):
            return pc.Counter(name, doc, labels, registry=self.registry).labels(*values)

        self.generation = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prompt = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.running = pc.Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=self.registry,
        ).labels(*values)
        self.waiting = pc.Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=self.registry
        ).labels(*values)
        self.k = k
        if k:
            self.drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            per_pos = pc.Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels + ["position"],
                registry=self.registry,
            )
            self.per_pos = [per_pos.labels(*values, str(i)) for i in range(k)]

    def observe_draft(self, drafted: int, accepted: int) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(drafted)
        self.accepted.inc(accepted)
        for i in range(accepted):
            self.per_pos[i].inc()

    def exposition(self) -> bytes:
        return self.pc.generate_latest(self.registry)


def main(argv: list[str]) -> int:
    parser = build_parser()
    vns = parser.parse_args(argv)
    defaults = vars(parser.parse_args(["serve"]))
    non_default = {k: v for k, v in vars(vns).items() if not k.startswith("sim_") and v != defaults.get(k)}
    faults = sim_args.parse_faults(parser, vns.sim_fault)
    acceptance = sim_args.parse_acceptance(parser, vns.sim_acceptance)
    machine = sim_args.load_machine(parser, vns.sim_machine)
    log = VllmLog("info")
    try:
        ns = sglang_namespace(vns)
    except ImportError as e:  # SpeculativeConfig's own check, in the API server, before any engine starts
        log.plain("Traceback (most recent call last):")
        log.plain(
            '  File "/usr/lib/python3/dist-packages/vllm/config/speculative.py", line 1728, in _validate_suffix_decoding'
        )
        log.plain(f"ImportError: {e}")
        return 1
    except ValueError as e:
        log.at("APIServer", "api_server.py:1", "Error in inspecting model architecture", force=True)
        log.plain("Traceback (most recent call last):")
        log.plain(
            '  File "/usr/lib/python3/dist-packages/vllm/engine/arg_utils.py", line 1790, in create_speculative_config'
        )
        log.plain(
            f"pydantic_core._pydantic_core.ValidationError: {e}" if "validation error" in str(e) else f"ValueError: {e}"
        )
        return 1
    sim = VllmSimulator(ns, vns, faults, machine, acceptance, non_default)
    table = (vns.speculative_config or {}).get("num_speculative_tokens_per_batch_size")
    if table is not None:
        try:
            sim.adaptive = DynamicSchedule(table, sim.k)
        except ValueError as e:
            log.plain(f"ValueError: {e}")
            return 1
    try:
        return asyncio.run(sim.run())
    except KeyboardInterrupt:
        return 0
