"""The layer's element-wise pieces, written so that they keep exactly what Table 2 counts.

- `scale_mask_softmax`: Megatron's fused scale + causal mask + softmax as one autograd
  function that saves only its output (2as²b bytes per layer without parallelism). The
  causal mask is rebuilt in forward and never saved.
- `dropout`: multiplies by a given keep-mask and saves only that mask, one byte an element
  (torch.bool), as the paper assumes (as²b for attention, sbh after each block).
- Mask sources: `SlicedMasks` draws the full-size (serial) mask from a generator seeded by
  (seed, site) and keeps this rank's slice, so a sharded layer drops exactly the elements
  the serial layer drops; `LocalMasks` draws only the local shape from the device's global
  RNG (fast; what a timing or memory run on one GPU wants).
- The modern layer's pieces (docs/memory.md), each saving what its Megatron/TE
  counterpart saves: `rms_norm` (input + fp32 rsigma), `swiglu` (its 2f-wide input only),
  `squared_relu` (relu's output), `apply_rope` (nothing but the constant tables).
- `bias_dropout_add`: residual + dropout(x + bias), saving only the keep-mask.

Each takes a `RegionMath` (`regions`): eager (the default) runs the math as plain torch ops;
fused runs each region's forward and backward as one torch.compile'd kernel. The autograd
functions, and so what they save, are the same in both.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from simcluster.config.choices import LayerMode
from simcluster.profiler.layer.regions import EAGER_MATH, RegionMath


class _ScaleMaskSoftmax(torch.autograd.Function):
    """softmax(scale · x with the upper triangle (key > query) set to -inf), along the last dim."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, scale: float, impl: RegionMath) -> Tensor:
        probs = impl.softmax_fwd(scores, scale)
        ctx.scale, ctx.impl = scale, impl
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (probs,) = ctx.saved_tensors
        return ctx.impl.softmax_bwd(grad, probs, ctx.scale), None, None


def scale_mask_softmax(scores: Tensor, scale: float, impl: RegionMath = EAGER_MATH) -> Tensor:
    """Causal scaled softmax of attention scores [..., s, s]; saves only its output."""
    return _ScaleMaskSoftmax.apply(scores, scale, impl)


class _Dropout(torch.autograd.Function):
    """x · keep / (1 - p); saves only the 1-byte keep-mask."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, prob: float, impl: RegionMath) -> Tensor:
        ctx.scale, ctx.impl = 1.0 / (1.0 - prob), impl
        ctx.save_for_backward(keep)
        return impl.dropout_apply(x, keep, ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        (keep,) = ctx.saved_tensors
        return ctx.impl.dropout_apply(grad, keep, ctx.scale), None, None, None


def _check_keep(x: Tensor, keep: Tensor) -> None:
    if keep.dtype != torch.bool or keep.shape != x.shape:
        raise ValueError(
            f"keep-mask must be bool of shape {tuple(x.shape)}, got {keep.dtype} {tuple(keep.shape)}"
        )


def dropout(x: Tensor, keep: Tensor | None, prob: float, impl: RegionMath = EAGER_MATH) -> Tensor:
    """Inverted dropout with a precomputed bool keep-mask (None when prob == 0)."""
    if keep is None:
        return x
    _check_keep(x, keep)
    return _Dropout.apply(x, keep, prob, impl)


class _BiasDropoutAdd(torch.autograd.Function):
    """residual + dropout(x + bias) as one region (Megatron's `bias_dropout_add_fused_train`);
    saves only the keep-mask, as the eager composition does (its adds save nothing)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        bias: Tensor,
        residual: Tensor,
        keep: Tensor | None,
        prob: float,
        impl: RegionMath,
    ) -> Tensor:
        ctx.scale, ctx.impl, ctx.has_keep = 1.0 / (1.0 - prob), impl, keep is not None
        if keep is None:
            return impl.bias_add_fwd(x, bias, residual)
        ctx.save_for_backward(keep)
        return impl.bias_dropout_add_fwd(x, bias, residual, keep, ctx.scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None, None]:
        if not ctx.has_keep:
            return grad, ctx.impl.bias_grad(grad), grad, None, None, None
        (keep,) = ctx.saved_tensors
        grad_x, grad_bias = ctx.impl.dropout_bias_bwd(grad, keep, ctx.scale)
        return grad_x, grad_bias, grad, None, None, None


