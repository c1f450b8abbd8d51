"""EAGLE-3 phase timing inside a stock SGLang server (stdlib; torch only inside the server).

Loaded by ``sitecustomize`` when ``EAGLE3_PROFILE=1``. An import hook waits for SGLang's EAGLE
worker module and wraps its phases (no edits to SGLang's files):

* v1 worker (``sglang.srt.speculative.eagle_worker``): ``EAGLEWorker.draft``, ``.verify``,
  ``.forward_draft_extend_after_decode``;
* v2 worker (``sglang.srt.speculative.eagle_worker_v2``, SGLang 0.5.2x):
  ``EagleDraftWorker.draft``, ``EAGLEWorkerV2.verify``, ``EagleDraftWorker._draft_extend_for_decode``.
* vLLM's V1 engine (names verified in the 0.33.0 release): a step of the model runner is
  ``GPUModelRunner.execute_model`` (the target forward over the drafted tokens) then
  ``GPUModelRunner.sample_tokens`` (sampling, rejection, and the drafter's ``propose``), in
  ``vllm.v1.worker.gpu_model_runner`` and, for the V2 runner, ``vllm.v1.worker.gpu.model_runner``.
  The drafter is ``EagleProposer`` (``vllm.v1.spec_decode.eagle``), whose ``propose`` is
  inherited from ``SpecDecodeBaseProposer`` (``vllm.v1.spec_decode.llm_base_proposer``); the V2
  runner's ``EagleSpeculator`` inherits ``propose`` from ``TargetDependentARSpeculator``
  (``vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator``). draft = ``propose``,
  verify = the step minus the draft; vLLM's drafter extends inside ``propose``, so extend is 0.

* Drafting without a draft model, timed the same way: vLLM's ngram (``NgramProposer.propose``,
  ``vllm.v1.spec_decode.ngram_proposer``; ``NgramProposerGPU`` for ngram_gpu; the V2 runner's
  ``NgramGPUSpeculator``) and suffix decoding (``SuffixDecodingProposer.propose``), called from
  the runner's ``sample_tokens``; SGLang's NGRAM (``sglang.srt.speculative.ngram_worker``):
  ``NGRAMWorker.forward_batch_generation`` is one whole cycle, its
  ``_prepare_for_speculative_decoding`` the look-up (draft), verify the rest; a prefill batch is
  no cycle. Such lines carry ``drafter=ngram`` (or ``suffix``); NGRAM's ``steps`` is the tree's
  depth bound, draft tokens − 1.

Timing (``EAGLE3_PROFILE_SYNC``): ``event`` (default) records CUDA events around each phase on the
current stream and reads a window's events only when the next window is complete, so the server
never waits for the GPU; ``host`` synchronises around each phase (exact, but it serialises the
CPU with the GPU; for comparison). Without CUDA (a CPU engine: vLLM's CPU build) there are no
events and nothing to synchronise: phases are timed on the host clock and the line says
``sync=cpu``.
One line per ``EAGLE3_PROFILE_WINDOW`` cycles (default 40), from rank ``EAGLE3_PROFILE_RANK``
(default 0), through the worker module's own logger so the prefix matches SGLang's.

Format v2: each line also carries the accept-length histogram, the verify token count and the
steps in force. The steps are read from the worker at every cycle, because SGLang's
``--speculative-adaptive`` changes ``speculative_num_steps`` while the server runs; a window is
closed early when they change, so that every line describes one configuration. On vLLM,
``accept_len`` and the histogram count every request-step that got a token (a look-up drafter
that found no match drafted nothing: length 1); ``drafts`` and ``draft_accept_len`` count only the
request-steps that verified a draft, as vLLM's own "Mean acceptance length" does.

``python eagle3_probe.py --check [--sglang-path DIR]`` reads SGLang's source with ``ast`` (no
import, no GPU) and reports which phases it can patch, and whether the switch's patch points exist.

The switch (docs/switch.md): with ``TUITUNE_SWITCH_FILE`` and ``TUITUNE_SWITCH_KEY`` set (a launch
prepared for switching), the engine's own per-cycle switching code is hooked (vLLM's
``Scheduler.schedule``, SGLang's ``AdaptiveController``): at most every 50 ms the file is looked
at, a signed command to hold a step count (or to release it) is checked and applied through the
engine's own machinery, and acknowledged in ``<file>.ack``. Without them nothing is hooked.

Why one file of this size: it is copied to the target and imported inside the engine by
``sitecustomize``, stdlib only; one self-contained file is what can be uploaded and checked.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import math
import os
import stat
import sys
import time

TARGETS = {
    "sglang.srt.speculative.eagle_worker": {
        "EAGLEWorker": {"draft": "draft", "verify": "verify", "forward_draft_extend_after_decode": "extend"},
    },
    "sglang.srt.speculative.eagle_worker_v2": {
        "EagleDraftWorker": {"draft": "draft", "_draft_extend_for_decode": "extend"},
        "EAGLEWorkerV2": {"verify": "verify"},
    },
    "vllm.v1.worker.gpu_model_runner": {"GPUModelRunner": {"execute_model": "step", "sample_tokens": "step_end"}},
    "vllm.v1.spec_decode.llm_base_proposer": {"SpecDecodeBaseProposer": {"propose": "draft"}},
    "vllm.v1.worker.gpu.model_runner": {"GPUModelRunner": {"execute_model": "step", "sample_tokens": "step_end"}},
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator": {
        "TargetDependentARSpeculator": {"propose": "draft"}
    },
    # drafting without a draft model, inside the same runner step: ngram (prompt lookup, on the
    # host; ngram_gpu on the device), suffix decoding, and the V2 runner's ngram speculator
    "vllm.v1.spec_decode.ngram_proposer": {"NgramProposer": {"propose": "draft"}},
    "vllm.v1.spec_decode.ngram_proposer_gpu": {"NgramProposerGPU": {"propose": "draft"}},
    "vllm.v1.spec_decode.suffix_decoding": {"SuffixDecodingProposer": {"propose": "draft"}},
    "vllm.v1.worker.gpu.spec_decode.ngram.speculator": {"NgramGPUSpeculator": {"propose": "draft"}},
    # SGLang's NGRAM: one call is the whole cycle (look-up, verify forward, accept), the look-up
    # a method inside it
    "sglang.srt.speculative.ngram_worker": {
        "NGRAMWorker": {"forward_batch_generation": "cycle", "_prepare_for_speculative_decoding": "draft"}
    },
}
# modules whose drafting runs inside a timed step: a draft call outside one is a warm-up
STEPPED = ("vllm.", "sglang.srt.speculative.ngram_worker")
# drafters that look tokens up instead of running a model (what the line's ``drafter`` says)
LOOKUP = {
    "NgramProposer": "ngram",
    "NgramProposerGPU": "ngram",
    "NgramGPUSpeculator": "ngram",
    "SuffixDecodingProposer": "suffix",
    "NGRAMWorker": "ngram",
}
PHASES = ("draft", "verify", "extend")
HIST_LEN = 33  # accepted lengths counted per cycle: 1..33 (steps up to 32), longer ones in the last
# the phases a usable layout of each engine patches (vLLM's verify is derived from its steps)
ENGINE_PHASES = {"sglang": ("draft", "extend", "verify"), "vllm": ("draft", "step", "step_end")}


def _version(package: str = "sglang") -> str:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:  # noqa: BLE001 - a version is only for the message
        return "unknown"


class Recorder:
    """Collects phase timings of one process and logs a line per window (on the chosen rank)."""

    def __init__(self, window: int, sync: str):
        self.window = max(1, window)
        self.sync = sync
        self.torch = None
        self.cuda = False
        self.logger: logging.Logger | None = None
        self.enabled: bool | None = None  # decided at the first call (the rank is known by then)
        self.cycle: dict = self._new_cycle()
        self.cycles: list[dict] = []  # closed cycles of the current window
        self.pending: list[dict] | None = None  # the previous window, read when this one closes
        self.meta: dict = {}
        self.lens: _LensRing | None = None  # accept lengths kept on the device, counted once a window
        self.in_step = False  # vLLM: inside a runner step (SGLang NGRAM: inside a cycle)

    @staticmethod
    def _new_cycle() -> dict:
        return {
            "draft": [],
            "verify": [],
            "extend": [],
            "step": [],
            "accept": [],
            "hist": [],
            "bs": None,
            "t0": None,
            "steps": None,
            "draft_tokens": None,
            "spec_reqs": None,  # vLLM: the requests this step verified a draft for
            "drafts": None,  # vLLM: [request-steps with a draft, drafts accepted in them]
            "sched_k": None,  # vLLM: the K its scheduler scheduled for this step (its lookup's)
            "held": None,  # the step count a tuitune hold keeps in force (None: the engine's own policy)
        }

    def _setup(self, worker) -> None:
        try:
            import torch

            self.torch = torch
            self.cuda = torch.cuda.is_available()
        except ImportError:
            self.cuda = False
        if not self.cuda:
            self.sync = "cpu"  # a CPU engine: the host clock, nothing to wait for
        want = int(os.environ.get("EAGLE3_PROFILE_RANK", "0"))
        rank = getattr(worker, "tp_rank", None)
        if (
            rank is None
            and self.torch is not None
            and self.torch.distributed.is_available()
            and self.torch.distributed.is_initialized()
        ):
            rank = self.torch.distributed.get_rank()
        self.enabled = (rank or 0) == want
        v = getattr(worker, "topk", None)
        if isinstance(v, int):
            self.meta["topk"] = v

    def _read_steps(self, worker) -> None:
        """The steps and draft tokens in force for this cycle (adaptive mode changes them)."""
        for attr, key in (("speculative_num_steps", "steps"), ("speculative_num_draft_tokens", "draft_tokens")):
            v = getattr(worker, attr, None)
            if isinstance(v, int) and not isinstance(v, bool):
                self.cycle[key] = v
        k = getattr(
            getattr(worker, "speculative_config", None),
            "num_speculative_tokens",
            getattr(worker, "num_speculative_tokens", None),
        )
        if isinstance(self.cycle["sched_k"], int) and isinstance(k, int):
            k = self.cycle["sched_k"]  # the K this step runs at, not only the configured maximum
        if isinstance(k, int) and not isinstance(k, bool):  # vLLM: a chain of k drafts, k + 1 tokens verified
            self.cycle.update(steps=k, draft_tokens=k + 1)
            self.meta["topk"] = 1
        name = type(worker).__name__
        if name in LOOKUP:
            self.meta["drafter"] = LOOKUP[name]
        if name == "NGRAMWorker" and isinstance(self.cycle["draft_tokens"], int):
            # SGLang derives its num_steps as tokens // breadth; the tree is tokens − 1 deep at most
            self.cycle["steps"] = self.cycle["draft_tokens"] - 1

    # ---- timing ---------------------------------------------------------------------------
    def start(self, phase: str, worker, args: tuple = ()):
        if self.enabled is None:
            self._setup(worker)
            self.logger = logging.getLogger(type(worker).__module__)
        if not self.enabled:
            return None
        if phase == "draft" and self.cycle["verify"]:
            self._close_cycle()
        if phase == "draft" and not self.in_step and type(worker).__module__.startswith(STEPPED):
            return None  # drafting outside a runner step (a cycle): a warm-up or dummy run
        if phase == "cycle":
            batch = args[0] if args else None
            mode = getattr(batch, "forward_mode", None)
            is_decode = getattr(mode, "is_decode", None)
            if callable(is_decode) and not is_decode():
                return None  # a prefill batch: no speculative cycle
        if phase.startswith("step") or phase == "cycle":
            self.in_step = True
        if self.cycle["t0"] is None:
            self.cycle["t0"] = time.perf_counter()
            self.cycle["held"] = SWITCH.held_now() if SWITCH is not None else None
        if phase == "step" and _vllm_batch_size(args[0] if args else None):  # a step with tokens scheduled
            k = self.cycle["sched_k"] = _scheduled_k(args[0])
            held = SWITCH.held_now() if SWITCH is not None else None
            # vLLM's worker learns of a hold from the ack, a step or two after its scheduler: a
            # step at another K than the hold's is the scheduler's own again (released)
            self.cycle["held"] = held if k is None or held in (None, k) else None
        self._read_steps(worker)
        if self.sync == "event":
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def stop(self, phase: str, token, worker, args, result) -> None:
        if token is None:
            return
        slot = "step" if phase.startswith("step") or phase == "cycle" else phase
        if self.sync == "event":
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.cycle[slot].append((token, e))
        else:
            if self.cuda:
                self.torch.cuda.synchronize()
            self.cycle[slot].append((time.perf_counter() - token) * 1000.0)
        if phase == "step":
            out = args[0] if args else None
            self.cycle["bs"] = _vllm_batch_size(out) or self.cycle["bs"]
            spec = getattr(out, "scheduled_spec_decode_tokens", None)
            if isinstance(spec, dict):  # what the scheduler counts as a draft (its observe_draft)
                self.cycle["spec_reqs"] = (self.cycle["spec_reqs"] or set()) | {r for r, t in spec.items() if t}
        if phase == "step_end":
            self.in_step = False
            self._accept_sampled(result)
            self._close_cycle()
        if phase == "cycle":
            self.in_step = False
            reqs = getattr(args[0] if args else None, "reqs", None)
            self.cycle["bs"] = len(reqs) if reqs is not None else self.cycle["bs"]
            self._accept(result)  # NGRAM's accept_lens count the bonus token
            self._close_cycle()
        if phase == "verify":
            self._accept(result)
            batch = args[0] if args else None
            bs = getattr(batch, "batch_size", None)
            bs = bs() if callable(bs) else bs
            if bs is None and hasattr(batch, "reqs"):
                bs = len(batch.reqs)
            self.cycle["bs"] = bs
        if phase == "extend":
            self._close_cycle()

    def _accept(self, result) -> None:
        """Accept length, bonus token included, from a verify result of either worker version."""
        for obj in (result, *(result if isinstance(result, (tuple, list)) else ())):
            lens = getattr(obj, "accept_lens", None)
            if lens is not None:
                if self.torch is not None and isinstance(lens, self.torch.Tensor):
                    # one device-to-device copy a cycle into a ring on the tensor's device; the
                    # window's histogram and sum are counted there when it closes and read a
                    # window later (an .item() or .tolist() here would drain the whole stream)
                    if self.lens is None:
                        self.lens = _LensRing(self.torch, lens, self.window)
                    self.cycle["lens_at"] = self.lens.add(lens)
                    return
                self._accept_list([int(x) for x in lens])
                return
            per_req = getattr(obj, "accept_length_per_req_cpu", None)
            if per_req is not None:  # v1 counts accepted drafts only
                self._accept_list([int(x) + 1 for x in per_req])
                return

    def _accept_list(self, lens: list[int]) -> None:
        self.cycle["accept"].append((float(sum(lens)), len(lens)))
        hist = [0] * HIST_LEN
        for n in lens:
            hist[min(max(n, 1), HIST_LEN) - 1] += 1
        self.cycle["hist"].append(hist)

    def _accept_sampled(self, result) -> None:
        """vLLM: tokens each request got this step (accepted drafts + 1), from the runner's output.

        Every request that got a token counts (a look-up drafter that found no match drafts
        nothing: its step gives one token, length 1), so ``accept_len`` is tokens per request-step,
        what throughput is made of. A request that got none (a chunk of a prefill) had no step. The
        requests the step verified a draft for are also counted apart, as vLLM's scheduler counts
        them (``observe_draft``: a request with scheduled draft tokens and an output): ``drafts``
        and ``draft_accept_len``, vLLM's "Mean acceptance length" (1 + accepted / drafts)."""
        ids = getattr(result, "sampled_token_ids", None)
        if isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
            self._accept_list([len(x) for x in ids if x])
            spec, req_ids = self.cycle["spec_reqs"], getattr(result, "req_ids", None)
            if spec is not None and isinstance(req_ids, list) and len(req_ids) == len(ids):
                drafted = [len(x) for i, x in enumerate(ids) if x and req_ids[i] in spec]
                self.cycle["drafts"] = [len(drafted), sum(n - 1 for n in drafted)]

    def _close_cycle(self) -> None:
        c = self.cycle
        self.cycle = self._new_cycle()
        if c["verify"] or c["step"]:
            c["wall_ms"] = (time.perf_counter() - c["t0"]) * 1000.0 if c["t0"] else math.nan
            if self.cycles and (
                self.cycles[0]["steps"],
                self.cycles[0]["draft_tokens"],
                self.cycles[0]["held"],
            ) != (c["steps"], c["draft_tokens"], c["held"]):
                # the steps changed (adaptive mode, a schedule, a hold): one line per configuration;
                # this cycle's accept lengths, already in the ring, open the next window
                self._close_window(c.get("lens_at"))
            self.cycles.append(c)
        if len(self.cycles) >= self.window:
            self._close_window()

    def _close_window(self, lens_upto: int | None = None) -> None:
        window, self.cycles = self.cycles, []
        if self.lens is not None and window:
            window[0]["lens"] = self.lens.close(lens_upto)
        if self.sync == "event":
            # this window's events are still in flight: log the previous one, now surely done
            if self.pending is not None:
                self._log(self.pending)
            self.pending = window
        else:
            self._log(window)

    # ---- output ---------------------------------------------------------------------------
    def _ms(self, item) -> float:
        if isinstance(item, tuple):
            start, end = item
            end.synchronize()  # complete a window ago: returns at once
            return start.elapsed_time(end)
        return item

    def _log(self, window: list[dict]) -> None:  # noqa: C901
        sums = {p: 0.0 for p in PHASES}
        verifies: list[float] = []
        acc_total, acc_n, bs_total, verify_tokens = 0.0, 0, 0, 0
        drafts: list[int] | None = None  # vLLM: request-steps with a draft, drafts accepted in them
        hist = [0] * HIST_LEN
        for c in window:
            if c["step"]:  # vLLM: verify is the runner's step without the draft inside it
                c["verify"] = [sum(self._ms(x) for x in c["step"]) - sum(self._ms(x) for x in c["draft"])]
            for p in PHASES:
                ms = sum(self._ms(x) for x in c[p])
                sums[p] += ms
                if p == "verify":
                    verifies.append(ms)
            for total, n in c["accept"]:
                acc_total += total
                acc_n += n
            if c.get("lens") is not None and self.lens is not None:  # counted on the device at the window's close
                counts, total = self.lens.read(c["lens"])
                acc_total += total
                acc_n += sum(counts)
                for i, k in enumerate(counts):
                    hist[i] += k
            for h in c["hist"]:
                for i, k in enumerate(h):
                    hist[i] += k
            if c["drafts"] is not None:
                drafts = [(drafts or [0, 0])[0] + c["drafts"][0], (drafts or [0, 0])[1] + c["drafts"][1]]
            bs_total += c["bs"] or 0
            tokens = c["draft_tokens"] if c["steps"] != 0 else 1  # steps 0: one token a request
            verify_tokens += (c["bs"] or 0) * (tokens or 0)
        n = len(window)
        d, v, e = (sums[p] / n for p in PHASES)
        cycle = d + v + e
        accept = acc_total / acc_n if acc_n else math.nan
        bs = round(bs_total / n) if bs_total else None
        verifies.sort()
        first = window[0]
        config = [("steps", first["steps"]), ("topk", self.meta.get("topk")), ("draft_tokens", first["draft_tokens"])]
        if self.meta.get("drafter"):
            config.append(("drafter", self.meta["drafter"]))
        config.append(("held", first["held"]))
        fields = (
            [("v", 2), ("cycles", n)]
            + ([("bs", bs)] if bs else [])
            + [(k, val) for k, val in config if val is not None]
            + ([("verify_tokens", round(verify_tokens / n))] if verify_tokens else [])
            + [
                ("draft_ms", f"{d:.3f}"),
                ("verify_ms", f"{v:.3f}"),
                ("extend_ms", f"{e:.3f}"),
                ("cycle_ms", f"{cycle:.3f}"),
                ("accept_len", f"{accept:.3f}"),
            ]
        )
        if any(hist):
            fields.append(("accept_hist", ",".join(f"{i + 1}:{k}" for i, k in enumerate(hist) if k)))
        if drafts is not None:
            fields.append(("drafts", drafts[0]))
            if drafts[0]:
                fields.append(("draft_accept_len", f"{1 + drafts[1] / drafts[0]:.3f}"))
        if bs and cycle > 0 and not math.isnan(accept):
            fields.append(("eff_tok_s", f"{accept * bs / cycle * 1000:.2f}"))
        fields += [
            ("p50_verify_ms", f"{verifies[len(verifies) // 2]:.3f}"),
            ("p90_verify_ms", f"{verifies[min(n - 1, int(n * 0.9))]:.3f}"),
            ("max_verify_ms", f"{verifies[-1]:.3f}"),
            ("sync", self.sync),
        ]
        line = "EAGLE3_PROFILE " + " ".join(f"{k}={val}" for k, val in fields)
        (self.logger or logging.getLogger("sglang")).info(line)


