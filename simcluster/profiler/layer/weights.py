"""Layer parameters: deterministic serial init, Megatron sharding to rank r of t, and back.

Layout (Megatron): `qkv_weight` is [3h, h] with rows grouped per head as
[q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (each block hn = h/a rows), so rank r's contiguous row
block holds whole heads r·a/t ... (r+1)·a/t - 1. Column-parallel layers (QKV, fc1) split
their output rows and biases; row-parallel layers (proj, fc2) split their input columns and
keep the full bias on every rank, added once after the all-reduce / reduce-scatter. Layer
norms are replicated.
"""

from __future__ import annotations

import torch
from torch import Tensor

from simcluster.profiler.layer.spec import LayerSpec

WEIGHT_STD = 0.02  # Megatron's init_method_normal(0.02)

COLUMN_PARALLEL = ("qkv_weight", "qkv_bias", "fc1_weight", "fc1_bias")  # split dim 0
ROW_PARALLEL = ("proj_weight", "fc2_weight")  # split dim 1
REPLICATED = ("ln1_weight", "ln1_bias", "proj_bias", "ln2_weight", "ln2_bias", "fc2_bias")
PARAM_NAMES = COLUMN_PARALLEL + ROW_PARALLEL + REPLICATED


def param_shapes(spec: LayerSpec) -> dict[str, tuple[int, ...]]:
    """Per-rank parameter shapes for `spec` (serial shapes when spec.tp == 1)."""
    h, f, t = spec.hidden_size, spec.ffn_hidden_size, spec.tp
    return {
        "ln1_weight": (h,), "ln1_bias": (h,),
        "qkv_weight": (3 * h // t, h), "qkv_bias": (3 * h // t,),
        "proj_weight": (h, h // t), "proj_bias": (h,),
        "ln2_weight": (h,), "ln2_bias": (h,),
        "fc1_weight": (f // t, h), "fc1_bias": (f // t,),
        "fc2_weight": (h, f // t), "fc2_bias": (h,),
    }


def _draw(shape: tuple[int, ...], name: str, gen: torch.Generator, device: torch.device,
          dtype: torch.dtype) -> Tensor:
    """Normal(0, 0.02) weights and biases; layer-norm weights 1 + Normal(0, 0.02).

    Biases are random rather than Megatron's zeros so that tests see every bias's effect.
    """
    values = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * WEIGHT_STD
    if name in ("ln1_weight", "ln2_weight"):
        values += 1.0
    return values.to(dtype)


def serial_weights(spec: LayerSpec, seed: int) -> dict[str, Tensor]:
    """Full (t = 1) fp32 parameters on the CPU, a pure function of (shape, seed)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    shapes = param_shapes(spec.serial())
    return {name: _draw(shapes[name], name, gen, torch.device("cpu"), torch.float32)
            for name in PARAM_NAMES}


def local_weights(spec: LayerSpec, seed: int, device: torch.device) -> dict[str, Tensor]:
    """Random parameters of rank shapes drawn directly on `device`, in spec's dtype.

    Not slices of `serial_weights`: for timing and memory runs, where values do not matter
    but a full-size draw on the host would (12h² values per layer).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shapes = param_shapes(spec)
    return {name: _draw(shapes[name], name, gen, device, spec.torch_dtype)
            for name in PARAM_NAMES}


def shard(full: dict[str, Tensor], spec: LayerSpec, rank: int) -> dict[str, Tensor]:
    """Rank `rank`'s slice of serial parameters (copies, so shards own their storage)."""
    t = spec.tp
    out = {}
    for name, value in full.items():
        if name in COLUMN_PARALLEL:
            value = value.chunk(t, dim=0)[rank]
        elif name in ROW_PARALLEL:
            value = value.chunk(t, dim=1)[rank]
        out[name] = value.clone()
    return out

