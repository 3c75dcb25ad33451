"""Which kind of work an op is, for splitting a predicted time by kind.

A miss between a predicted and a measured time can only be found if the prediction says
where its time went. The kinds follow what a GPU runs for a Megatron layer:

- `gemm`          the linear layers' GEMMs (QKV, projection, MLP, logits; forward, dgrad, wgrad)
- `attention`     the attention core: a fused flash kernel, or the unfused path's batched
                  GEMMs (QKᵀ, ×V and their gradients), scale-mask-softmax, attention dropout
                  and the GQA key/value repeat (`workload.layer._attention_core_*`)
- `memory_bound`  every other element-wise kernel (norms, RoPE, activations,
                  bias-dropout-add, layout copies, residual adds, FP8 amax/scale)
- `standin_copy`  the local copies one GPU playing a tensor-parallel rank makes in place of a
                  collective (`calibration.shapes.standin_ops`, check-profile only)
- `communication` a collective (all-reduce, all-gather, reduce-scatter)
"""

from __future__ import annotations

import enum

from simcluster.workload.ops import Op, OpKind


class OpCategory(str, enum.Enum):
    GEMM = "gemm"
    ATTENTION = "attention"
    MEMORY_BOUND = "memory_bound"
    STANDIN_COPY = "standin_copy"
    COMMUNICATION = "communication"


ATTENTION_CORE_OPS = frozenset({"qk", "av", "softmax", "dropout", "kv_repeat", "flash"})
"""Second name components of the attention core's ops (`workload.layer`): "attn.qk",
"attn.qk.dgrad_q", "attn.softmax.bwd", ... (not "attn.qkv", a linear layer)."""

STANDIN_MARKER = ".standin_"  # `calibration.shapes.standin_op_name`


def op_category(op: Op) -> OpCategory:
    """The kind of `op` (module docstring)."""
    if op.kind is OpKind.COLLECTIVE:
        return OpCategory.COMMUNICATION
    if op.kind is OpKind.ATTENTION or _is_attention_core(op.name):
        return OpCategory.ATTENTION
    if op.kind is OpKind.GEMM:
        return OpCategory.GEMM
    if STANDIN_MARKER in op.name:
        return OpCategory.STANDIN_COPY
    return OpCategory.MEMORY_BOUND


def _is_attention_core(name: str) -> bool:
    parts = name.split(".")
    return len(parts) > 1 and parts[0] == "attn" and parts[1] in ATTENTION_CORE_OPS
