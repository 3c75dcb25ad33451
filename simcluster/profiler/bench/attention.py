"""Fused attention: `torch.nn.functional.scaled_dot_product_attention`, forward and
forward + backward, over the attention grid (`calibration.shapes.attention_grid`).

What the profile's flash tables price (`costs.compute.attention_time_s`) is the fused
kernel Megatron-core runs (Transformer Engine's cuDNN or flash attention). Torch's SDPA
dispatches to the same families (cuDNN, FlashAttention-2, memory-efficient, or a C++ flash
kernel on a CPU); the one it picked is recorded with each shape (`sdpa_backend`), since
the rate depends on it.

Every shape is timed twice with the same inputs (requiring grad, as in training, so the
forward saves what the backward needs): the forward alone, and forward followed by
`torch.autograd.grad` of the output (no `.grad` accumulation between repeats). The
backward's time is their difference (`calibration.attention_fit`). Q, K, V are [b, h, s, d]
views of [b, s, h, d] tensors, the layout a projection's output has (FlashAttention-3's
benchmark layout); no dropout, default scale, bf16. A shape that does not fit in device
memory (an unfused fallback's s² scores) is skipped, not fatal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from simcluster.calibration.records import AttentionRecord
from simcluster.calibration.shapes import AttentionGrid
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.progress import Progress
from simcluster.profiler.bench.timing import Call, Timer, median_and_spread

_FUSED_PREFIX, _FUSED_SUFFIX = "ScaledDotProduct", "Backward0"


def attention_steps(grid: AttentionGrid) -> int:
    """Progress steps `time_attention` takes: one per (head dim, length, mask)."""
    return len(grid.head_dims) * len(grid.seq_lengths) * 2


def time_attention(
    timer: Timer, ctx: BuildContext, grid: AttentionGrid, progress: Progress | None = None
) -> list[AttentionRecord]:
    """Every (head dim, length, mask) of `grid` that fits, forward and forward + backward."""
    records = []
    for head_dim in grid.head_dims:
        for seq in grid.seq_lengths:
            for causal in (False, True):
                record = _time_shape(timer, ctx, grid.batch(seq), grid.heads, seq, head_dim, causal)
                if record is not None:
                    records.append(record)
                if progress is not None:
                    mask = "causal" if causal else "full"
                    progress.step(f"attention s={seq} d={head_dim} {mask}")
    return records


def _time_shape(
    timer: Timer, ctx: BuildContext, batch: int, heads: int, seq: int, head_dim: int, causal: bool
) -> AttentionRecord | None:
    dims = (batch, heads, seq, head_dim)
    set_bytes = 5.0 * batch * heads * seq * head_dim * ctx.dtype.itemsize  # q, k, v, out, grad
    try:
        probe = attention_inputs(ctx, *dims)
        backend = sdpa_backend(F.scaled_dot_product_attention(*probe[:3], is_causal=causal))
        del probe
        forward_s, forward_spread = _measure(timer, ctx, dims, causal, backward=False, set_bytes=set_bytes)
        total_s, total_spread = _measure(timer, ctx, dims, causal, backward=True, set_bytes=set_bytes)
    except torch.cuda.OutOfMemoryError:
        _release(ctx.device)
        return None
    return AttentionRecord(
        batch, heads, seq, head_dim, causal, forward_s, total_s, forward_spread, total_spread, backend
    )


def _measure(
    timer: Timer,
    ctx: BuildContext,
    dims: tuple[int, int, int, int],
    causal: bool,
    backward: bool,
    set_bytes: float,
) -> tuple[float, float]:
    build = _forward_backward if backward else _forward
    calls = [build(ctx, dims, causal) for _ in range(timer.num_buffers(set_bytes))]
    times = timer.times_s(calls)
    del calls
    return median_and_spread(times)


def attention_inputs(
    ctx: BuildContext, batch: int, heads: int, seq: int, head_dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v ([b, h, s, d] views of [b, s, h, d], requiring grad) and an output gradient."""

    def bshd() -> Tensor:
        return ctx.randn(batch, seq, heads, head_dim).requires_grad_(True)

    q, k, v = bshd(), bshd(), bshd()
    grad_out = ctx.randn(batch, seq, heads, head_dim).transpose(1, 2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), grad_out


def _forward(ctx: BuildContext, dims: tuple[int, int, int, int], causal: bool) -> Call:
    q, k, v, _ = attention_inputs(ctx, *dims)
    return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _forward_backward(ctx: BuildContext, dims: tuple[int, int, int, int], causal: bool) -> Call:
    q, k, v, grad_out = attention_inputs(ctx, *dims)

    def call() -> object:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    return call


def sdpa_backend(out: Tensor) -> str:
    """The SDPA backend that produced `out`, read from its autograd node: the fused kernels
    have their own ("ScaledDotProductCudnnAttentionBackward0" -> "CudnnAttention";
    "FlashAttention", "EfficientAttention", "FlashAttentionForCpu"); the unfused math path
    is a chain of ordinary ops ("math (<node>)")."""
    node = out.grad_fn
    name = node.name() if node is not None else "none"
    if name.startswith(_FUSED_PREFIX) and name.endswith(_FUSED_SUFFIX):
        return name[len(_FUSED_PREFIX) : -len(_FUSED_SUFFIX)]
    return f"math ({name})"


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
