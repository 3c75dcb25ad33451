"""The math of the layer's memory-bound regions, eager or fused (torch.compile'd).

Each function here is the forward or the backward of one region of `ops` (RMSNorm, RoPE,
SwiGLU, squared ReLU, scale-mask-softmax, dropout, bias-dropout-add), written with plain
tensor ops and no autograd. `ops`' autograd functions call them through a `RegionMath`:

- `EAGER_MATH` runs them as written: each torch op one (or a few) kernels, as the eager
  layer always has.
- `fused_math()` runs each through `torch.compile` (Inductor), so each region's forward and
  backward become one generated kernel each, as Megatron-core and Transformer Engine run
  them (TE's fused RoPE and RMSNorm, Megatron's `bias_dropout_add_fused_train`,
  `bias_swiglu_impl` and `FusedScaleMaskSoftmax`; Megatron-LM `megatron/core/fusions/`).

The autograd boundaries stay where they were: what each region saves for backward is set by
`ctx.save_for_backward` in `ops`, never by the compiler, so a fused layer keeps exactly the
bytes the eager one keeps (Table 2, `accounting`). Compilation happens on first use, per
shape family (torch's automatic dynamic shapes recompile once with symbolic sizes), with
the last dim -- the row every norm and softmax reduces over -- kept static (`_rows_static`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from simcluster.config.choices import LayerMode

RECOMPILE_LIMIT = 256  # shape families per region function: one per row length met, and a few more


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rms_norm_fwd(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd): y = x · rsqrt(mean(x²) + eps) · w in fp32; rstd (..., 1) fp32."""
    rstd = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x.float() * rstd * weight.float()).to(x.dtype), rstd


def rms_norm_bwd(grad: Tensor, x: Tensor, weight: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_weight) of `rms_norm_fwd`."""
    g = grad.float()
    x_hat = x.float() * rstd
    grad_weight = (g * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
    g_hat = g * weight.float()  # d loss / d x_hat
    grad_x = rstd * (g_hat - x_hat * (g_hat * x_hat).mean(dim=-1, keepdim=True))
    return grad_x.to(x.dtype), grad_weight.to(weight.dtype)


def rope_fwd(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x · cos + rotate_half(x) · sin."""
    return x * cos + rotate_half(x) * sin


