"""What FP8 training (Transformer Engine, `training.dtype: fp8`) changes in the workload,
hardware-free: which ops are the TE linears, and the FP8 weight copies they keep.

Megatron-core's dense TE layer (modern.md §3.7-3.8) runs four TE linears per layer: QKV
(`TELayerNormColumnParallelLinear`), proj (`TERowParallelLinear`), fc1 and fc2. Their fprop,
dgrad and wgrad GEMMs run in FP8; the attention core and the LM head (Megatron's own
`ColumnParallelLinear`) stay BF16.
"""

from __future__ import annotations

from dataclasses import replace

from simcluster.config.choices import Recompute
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Op, OpKind

TE_LINEARS = frozenset({"attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"})
"""Op-name prefixes of the layer's TE linears (`workload.layer`)."""

FP8_WEIGHT_BYTES_PER_PARAM = 1
"""TE keeps an FP8 copy of each linear's weight next to the bf16 parameter (cast once per
step, on the first microbatch) unless --fp8-param-gather makes the FP8 copy the parameter
(not modelled): 1 byte per copy. How many copies (row-wise, plus the column-wise transposed
one where FP8 GEMMs need the TN layout: TE `Linear` sets the weight quantizer's usage to
rowwise and columnwise while training) is the hardware's `fp8_weight_copies`."""


def is_te_linear_gemm(op: Op) -> bool:
    """A GEMM (fprop, dgrad or wgrad) of one of the layer's TE linears."""
    return op.kind is OpKind.GEMM and ".".join(op.name.split(".")[:2]) in TE_LINEARS


def te_linear_weight_params(forward: tuple[Op, ...]) -> float:
    """Weight elements of the TE linears on one rank: k·n of each fprop GEMM X[m,k]·W[k,n]."""
    shapes = [op.gemm for op in forward if op.gemm is not None and is_te_linear_gemm(op)]
    return float(sum(shape.k * shape.n for shape in shapes))


def fp8_weight_bytes_per_layer(forward: tuple[Op, ...]) -> float:
    """FP8 weight copies one layer holds on one rank."""
    return FP8_WEIGHT_BYTES_PER_PARAM * te_linear_weight_params(forward)


FP8_SAVED_BYTES_PER_ELEMENT = 1


def fp8_saved_forward(forward: tuple[Op, ...], cfg: LayerConfig) -> tuple[Op, ...]:
    """The forward ops with FP8's saved bytes (modern.md §3.7 and §4 "Effect of FP8"): a TE
    Linear saves only its quantized input, 1 byte per element (TE `linear.py`), and a
    LayerNormLinear its FP8 ln_out, the local sequence shard under SP
    (`layernorm_linear.py`). So QKV's and fc1's ln_out and fc2's input drop to 1 byte, and
    proj keeps an FP8 copy of its input O, on top of the bf16 O the flash-attention kernel
    saves (or in place of its own bf16 copy with the unfused core and under the core_attn
    checkpoint). The norm inputs, the activation's input and the attention tensors stay
    bf16. Full recompute keeps only the (bf16) layer input: unchanged."""
    if cfg.recompute is Recompute.FULL:
        return forward
    e = cfg.element_bytes
    out = []
    for op in forward:
        if op.gemm is not None and op.name in ("attn.qkv", "mlp.fc1", "mlp.fc2"):
            op = replace(op, saved_bytes=op.saved_bytes * FP8_SAVED_BYTES_PER_ELEMENT / e)
        elif op.gemm is not None and op.name == "attn.proj":
            input_elements = op.gemm.batch * op.gemm.m * op.gemm.k
            op = replace(op, saved_bytes=FP8_SAVED_BYTES_PER_ELEMENT * float(input_elements))
        out.append(op)
    return tuple(out)