def bias_dropout_add(
    x: Tensor,
    bias: Tensor | None,
    residual: Tensor,
    keep: Tensor | None,
    prob: float,
    impl: RegionMath = EAGER_MATH,
) -> Tensor:
    """residual + dropout(x + bias, keep): eager, the composition of torch ops the eager
    layer has always run; fused, one region forward and one backward. Without a bias
    (`add_bias_linear` false) residual + dropout(x, keep), as Megatron-core's
    `_bias_dropout_add_func` with bias None (fusions/fused_bias_dropout.py): the dropout's
    region (none at p = 0) and one add; it saves the same keep-mask."""
    if bias is None:
        return residual + dropout(x, keep, prob, impl)
    if impl.mode is LayerMode.EAGER:
        return residual + dropout(x + bias, keep, prob)
    if keep is not None:
        _check_keep(x, keep)
    return _BiasDropoutAdd.apply(x, bias, residual, keep, prob, impl)


class MaskSource(Protocol):
    """Where dropout keep-masks come from.

    `full_shape` is the serial (t = 1) mask; this rank keeps `[start, stop)` of `dim`.
    """

    def keep_mask(
        self,
        site: str,
        full_shape: tuple[int, ...],
        dim: int,
        start: int,
        stop: int,
        prob: float,
        device: torch.device,
    ) -> Tensor | None: ...


class SlicedMasks:
    """Exact masks: every rank draws the full serial mask for `site` and keeps its slice.

    The generator is re-seeded from (seed, site) on every call, so a recompute (selective or
    full) redraws the same mask, and the serial and sharded layers agree element by element.
    Costs a full-size draw per call: for tests and small shapes.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def keep_mask(
        self,
        site: str,
        full_shape: tuple[int, ...],
        dim: int,
        start: int,
        stop: int,
        prob: float,
        device: torch.device,
    ) -> Tensor | None:
        if prob == 0.0:
            return None
        gen = torch.Generator(device="cpu")
        gen.manual_seed(self.seed * 1_000_003 + zlib.crc32(site.encode()))
        full = torch.rand(full_shape, generator=gen) >= prob
        # A copy, not a view: a saved view would keep the whole full-size mask alive.
        return full.narrow(dim, start, stop - start).clone().to(device)


class LocalMasks:
    """Fast masks of the local shape only, from the device's global RNG (which
    torch.utils.checkpoint saves and restores, so recompute redraws the same mask)."""

    def keep_mask(
        self,
        site: str,
        full_shape: tuple[int, ...],
        dim: int,
        start: int,
        stop: int,
        prob: float,
        device: torch.device,
    ) -> Tensor | None:
        if prob == 0.0:
            return None
        shape = list(full_shape)
        shape[dim] = stop - start
        return torch.empty(shape, dtype=torch.bool, device=device).bernoulli_(1.0 - prob)


class _RMSNorm(torch.autograd.Function):
    """y = x · rsqrt(mean(x²) + eps) · w over the last dim, in fp32 like TE's fused norm;
    saves what TE's LayerNormLinear saves for it: the input and the fp32 rsigma per token
    (TE `layernorm_linear.py`), and the weight (a parameter, not an activation)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float, impl: RegionMath) -> Tensor:
        y, rstd = impl.rms_norm_fwd(x, weight, eps)  # rstd (..., 1) fp32
        ctx.impl = impl
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_weight = ctx.impl.rms_norm_bwd(grad, x, weight, rstd)
        return grad_x, grad_weight, None, None


