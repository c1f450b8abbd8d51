"""A tensor-parallel decode step under each NCCL setting, against what nccl-bench predicts for it.

For each NCCL setting (a fresh set of processes each: NCCL reads its variables when a communicator
is created) this runs, with the same environment:

1. nccl-bench's own worker (``tuitune/machine/remote/nccl_worker.py --graph``, what `tuitune
   nccl-bench` runs on a target) at the step's all-reduce sizes, one process a GPU;
2. the decode step of a Llama-8B-shaped model (32 layers, hidden 4096, 32 query / 8 KV heads of
   128, MLP 14336, vocab 128256; each rank holds its 1/world share, as tensor parallelism splits
   it), one process a GPU: the vocab-parallel embedding and its all-reduce, then per layer RMSNorm,
   the QKV projection, attention of each request's token(s) over a KV cache of ``--context``
   tokens, the output projection and its all-reduce, RMSNorm, gate/up, SiLU, the down projection
   and its all-reduce; the LM head on the rank's vocabulary share (the logits' all-gather is left
   out: it is not an all-reduce). The step is captured in a CUDA graph per batch size and
   replayed, as engines decode; each replay is timed with CUDA events. The same step without its
   all-reduces is captured and replayed too (blocks alternate), so the table shows the all-reduce
   time inside the step as well.

The prediction (``tuitune.decide.ncclstep``, the one ``tune --nccl`` uses): the all-reduces a step
makes (2 a layer + 1, the benchmark counts them as they run and checks the count) times
nccl-bench's median latency at their size; the predicted saving of a setting is the reference's
(the first setting) all-reduce time minus its own, the measured saving the difference of the
median step times. Each setting runs ``--repeats`` times (fresh processes, interleaved with the
others); its noise is the larger of the spread of one run's block medians and the spread of its
runs' medians; pairs of settings closer than their two noises together are not ranked. NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0``; a setting that turns it on is refused).

    python benchmarks/nccl_decode_step.py [--world-size 2] [--batches 1,2,4,8,16,32,64]
        [--setting "NCCL_PROTO=LL NCCL_ALGO=Ring" ...] [--json OUT]

Without ``--setting`` the settings are NCCL's defaults then NCCL_PROTO ∈ {LL, LL128, Simple} ×
NCCL_ALGO ∈ {Ring, Tree}, the grid `tuitune nccl-bench` ranks. ``--backend gloo`` runs the same
orchestration on CPUs (NCCL is not used then: a trial of the script; the tests use it).
``--world-size 1`` runs the single-GPU parts (capture, replay, timing; one rank's share of the
model with ``--shard 2``); PyTorch creates no NCCL communicator for one rank, so nothing is
compared then. Needs one GPU a process for the nccl backend. The figures, with the world they
were measured in: docs/nccl-decode-step.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tuitune.decide import ncclstep as NS

ROOT = Path(__file__).resolve().parent.parent


WORKER = ROOT / "tuitune" / "machine" / "remote" / "nccl_worker.py"
# NVLink multicast can put a shared host's GPUs out of service: always off, in every process
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
DEFAULT_SETTINGS = [""] + [f"NCCL_PROTO={p} NCCL_ALGO={a}" for p in ("LL", "LL128", "Simple") for a in ("Ring", "Tree")]
ECHO = re.compile(r"(NCCL_[A-Z0-9_]+) set by environment to (\S+?)\.?(?=\s|$)", re.M)


def parse_setting(text: str) -> dict[str, str]:
    """``"NCCL_PROTO=LL NCCL_ALGO=Ring"`` (``defaults`` or empty: NCCL's own) -> variables."""
    env: dict[str, str] = {}
    for part in text.replace(",", " ").split():
        if part == "defaults":
            continue
        name, sep, value = part.partition("=")
        if not sep or not name or not value:
            raise SystemExit(f"nccl_decode_step: --setting {text!r}: expected NAME=VALUE pairs")
        if name == "NCCL_NVLS_ENABLE" and value != "0":
            raise SystemExit("nccl_decode_step: NVLink multicast stays off on this machine (NCCL_NVLS_ENABLE=0)")
        env[name] = value
    return env


def label_of(env: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items()) or "defaults"


# ---- one setting: the ranks ------------------------------------------------------------------


def _model(torch, a: argparse.Namespace, device, dtype, shard: int, rank: int) -> dict:
    g = torch.Generator(device=device).manual_seed(1234 + rank)  # drawn where they live: no host copy

    def w(rows: int, cols: int):
        return torch.randn(rows, cols, generator=g, device=device, dtype=dtype) / rows**0.5

    def cache():
        return torch.randn(max(a.batches), kvh, a.context, a.head_dim, generator=g, device=device, dtype=dtype)

    qh, kvh = a.heads // shard, max(1, a.kv_heads // shard)
    inter, vocab = a.intermediate // shard, a.vocab // shard
    layers = []
    for _ in range(a.layers):
        layers.append(
            {
                "n1": torch.ones(a.hidden, device=device, dtype=dtype),
                "qkv": w(a.hidden, (qh + 2 * kvh) * a.head_dim),
                "o": w(qh * a.head_dim, a.hidden),
                "n2": torch.ones(a.hidden, device=device, dtype=dtype),
                "gu": w(a.hidden, 2 * inter),
                "down": w(inter, a.hidden),
                # the KV cache of every request, for the largest batch (slices for smaller ones)
                "k": cache(),
                "v": cache(),
            }
        )
    return {
        "qh": qh,
        "kvh": kvh,
        "emb": w(vocab, a.hidden),
        "vocab_start": rank * vocab,
        "layers": layers,
        "nf": torch.ones(a.hidden, device=device, dtype=dtype),
        "head": w(a.hidden, vocab),
        "ids": torch.randint(0, a.vocab, (max(a.batches) * a.tokens_per_req,), generator=g, device=device),
    }


def _step(torch, m: dict, a: argparse.Namespace, batch: int, allreduce):
    """One decode forward over ``batch`` requests of ``tokens_per_req`` tokens each."""
    F = torch.nn.functional
    t = a.tokens_per_req
    n = batch * t

    def rms(x, weight):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight

    local = m["ids"][:n] - m["vocab_start"]  # the vocab-parallel embedding: this rank's rows, zeros elsewhere
    mine = (local >= 0) & (local < m["emb"].shape[0])
    x = F.embedding(local.clamp(0, m["emb"].shape[0] - 1), m["emb"]) * mine.unsqueeze(1).to(m["emb"].dtype)
    allreduce(x)
    qh, kvh, hd = m["qh"], m["kvh"], a.head_dim
    for L in m["layers"]:
        qkv = rms(x, L["n1"]) @ L["qkv"]
        q = qkv[:, : qh * hd].reshape(batch, t, qh, hd).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, L["k"][:batch], L["v"][:batch], enable_gqa=qh != kvh)
        o = att.transpose(1, 2).reshape(n, qh * hd) @ L["o"]
        allreduce(o)
        x = x + o
        gate, up = (rms(x, L["n2"]) @ L["gu"]).chunk(2, dim=-1)
        d = (F.silu(gate) * up) @ L["down"]
        allreduce(d)
        x = x + d
    return rms(x, m["nf"]) @ m["head"]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def _rank(rank: int, a: argparse.Namespace, port: int) -> None:
    import faulthandler

    import torch
    import torch.distributed as dist

    nccl = a.backend == "nccl"
    if nccl:
        torch.cuda.set_device(rank)
        device, dtype = torch.device("cuda", rank), torch.bfloat16
    else:
        device, dtype = torch.device("cpu"), torch.float32  # gloo's CPU all-reduce: float32
        torch.set_num_threads(1)  # ranks that share a few cores: no spinning thread pools
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.world_size)
    faulthandler.dump_traceback_later(a.stall_s, exit=True)  # a hung collective fails the run
    shard = a.shard or a.world_size
    torch.manual_seed(rank)
    m = _model(torch, a, device, dtype, shard, rank)
    seen: list[int] = []

    def counted(x):
        seen.append(x.numel() * x.element_size())
        dist.all_reduce(x)

    def none(x):
        return None

    out: dict = {}
    for batch in a.batches:
        faulthandler.dump_traceback_later(a.stall_s, exit=True)
        seen.clear()
        with torch.no_grad():
            _step(torch, m, a, batch, counted)  # eager once: counts the all-reduces, warms NCCL up
        sizes = sorted(set(seen))
        observed = [[seen.count(s), s] for s in sizes]
        step_t: list[float] = []
        comp_t: list[float] = []
        blocks: list[float] = []
        comp_blocks: list[float] = []
        per_block = max(1, a.iters // a.blocks)
        if nccl and a.graph:
            graphs = {}
            for name, fn in (("step", dist.all_reduce), ("compute", none)):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side), torch.no_grad():
                    for _ in range(3):
                        _step(torch, m, a, batch, fn)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: NCCL's watchdog thread queries events while this thread captures
                with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.no_grad():
                    _step(torch, m, a, batch, fn)
                graphs[name] = graph
            for _ in range(a.warmup):
                graphs["step"].replay()
                graphs["compute"].replay()
            torch.cuda.synchronize()
            for _ in range(a.blocks):
                for name, times, medians in (("step", step_t, blocks), ("compute", comp_t, comp_blocks)):
                    ev = [
                        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                        for _ in range(per_block)
                    ]
                    for s, e in ev:
                        s.record()
                        graphs[name].replay()
                        e.record()
                    torch.cuda.synchronize()
                    block = [s.elapsed_time(e) * 1000.0 for s, e in ev]
                    times += block
                    medians.append(statistics.median(block))
            del graphs
        else:
            with torch.no_grad():
                for _ in range(a.warmup):
                    _step(torch, m, a, batch, dist.all_reduce)
                for _ in range(a.blocks):
                    for fn, times, medians in ((dist.all_reduce, step_t, blocks), (none, comp_t, comp_blocks)):
                        block = []
                        for _ in range(per_block):
                            if nccl:
                                torch.cuda.synchronize()
                            t0 = time.perf_counter()
                            _step(torch, m, a, batch, fn)
                            if nccl:
                                torch.cuda.synchronize()
                            block.append((time.perf_counter() - t0) * 1e6)
                        times += block
                        medians.append(statistics.median(block))
        out[str(batch)] = {
            "tokens": batch * a.tokens_per_req,
            "step_us": statistics.median(step_t),
            "step_p10_us": _pct(step_t, 0.1),
            "step_p90_us": _pct(step_t, 0.9),
            "block_us": blocks,
            "noise_us": max(blocks) - min(blocks),
            "compute_us": statistics.median(comp_t),
            "compute_noise_us": max(comp_blocks) - min(comp_blocks),
            "replays": len(step_t),
            "allreduces": observed,
        }
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        info = {
            "backend": a.backend,
            "world_size": a.world_size,
            "shard": shard,
            "graph": bool(nccl and a.graph),
            "torch": torch.__version__,
            "batches": out,
        }
        if nccl:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["device"] = torch.cuda.get_device_name(0)
        print("DECODE_STEP_RESULT " + json.dumps(info), flush=True)
    sys.stdout.flush()
    if nccl and a.graph:
        os._exit(0)  # tearing down a communicator that a live CUDA graph captured can hang
    dist.barrier()
    dist.destroy_process_group()