class _LensRing:
    """Accept lengths of a window kept on their device: a copy into a ring each cycle, counted there
    (histogram and sum) when the window closes, copied to pinned memory without blocking, and read
    a window later, once the window's events are done: nothing waits for the GPU.

    ``[start, off)`` holds the open window's lengths. A ring that would overflow first folds them
    into ``acc`` (counts per length 1..HIST_LEN, then their sum), on the device, and starts over.
    """

    ROWS = 4  # pinned rows in turn: a row is read at most one window after it was written

    def __init__(self, torch, like, window: int):
        self.torch = torch
        dev = like.device
        self.cuda = dev.type == "cuda"
        self.buf = torch.empty(max(4096, 8 * window * like.numel()), dtype=like.dtype, device=dev)
        self.off = self.start = 0
        self.lengths = torch.arange(1, HIST_LEN + 1, dtype=like.dtype, device=dev)
        self.acc = torch.zeros(HIST_LEN + 1, dtype=torch.int64, device=dev)
        self.host = torch.zeros((self.ROWS, HIST_LEN + 1), dtype=torch.int64, pin_memory=self.cuda)
        self.row = 0

    def add(self, lens) -> int:
        """Copy one cycle's lengths in (one device-to-device copy); where they start."""
        flat = lens.reshape(-1)
        n = flat.numel()
        if self.off + n > len(self.buf):
            self._fold(self.start, self.off)
            if n > len(self.buf):
                self.buf = self.torch.empty(2 * n, dtype=self.buf.dtype, device=self.buf.device)
            self.off = self.start = 0
        at = self.off
        self.buf[at : at + n].copy_(flat, non_blocking=True)
        self.off += n
        return at

    def _fold(self, a: int, b: int) -> None:
        if b > a:
            seg = self.buf[a:b]
            # counts per length by comparison with 1..HIST_LEN: a fixed shape, so no sync
            # (bincount's output size depends on the data and would wait for it)
            self.acc[:HIST_LEN] += (seg.clamp(1, HIST_LEN).unsqueeze(1) == self.lengths).sum(0)
            self.acc[HIST_LEN] += seg.sum()

    def close(self, upto: int | None = None):
        """Count the open window's lengths (those before ``upto``: a later cycle's open the next
        window) and start copying the counts out; a handle for ``read``."""
        upto = self.off if upto is None else upto
        self._fold(self.start, upto)
        row = self.host[self.row % self.ROWS]
        self.row += 1
        row.copy_(self.acc, non_blocking=True)
        done = None
        if self.cuda:
            done = self.torch.cuda.Event()
            done.record()
        self.acc.zero_()
        self.start = upto
        return row, done

    def read(self, handle) -> tuple[list[int], float]:
        row, done = handle
        if done is not None:
            done.synchronize()  # recorded a window ago in event mode: returns at once
        values = row.tolist()
        return [int(k) for k in values[:HIST_LEN]], float(values[HIST_LEN])