def rope_bwd(grad: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """rotate_half is R(x1, x2) = (−x2, x1); its transpose is −R."""
    return grad * cos - rotate_half(grad * sin)


def swiglu_fwd(x: Tensor) -> Tensor:
    """silu(gate) · up, [gate, up] = x.chunk(2)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_bwd(grad: Tensor, x: Tensor) -> Tensor:
    gate, up = x.float().chunk(2, dim=-1)
    sig = torch.sigmoid(gate)
    g = grad.float()
    d_gate = g * up * sig * (1 + gate * (1 - sig))  # d silu / d gate = σ(1 + gate(1 − σ))
    return torch.cat([d_gate, g * gate * sig], dim=-1).to(x.dtype)


def squared_relu_fwd(x: Tensor) -> Tensor:
    return torch.pow(F.relu(x), 2)


def squared_relu_bwd(grad: Tensor, x: Tensor) -> Tensor:
    return grad * 2 * F.relu(x)


def softmax_fwd(scores: Tensor, scale: float) -> Tensor:
    """softmax(scale · scores, key > query set to −inf) along the last dim."""
    sq, sk = scores.shape[-2:]
    causal = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu_(1)
    return torch.softmax((scores * scale).masked_fill_(causal, -math.inf), dim=-1)


def softmax_bwd(grad: Tensor, probs: Tensor, scale: float) -> Tensor:
    p = probs.float()
    g = grad.float()
    return (scale * p * (g - (g * p).sum(dim=-1, keepdim=True))).to(probs.dtype)


def dropout_apply(x: Tensor, keep: Tensor, scale: float) -> Tensor:
    """x · keep · scale, scale = 1 / (1 − p): the forward and the backward of dropout."""
    return x * keep * scale


def bias_dropout_add_fwd(x: Tensor, bias: Tensor, residual: Tensor, keep: Tensor, scale: float) -> Tensor:
    """residual + (x + bias) · keep · scale."""
    return residual + (x + bias) * keep * scale


def bias_add_fwd(x: Tensor, bias: Tensor, residual: Tensor) -> Tensor:
    """residual + x + bias (no dropout)."""
    return residual + (x + bias)


def bias_grad(grad: Tensor) -> Tensor:
    """Sum over every dim but the last (a broadcast bias's gradient)."""
    return grad.reshape(-1, grad.shape[-1]).sum(dim=0)


def dropout_bias_bwd(grad: Tensor, keep: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(grad_x, grad_bias) of `bias_dropout_add_fwd`: one pass over the gradient."""
    grad_x = grad * keep * scale
    return grad_x, grad_x.reshape(-1, grad_x.shape[-1]).sum(dim=0).to(grad.dtype)


@dataclass(frozen=True)
class RegionMath:
    """One implementation of every region's forward and backward."""

    mode: LayerMode
    rms_norm_fwd: Callable[..., tuple[Tensor, Tensor]]
    rms_norm_bwd: Callable[..., tuple[Tensor, Tensor]]
    rope_fwd: Callable[..., Tensor]
    rope_bwd: Callable[..., Tensor]
    swiglu_fwd: Callable[..., Tensor]
    swiglu_bwd: Callable[..., Tensor]
    squared_relu_fwd: Callable[..., Tensor]
    squared_relu_bwd: Callable[..., Tensor]
    softmax_fwd: Callable[..., Tensor]
    softmax_bwd: Callable[..., Tensor]
    dropout_apply: Callable[..., Tensor]
    bias_dropout_add_fwd: Callable[..., Tensor]
    bias_add_fwd: Callable[..., Tensor]
    bias_grad: Callable[..., Tensor]
    dropout_bias_bwd: Callable[..., tuple[Tensor, Tensor]]


EAGER_MATH = RegionMath(
    LayerMode.EAGER,
    rms_norm_fwd,
    rms_norm_bwd,
    rope_fwd,
    rope_bwd,
    swiglu_fwd,
    swiglu_bwd,
    squared_relu_fwd,
    squared_relu_bwd,
    softmax_fwd,
    softmax_bwd,
    dropout_apply,
    bias_dropout_add_fwd,
    bias_add_fwd,
    bias_grad,
    dropout_bias_bwd,
)


@functools.cache
def fused_math() -> RegionMath:
    """Every region through torch.compile (compiled lazily, on each function's first call).

    A function that meets more shape families than dynamo's recompile limit (8 by default)
    would silently run eager from then on, and a fused measurement would time eager code:
    the limit is raised to `RECOMPILE_LIMIT` and hitting it raises instead."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    config.fail_on_recompile_limit_hit = True
    compiled = {
        f.name: _rows_static(torch.compile(getattr(EAGER_MATH, f.name)))
        for f in fields(RegionMath)
        if f.name != "mode"
    }
    return RegionMath(mode=LayerMode.FUSED, **compiled)


def _rows_static(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled` with every tensor argument's last dim marked static.

    Dynamo's automatic dynamic shapes make a dim symbolic once a second size is met. A
    symbolic row length leaves Inductor unable to keep a row in registers, so it emits a
    looped (split) reduction: on an H100 the microbench's fused softmax, which meets
    key lengths 1024, 2048 and 4096, ran at 0.8-1.0 TB/s while the layers of one sequence
    length ran the same region faster (docs/calibration/h100-2026-11-26-script/README.md).
    Megatron's fused softmax is compiled per key length (`scaled_masked_softmax` templates
    on the power of two above it, Megatron-LM megatron/core/fusions/fused_softmax.py), and
    TE's norms per hidden size, so a static row length is the closer stand-in. Batch-like
    dims stay dynamic, which keeps the number of compilations small."""

    def call(*args: Any, **kwargs: Any) -> Any:
        for arg in args:
            if isinstance(arg, Tensor) and arg.dim() > 0:
                torch._dynamo.mark_static(arg, arg.dim() - 1)
        return compiled(*args, **kwargs)

    return call


def region_math(mode: LayerMode) -> RegionMath:
    return fused_math() if LayerMode(mode) is LayerMode.FUSED else EAGER_MATH
