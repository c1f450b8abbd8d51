"""All-reduce micro-benchmark run on the target by `tuitune nccl-bench` (stdlib + torch only).

One process per GPU (``--world-size``), spawned here; NCCL reads its variables when the first
communicator is created, so every configuration is a fresh run of this script. For each message
size: a correctness check, warm-up, then ``--iters`` timed all-reduces (CUDA events on the NCCL
backend, wall clock on gloo); with ``--graph`` the all-reduces are captured in a CUDA graph and
replayed, as SGLang's decode does. Rank 0 prints one ``NCCL_BENCH_RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import statistics
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _run(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    nccl = args.backend == "nccl"
    if nccl:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dtype = {2: torch.bfloat16, 4: torch.float32}[args.dtype_bytes]
    else:
        device = torch.device("cpu")
        dtype = torch.float32  # gloo's CPU all-reduce: float32
    elem = torch.tensor([], dtype=dtype).element_size()
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.world_size)
    results = []
    for size in args.sizes:
        # a stage that stalls (a hung collective) dumps every thread's stack and fails this run
        faulthandler.dump_traceback_later(args.stall_s, exit=True)
        n = max(1, size // elem)
        check = torch.ones(n, dtype=dtype, device=device)
        dist.all_reduce(check)
        if float(check[0]) != args.world_size:
            raise RuntimeError(f"all-reduce gave {float(check[0])}, expected {args.world_size}")
        x = torch.zeros(n, dtype=dtype, device=device)  # zeros: repeated sums never overflow
        for _ in range(args.warmup):
            dist.all_reduce(x)
        times_us: list[float] = []
        if nccl:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if args.graph:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        dist.all_reduce(x)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: NCCL's watchdog thread queries events while this thread captures
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    for _ in range(args.per_graph):
                        dist.all_reduce(x)
                graph.replay()
                torch.cuda.synchronize()
                for _ in range(args.iters):
                    start.record()
                    graph.replay()
                    end.record()
                    end.synchronize()
                    times_us.append(start.elapsed_time(end) * 1000.0 / args.per_graph)
            else:
                for _ in range(args.iters):
                    start.record()
                    dist.all_reduce(x)
                    end.record()
                    end.synchronize()
                    times_us.append(start.elapsed_time(end) * 1000.0)
        else:
            for _ in range(args.iters):
                t0 = time.perf_counter()
                dist.all_reduce(x)
                times_us.append((time.perf_counter() - t0) * 1e6)
        results.append(
            {
                "bytes": n * elem,
                "median_us": statistics.median(times_us),
                "p99_us": _pct(times_us, 0.99),
                "min_us": min(times_us),
                "mean_us": statistics.fmean(times_us),
                "iters": len(times_us),
            }
        )
    faulthandler.cancel_dump_traceback_later()
    if rank == 0:
        info = {
            "backend": args.backend,
            "world_size": args.world_size,
            "graph": bool(args.graph and nccl),
            "torch": torch.__version__,
            "results": results,
        }
        if nccl:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["device"] = torch.cuda.get_device_name(0)
        print("NCCL_BENCH_RESULT " + json.dumps(info), flush=True)
    sys.stdout.flush()
    if args.graph and nccl:
        # tearing down a communicator that a live CUDA graph captured can hang; the work is done
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True, help="bytes")
    p.add_argument("--dtype-bytes", type=int, choices=[2, 4], default=2)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--graph", action="store_true")
    p.add_argument("--per-graph", type=int, default=20, help="all-reduces captured per graph")
    p.add_argument("--stall-s", type=float, default=60.0, help="give up on a size after this long")
    args = p.parse_args(argv)
    if args.backend == "nccl":  # say so at once, before spawning processes that would each fail
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < args.world_size:
            print(f"NCCL_BENCH_NO_CUDA {have} CUDA device(s) for world size {args.world_size}", flush=True)
            return 3
    import torch.multiprocessing as mp

    port = _free_port()
    try:
        mp.spawn(_run, args=(args, port), nprocs=args.world_size, join=True)
    except Exception as e:  # noqa: BLE001 - one line for the orchestrator, then a failing exit
        print(
            f"NCCL_BENCH_FAILED {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}",
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
