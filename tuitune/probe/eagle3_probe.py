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
import, no GPU) and reports which phases it can patch.

Why one file of this size: it is copied to the target and imported inside the engine by
``sitecustomize``, stdlib only; one self-contained file is what can be uploaded and checked.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import math
import os
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
            if self.cycles and (self.cycles[0]["steps"], self.cycles[0]["draft_tokens"]) != (
                c["steps"],
                c["draft_tokens"],
            ):
                # the steps changed (adaptive mode): one line per configuration; this cycle's
                # accept lengths, already in the ring, open the next window
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
        patch_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Called from sitecustomize in every process that starts with EAGLE3_PROFILE set."""
    global RECORDER
    if RECORDER is not None:
        return
    sync = os.environ.get("EAGLE3_PROFILE_SYNC", "event").lower()
    RECORDER = Recorder(int(os.environ.get("EAGLE3_PROFILE_WINDOW", "40")), "host" if sync == "host" else "event")
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
    }


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="check which EAGLE phases the probe can patch")
    ap.add_argument("--check", action="store_true", required=True)
    ap.add_argument("--sglang-path", help="the engine's package directory (default: the one this python finds)")
    ap.add_argument("--engine", choices=sorted(ENGINE_PHASES), default="sglang")
    ns = ap.parse_args()
    print(json.dumps(check(ns.sglang_path, ns.engine)))
