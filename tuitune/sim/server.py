"""The simulated SGLang server process: start-up log, scheduler, HTTP API, faults.

Why one module of this size: the simulator is an independent program; its start-up log, scheduler,
HTTP API and fault injection share the one event loop and clock of a simulated server.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace

from aiohttp import web

from tuitune.sim import adaptive as sim_adaptive
from tuitune.sim import args as sim_args
from tuitune.sim import model, multinode
from tuitune.sim import switch as sim_switch

VERSION = "0.5.3 (tuitune.sim)"
HIDDEN_SIZE = 7168  # Kimi-K2.5 / DeepSeek-V3 shape: decode all-reduce = hidden × tokens × 2 B
NCCL_PROTOS = {"ll", "ll128", "simple"}
NCCL_ALGOS = {"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"}
WORDS = (
    "the of and to in is that it for as with was on be by this are from at or an which "
    "model token decode cycle verify draft tensor parallel kernel graph cache memory "
    "latency throughput speculative accept reject batch stream server request"
).split()


class Log:
    """Writes SGLang-shaped log lines (``[YYYY-mm-dd HH:MM:SS TP0] msg``) to stdout, unbuffered."""

    def __init__(self, level: str):
        self.quiet = level in ("warning", "error", "critical")
        self.ms = os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true")

    def prefix(self, rank: str | None = "TP0") -> str:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.ms:
            stamp += f".{int(now * 1000) % 1000:03d}"
        return f"[{stamp}{' ' + rank if rank else ''}] "

    def raw(self, data: bytes) -> None:
        os.write(1, data)

    def line(self, msg: str, rank: str | None = "TP0", force: bool = False) -> None:
        if self.quiet and not force:
            return
        self.raw((self.prefix(rank) + msg + "\n").encode("utf-8", "replace"))

    def plain(self, msg: str) -> None:
        self.raw((msg + "\n").encode("utf-8", "replace"))


def _nccl_tokens_ok(value: str, allowed: set[str]) -> str | None:
    """Return the first invalid token of an NCCL_PROTO / NCCL_ALGO value, or None."""
    for part in value.split(";"):
        part = part.strip()
        if ":" in part:
            part = part.split(":", 1)[1]
        for tok in part.split(","):
            tok = tok.strip().lstrip("^").lower()
            if tok and tok not in allowed:
                return tok
    return None


@dataclass
class Request:
    rid: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    rng: random.Random
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    produced: int = 0
    verify_ct: int = 0
    unsent: int = 0  # tokens decoded but not streamed yet (--stream-interval)
    first_token_time: float | None = None
    finished: bool = False
    received_wall: float = 0.0

    def next_words(self, n: int) -> list[str]:
        return [self.rng.choice(WORDS) for _ in range(n)]

    async def take(self) -> tuple[int, bool]:
        """Tokens emitted since the last call (waits for one emission at least). A reader that
        fell behind gets them in one chunk, as a server coalesces a slow stream."""
        n, done = await self.out.get()
        while not done and not self.out.empty():
            more, done = self.out.get_nowait()
            n += more
        return n, done

    async def all_words(self) -> list[str]:
        """Every word of the answer, once the request is done (a non-streamed response)."""
        words: list[str] = []
        while True:
            n, done = await self.take()
            words += self.next_words(n)
            if done:
                return words


class Window:
    """One EAGLE3_PROFILE window: phase sums, batch sizes and accepted lengths of its cycles."""

    def __init__(self, start: float):
        self.start = start
        self.cycles = 0
        self.sums = {"draft": 0.0, "verify": 0.0, "extend": 0.0, "other": 0.0}
        self.verify_samples: list[float] = []
        self.bs_hist: Counter[int] = Counter()
        self.accept_hist: Counter[int] = Counter()
        self.tokens = 0
        self.verifies = 0
        self.held: int | None = None  # a tuitune hold in force through the window (docs/switch.md)

    def add(self, bs: int, accepted: list[int], draft: float, verify: float, extend: float, other: float) -> None:
        self.cycles += 1
        for k, v in (("draft", draft), ("verify", verify), ("extend", extend), ("other", other)):
            self.sums[k] += v
        self.verify_samples.append(verify)
        self.bs_hist[bs] += 1
        self.accept_hist.update(accepted)  # one count per request per cycle, bonus token included
        self.tokens += sum(accepted)
        self.verifies += bs

    def profile_line(self, cfg: model.SimConfig) -> str:
        """Profile format v2: v1's keys plus accept_hist, verify_tokens and bs_hist."""
        n = self.cycles
        d, v, e, o = (self.sums[k] / n for k in ("draft", "verify", "extend", "other"))
        cycle = d + v + e + o
        bs = max(1, round(self.verifies / n))
        accept_len = self.tokens / max(1, self.verifies)
        eff = self.tokens / n / cycle * 1000 if cycle > 0 else 0.0
        srt = sorted(self.verify_samples)
        p50, p90 = srt[len(srt) // 2], srt[min(len(srt) - 1, int(len(srt) * 0.9))]
        hist = ",".join(f"{k}:{c}" for k, c in sorted(self.accept_hist.items()))
        bs_hist = ",".join(f"{k}:{c}" for k, c in sorted(self.bs_hist.items()))
        return (
            f"EAGLE3_PROFILE v=2 cycles={n} bs={bs} steps={cfg.steps} topk={cfg.topk} "
            f"draft_tokens={cfg.draft_tokens} {'drafter=ngram ' if cfg.model_free else ''}"
            f"verify_tokens={bs * cfg.draft_tokens} draft_ms={d:.3f} "
            f"verify_ms={v:.3f} extend_ms={e:.3f} other_ms={o:.3f} cycle_ms={cycle:.3f} "
            f"accept_len={accept_len:.3f} accept_hist={hist} bs_hist={bs_hist} eff_tok_s={eff:.2f} "
            f"p50_verify_ms={p50:.3f} p90_verify_ms={p90:.3f} max_verify_ms={srt[-1]:.3f} sync=sim"
            + ("" if self.held is None else f" held={self.held}")
        )


class Simulator:
    # the OpenAI stream's chunks: "usage": null in each text chunk (SGLang's), and no text held back
    USAGE_NULL = True
    HOLD_BACK, HOLD_BACK_EVERY = 0, 0

    def __init__(
        self,
        ns,
        faults: sim_args.Faults,
        machine: model.Machine,
        acceptance: tuple[float, ...] | None,
        warnings: list[str],
    ):
        self.ns = ns
        self.faults = faults
        self.log = Log(ns.log_level)
        self.speedup = max(1e-3, ns.sim_speedup)
        if ns.sim_seed is None:
            ns.sim_seed = random.SystemRandom().randrange(2**31)
        self.rng = random.Random(ns.sim_seed)
        self.uniform = model.QuasiDraws(ns.sim_seed) if ns.sim_draws == "quasi" else (lambda d: self.rng.random())
        self.env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        if ns.sim_topology:
            machine = replace(machine, topology=ns.sim_topology)
        sigma = machine.launch_sigma if ns.sim_launch_sigma is None else ns.sim_launch_sigma
        self.machine = machine
        self.node = multinode.Node(self)
        nnodes = self.node.dist.nnodes
        self.cfg = model.sim_config(
            machine,
            tp_size=ns.tp_size // nnodes,  # the intra-node all-reduce spans one node's GPUs
            custom_all_reduce=not ns.disable_custom_all_reduce,
            continuous_decode_steps=ns.num_continuous_decode_steps,
            algorithm=ns.speculative_algorithm,
            steps=ns.speculative_num_steps or 0,
            topk=ns.speculative_eagle_topk or 1,
            draft_tokens=ns.speculative_num_draft_tokens or 0,
            acceptance=acceptance,
            env_factor=model.nccl_factor(self.env),
            launch_factor=ns.sim_scale * model.jitter(random.Random(ns.sim_seed + 7), sigma),
            internode_ms=multinode.internode_ms(self.env, nnodes, ns.speculative_num_draft_tokens or 1),
        )
        self.warnings = warnings
        self.adaptive: sim_adaptive.AdaptiveSteps | sim_switch.DynamicSchedule | None = None  # steps by batch size
        self.switch = sim_switch.SimSwitch.from_env(lambda msg: self.log.line(msg, force=True))
        self.profile = os.environ.get("EAGLE3_PROFILE", "") not in ("", "0")
        self.record_step_time = os.environ.get("SGLANG_RECORD_STEP_TIME", "") not in ("", "0")
        self.max_running = ns.max_running_requests or 256
        self.ready = False
        self.ready_at: float | None = None
        self.cfg_long: model.SimConfig | None = None  # --sim-context-limit's
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.req_counter = 0
        # Statistics for /server_info and /metrics.
        self.last_gen_throughput = 0.0
        self.last_accept_len = 0.0
        self.total_accept = 0
        self.total_verify = 0
        self.step_times: dict[int, deque] = {}
        self.num_requests_total = 0
        self.generation_tokens_total = 0
        self.cycles_total = self.cycles_late = 0
        self.lag_warned = False
        # The process's own account of keeping up: modelled time (prefills + decode cycles, in real
        # seconds) against the wall time the scheduler was busy; what is over is lag (the host's).
        self.model_busy_s = self.prefill_busy_s = self.wall_busy_s = 0.0
        self.busy_since: float | None = None
        self.lag_s = 0.0  # how far the last cycle started behind its modelled start
        self.children: list[subprocess.Popen] = []
        # SGLang's forward time by category (sglang:forward_execution_seconds_total), kept only with
        # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 as SGLang keeps it (CUDA events: GPUs only)
        self.device_timer = os.environ.get("SGLANG_ENABLE_METRICS_DEVICE_TIMER", "") in ("1", "true", "True")
        self.forward_s: dict[str, float] = {}

    # ---- helpers -------------------------------------------------------------------------
    def scaled(self, ms: float) -> float:
        """Simulated milliseconds -> real seconds."""
        return ms / 1000.0 / self.speedup

    async def sleep_sim(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.speedup)

    def server_args_repr(self) -> str:
        items = {k: v for k, v in vars(self.ns).items() if not k.startswith("sim_")}
        return "server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in items.items()) + ")"

    def expected(self) -> dict:
        cost = model.cycle_cost(self.cfg, 1)
        return {
            "expected_tok_s": model.expected_tok_s(self.cfg) * self.speedup,
            "expected_accept_len": model.expected_accept_len(self.cfg),
            "expected_cycle_ms": cost.cycle_ms / self.speedup,
            "expected_verify_ms": cost.verify_ms / self.speedup,
            "nccl_factor": self.cfg.env_factor,
            "internode_ms": self.cfg.internode_ms,
            "launch_factor": self.cfg.launch_factor,
            "speedup": self.speedup,
            "machine": self.machine.name,
            "cycles": self.cycles_total,
            "cycles_late": self.cycles_late,  # started more than a cycle late: the host was too slow
            # the model's time of the work done vs the wall time it took: wall - model is the lag
            "model_busy_s": round(self.model_busy_s, 6),
            "prefill_busy_s": round(self.prefill_busy_s, 6),
            "wall_busy_s": round(self.busy_wall(), 6),
            "lag_ms": round(self.lag_s * 1000, 3),
            "tokens": self.generation_tokens_total,
        }

    def busy_wall(self) -> float:
        """Wall seconds the scheduler has had work, the current busy spell included."""
        now = asyncio.get_running_loop().time() if self.busy_since is not None else 0.0
        return self.wall_busy_s + (now - self.busy_since if self.busy_since is not None else 0.0)

    # ---- start-up ------------------------------------------------------------------------
    def nccl_init(self) -> bool:
        """Echo NCCL variables as NCCL does; return False on an invalid PROTO/ALGO (init fails)."""
        host = socket.gethostname()
        pid = os.getpid()
        head = f"{host}:{pid}:{pid} [0] NCCL"
        debug = self.env.get("NCCL_DEBUG", "").upper()
        subsys = self.env.get("NCCL_DEBUG_SUBSYS", "").upper()
        if debug in ("INFO", "TRACE"):
            self.log.plain(f"{head} INFO NCCL version 2.27.3+cuda12.9")
            for k in sorted(self.env):
                v = self.env[k]
                if k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"):
                    continue
                end = "." if v.strip().lstrip("-").isdigit() else ""
                self.log.plain(f"{head} INFO {k} set by environment to {v}{end}")
        if self.node.dist.multi:
            lines, fatal = multinode.nccl_net_lines(self.env, head)
            if debug in ("INFO", "TRACE"):
                for ln in lines:
                    self.log.plain(ln)
            if fatal:
                self.log.plain(fatal)
                self.traceback(
                    "torch.distributed.DistBackendError: NCCL error: unhandled system "
                    "error, NCCL version 2.27.3\nncclSystemError: " + fatal.split(" WARN ", 1)[1]
                )
                return False
        for var, allowed, what in (("NCCL_PROTO", NCCL_PROTOS, "protocol"), ("NCCL_ALGO", NCCL_ALGOS, "algorithm")):
            bad = _nccl_tokens_ok(self.env.get(var, ""), allowed)
            if bad is not None:
                self.log.plain(f"{head} WARN Invalid {what} {bad!r} in {var}")
                self.traceback(
                    "torch.distributed.DistBackendError: NCCL error in: "
                    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, invalid usage "
                    "(run with NCCL_DEBUG=WARN for details), NCCL version 2.27.3\n"
                    "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
                )
                return False
        if debug in ("INFO", "TRACE") and ("TUNING" in subsys or subsys == "ALL"):
            tokens = self.cfg.draft_tokens if self.cfg.speculative else 1
            size = HIDDEN_SIZE * 2 * tokens
            proto = self._chosen(self.env.get("NCCL_PROTO", ""), ["LL", "LL128", "SIMPLE"], "LL")
            algo = self._chosen(self.env.get("NCCL_ALGO", ""), ["RING", "TREE"], "RING")
            chans = self.env.get("NCCL_MAX_NCHANNELS", "32")
            hi = max(0, int(chans) - 1) if chans.isdigit() else 31
            self.log.plain(
                f"{head} INFO AllReduce: {size} Bytes -> Algo {algo} proto {proto} channel{{Lo..Hi}}={{0..{hi}}}"
            )
        return True

    @staticmethod
    def _chosen(value: str, names: list[str], default: str) -> str:
        toks = [t.strip().upper() for t in value.replace(";", ",").split(",") if t.strip()]
        toks = [t.split(":")[-1] for t in toks if not t.startswith("^")]
        for t in toks:
            if t in names:
                return t
        return default

    def traceback(self, final: str) -> None:
        self.log.line("Scheduler hit an exception: Traceback (most recent call last):", force=True)
        self.log.plain(
            '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", '
            "line 2870, in run_scheduler_process"
        )
        self.log.plain("    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)")
        self.log.plain(
            '  File "/usr/lib/python3/dist-packages/sglang/srt/model_executor/'
            'model_runner.py", line 412, in init_torch_distributed'
        )
        self.log.plain("    initialize_model_parallel(tensor_model_parallel_size=self.tp_size)")
        for ln in final.splitlines():
            self.log.plain(ln)
        self.log.line(
            "Received sigquit from a child process. It usually means the child failed.", rank=None, force=True
        )

    def spawn_scheduler_children(self) -> None:
        """Like SGLang, run helper processes in the same process group (one per extra rank, max 2)."""
        code = (
            "import os,signal,sys,time\n"
            f"hang={self.faults.hang_on_sigterm!r}\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN if hang else signal.SIG_DFL)\n"
            "p=int(sys.argv[1])\n"
            "while os.getppid()==p: time.sleep(0.2)\n"
        )
        for _ in range(min(2, self.ns.tp_size - 1)):
            self.children.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, str(os.getpid())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    async def startup(self) -> bool:
        ns = self.ns
        self.log.line(self.server_args_repr(), rank=None)
        for w in self.warnings:
            self.log.line(w, rank=None)
        if ns.tp_size > 1:
            self.spawn_scheduler_children()
        load = max(0.0, ns.sim_load_seconds)
        if not self.nccl_init() or not await self.node.join():
            return False
        if ns.mem_fraction_static is not None and ns.mem_fraction_static > 0.95:
            await self.sleep_sim(load * 0.2)
            self.traceback(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has "
                "a total capacity of 94.97 GiB of which 1.12 GiB is free. Of the allocated memory "
                f"{90.3:.2f} GiB is allocated by PyTorch (mem_fraction_static={ns.mem_fraction_static})."
            )
            return False
        self.log.line("Load weight begin. avail mem=93.62 GB")
        steps = 4
        for i in range(1, steps + 1):
            await self.sleep_sim(load * 0.55 / steps)
            self.log.plain(f"Loading safetensors checkpoint shards: {100 * i // steps}% Completed | {i * 16}/64")
        self.log.line(
            "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=22.41 GB, mem usage=71.21 GB."
        )
        if self.cfg.speculative and not self.cfg.model_free:  # SGLang loads the draft model after the target
            self.log.line("Load weight begin. avail mem=22.41 GB")
            self.log.line(
                "Load weight end. elapsed=0.42 s, type=LlamaForCausalLMEagle3, avail mem=21.52 GB, mem usage=0.89 GB."
            )
        self.log.line("KV Cache is allocated. #tokens: 1062144, K size: 8.02 GB, V size: 8.02 GB")
        self.log.line("Capture cuda graph begin. This can take up to several minutes. avail mem=5.12 GB")
        await self.sleep_sim(load * 0.3 if self.cfg.speculative else load * 0.4)
        self.log.line(
            f"Capture cuda graph end. Time elapsed: {load * 0.3:.2f} s. mem usage=1.02 GB. avail mem=4.10 GB."
        )
        if self.cfg.speculative and not self.cfg.model_free:  # NGRAM has no draft model to capture
            self.log.line("Capture draft cuda graph begin. This can take up to several minutes. avail mem=4.10 GB")
            await self.sleep_sim(load * 0.1)
            self.log.line(
                f"Capture draft cuda graph end. Time elapsed: {load * 0.1:.2f} s. mem usage=0.31 GB. avail mem=3.79 GB."
            )
            self.log.line("Capture draft extend cuda graph begin. avail mem=3.79 GB")
            self.log.line("Capture draft extend cuda graph end. Time elapsed: 0.05 s.")
        self.log.line(  # SGLang 0.5.18's summary of the start (seen on its CPU build)
            f"Engine startup timings (s): load_weight={load * 0.55:.2f}, kv_cache_allocation=0.46, "
            f"scheduler_e2e={load:.2f}, cuda_graph={{prefill=0.00, decode={load * 0.3:.2f}}}"
        )
        self.log.line(
            f"max_total_num_tokens=1062144, chunked_prefill_size=8192, "
            f"max_prefill_tokens=16384, max_running_requests={self.max_running}, "
            f"context_len=262144"
        )
        return True

    # ---- scheduler -----------------------------------------------------------------------
    async def scheduler(self) -> None:  # noqa: C901
        """The batch loop: new requests are prefilled together, then every running request decodes
        in the same cycle, whose cost follows the live batch size and context."""
        loop = asyncio.get_running_loop()
        win = Window(loop.time())
        deadline = None
        while not self.stopping.is_set():
            if not self.waiting and not self.running:
                self.wake.clear()
                if self.busy_since is not None:
                    # the spell ends when its last modelled work does (or now, if the host lagged)
                    self.wall_busy_s += max(loop.time(), deadline or 0.0) - self.busy_since
                    self.busy_since = None
                deadline = None
                await self.wake.wait()
                win.start = loop.time()  # the idle time is no part of the window's throughput
                continue
            if deadline is None:
                deadline = self.busy_since = loop.time()
            if self.waiting and len(self.running) < self.max_running:
                new = []
                while self.waiting and len(self.running) + len(new) < self.max_running:
                    new.append(self.waiting.popleft())
                tokens = sum(r.prompt_tokens for r in new)
                ms = model.prefill_ms(self.cfg, tokens)
                deadline += self.scaled(ms)
                self.model_busy_s += self.scaled(ms)
                self.prefill_busy_s += self.scaled(ms)
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                self.log.line(
                    f"Prefill batch, #new-seq: {len(new)}, #new-token: {tokens}, #cached-token: 0, "
                    f"token usage: 0.00, #running-req: {len(self.running)}, #queue-req: "
                    f"{len(self.waiting)}, #pending-token: 0, {self.ns.device} graph: False, "
                    f"input throughput (token/s): {tokens / max(ms, 1e-3) * 1000:.2f}"
                )
                now = loop.time()
                for r in new:
                    r.first_token_time = now
                    self.emit(r, 1)
                    if not r.finished:
                        self.running.append(r)
                continue
            self.running = [r for r in self.running if not r.finished]
            if not self.running:
                continue
            bs = len(self.running)
            if self.switch is not None:
                self.switch.tick(self.refuse_hold)
            if self.adaptive is not None:
                win = self.adapt_steps(win, bs, loop.time())
            context = sum(r.prompt_tokens + r.produced for r in self.running) / bs
            cost = model.cycle_cost(self.cfg, bs, context)
            j = model.jitter(self.rng, self.ns.sim_jitter)
            draft, verify = cost.draft_ms * j, cost.verify_ms * model.jitter(self.rng, self.ns.sim_jitter)
            extend, other = cost.extend_ms * j, cost.other_ms
            cycle = draft + verify + extend + other
            deadline += self.scaled(cycle)
            self.model_busy_s += self.scaled(cycle)
            delay = deadline - loop.time()
            await asyncio.sleep(max(0.0, delay))
            self.note_lag(-delay, self.scaled(cycle))
            accepted = []
            self.shift_acceptance(loop.time())
            for r in self.running:
                n = model.draw_accepted(self.cfg_for(r), self.uniform)  # per request, position by position
                r.verify_ct += 1
                accepted.append(n)
                self.emit(r, n)
            self.total_accept += sum(accepted)
            if self.adaptive is not None and win.held is None:  # held: the policy's feedback is frozen
                self.adaptive.observe(bs, accepted)
            self.total_verify += bs
            if self.cfg.speculative:  # SGLang's device timer's categories (real seconds, as the server sees them)
                for category, ms in (("eagle_draft", draft), ("target_verify", verify), ("eagle_draft_extend", extend)):
                    if ms:
                        self.forward_s[category] = self.forward_s.get(category, 0.0) + self.scaled(ms)
            self.running = [r for r in self.running if not r.finished]
            if self.record_step_time:
                self.step_times.setdefault(bs, deque(maxlen=1000)).append(round(cycle / 1000 / self.speedup, 6))
            win.add(
                bs, accepted, draft / self.speedup, verify / self.speedup, extend / self.speedup, other / self.speedup
            )
            if self.faults.garbage and self.rng.random() < 0.05:
                self.log.raw(b"\xff\xfe garbage \xc3\x28 bytes " + b"x" * self.rng.randint(0, 300) + b"\n")
                if self.rng.random() < 0.1:
                    self.log.raw(b"LONG " + b"y" * (3 * 1024 * 1024) + b"\n")
            if win.cycles >= self.ns.decode_log_interval:
                self.report_window(win, loop.time())
                win = Window(loop.time())

    def adapt_steps(self, win: Window, bs: int, now: float) -> Window:
        """Adaptive mode (or a schedule): the steps for this batch size, or a hold's; a profile window
        never mixes two settings."""
        held = self.switch.hold if self.switch is not None else None
        steps = held if held is not None else self.adaptive.steps_for(bs)
        if steps == self.cfg.steps and held == win.held:
            return win
        if win.cycles:
            self.report_window(win, now)
            win = Window(now)
        win.held = held
        if steps == self.cfg.steps:
            return win
        self.log.line(f"Adaptive speculative steps {self.cfg.steps} -> {steps} at batch size {bs}")
        cfg = replace(self.cfg, steps=steps, draft_tokens=steps + 1)
        self.cfg = replace(cfg, tree=model.build_tree(cfg))
        return win

    def refuse_hold(self, steps: int | None) -> str | None:
        """Why this launch cannot hold ``steps`` (None: it can): only the candidate steps of its
        adaptive config have runtime states."""
        if self.adaptive is None:
            return "this server runs without --speculative-adaptive: relaunch with it to switch steps in one launch"
        if steps is None:
            return None
        prepared = sorted({s for b in getattr(self.adaptive, "buckets", {}).values() for s in b.candidates})
        if steps not in prepared:
            return f"steps {steps} has no runtime state in this launch (prepared: {prepared})"
        return None

    def note_lag(self, late_s: float, cycle_s: float) -> None:
        """Count cycles that started late: a CPU-bound simulator decodes slower than its model."""
        self.cycles_total += 1
        self.lag_s = max(0.0, late_s)
        if late_s > max(0.002, cycle_s):
            self.cycles_late += 1
            if not self.lag_warned and self.cycles_late >= 50:
                self.lag_warned = True
                self.log.line(
                    f"WARNING: simulator is {late_s * 1000:.1f} ms behind its clock (CPU-bound at "
                    f"{len(self.running)} running requests): its figures are too slow; lower --sim-speedup",
                    force=True,
                )

    def report_window(self, win: Window, now: float) -> None:
        elapsed = max(now - win.start, 1e-9)
        self.last_gen_throughput = win.tokens / elapsed
        bs = len(self.running)
        spec = self.cfg.speculative
        fields = [
            f"#running-req: {bs}",
            f"#token: {sum(r.prompt_tokens + r.produced for r in self.running)}",
            "token usage: 0.00",
        ]
        accept_len = win.tokens / max(1, win.verifies)
        if spec:
            self.last_accept_len = accept_len
            rate = (accept_len - 1) / max(1, self.cfg.draft_tokens - 1)
            fields += [f"accept len: {accept_len:.2f}", f"accept rate: {rate:.2f}"]
        fields += [
            # SGLang names the device's graphs; on a CPU speculation always runs eager
            "cpu graph: False" if self.ns.device == "cpu" else "cuda graph: True",
            f"gen throughput (token/s): {self.last_gen_throughput:.2f}",
            f"#queue-req: {len(self.waiting)}",
        ]
        self.log.line("Decode batch, " + ", ".join(fields))
        if spec and self.profile:
            self.log.line(win.profile_line(self.cfg))

    def emit(self, r: Request, n: int) -> int:
        n = min(n, r.max_tokens - r.produced)
        if n <= 0:
            return 0
        r.produced += n
        r.unsent += n
        self.generation_tokens_total += n
        done = r.produced >= r.max_tokens
        r.finished = done
        # like SGLang's --stream-interval: a chunk every N decode cycles (the first token at once)
        if done or r.verify_ct % self.ns.stream_interval == 0:
            r.out.put_nowait((r.unsent, done))
            r.unsent = 0
        return n

    # ---- HTTP ----------------------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int) -> Request:
        self.req_counter += 1
        self.num_requests_total += 1
        r = Request(
            rid=f"{self.req_counter:032x}",
            prompt_tokens=max(1, prompt_tokens),
            max_tokens=max(1, max_tokens),
            arrival=time.monotonic(),
            rng=random.Random(self.ns.sim_seed * 1_000_003 + self.req_counter),
        )
        self.waiting.append(r)
        self.wake.set()
        return r

    def meta(self, r: Request, finish: bool) -> dict:
        m = {
            "id": r.rid,
            "finish_reason": {"type": "length", "length": r.max_tokens} if finish else None,
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.produced,
            "cached_tokens": 0,
            "e2e_latency": time.monotonic() - r.arrival,
            # sim-only: wall clock when the handler got the request and when this chunk is written,
            # so a client on the same machine can measure the latency it adds itself
            "sim_received_wall": r.received_wall,
            "sim_sent_wall": time.time(),
        }
        if self.cfg.speculative:
            m["spec_verify_ct"] = r.verify_ct
        return m

    @staticmethod
    def _prompt_tokens(body: dict) -> int:
        if isinstance(body.get("input_ids"), list):
            return len(body["input_ids"])
        text = body.get("text") or body.get("prompt") or ""
        if isinstance(body.get("messages"), list):  # the chat API: every turn's text is prompt
            text = " ".join(str(m.get("content") or "") for m in body["messages"] if isinstance(m, dict))
        if isinstance(text, list):
            text = " ".join(map(str, text))
        return max(1, int(len(str(text).split()) * 1.3))

    @staticmethod
    async def _json(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest(
                text='{"error": "request body is not valid JSON"}', content_type="application/json"
            ) from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(
                text='{"error": "request body must be a JSON object"}', content_type="application/json"
            )
        return body

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        received = time.time()
        body = await self._json(request)
        sp = body.get("sampling_params") or {}
        r = self.submit(self._prompt_tokens(body), int(sp.get("max_new_tokens", 128)))
        r.received_wall = received
        if not body.get("stream"):
            words = await r.all_words()
            ids = [hash(w) % 50000 for w in words]
            return web.json_response({"text": " ".join(words), "output_ids": ids, "meta_info": self.meta(r, True)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        # Cumulative text and ids, as SGLang's native stream sends them, kept as JSON text that
        # grows by appending: re-encoding the whole lists per chunk made 64 streams CPU-bound.
        text = ids_json = ""
        try:
            while True:
                n, done = await r.take()
                words = r.next_words(n)  # plain ASCII words: nothing to escape
                text += (" " if text else "") + " ".join(words)
                ids_json += ("," if ids_json else "") + ",".join(str(hash(w) % 50000) for w in words)
                await resp.write(
                    f'data: {{"text": "{text}", "output_ids": [{ids_json}], "meta_info": '
                    f"{json.dumps(self.meta(r, done))}}}\n\n".encode()
                )
                if done:
                    break
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            pass  # the client went away mid-stream; its request is dropped below
        finally:
            r.finished = True
        return resp

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        """The OpenAI chat API: as completions, its text in ``delta.content`` (``message`` whole)."""
        return await self.h_completions(request, chat=True)

    async def h_completions(self, request: web.Request, chat: bool = False) -> web.StreamResponse:
        body = await self._json(request)
        if chat and not (isinstance(body.get("messages"), list) and body["messages"]):
            return web.json_response(
                {"error": {"message": "messages: a list of turns is required", "code": 400}}, status=400
            )
        r = self.submit(self._prompt_tokens(body), int(body.get("max_tokens", 16)))
        created = int(time.time())
        base = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{r.rid}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": self.ns.served_model_name or self.ns.model_path,
        }

        def choice(text: str, finish: str | None, whole: bool = False) -> dict:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish}
            if whole:
                return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            return {"index": 0, "delta": {"content": text}, "finish_reason": finish}

        def usage() -> dict:
            return {
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.produced,
                "total_tokens": r.prompt_tokens + r.produced,
            }

        if not body.get("stream"):
            words = await r.all_words()
            return web.json_response(
                {
                    **base,
                    "choices": [choice(" ".join(words), "length", whole=True)],
                    "usage": usage(),
                }
            )
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # a request of HOLD_BACK_EVERY ends on HOLD_BACK tokens whose text is not whole yet: their chunks
        # carry an empty text, as a detokenizer's do (the real vLLM: one prompt of six in its tests)
        held = self.HOLD_BACK if self.HOLD_BACK_EVERY and int(r.rid, 16) % self.HOLD_BACK_EVERY == 0 else 0
        try:
            if chat:  # the role comes first, in a chunk of its own that carries no token (as vLLM sends it)
                role = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                await resp.write(b"data: " + json.dumps(role).encode() + b"\n\n")
            while True:
                n, done = await r.take()
                delta = " " + " ".join(r.next_words(n))
                if r.produced > r.max_tokens - held:
                    delta = ""
                chunk = {
                    **base,
                    "choices": [choice(delta, "length" if done else None)],
                    **({"usage": None} if self.USAGE_NULL else {}),
                }
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if done:
                    break
            if include_usage:
                await resp.write(b"data: " + json.dumps({**base, "choices": [], "usage": usage()}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:
            pass
        finally:
            r.finished = True
        return resp

    async def h_health(self, request: web.Request) -> web.Response:
        if self.faults.health_hang:
            await asyncio.sleep(3600)
        return web.Response(status=200 if self.ready else 503)

    def server_info(self) -> dict:
        info = {k: v for k, v in vars(self.ns).items() if not k.startswith("sim_")}
        state = {
            "last_gen_throughput": self.last_gen_throughput,
            "avg_spec_accept_length": (self.total_accept / self.total_verify if self.total_verify else None),
            "num_running_reqs": len(self.running),
            "pid": os.getpid(),
            # SGLang 0.5.18's internal state: the limit the scheduler really runs with (48 with speculation)
            "effective_max_running_requests_per_dp": self.max_running,
        }  # for sim.nvidia_smi
        if self.record_step_time:
            state["step_time_dict"] = {str(bs): list(v) for bs, v in self.step_times.items()}
        info.update(
            version=VERSION, internal_states=[state], sim=self.expected(), status="ready" if self.ready else "starting"
        )
        return info

    async def h_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info())

    async def h_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.ns.model_path,
                "tokenizer_path": self.ns.tokenizer_path or self.ns.model_path,
                "is_generation": True,
            }
        )

    async def h_models(self, request: web.Request) -> web.Response:
        name = self.ns.served_model_name or self.ns.model_path
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "sglang",
                        "root": name,
                        "max_model_len": self.ns.context_length or 262144,
                    }
                ],
            }
        )

    async def h_flush(self, request: web.Request) -> web.Response:
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.\n")

    async def h_metrics(self, request: web.Request) -> web.Response:
        name = self.ns.served_model_name or self.ns.model_path
        lbl = f'{{model_name="{name}"}}'
        acc = self.total_accept / self.total_verify if self.total_verify else 0.0
        rate = (acc - 1) / max(1, self.cfg.draft_tokens - 1) if self.cfg.speculative else 0.0
        lines = []
        for metric, kind, value in (
            ("gen_throughput", "gauge", self.last_gen_throughput),
            ("spec_accept_length", "gauge", acc),
            ("spec_accept_rate", "gauge", rate),
            ("num_running_reqs", "gauge", len(self.running)),
            ("num_queue_reqs", "gauge", len(self.waiting)),
            ("num_requests_total", "counter", self.num_requests_total),
            ("generation_tokens_total", "counter", self.generation_tokens_total),
            # SGLang 0.5.18 (seen on its CPU build): request-verifies, and the steps and draft tokens it runs
            # (NGRAM's steps are its draft tokens // breadth there: 0 for 8 tokens at breadth 10)
            ("spec_verify_calls_total", "counter", self.total_verify),
            ("spec_num_steps", "gauge", self.gauge_steps() if self.cfg.speculative else 0),
            ("spec_num_draft_tokens", "gauge", self.cfg.draft_tokens if self.cfg.speculative else 0),
        ):
            lines += [
                f"# HELP sglang:{metric} {metric.replace('_', ' ')}",
                f"# TYPE sglang:{metric} {kind}",
                f"sglang:{metric}{lbl} {float(value)}",
            ]
        if self.device_timer:
            metric = "forward_execution_seconds_total"
            lines += [
                f"# HELP sglang:{metric} Total time that GPU is busy executing model forward passes.",
                f"# TYPE sglang:{metric} counter",
            ]
            for category, seconds in sorted(self.forward_s.items()):
                lines.append(f'sglang:{metric}{{model_name="{name}",category="{category}"}} {seconds}')
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def gauge_steps(self) -> int:
        if self.cfg.model_free:
            return self.cfg.draft_tokens // max(1, self.ns.speculative_ngram_max_bfs_breadth)
        return self.cfg.steps

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/health_generate", self.h_health)
        app.router.add_post("/generate", self.h_generate)
        app.router.add_post("/v1/completions", self.h_completions)
        app.router.add_post("/v1/chat/completions", self.h_chat)
        app.router.add_get("/v1/models", self.h_models)
        app.router.add_get("/server_info", self.h_server_info)
        app.router.add_get("/get_server_info", self.h_server_info)
        app.router.add_get("/get_model_info", self.h_model_info)
        app.router.add_post("/flush_cache", self.h_flush)
        app.router.add_get("/flush_cache", self.h_flush)
        if self.ns.enable_metrics:
            app.router.add_get("/metrics", self.h_metrics)
        return app

    # ---- main ----------------------------------------------------------------------------
    async def crash_timer(self) -> None:
        await self.sleep_sim(self.faults.crash_after)
        self.traceback(
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call."
        )
        self.kill_children()
        os._exit(1)

    def kill_children(self) -> None:
        for c in self.children:
            try:
                c.kill()
            except OSError:
                pass

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            if sig == signal.SIGTERM and self.faults.hang_on_sigterm:
                loop.add_signal_handler(
                    sig, lambda: self.log.line("SIGTERM received; ignoring it (sim fault hang-on-sigterm)")
                )
            else:
                loop.add_signal_handler(sig, self.stopping.set)
        tasks = []
        if self.faults.crash_after is not None:
            tasks.append(asyncio.ensure_future(self.crash_timer()))
        runner = None
        try:
            start = asyncio.ensure_future(self.startup())
            stop = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
            if self.stopping.is_set():
                start.cancel()
                return 0
            stop.cancel()
            if not start.result():
                return 1
            if self.node.worker:
                return await self.node.serve_worker()
            tasks.append(asyncio.ensure_future(self.node.watch()))
            runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False)
            await runner.setup()
            try:
                site = web.TCPSite(runner, self.ns.host, self.ns.port, reuse_address=True)
                await site.start()
            except OSError as e:
                self.log.line(
                    f"ERROR:    [Errno {e.errno}] error while attempting to bind on address "
                    f"({self.ns.host!r}, {self.ns.port}): {e.strerror.lower() if e.strerror else e}",
                    rank=None,
                    force=True,
                )
                return 1
            self.log.line(f"INFO:     Started server process [{os.getpid()}]", rank=None)
            self.log.line("INFO:     Waiting for application startup.", rank=None)
            self.log.line("INFO:     Application startup complete.", rank=None)
            self.log.line(
                f"INFO:     Uvicorn running on http://{self.ns.host}:{self.ns.port} (Press CTRL+C to quit)", rank=None
            )
            tasks.append(asyncio.ensure_future(self.scheduler()))
            await self.warmup()
            await self.stopping.wait()
            self.log.line("Received SIGTERM; shutting down.", rank=None)
            return 0
        finally:
            for t in tasks:
                t.cancel()
            if runner is not None:
                try:
                    await asyncio.wait_for(runner.cleanup(), 1.0)
                except (TimeoutError, Exception):  # noqa: BLE001 - exiting anyway
                    pass
            self.kill_children()
            self.node.close()

    def shift_acceptance(self, now: float) -> None:
        """--sim-acceptance-shift: from its time after ready on, the other acceptance."""
        shift = self.ns.sim_acceptance_shift
        if shift is None or self.ready_at is None or now - self.ready_at < shift[0]:
            return
        self.cfg = replace(self.cfg, acceptance=shift[1])
        self.ns.sim_acceptance_shift = None
        self.cfg_long = None

    def cfg_for(self, r: Request) -> model.SimConfig:
        """The configuration a request's draws use: --sim-context-limit cuts a long request's acceptance."""
        limit = self.ns.sim_context_limit
        if limit is None or r.prompt_tokens + r.produced <= limit or not self.cfg.speculative:
            return self.cfg
        if self.cfg_long is None:
            self.cfg_long = replace(self.cfg, acceptance=tuple(a / 5 for a in self.cfg.rates))
        return self.cfg_long

    async def warmup(self) -> None:
        self.log.line(
            f'INFO:     127.0.0.1:{40000 + os.getpid() % 20000} - "GET /get_model_info HTTP/1.1" 200 OK', rank=None
        )
        r = self.submit(8, 1)
        await r.out.get()
        self.log.line(
            f'INFO:     127.0.0.1:{40001 + os.getpid() % 20000} - "POST /generate HTTP/1.1" 200 OK', rank=None
        )
        await self.sleep_sim(max(0.05, self.ns.sim_load_seconds * 0.05))
        self.ready = True
        self.ready_at = asyncio.get_running_loop().time()
        self.log.line("The server is fired up and ready to roll!", rank=None)