def rms_norm(x: Tensor, weight: Tensor, eps: float, impl: RegionMath = EAGER_MATH) -> Tensor:
    """RMSNorm that keeps its input and fp32 rsigma, as TE's fused norm does."""
    return _RMSNorm.apply(x, weight, eps, impl)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up with [gate, up] = x.chunk(2) on the last dim; saves only x (2f wide),
    as Megatron's fused `bias_swiglu_impl` does (`fusions/fused_bias_swiglu.py`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, impl: RegionMath) -> Tensor:
        ctx.impl = impl
        ctx.save_for_backward(x)
        return impl.swiglu_fwd(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        return ctx.impl.swiglu_bwd(grad, x), None


def swiglu(x: Tensor, impl: RegionMath = EAGER_MATH) -> Tensor:
    """SwiGLU of a [..., 2f] fc1 output -> [..., f]; saves only its input."""
    return _SwiGLU.apply(x, impl)


class _SquaredReLU(torch.autograd.Function):
    """relu(x)² as one region; saves its input, the same bytes as the eager composition's
    relu output (same shape and dtype)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, impl: RegionMath) -> Tensor:
        ctx.impl = impl
        ctx.save_for_backward(x)
        return impl.squared_relu_fwd(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (x,) = ctx.saved_tensors
        return ctx.impl.squared_relu_bwd(grad, x), None


def squared_relu(x: Tensor, impl: RegionMath = EAGER_MATH) -> Tensor:
    """Megatron's `squared_relu`: relu(x)². Eager, autograd keeps relu's output only (relu
    saves its result, pow saves its input, the same storage); fused, one region saving x."""
    if impl.mode is LayerMode.EAGER:
        return torch.pow(F.relu(x), 2)
    return _SquaredReLU.apply(x, impl)


class _Rope(torch.autograd.Function):
    """x · cos + rotate_half(x) · sin (Megatron's non-fused rotary, rotate-half style);
    saves only the cos/sin tables, which are the layer's constant buffers, as TE's fused
    RoPE saves only the frequencies (TE `attention/rope.py::FusedRoPEFunc`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor, impl: RegionMath) -> Tensor:
        ctx.impl = impl
        ctx.save_for_backward(cos, sin)
        return impl.rope_fwd(x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        cos, sin = ctx.saved_tensors
        return ctx.impl.rope_bwd(grad, cos, sin), None, None, None


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, impl: RegionMath = EAGER_MATH) -> Tensor:
    """Rotary position embedding of x [s, b, n, d] with tables [s, 1, 1, d]."""
    return _Rope.apply(x, cos, sin, impl)


def rope_tables(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin [s, 1, 1, d] for token `positions` [s] (Megatron's RotaryEmbedding:
    inv_freq = base^(−2i/d), the angles repeated for both halves)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(positions.to(torch.float64), inv_freq)  # (s, d/2)
    emb = torch.cat((angles, angles), dim=-1)[:, None, None, :]  # (s, 1, 1, d)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def te_qkv_layout(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K, V [s, b, n, d] as Transformer Engine's DotProductAttention hands them to its
    backends: TE `attention/dot_product_attention/utils.py::get_qkv_layout` (TE @002a3e5)
    accepts one of its sbhd layouts as is (sb3hd, sbh3d, sbhd_sb2hd, sbhd_sbh2d,
    sbhd_sbhd_sbhd) and otherwise makes all three contiguous; `DotProductAttention.forward`
    (TE @9c0b6db) replaces its inputs with the result before picking a backend.

    So Megatron's MHA split without RoPE (three views of the QKV output, interleaved per
    head: sbh3d) is kept as views, while a RoPE'd Q/K beside V's view, or the GQA split
    (K and V views at a non-zero offset), is "not_supported" and V becomes a copy: the QKV
    output is then freed once the layer's forward is done with it. The same checks here,
    in elements (storage identity by data pointer, as TE does)."""
    ptr = q.untyped_storage().data_ptr()
    ptrs_qkv = all(x.untyped_storage().data_ptr() == ptr for x in (k, v))
    ptrs_qk = k.untyped_storage().data_ptr() == ptr
    ptrs_kv = v.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()
    shapes_qkv = q.shape == k.shape == v.shape
    shapes_kv = k.shape[:-1] == v.shape[:-1]
    strides_qkv = q.stride() == k.stride() == v.stride()
    strides_kv = tuple(x / k.shape[-1] for x in k.stride()[:-1]) == tuple(
        x / v.shape[-1] for x in v.stride()[:-1]
    )
    offsets = [x.storage_offset() for x in (q, k, v)]
    hd = q.shape[-1] * q.shape[-2]
    offsets_3hd = offsets == [0, hd, 2 * hd]
    offsets_h3d = offsets == [0, q.shape[-1], 2 * q.shape[-1]]
    numel_q, numel_k = q.numel(), k.numel()
    base = numel_q if ptrs_qkv else 0
    kv_hd = k.shape[-1] * k.shape[-2]
    offsets_2hd = offsets[1:] == [base, base + kv_hd]
    offsets_h2d = offsets[1:] == [base, base + k.shape[-1]]
    hd_qkv = offsets == ([0, numel_q, numel_q + numel_k] if ptrs_qkv else [0, 0, 0])
    hd_qk = offsets[:2] == ([0, numel_q] if not ptrs_qkv and ptrs_qk else [0, 0])
    hd_kv = offsets[1:] == ([0, numel_k] if not ptrs_qkv and ptrs_kv else [0, 0])
    supported = (
        (ptrs_qkv and strides_qkv and shapes_qkv and (offsets_3hd or offsets_h3d))
        or (ptrs_kv and strides_kv and shapes_kv and (offsets_2hd or offsets_h2d))
        or (strides_kv and shapes_kv and (hd_qkv or hd_kv or hd_qk))
    )
    if supported:
        return q, k, v
    return q.contiguous(), k.contiguous(), v.contiguous()
