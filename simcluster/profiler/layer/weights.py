"""Layer parameters: deterministic serial init, Megatron sharding to rank r of t, and back.

Layout (Megatron): `qkv_weight` is [q + 2k, h] (q = a·d, k = g·d; 3h without GQA) with
rows grouped per query group as [Q_0 k_0 v_0 | Q_1 k_1 v_1 | ...], Q_j being the a/g query
heads of group j (Megatron-core's `linear_qkv` layout; [q_0 k_0 v_0 | ...] per head when
g = a), so rank r's contiguous row block holds whole groups r·g/t ... (r+1)·g/t - 1.
Column-parallel layers (QKV, fc1) split their output rows and biases; row-parallel layers
(proj, fc2) split their input columns and keep the full bias on every rank, added once after
the all-reduce / reduce-scatter. Norms are replicated (RMSNorm has no bias). Without
Megatron's `add_bias_linear` (`--disable-bias-linear`) the four linears have no bias.

SwiGLU's fc1 is one [2f, h] GEMM whose serial rows are [gate; up]. Megatron shards it with
stride 2: rank r holds [gate_r; up_r] (its slice of each), so the local output splits into
gate and up with one chunk, as `glu` does on every rank.
"""

from __future__ import annotations

import torch
from torch import Tensor

from simcluster.config.choices import Normalization
from simcluster.profiler.layer.spec import LayerSpec

WEIGHT_STD = 0.02  # Megatron's init_method_normal(0.02)

COLUMN_PARALLEL = ("qkv_weight", "qkv_bias", "fc1_weight", "fc1_bias")  # split dim 0
ROW_PARALLEL = ("proj_weight", "fc2_weight")  # split dim 1
REPLICATED = ("ln1_weight", "ln1_bias", "proj_bias", "ln2_weight", "ln2_bias", "fc2_bias")
PARAM_NAMES = COLUMN_PARALLEL + ROW_PARALLEL + REPLICATED
NORM_BIASES = ("ln1_bias", "ln2_bias")
LINEAR_BIASES = ("qkv_bias", "proj_bias", "fc1_bias", "fc2_bias")  # Megatron's add_bias_linear
STRIDE_2 = ("fc1_weight", "fc1_bias")  # gate and up sharded separately under SwiGLU


def param_names(spec: LayerSpec) -> tuple[str, ...]:
    """The layer's parameters: RMSNorm has a weight only; without `add_bias_linear` the
    linears have no bias (Megatron builds them with `bias=config.add_bias_linear`)."""
    dropped: tuple[str, ...] = NORM_BIASES if spec.normalization is Normalization.RMSNORM else ()
    if not spec.add_bias_linear:
        dropped += LINEAR_BIASES
    return tuple(n for n in PARAM_NAMES if n not in dropped)


def param_shapes(spec: LayerSpec) -> dict[str, tuple[int, ...]]:
    """Per-rank parameter shapes for `spec` (serial shapes when spec.tp == 1)."""
    h, f, t = spec.hidden_size, spec.ffn_hidden_size, spec.tp
    q = spec.num_attention_heads * spec.head_dim  # = h
    qkv, fc1 = spec.qkv_width // t, spec.fc1_width // t
    shapes = {
        "ln1_weight": (h,),
        "ln1_bias": (h,),
        "qkv_weight": (qkv, h),
        "qkv_bias": (qkv,),
        "proj_weight": (h, q // t),
        "proj_bias": (h,),
        "ln2_weight": (h,),
        "ln2_bias": (h,),
        "fc1_weight": (fc1, h),
        "fc1_bias": (fc1,),
        "fc2_weight": (h, f // t),
        "fc2_bias": (h,),
    }
    return {n: shapes[n] for n in param_names(spec)}


def _draw(
    shape: tuple[int, ...], name: str, gen: torch.Generator, device: torch.device, dtype: torch.dtype
) -> Tensor:
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
    return {
        name: _draw(shapes[name], name, gen, torch.device("cpu"), torch.float32) for name in param_names(spec)
    }


def local_weights(spec: LayerSpec, seed: int, device: torch.device) -> dict[str, Tensor]:
    """Random parameters of rank shapes drawn directly on `device`, in spec's dtype.

    Not slices of `serial_weights`: for timing and memory runs, where values do not matter
    but a full-size draw on the host would (12h² values per layer).
    """
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    shapes = param_shapes(spec)
    return {name: _draw(shapes[name], name, gen, device, spec.torch_dtype) for name in param_names(spec)}


def shard(full: dict[str, Tensor], spec: LayerSpec, rank: int) -> dict[str, Tensor]:
    """Rank `rank`'s slice of serial parameters (copies, so shards own their storage)."""
    t = spec.tp
    out = {}
    for name, value in full.items():
        if name in STRIDE_2 and spec.activation.gated:
            gate, up = value.chunk(2, dim=0)  # each [f, ...]
            value = torch.cat([gate.chunk(t, dim=0)[rank], up.chunk(t, dim=0)[rank]])  # [2f/t, ...]
        elif name in COLUMN_PARALLEL:
            value = value.chunk(t, dim=0)[rank]
        elif name in ROW_PARALLEL:
            value = value.chunk(t, dim=1)[rank]
        out[name] = value.clone()
    return out
