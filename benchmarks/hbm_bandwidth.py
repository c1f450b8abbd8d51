"""The GPU's memory bandwidth as a decode step sees it: bytes a second read (and written) by
simple kernels over buffers far larger than the L2 cache, measured on the GPU machine.

Three kernels over a bf16 buffer of ``--gb`` GB: a sum (reads the buffer once: what reading the
weights costs a memory-bound decode step), a copy into a second buffer (reads and writes it: both
counted) and a fill (writes it). Each is timed with CUDA events, the median of ``--reps`` runs
after a warm-up. docs/nccl-decode-step.md compares a rank's unfused step with the time its
weights take to read at the sum's rate.

    python benchmarks/hbm_bandwidth.py [--gb 8] [--reps 20]   # needs CUDA (the GPU machine)
"""

from __future__ import annotations

import argparse
import statistics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA: run it on the GPU machine")
    n = int(a.gb * 1e9) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(a.reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}, buffer {nbytes / 1e9:.2f} GB bf16, median of {a.reps} runs")
    for label, fn, moved in (
        ("sum (read)", lambda: x.sum(dtype=torch.float32), nbytes),
        ("copy (read + write)", lambda: y.copy_(x), 2 * nbytes),
        ("fill (write)", lambda: y.fill_(1.0), nbytes),
    ):
        t = timed(fn)
        print(f"  {label:<20} {moved / t / 1e12:.2f} TB/s ({t * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