RECORDER: Recorder | None = None
_PATCHED: list[tuple[type, str]] = []  # every (class, method) wrapped, to restore on an error


def _disable(error: BaseException) -> None:
    """The probe failed: stop profiling for good, put SGLang's own methods back, say so once.
    Nothing of the probe may ever take the server down."""
    global RECORDER
    rec, RECORDER = RECORDER, None
    if rec is None:
        return
    for cls, name in _PATCHED:
        fn = cls.__dict__.get(name)
        if getattr(fn, "__eagle3_probe__", False):
            setattr(cls, name, fn.__wrapped__)
    _PATCHED.clear()
    try:
        (rec.logger or logging.getLogger("sglang")).warning(
            "EAGLE3_PROFILE: probe disabled after an internal error (%s: %s); the server runs on unprofiled",
            type(error).__name__,
            error,
        )
    except Exception:  # noqa: BLE001 - not even the warning may fail the server's call
        pass


def _scheduled_k(scheduler_output) -> int | None:
    """vLLM: the K the scheduler scheduled this step (its schedule's or a hold's), from its output's
    ``num_spec_tokens_to_schedule`` (the K the drafter is told to propose; vLLM 0.32 on). Not the
    lengths of ``scheduled_spec_decode_tokens``: a look-up drafter's partial match is shorter than K
    without any change of setting. None where the output has no such field (the configured K)."""
    k = getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def _vllm_batch_size(scheduler_output) -> int | None:
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None)
    return len(scheduled) if isinstance(scheduled, dict) and scheduled else None


