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
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Protocol

import torch
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
