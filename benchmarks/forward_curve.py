"""A target model's forward time against the number of tokens in the step, measured on a GPU.

The shape is Llama-3.1-8B's (hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336, 32 layers, vocabulary
128256), in bf16, with random weights: the timing of a forward depends on the shapes, not the values. A step of T
tokens is what a verify over T tokens costs (T = concurrent streams x (draft tokens + 1)): the 32 layers' GEMMs
(QKV, O, gate+up, down), RMSNorm and SiLU-and-multiply elementwise work, and the LM head over all T tokens; each
token's attention over a KV cache of `--context` tokens is timed apart (it grows linearly with T and with the
context, and an engine's paged kernels differ from PyTorch's SDPA), so a curve can be rebuilt for any context.
Each T is captured in a CUDA graph (engines replay decode steps from graphs too) and timed with CUDA events: the
median of `--blocks` blocks of `--reps` replays.

The point of the figure is its shape: flat while the step is memory-bound (the weights are read once whatever T
is), then steps where the GEMMs cross tile boundaries. `benchmarks/advisor_worlds.py` uses this curve as the
physics of a world the advisor's cost model does not share.

    python benchmarks/forward_curve.py [--out FILE] [--context 1024] [--layers 32]   # needs CUDA (the GPU machine)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time


def token_counts() -> list[int]:
    return list(range(1, 65)) + list(range(68, 257, 4)) + list(range(272, 1025, 16))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="h200_llama8b_forward.json")
    ap.add_argument("--context", type=int, default=1024, help="KV-cache length for the attention figure")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("forward_curve.py needs CUDA; run it on the GPU machine", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    hidden, heads, kv_heads, hd, inter, vocab = 4096, 32, 8, 128, 14336, 128256
    qkv_out = (heads + 2 * kv_heads) * hd

    def w(n_in: int, n_out: int) -> torch.Tensor:
        return (torch.randn(n_out, n_in, device=dev, dtype=dt) * 0.02).contiguous()

    layers = [
        (w(hidden, qkv_out), w(heads * hd, hidden), w(hidden, 2 * inter), w(inter, hidden)) for _ in range(a.layers)
    ]
    norm = torch.ones(hidden, device=dev, dtype=dt)
    lm_head = w(hidden, vocab)

    def rms(x: torch.Tensor) -> torch.Tensor:
        v = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(v + 1e-5)).to(dt) * norm

    def forward(x: torch.Tensor) -> torch.Tensor:
        for wqkv, wo, wgu, wd in layers:
            h = rms(x)
            qkv = h @ wqkv.t()
            attn = qkv[:, : heads * hd]  # attention itself is timed apart (below)
            x = x + attn @ wo.t()
            h = rms(x)
            gu = h @ wgu.t()
            g, u = gu.split(inter, dim=-1)
            x = x + (torch.nn.functional.silu(g) * u) @ wd.t()
        return rms(x) @ lm_head.t()

    def timed(fn, reps: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        blocks = []
        for _ in range(a.blocks):
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            torch.cuda.synchronize()
            blocks.append(start.elapsed_time(end) / reps)
        return statistics.median(blocks)

    tokens, ms = [], []
    t0 = time.monotonic()
    for t in token_counts():
        x = torch.randn(t, hidden, device=dev, dtype=dt)
        for _ in range(2):
            forward(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            forward(x)
        g.replay()
        torch.cuda.synchronize()
        tokens.append(t)
        ms.append(round(timed(g.replay, a.reps), 4))
        del g
    # attention: one query per token over a KV cache of `context` tokens, GQA, per layer x layers
    attn = []
    for t in (1, 8, 64, 256):
        q = torch.randn(t, heads, 1, hd, device=dev, dtype=dt)
        k = torch.randn(t, kv_heads, a.context, hd, device=dev, dtype=dt)
        v = torch.randn(t, kv_heads, a.context, hd, device=dev, dtype=dt)

        def sdpa(q=q, k=k, v=v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        sdpa()
        torch.cuda.synchronize()
        attn.append({"tokens": t, "ms_all_layers": round(timed(sdpa, a.reps) * a.layers, 4)})
    out = {
        "what": "Llama-3.1-8B-shaped forward (bf16, random weights), GEMMs + norms + LM head, CUDA-graph replay",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "layers": a.layers,
        "command": "python benchmarks/forward_curve.py " + " ".join(sys.argv[1:]),
        "tokens": tokens,
        "ms": ms,
        "attention_context": a.context,
        "attention": attn,
        "seconds": round(time.monotonic() - t0, 1),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{out['gpu']}  torch {out['torch']}  {len(tokens)} token counts in {out['seconds']} s -> {a.out}")
    for t, m in zip(tokens, ms, strict=True):
        if t in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024):
            print(f"  T={t:5d}  {m:8.3f} ms   {m / ms[0]:5.2f}x T=1")
    for row in attn:
        print(f"  attention, {row['tokens']} tokens x context {a.context}: {row['ms_all_layers']:.3f} ms (all layers)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