def worker_main(a: argparse.Namespace) -> int:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(_rank, args=(a, port), nprocs=a.world_size, join=True)
    except Exception as e:  # noqa: BLE001 - one line for the orchestrator
        lines = str(e).strip().splitlines()
        print(f"DECODE_STEP_FAILED {type(e).__name__}: {lines[-1] if lines else ''}", flush=True)
        return 1
    return 0


# ---- the orchestration ------------------------------------------------------------------------


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s (a hung collective?)"
    return r.returncode, r.stdout + r.stderr


def _result(text: str, marker: str) -> dict | None:
    for line in text.splitlines():
        if line.startswith(marker + " "):
            return json.loads(line[len(marker) + 1 :])
    return None


def _why(text: str, rc: int) -> str:
    for line in text.splitlines():
        if line.startswith(("DECODE_STEP_FAILED ", "NCCL_BENCH_FAILED ", "NCCL_BENCH_NO_CUDA ")):
            return line.split(" ", 1)[1][:300]
    tail = text.strip().splitlines()
    return (tail[-1] if tail else f"exit status {rc}")[:300]


def shape_of(a: argparse.Namespace) -> NS.TPShape:
    return NS.TPShape(layers=a.layers, hidden=a.hidden, dtype_bytes=2 if a.backend == "nccl" else 4)