def main(argv: list[str] | None = None) -> int:
    parser = sim_args.build_parser()
    ns = parser.parse_args(argv)
    faults = sim_args.parse_faults(parser, ns.sim_fault)
    if ns.stream_interval < 1:
        parser.error(f"--stream-interval must be at least 1 (got {ns.stream_interval})")
    acceptance = sim_args.parse_acceptance(parser, ns.sim_acceptance)
    ns.sim_acceptance_shift = sim_args.parse_acceptance_shift(parser, ns.sim_acceptance_shift)
    if ns.sim_context_limit is not None and ns.sim_context_limit < 1:
        parser.error(f"--sim-context-limit must be at least 1 (got {ns.sim_context_limit})")
    machine = sim_args.load_machine(parser, ns.sim_machine)
    log = Log(ns.log_level)
    try:
        warnings = sim_args.resolve_speculative(ns)
        adaptive = sim_adaptive.from_args(ns)
        multinode.parse(ns)
    except (sim_args.ServerArgsError, ValueError) as e:
        log.plain("Traceback (most recent call last):")
        log.plain('  File "/usr/lib/python3/dist-packages/sglang/launch_server.py", line 11, in <module>')
        log.plain("    server_args = prepare_server_args(sys.argv[1:])")
        log.plain(f"ValueError: {e}")
        return 1
    sim = Simulator(ns, faults, machine, acceptance, warnings)
    sim.adaptive = adaptive
    try:
        return asyncio.run(sim.run())
    except KeyboardInterrupt:
        return 0
