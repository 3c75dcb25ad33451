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
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class _ScaleMaskSoftmax(torch.autograd.Function):
    """softmax(scale · x with the upper triangle (key > query) set to -inf), along the last dim."""

    @staticmethod
    def forward(ctx: Any, scores: Tensor, scale: float) -> Tensor:
        sq, sk = scores.shape[-2:]
        causal = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu_(1)
        probs = torch.softmax((scores * scale).masked_fill_(causal, -math.inf), dim=-1)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (probs,) = ctx.saved_tensors
        p = probs.float()
        g = grad.float()
        grad_scores = ctx.scale * p * (g - (g * p).sum(dim=-1, keepdim=True))
        return grad_scores.to(probs.dtype), None


def scale_mask_softmax(scores: Tensor, scale: float) -> Tensor:
    """Causal scaled softmax of attention scores [..., s, s]; saves only its output."""
    return _ScaleMaskSoftmax.apply(scores, scale)


class _Dropout(torch.autograd.Function):
    """x · keep / (1 - p); saves only the 1-byte keep-mask."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, prob: float) -> Tensor:
        ctx.scale = 1.0 / (1.0 - prob)
        ctx.save_for_backward(keep)
        return x * keep * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None, None


def dropout(x: Tensor, keep: Tensor | None, prob: float) -> Tensor:
    """Inverted dropout with a precomputed bool keep-mask (None when prob == 0)."""
    if keep is None:
        return x
    if keep.dtype != torch.bool or keep.shape != x.shape:
        raise ValueError(f"keep-mask must be bool of shape {tuple(x.shape)}, "
                         f"got {keep.dtype} {tuple(keep.shape)}")
    return _Dropout.apply(x, keep, prob)


class MaskSource(Protocol):
    """Where dropout keep-masks come from.

    `full_shape` is the serial (t = 1) mask; this rank keeps `[start, stop)` of `dim`.
    """

    def keep_mask(self, site: str, full_shape: tuple[int, ...], dim: int, start: int,
                  stop: int, prob: float, device: torch.device) -> Tensor | None: ...


class SlicedMasks:
    """Exact masks: every rank draws the full serial mask for `site` and keeps its slice.

    The generator is re-seeded from (seed, site) on every call, so a recompute (selective or
    full) redraws the same mask, and the serial and sharded layers agree element by element.
    Costs a full-size draw per call: for tests and small shapes.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def keep_mask(self, site: str, full_shape: tuple[int, ...], dim: int, start: int,
                  stop: int, prob: float, device: torch.device) -> Tensor | None:
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

    def keep_mask(self, site: str, full_shape: tuple[int, ...], dim: int, start: int,
                  stop: int, prob: float, device: torch.device) -> Tensor | None:
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
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rstd = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1) fp32
        ctx.save_for_backward(x, weight, rstd)
        return (x.float() * rstd * weight.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        g = grad.float()
        x_hat = x.float() * rstd
        grad_weight = (g * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        g_hat = g * weight.float()  # d loss / d x_hat
        grad_x = rstd * (g_hat - x_hat * (g_hat * x_hat).mean(dim=-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm that keeps its input and fp32 rsigma, as TE's fused norm does."""
    return _RMSNorm.apply(x, weight, eps)


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up with [gate, up] = x.chunk(2) on the last dim; saves only x (2f wide),
    as Megatron's fused `bias_swiglu_impl` does (`fusions/fused_bias_swiglu.py`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        gate, up = x.float().chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        g = grad.float()
        d_gate = g * up * sig * (1 + gate * (1 - sig))  # d silu / d gate = σ(1 + gate(1 − σ))
        return torch.cat([d_gate, g * gate * sig], dim=-1).to(x.dtype)


def swiglu(x: Tensor) -> Tensor:
    """SwiGLU of a [..., 2f] fc1 output -> [..., f]; saves only its input."""
    return _SwiGLU.apply(x)


def squared_relu(x: Tensor) -> Tensor:
    """Megatron's `squared_relu`: relu(x)²; autograd keeps relu's output only (relu saves its
    result, pow saves its input, the same storage)."""
    return torch.pow(F.relu(x), 2)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Rope(torch.autograd.Function):
    """x · cos + rotate_half(x) · sin (Megatron's non-fused rotary, rotate-half style);
    saves only the cos/sin tables, which are the layer's constant buffers, as TE's fused
    RoPE saves only the frequencies (TE `attention/rope.py::FusedRoPEFunc`)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return x * cos + _rotate_half(x) * sin

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        # rotate_half is the linear map R(x1, x2) = (−x2, x1); its transpose is −R.
        return grad * cos - _rotate_half(grad * sin), None, None


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of x [s, b, n, d] with tables [s, 1, 1, d]."""
    return _Rope.apply(x, cos, sin)


def rope_tables(positions: Tensor, head_dim: int, base: float, dtype: torch.dtype
                ) -> tuple[Tensor, Tensor]:
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
    strides_kv = (tuple(x / k.shape[-1] for x in k.stride()[:-1])
                  == tuple(x / v.shape[-1] for x in v.stride()[:-1]))
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