def run_setting(a: argparse.Namespace, env_vars: dict[str, str], argv: list[str]) -> dict:
    """nccl-bench's worker, then the decode step, both under ``env_vars``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(SAFE_ENV)
    env.update(env_vars)
    if a.backend == "nccl":
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ENV"})  # NCCL echoes what it read
    env["PYTHONUNBUFFERED"] = "1"
    shape = shape_of(a)
    sizes = sorted({shape.message_bytes(NS.step_tokens(b, a.tokens_per_req)) for b in a.batches})
    row: dict = {"label": label_of(env_vars), "env": env_vars}
    t0 = time.monotonic()
    bench = [
        sys.executable,
        str(WORKER),
        "--backend",
        a.backend,
        "--world-size",
        str(a.world_size),
        "--sizes",
        ",".join(map(str, sizes)),
        "--iters",
        str(a.bench_iters),
        "--warmup",
        "20",
        "--dtype-bytes",
        str(shape.dtype_bytes),
    ] + (["--graph"] if a.graph and a.backend == "nccl" else [])
    rc, text = _run(bench, env, a.timeout)
    res = _result(text, "NCCL_BENCH_RESULT")
    if rc != 0 or res is None:
        row["error"] = "nccl-bench worker: " + _why(text, rc)
        return row
    row["nccl_bench"] = res["results"]
    echoed = dict(ECHO.findall(text))
    rc, text = _run([sys.executable, str(Path(__file__).resolve()), "--worker", *argv], env, a.timeout)
    res = _result(text, "DECODE_STEP_RESULT")
    if rc != 0 or res is None:
        row["error"] = "decode step: " + _why(text, rc)
        return row
    row["step"] = res
    echoed.update(ECHO.findall(text))
    row["echoed"] = echoed
    row["seconds"] = time.monotonic() - t0
    return row


def merge(runs: list[dict]) -> dict:
    """One setting's repeated runs (fresh processes each) as one row: medians across runs; the
    noise is the larger of a run's block spread and the spread of the runs' medians (a CUDA graph
    captured in another process can run some microseconds apart)."""
    ok = [r for r in runs if "step" in r]
    row = {"label": runs[0]["label"], "env": runs[0]["env"], "runs": len(runs)}
    failed = [r["error"] for r in runs if "error" in r]
    if failed:
        row["failed_runs"] = failed
    if not ok:
        row["error"] = failed[0]
        return row
    row["echoed"] = ok[0]["echoed"]
    sizes = [x["bytes"] for x in ok[0]["nccl_bench"]]
    row["nccl_bench"] = [
        {
            "bytes": size,
            "median_us": statistics.median(x["median_us"] for r in ok for x in r["nccl_bench"] if x["bytes"] == size),
            "per_run_us": [x["median_us"] for r in ok for x in r["nccl_bench"] if x["bytes"] == size],
        }
        for size in sizes
    ]
    step = {k: v for k, v in ok[0]["step"].items() if k != "batches"}
    step["batches"] = {}
    for b, first in ok[0]["step"]["batches"].items():
        each = [r["step"]["batches"][b] for r in ok]
        medians = [x["step_us"] for x in each]
        comp = [x["compute_us"] for x in each]
        step["batches"][b] = {
            "tokens": first["tokens"],
            "step_us": statistics.median(medians),
            "run_us": medians,
            "noise_us": max(max(x["noise_us"] for x in each), max(medians) - min(medians)),
            "compute_us": statistics.median(comp),
            "compute_noise_us": max(max(x["compute_noise_us"] for x in each), max(comp) - min(comp)),
            "replays": sum(x["replays"] for x in each),
            "allreduces": first["allreduces"],
            "allreduces_agree": all(x["allreduces"] == first["allreduces"] for x in each),
        }
    row["step"] = step
    return row


def analyse(a: argparse.Namespace, rows: list[dict]) -> dict:
    """Per batch: each setting's measured step, predicted and measured all-reduce time and saving
    against the reference (the first setting that ran), and whether the two rankings agree."""
    shape = shape_of(a)
    ok = [r for r in rows if "step" in r]
    out: dict = {"reference": ok[0]["label"] if ok else None, "batches": {}}
    if not ok:
        return out
    ref = ok[0]["label"]
    for b in a.batches:
        tokens = NS.step_tokens(b, a.tokens_per_req)
        preds = {
            p.label: p for p in NS.predict({r["label"]: NS.points_of(r["nccl_bench"]) for r in ok}, shape, tokens, ref)
        }
        meas = {r["label"]: r["step"]["batches"][str(b)] for r in ok}
        ref_step = meas[ref]["step_us"]
        table = []
        for r in ok:
            m, p = meas[r["label"]], preds[r["label"]]
            saving = ref_step - m["step_us"]
            beyond = abs(saving) > m["noise_us"] + meas[ref]["noise_us"]
            table.append(
                {
                    "label": r["label"],
                    "step_us": m["step_us"],
                    "noise_us": m["noise_us"],
                    "compute_us": m["compute_us"],
                    "measured_comm_us": m["step_us"] - m["compute_us"],
                    "predicted_comm_us": p.comm_us,
                    "measured_saving_us": saving,
                    "predicted_saving_us": p.saving_us,
                    "saving_error": (p.saving_us - saving) / saving
                    if (beyond and p.saving_us is not None and saving)
                    else None,
                    "beyond_noise": beyond,
                    "allreduces_match": m["allreduces_agree"]
                    and m["allreduces"] == [list(x) for x in shape.allreduces(tokens)],
                }
            )
        pairs = agree = 0
        for i, x in enumerate(table):
            for y in table[i + 1 :]:
                if x["predicted_comm_us"] is None or y["predicted_comm_us"] is None:
                    continue
                if abs(x["step_us"] - y["step_us"]) <= x["noise_us"] + y["noise_us"]:
                    continue  # within the noise: not ranked
                pairs += 1
                agree += (x["step_us"] < y["step_us"]) == (x["predicted_comm_us"] < y["predicted_comm_us"])
        out["batches"][str(b)] = {"tokens": tokens, "rows": table, "pairs": pairs, "agree": agree}
    return out


def print_report(a: argparse.Namespace, rows: list[dict], an: dict) -> None:
    ok = [r for r in rows if "step" in r]
    info = ok[0]["step"] if ok else {}
    shape = shape_of(a)
    print(
        f"decode step, {a.world_size} process(es), backend {a.backend}"
        + (f", {info.get('device')}, NCCL {info.get('nccl')}, torch {info.get('torch')}" if info.get("device") else "")
        + (", CUDA graph" if info.get("graph") else ", eager")
        + f"; model: {a.layers} layers, hidden {a.hidden}, each rank 1/{info.get('shard', a.world_size)}"
        + f"; {a.tokens_per_req} token(s) a request, KV cache {a.context}"
    )
    print(
        "prediction rests on: " + NS.basis(shape, NS.step_tokens(1, a.tokens_per_req), a.world_size) + " (at batch 1)"
    )
    for r in rows:
        if "error" in r:
            print(f"  {r['label']}: failed: {r['error']}")
        elif r.get("failed_runs"):
            print(f"  {r['label']}: {len(r['failed_runs'])} of {r['runs']} runs failed: {r['failed_runs'][0]}")
        elif a.backend == "nccl":
            missing = [k for k in r["env"] if r["echoed"].get(k) != r["env"][k]]
            if missing:
                print(f"  {r['label']}: NCCL did not echo {', '.join(missing)}")
    if not ok:
        return
    print(f"reference: {an['reference']}; µs a step (median); saving = reference minus setting")
    head = (
        f"{'bs':>3} {'setting':<32} {'step':>9} {'noise':>7} {'compute':>9} {'comm meas':>10} {'comm pred':>10}"
        f" {'saving meas':>12} {'saving pred':>12} {'error':>7}"
    )
    print(head)
    for b in a.batches:
        res = an["batches"][str(b)]
        for x in res["rows"]:
            pc = f"{x['predicted_comm_us']:.1f}" if x["predicted_comm_us"] is not None else "-"
            ps = f"{x['predicted_saving_us']:+.1f}" if x["predicted_saving_us"] is not None else "-"
            err = f"{x['saving_error']:+.1%}" if x["saving_error"] is not None else "-"
            flag = "" if x["allreduces_match"] else "  (all-reduces differ from the prediction's count!)"
            print(
                f"{b:>3} {x['label']:<32} {x['step_us']:>9.1f} {x['noise_us']:>7.1f} {x['compute_us']:>9.1f}"
                f" {x['measured_comm_us']:>10.1f} {pc:>10} {x['measured_saving_us']:>+12.1f} {ps:>12} {err:>7}{flag}"
            )
        print(
            f"{'':>3} ranking: {res['agree']} of {res['pairs']} pairs beyond the noise ordered as nccl-bench predicts"
        )
    if a.world_size == 1:
        print(
            "world size 1: PyTorch creates no NCCL communicator for one rank, so the settings are not exercised "
            "(the capture, replay and timing are)"
        )
    if a.backend == "gloo":
        print("backend gloo: NCCL is not used, so the NCCL variables are not exercised (a trial of the script)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="TP decode step under NCCL settings vs nccl-bench's prediction")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--shard", type=int, help="each rank's share of the model as 1/N (default: the world size)")
    p.add_argument(
        "--setting", action="append", help="NCCL variables of one setting ('NCCL_PROTO=LL NCCL_ALGO=Ring'); repeatable"
    )
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--tokens-per-req", type=int, default=1, help="tokens a request a step (a verify: draft tokens)")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--context", type=int, default=1024, help="KV-cache tokens each request attends to")
    p.add_argument(
        "--iters", type=int, default=200, help="timed replays a batch size (and as many without all-reduces)"
    )
    p.add_argument(
        "--blocks", type=int, default=5, help="blocks the replays are split into (noise: their medians' spread)"
    )
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2, help="fresh runs of each setting, interleaved")
    p.add_argument("--bench-iters", type=int, default=200, help="nccl-bench's timed all-reduces a size")
    p.add_argument("--eager", dest="graph", action="store_false", help="no CUDA graphs (time each step eagerly)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a setting's run may take")
    p.add_argument("--stall-s", type=float, default=120.0)
    p.add_argument("--json", type=Path, help="write the rows and the analysis here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.worker:
        return worker_main(a)
    if a.world_size < 1 or not a.batches or min(a.batches) < 1:
        raise SystemExit("nccl_decode_step: world size and batch sizes must be at least 1")
    settings = [parse_setting(s) for s in (a.setting or DEFAULT_SETTINGS)]  # refused before anything runs
    if a.backend == "nccl":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < a.world_size:
            print(f"nccl_decode_step: {have} CUDA device(s) for {a.world_size} NCCL process(es); skipped")
            return 0
    child, skip = [], False  # the ranks' processes get the same arguments, less --json
    for x in argv:
        if skip or x.startswith("--json="):
            skip = False
            continue
        skip = x == "--json"
        if not skip:
            child.append(x)
    runs: dict[str, list[dict]] = {}
    for rep in range(a.repeats):  # interleaved: drift of the machine spreads over every setting
        for env_vars in settings:
            print(f"running {label_of(env_vars)} ({rep + 1} of {a.repeats}) ...", flush=True)
            runs.setdefault(label_of(env_vars), []).append(run_setting(a, env_vars, child))
    rows = [merge(r) for r in runs.values()]
    an = analyse(a, rows)
    print_report(a, rows, an)
    if a.json:
        a.json.write_text(
            json.dumps(
                {"args": {k: v for k, v in vars(a).items() if k != "json"}, "rows": rows, "analysis": an}, default=str
            )
        )
    return 0 if any("step" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
