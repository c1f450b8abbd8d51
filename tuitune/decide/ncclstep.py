"""The NCCL term of a decode step: from all-reduce latencies (``tuitune nccl-bench``) to the step
time a setting adds, and so the difference between settings (pure; no I/O).

What it rests on, said by ``basis``: a tensor-parallel decoder forward ends each layer's attention
(the row-parallel output projection) and its MLP (the down projection) in one all-reduce of the
hidden state, and the vocab-parallel embedding in one more, so a forward over ``tokens`` tokens
makes ``2 × layers + 1`` all-reduces of ``tokens × hidden × dtype bytes``. Inside a CUDA graph they
run back to back with the compute on one stream, so each adds its own latency to the step, and the
compute, the attention and the logits' all-gather (not an all-reduce) are the same under every
NCCL setting: the difference between two settings' step times is the difference of their
all-reduce time. The latencies are nccl-bench's medians at the exact sizes (or linearly between two
measured sizes); a size outside what was measured has no prediction rather than a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

SIZE_TOLERANCE = 0.02  # the worker rounds sizes to whole elements: within 2 % is the same size


@dataclass(frozen=True)
class TPShape:
    """The all-reduces of one tensor-parallel decoder forward."""

    layers: int
    hidden: int
    dtype_bytes: int = 2
    per_layer: int = 2  # attention output and MLP down projection
    embedding: int = 1  # the vocab-parallel embedding's

    def count(self) -> int:
        return self.per_layer * self.layers + self.embedding

    def message_bytes(self, tokens: int) -> int:
        return tokens * self.hidden * self.dtype_bytes

    def allreduces(self, tokens: int) -> list[tuple[int, int]]:
        """(how many, bytes each) a forward over ``tokens`` tokens makes."""
        return [(self.count(), self.message_bytes(tokens))]


LLAMA_8B = TPShape(layers=32, hidden=4096)


def step_tokens(batch: int, draft_tokens: int | None = None) -> int:
    """Tokens in one forward of the target model: one a request, or the draft tokens verified."""
    return batch * (draft_tokens or 1)


def latency_us(points: Iterable[tuple[int, float]], size: int) -> float | None:
    """Latency of one all-reduce of ``size`` bytes from measured (bytes, µs) points: the point at
    that size, or linear between the two that bracket it; None outside the measured range."""
    pts = sorted(points)
    if not pts:
        return None
    for b, us in pts:
        if abs(b - size) <= SIZE_TOLERANCE * max(size, 1):
            return us
    for (b0, u0), (b1, u1) in zip(pts, pts[1:]):  # noqa: B905 - pairs of neighbours
        if b0 < size < b1:
            return u0 + (u1 - u0) * (size - b0) / (b1 - b0)
    return None


def step_comm_us(points: Sequence[tuple[int, float]], shape: TPShape, tokens: int) -> float | None:
    """All-reduce time in one forward over ``tokens`` tokens (µs), or None if a size was not measured."""
    total = 0.0
    for count, size in shape.allreduces(tokens):
        us = latency_us(points, size)
        if us is None:
            return None
        total += count * us
    return total


@dataclass(frozen=True)
class StepPrediction:
    label: str
    tokens: int
    comm_us: float | None  # all-reduce time a step under this setting
    saving_us: float | None  # the reference's all-reduce time minus this one's (positive: faster)

    def to_dict(self) -> dict:
        return {"label": self.label, "tokens": self.tokens, "comm_us": self.comm_us, "saving_us": self.saving_us}


def predict(
    latencies: Mapping[str, Sequence[tuple[int, float]]], shape: TPShape, tokens: int, reference: str
) -> list[StepPrediction]:
    """Every setting's all-reduce time a step and its saving against ``reference``, fastest first
    (settings without a prediction last)."""
    comm = {label: step_comm_us(pts, shape, tokens) for label, pts in latencies.items()}
    ref = comm.get(reference)
    out = [
        StepPrediction(label, tokens, c, (ref - c) if (ref is not None and c is not None) else None)
        for label, c in comm.items()
    ]
    out.sort(key=lambda p: (p.comm_us is None, p.comm_us or 0.0))
    return out


def predicted_gain(saving_us: float, cycle_ms: float) -> float | None:
    """Throughput gain a step saving gives a cycle of ``cycle_ms`` (0.05 = 5 % faster), or None."""
    left = cycle_ms * 1000.0 - saving_us
    if cycle_ms <= 0 or left <= 0:
        return None
    return cycle_ms * 1000.0 / left - 1.0


def points_of(results: Sequence[Mapping] | None) -> list[tuple[int, float]]:
    """(bytes, median µs) of one ``nccl-bench`` report row's ``results``."""
    return [(int(r["bytes"]), float(r["median_us"])) for r in results or []]


def basis(shape: TPShape, tokens: int, tp: int) -> str:
    """One sentence: what the prediction rests on."""
    return (
        f"{shape.count()} all-reduces a forward ({shape.per_layer} a layer × {shape.layers} layers"
        + (f" + {shape.embedding} for the embedding" if shape.embedding else "")
        + f") of {tokens} token(s) × {shape.hidden} × {shape.dtype_bytes} B = {shape.message_bytes(tokens):,} B"
        f" across {tp} GPUs, each at nccl-bench's CUDA-graph median; compute, attention and the logits'"
        " all-gather taken as equal under every setting, no overlap of all-reduce and compute"
    )