def _wrap(cls, name: str, phase: str) -> None:
    original = getattr(cls, name)
    if getattr(original, "__eagle3_probe__", False):
        return

    def wrapper(self, *args, **kwargs):
        # SGLang's method runs exactly once, and its own exceptions pass through untouched; an
        # error of the probe's bookkeeping before or after it only disables the probe.
        rec = RECORDER
        if rec is None:
            return original(self, *args, **kwargs)
        try:
            token = rec.start(phase, self, args)
        except Exception as e:  # noqa: BLE001
            _disable(e)
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        try:
            rec.stop(phase, token, self, args, result)
        except Exception as e:  # noqa: BLE001
            _disable(e)
        return result

    wrapper.__eagle3_probe__ = True
    wrapper.__wrapped__ = original
    wrapper.__name__ = original.__name__
    wrapper.__doc__ = original.__doc__
    setattr(cls, name, wrapper)
    _PATCHED.append((cls, name))


def patch_module(module) -> list[str]:
    """Wrap the phases this module defines; return what was expected but not found."""
    missing = []
    for cls_name, methods in TARGETS.get(module.__name__, {}).items():
        cls = getattr(module, cls_name, None)
        if cls is None:
            missing.append(cls_name)
            continue
        for meth, phase in methods.items():
            if callable(getattr(cls, meth, None)):
                _wrap(cls, meth, phase)
            else:
                missing.append(f"{cls_name}.{meth}")
    if missing:
        package = module.__name__.split(".")[0]
        logging.getLogger(module.__name__).warning(
            "EAGLE3_PROFILE: %s %s: %s not found in %s; the server runs unprofiled",
            {"vllm": "vLLM"}.get(package, "SGLang"),
            _version(package),
            ", ".join(missing),
            module.__name__,
        )
        _unpatch(module)
    return missing


def _unpatch(module) -> None:
    for cls_name, methods in TARGETS.get(module.__name__, {}).items():
        cls = getattr(module, cls_name, None)
        for meth in methods:
            fn = getattr(cls, meth, None) if cls is not None else None
            if getattr(fn, "__eagle3_probe__", False):
                setattr(cls, meth, fn.__wrapped__)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        if RECORDER is not None:  # a launch with the switch alone profiles nothing
            patch_module(module)
        try:
            patch_switch(module)
        except Exception as e:  # noqa: BLE001 - never fail the engine's import: it runs without a switch
            logging.getLogger(module.__name__).warning("EAGLE3_SWITCH: not hooked (%s: %s)", type(e).__name__, e)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        profiled = RECORDER is not None and fullname in TARGETS
        if not profiled and (SWITCH is None or fullname not in SWITCH_TARGETS):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


# ---- switch: hold a step count through the engine's own switching code (docs/switch.md) ----------

SWITCH_TARGETS = {
    # vLLM: the scheduler looks K up per batch size at every step when a schedule is set
    "vllm.v1.core.sched.scheduler": {"Scheduler": ("schedule",)},
    # SGLang --speculative-adaptive: the controller that swaps prepared runtime states
    "sglang.srt.speculative.adaptive_runtime_state": {
        "AdaptiveController": ("on_verify_complete", "_activate", "activate_step_by_batch")
    },
}
SWITCH_OPTIONAL = {"activate_step_by_batch"}  # SGLang versions before it switch in on_verify_complete only
SWITCH_POLL_S = 0.05
SWITCH_FIELDS = ("v", "seq", "hold")


def switch_canonical(command: dict) -> bytes:
    """The signed bytes of a command: its v, seq and hold as JSON, keys sorted, no spaces."""
    return json.dumps({k: command.get(k) for k in SWITCH_FIELDS}, sort_keys=True, separators=(",", ":")).encode()


def switch_mac(key: bytes, command: dict) -> str:
    return hmac.new(key, switch_canonical(command), hashlib.sha256).hexdigest()


def _write_atomic(path: str, data: dict) -> None:
    """``path`` replaced in one rename by a 0600 file of the same folder holding ``data`` as JSON."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(data, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Switch:
    """The reader of one launch's switch file: checks each new command, tells the engine's hook
    what to hold, acknowledges in ``<file>.ack``. ``hold`` is the step count held (None: the
    engine's own policy); ``seq`` the last authentic command's."""

    def __init__(self, path: str, key: bytes):
        self.path = path
        self.key = key
        self.seq = 0
        self.hold: int | None = None
        self.applies = False  # this process runs the engine's switching code (its hook was called)
        self.next_poll = 0.0
        self.seen: tuple | None = None  # (mtime, size, inode) of the file last read
        self.ack_seen: tuple | None = None
        self.logger: logging.Logger | None = None

    @classmethod
    def from_env(cls) -> Switch | None:
        path, key = os.environ.get("TUITUNE_SWITCH_FILE", ""), os.environ.get("TUITUNE_SWITCH_KEY", "")
        if not path or not key:
            return None
        try:
            raw = bytes.fromhex(key)
        except ValueError:
            raw = b""
        if len(raw) < 16:
            sys.stderr.write("EAGLE3_SWITCH: TUITUNE_SWITCH_KEY is not a hex key of 16 bytes or more; no switch\n")
            return None
        return cls(path, raw)

    # ---- the engine's side ---------------------------------------------------------------------
    def due(self) -> dict | None:
        """A new authentic command to apply, or None (nothing new, not yet time, or refused: a
        refusal is acknowledged here). At most one look at the file every SWITCH_POLL_S."""
        self.applies = True
        now = time.monotonic()
        if now < self.next_poll:
            return None
        self.next_poll = now + SWITCH_POLL_S
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        mark = (st.st_mtime_ns, st.st_size, st.st_ino)
        if mark == self.seen:
            return None
        self.seen = mark
        command, why = self._read()
        if why is not None:
            seq = command.get("seq") if isinstance(command, dict) else None
            self.answer(seq if type(seq) is int else None, None, why)  # a seq is said only as a number
            return None
        return command

    def _read(self) -> tuple[dict | None, str | None]:
        """(command, None) for one to apply, else (what could be read, the refusal)."""
        try:
            st, data = _read_regular(self.path)
        except OSError as e:
            return None, f"the command file cannot be read ({e.strerror or e})"
        if st.st_uid != os.geteuid():
            return None, f"the command file belongs to uid {st.st_uid}, not to the engine's user"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None, "the command file is writable by others than its owner"
        try:
            command = json.loads(data)
        except ValueError:
            return None, "the command file is not JSON"
        if not isinstance(command, dict) or not isinstance(command.get("mac"), str):
            return None, "the command is no JSON object with a mac"
        if not hmac.compare_digest(command["mac"], switch_mac(self.key, command)):
            return command, "the command's mac does not match this launch's key"
        seq, hold = command.get("seq"), command.get("hold")
        if command.get("v") != 1 or type(seq) is not int:
            return command, "the command is not version 1 with an integer seq"
        if seq <= self.seq:
            return command, f"seq {seq} is not after the last accepted ({self.seq}): a replay"
        self.seq = seq  # authentic and new: what follows refuses or applies it, never again
        if hold is not None and not (isinstance(hold, dict) and type(hold.get("steps")) is int):
            return command, 'hold must be null or {"steps": K} with an integer K'
        return command, None

    def answer(self, seq, steps: int | None, why: str | None) -> None:
        """Acknowledge one command (``why`` None: applied) and log it, never raising."""
        applied = why is None
        if applied:
            self.hold = steps
        try:
            text = "hold" if steps is not None else "release"
            ack = {"seq": seq, "applied": applied, "steps": steps, "held": self.hold}
            ack["why"] = f"{text} applied through the engine's own switching code" if applied else why
            _write_atomic(self.path + ".ack", ack)
        except Exception as e:  # noqa: BLE001 - the engine runs on; the line below says it
            why = f"{why or 'applied'}; and the ack could not be written ({type(e).__name__}: {e})"
        try:
            (self.logger or logging.getLogger("eagle3_switch")).info(
                "EAGLE3_SWITCH seq=%s hold=%s applied=%d%s",
                seq,
                "release" if steps is None and applied else steps,
                1 if applied else 0,
                "" if applied else f" why={why}",
            )
        except Exception:  # noqa: BLE001
            pass

    # ---- the profile's side -------------------------------------------------------------------
    def held_now(self) -> int | None:
        """The step count held for a profile line: this process's own where it applies commands,
        else (vLLM's worker process, apart from its scheduler) what the last ack says."""
        if self.applies:
            return self.hold
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + SWITCH_POLL_S
            try:
                st = os.stat(self.path + ".ack")
                mark = (st.st_mtime_ns, st.st_size, st.st_ino)
                if mark != self.ack_seen:
                    self.ack_seen = mark
                    held = json.loads(_read_regular(self.path + ".ack")[1]).get("held")
                    self.hold = held if type(held) is int else None
            except (OSError, ValueError, AttributeError):
                pass
        return self.hold


SWITCH: Switch | None = None


def _read_regular(path: str, limit: int = 65536) -> tuple[os.stat_result, bytes]:
    """A regular file's status and first ``limit`` bytes, never blocking: no link is followed and a
    FIFO or device put at the path is refused (OSError) before anything waits on it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)  # the file read is the file checked
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        return st, os.read(fd, limit)
    finally:
        os.close(fd)


def _switch_tick(engine, apply) -> None:
    """One look from the engine's per-cycle hook: a new command is applied by ``apply(engine, K)``
    (None: applied, else the refusal), acknowledged either way. Never raises."""
    sw = SWITCH
    if sw is None:
        return
    try:
        if sw.logger is None:
            sw.logger = logging.getLogger(type(engine).__module__)
        command = sw.due()
        if command is None:
            return
        hold = command["hold"]
        steps = None if hold is None else hold["steps"]
        try:
            why = apply(engine, steps)
        except Exception as e:  # noqa: BLE001 - the engine's switching code refused it
            why = f"the engine's switching code failed ({type(e).__name__}: {e})"
        sw.answer(command["seq"], steps, why)
    except Exception as e:  # noqa: BLE001 - nothing of the switch may take the engine down
        try:
            logging.getLogger("eagle3_switch").warning("EAGLE3_SWITCH failed: %s: %s", type(e).__name__, e)
        except Exception:  # noqa: BLE001
            pass


def _vllm_apply(sched, steps: int | None) -> str | None:
    """vLLM: hold K by a constant lookup in place of the schedule's; release puts the schedule back."""
    own = sched.__dict__.get("_tuitune_own_lookup", _MISSING)
    if steps is None:
        if own is not _MISSING:
            sched.dynamic_sd_lookup = own
            del sched._tuitune_own_lookup
        return None
    lookup = sched.dynamic_sd_lookup if own is _MISSING else own
    if lookup is None:
        return (
            "this launch has no num_speculative_tokens_per_batch_size schedule: add one to "
            "--speculative-config (e.g. [[1, MAX_NUM_SEQS, K]]) and relaunch to switch K in it"
        )
    kmax = getattr(sched, "num_spec_tokens", None)
    if not isinstance(kmax, int) or not 0 <= steps <= kmax:
        return f"K={steps} is outside 0..{kmax}, the num_speculative_tokens this launch was started with"
    if own is _MISSING:
        sched._tuitune_own_lookup = lookup
    sched.dynamic_sd_lookup = [steps] * len(lookup)
    return None


def _sglang_apply(ctrl, steps: int | None) -> str | None:
    """SGLang: hold steps by activating its prepared runtime state; release asks the policy again."""
    worker = ctrl.worker
    if steps is None:
        bs = ctrl.__dict__.get("_tuitune_bs")
        choose = getattr(ctrl.params, "get_steps_for_batch", None)
        if bs is not None and callable(choose):
            target = choose(bs)
            if target != worker.speculative_num_steps:
                ctrl._activate(target)
        return None
    states = getattr(ctrl, "_states", None) or getattr(ctrl, "states", None) or {}
    if steps not in states:
        return (
            f"steps {steps} has no runtime state in this launch (prepared: {sorted(states)}): add it to "
            "the adaptive config's candidate_steps and relaunch"
        )
    if steps != worker.speculative_num_steps:
        ctrl._activate(steps)
    return None


_MISSING = object()


def _switch_wrap(cls, name: str) -> None:
    original = cls.__dict__.get(name)
    if original is None or getattr(original, "__eagle3_switch__", False):
        return
    if cls.__name__ == "Scheduler":

        def wrapper(self, *args, **kwargs):
            _switch_tick(self, _vllm_apply)
            return original(self, *args, **kwargs)

    elif name == "activate_step_by_batch":

        def wrapper(self, *args, **kwargs):
            if args and isinstance(args[0], int):
                self._tuitune_bs = args[0]
            _switch_tick(self, _sglang_apply)
            if SWITCH is not None and SWITCH.hold is not None:
                return None  # held: the policy's choice is not asked for
            return original(self, *args, **kwargs)

    elif name == "on_verify_complete":

        def wrapper(self, *args, **kwargs):
            _switch_tick(self, _sglang_apply)
            held = SWITCH.hold if SWITCH is not None else None
            if held is None:
                return original(self, *args, **kwargs)
            try:
                if held != self.worker.speculative_num_steps:  # versions that switch only here
                    self._activate(held)
            except Exception as e:  # noqa: BLE001 - never into the engine: the policy runs on as before
                logging.getLogger(type(self).__module__).warning(
                    "EAGLE3_SWITCH: hold %s not applied (%s: %s)", held, type(e).__name__, e
                )
                return original(self, *args, **kwargs)
            return None  # held: the policy's feedback is frozen

    else:
        return
    wrapper.__eagle3_switch__ = True
    wrapper.__wrapped__ = original
    wrapper.__name__ = original.__name__
    setattr(cls, name, wrapper)


def patch_switch(module) -> None:
    """Hook the engine's switching code of this module (only with a switch configured)."""
    if SWITCH is None:
        return
    for cls_name, methods in SWITCH_TARGETS.get(module.__name__, {}).items():
        cls = getattr(module, cls_name, None)
        missing = [m for m in methods if m not in SWITCH_OPTIONAL and cls is not None and m not in cls.__dict__]
        if cls is None or missing:
            logging.getLogger(module.__name__).warning(
                "EAGLE3_SWITCH: %s%s not found in %s; no switch in this launch",
                cls_name,
                "." + ", ".join(missing) if missing else "",
                module.__name__,
            )
            continue
        for meth in methods:
            _switch_wrap(cls, meth)


def install_switch() -> bool:
    """Called from sitecustomize when TUITUNE_SWITCH_FILE is set: hook the switching code."""
    global SWITCH
    if SWITCH is not None:
        return True
    SWITCH = Switch.from_env()
    if SWITCH is None:
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in SWITCH_TARGETS:
        if name in sys.modules:
            patch_switch(sys.modules[name])
    return True


def install() -> None:
    """Called from sitecustomize in every process that starts with EAGLE3_PROFILE set."""
    global RECORDER
    if RECORDER is not None:
        return
    sync = os.environ.get("EAGLE3_PROFILE_SYNC", "event").lower()
    RECORDER = Recorder(int(os.environ.get("EAGLE3_PROFILE_WINDOW", "40")), "host" if sync == "host" else "event")
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    for name in TARGETS:  # already imported (e.g. installed late): patch in place
        if name in sys.modules:
            patch_module(sys.modules[name])


# ---- check ---------------------------------------------------------------------------------------


def check(sglang_path: str | None = None, engine: str = "sglang") -> dict:
    """Which phases this SGLang (or vLLM) source tree allows patching (read with ast, nothing imported)."""
    if sglang_path is None:
        spec = importlib.util.find_spec(engine)
        if spec is None or not spec.submodule_search_locations:
            return {"sglang": None, "error": f"{engine} is not installed for this python", "phases": {}}
        sglang_path = list(spec.submodule_search_locations)[0]
    root = sglang_path
    version = None
    vfile = os.path.join(root, "_version.py")
    if os.path.exists(vfile):
        for node in ast.walk(ast.parse(open(vfile, encoding="utf-8").read())):
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") in ("__version__", "version") for t in node.targets
            ):
                if isinstance(node.value, ast.Constant):
                    version = node.value.value
    if version is None:  # an installed wheel: the dist-info beside the package says it
        parent = os.path.dirname(os.path.abspath(root))
        for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
            if entry.startswith(f"{engine}-") and entry.endswith(".dist-info"):
                version = entry[len(engine) + 1 : -len(".dist-info")]
    found: dict[str, dict] = {}
    for module, classes in TARGETS.items():
        if module.split(".")[0] != engine:
            continue
        rel = module.split(".", 1)[1].replace(".", os.sep) + ".py"
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        tree = ast.parse(open(path, encoding="utf-8").read())
        defined = {
            n.name: {m.name for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for n in tree.body
            if isinstance(n, ast.ClassDef)
        }
        for cls, methods in classes.items():
            for meth, phase in methods.items():
                ok = meth in defined.get(cls, set())
                found.setdefault(module, {})[f"{cls}.{meth}"] = {"phase": phase, "found": ok}
    usable = [m for m, entries in found.items() if all(e["found"] for e in entries.values())]
    switch = _check_switch(root, engine)
    phases = sorted({e["phase"] for m in usable for e in found[m].values()})
    missing = sorted(set(ENGINE_PHASES[engine]) - set(phases))
    return {
        "sglang": root,
        "engine": engine,
        "version": version,
        "modules": found,
        "usable": usable,
        "phases": phases,
        "missing": missing,
        "ok": not missing,
        "switch": switch,
    }


# what each engine's switch reads or calls besides the hooked methods (names in the module's source)
SWITCH_NAMES = {
    "vllm.v1.core.sched.scheduler": ("dynamic_sd_lookup", "num_spec_tokens"),
    "sglang.srt.speculative.adaptive_runtime_state": ("_states", "params", "worker"),
}


def _check_switch(root: str, engine: str) -> dict:
    """Whether the switch's patch points exist in this source tree (ast, nothing imported)."""
    points: dict[str, bool] = {}
    for module, classes in SWITCH_TARGETS.items():
        if module.split(".")[0] != engine:
            continue
        path = os.path.join(root, module.split(".", 1)[1].replace(".", os.sep) + ".py")
        tree = ast.parse(open(path, encoding="utf-8").read()) if os.path.exists(path) else None
        defined = {
            n.name: {m.name for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for n in (tree.body if tree else [])
            if isinstance(n, ast.ClassDef)
        }
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} if tree else set()
        for cls, methods in classes.items():
            for meth in methods:
                points[f"{module}:{cls}.{meth}"] = meth in defined.get(cls, set())
        for name in SWITCH_NAMES.get(module, ()):
            points[f"{module}:self.{name}"] = name in attrs
    needed = {k: v for k, v in points.items() if k.rsplit(".", 1)[-1] not in SWITCH_OPTIONAL}
    return {"points": points, "ok": bool(needed) and all(needed.values())}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="check which EAGLE phases the probe can patch")
    ap.add_argument("--check", action="store_true", required=True)
    ap.add_argument("--sglang-path", help="the engine's package directory (default: the one this python finds)")
    ap.add_argument("--engine", choices=sorted(ENGINE_PHASES), default="sglang")
    ns = ap.parse_args()
    print(json.dumps(check(ns.sglang_path, ns.engine)))
