"""Memory formulas of Korthikanti et al. (Table 2, Eq. 5–6, §4.2.3) and mixed-precision Adam.

These are the paper's closed forms; the op graph in `layer.py` must agree with them (a test
proves it), and the engine's memory tracker must reproduce the first-stage total.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from simcluster.config.choices import Activation, Recompute
from simcluster.config.layer_rules import query_groups_or_default
from simcluster.config.moe_choices import RecomputeModule


class Table2Row(enum.Enum):
    """The six configurations of Table 2."""

    NO_PARALLELISM = "no parallelism"
    TENSOR_PARALLEL = "tensor parallel (baseline)"
    TENSOR_SEQUENCE_PARALLEL = "tensor + sequence parallel"
    TENSOR_PARALLEL_SELECTIVE = "tensor parallel + selective recompute"
    TENSOR_SEQUENCE_PARALLEL_SELECTIVE = "tensor + sequence parallel + selective recompute"
    FULL_RECOMPUTE = "full recompute"


def table2_row(tp: int, sequence_parallel: bool, recompute: Recompute) -> Table2Row:
    if recompute is Recompute.FULL:
        return Table2Row.FULL_RECOMPUTE
    if recompute is Recompute.SELECTIVE:
        return (
            Table2Row.TENSOR_SEQUENCE_PARALLEL_SELECTIVE
            if sequence_parallel
            else Table2Row.TENSOR_PARALLEL_SELECTIVE
        )
    if sequence_parallel:
        return Table2Row.TENSOR_SEQUENCE_PARALLEL
    return Table2Row.NO_PARALLELISM if tp == 1 else Table2Row.TENSOR_PARALLEL


def table2_bytes_per_layer(
    s: int, b: int, h: int, a: int, t: int, sequence_parallel: bool, recompute: Recompute
) -> float:
    """Activation bytes per layer per rank, Table 2 (ffn = 4h, 2-byte activations).

    Full recompute keeps the layer input, 2sbh (Table 2, row 6); with sequence parallelism
    Megatron keeps the sequence shard of it, 2sbh/t, which we report.
    """
    sbh = float(s) * b * h
    attention_scores = 5.0 * a * s / h
    row = table2_row(t, sequence_parallel, recompute)
    if row is Table2Row.FULL_RECOMPUTE:
        return sbh * 2 / (t if sequence_parallel else 1)
    if row is Table2Row.NO_PARALLELISM:
        return sbh * (34 + attention_scores)
    if row is Table2Row.TENSOR_PARALLEL:
        return sbh * (10 + 24 / t + attention_scores / t)
    if row is Table2Row.TENSOR_SEQUENCE_PARALLEL:
        return sbh * (34 / t + attention_scores / t)
    if row is Table2Row.TENSOR_PARALLEL_SELECTIVE:
        return sbh * (10 + 24 / t)
    return sbh * 34 / t


MASK_BYTES = 1  # a dropout mask element (Table 2)
FLASH_LSE_BYTES = 4  # fp32 log-sum-exp per query and head


def layer_activation_bytes(
    s: int,
    b: int,
    h: int,
    a: int,
    t: int,
    sequence_parallel: bool,
    recompute: Recompute,
    *,
    ffn: int = 0,
    query_groups: int = 0,
    activation: Activation = Activation.GELU,
    flash: bool = False,
    hidden_dropout: bool = True,
    attention_dropout: bool = True,
    element_bytes: int = 2,
    rope: bool = False,
    recompute_modules: frozenset[RecomputeModule] | None = None,

    kv_channels: int = 0,
    qk_layernorm: bool = False,
) -> float:
    """Activation bytes per layer per rank for every layer option (docs/memory.md, "Activation
    memory of the modern layer"): Table 2 generalised, with q = a·d, k = g·d (d = `kv_channels`,
    0 = h/a, so q = h by default),
    f = ffn (0 = 4h), e bytes per element, r = 1/t with SP else 1:

        regions (norm inputs, QKV and fc1 inputs, masks) = sb·h·r·(4e + 2·[hidden dropout])
        attention, unfused    = sb·4e·q/t + a·s²·b·(e + (e + 1)·[attention dropout])/t
        attention, flash      = sb·e·(2q + 2k)/t + 4·s·b·a/t              (Q, K, V, O, LSE)
        MLP                   = sb·e·f·(2 if SwiGLU else 1)/t + sb·e·f/t    (activation, fc2 input)

    Selective recompute keeps the core's checkpoint inputs: unfused sb·e·(q + 2k)/t + the
    projection input sb·e·q/t; flash sb·e·(2q + 2k)/t (only the LSE goes); plus, because V is
    a view of the QKV output, sb·e·(q·[RoPE or Q copied] + k·[RoPE])/t (Q is copied when a
    rank holds several groups of several heads; `layer.qkv_output_held_bytes`). Full recompute
    keeps the layer input, sb·e·h·r. At the defaults this is `table2_bytes_per_layer`.
    The norms' fp32 statistics are not counted (Table 2 does not count layer norm's).

    `recompute_modules` (selective only; None = [core_attn], Megatron's default): the
    attention terms above are the checkpoint's only with `core_attn`; `mlp` keeps of the
    MLP only its input (norm 2's, already in the regions), so the MLP term and fc1's input
    sb·e·h·r go; `layernorm` changes nothing in a dense TE layer (both norms are fused
    into the linears: docs/moe.md, "recompute_modules (simulator)").

    `qk_layernorm` (Megatron `--qk-layernorm`): the query and key norms keep their
    (contiguous) inputs, sb·e·(q + k)/t, unless full recompute (`layer._qk_norm`)."""
    e = element_bytes
    f = ffn or 4 * h
    g = query_groups_or_default(a, query_groups)
    d = kv_channels or h // a
    q, k = a * d, g * d
    r = 1.0 / t if sequence_parallel else 1.0
    sb = float(s) * b
    if recompute is Recompute.FULL:
        return sb * e * h * r
    selective = recompute is Recompute.SELECTIVE
    core_attn = selective and (recompute_modules is None or RecomputeModule.CORE_ATTN in recompute_modules)
    mlp_checkpoint = selective and recompute_modules is not None and RecomputeModule.MLP in recompute_modules
    regions = sb * h * r * (4 * e + (2 * MASK_BYTES if hidden_dropout else 0))
    qk_norm = sb * e * (q + k) / t if qk_layernorm else 0.0
    mlp = sb * e * f * (2 if activation is Activation.SWIGLU else 1) / t + sb * e * f / t
    if mlp_checkpoint:
        regions, mlp = regions - sb * e * h * r, 0.0
    held = 0.0
    if core_attn:
        groups_per_rank, heads_per_group = g // t, a // g
        query_copied = rope or (groups_per_rank > 1 and heads_per_group > 1)
        held = sb * e * ((q if query_copied else 0) + (k if rope else 0)) / t
    if flash:
        lse = 0.0 if core_attn else FLASH_LSE_BYTES * sb * a / t
        attention = sb * e * (2 * q + 2 * k) / t + lse + held
    elif core_attn:
        attention = sb * e * (q + 2 * k) / t + sb * e * q / t + held
    else:
        probs = e + (e + MASK_BYTES if attention_dropout else 0)
        attention = sb * 4 * e * q / t + float(a) * s * s * b * probs / t
    return regions + attention + mlp + qk_norm


def interleave_factor(pp: int, vpp: int) -> float:
    """First-stage in-flight layers over L with interleaving: 1 + (p − 1)/(p·m) (§4.2.3)."""
    return 1.0 + (pp - 1) / (pp * vpp) if vpp > 1 else 1.0


def first_stage_activation_bytes(
    per_layer_bytes: float, num_layers: int, pp: int, vpp: int, num_microbatches: int
) -> float:
    """Eq. 5 shape: the first stage holds min(p, m) microbatches of L/p layers (1F1B), times
    the interleave factor; excludes the embedding / output extras."""
    if vpp > 1:
        return per_layer_bytes * num_layers * interleave_factor(pp, vpp)
    return per_layer_bytes * num_layers / pp * min(pp, num_microbatches)


# Mixed-precision Adam (Megatron, theoretical_memory_usage.py): bf16 weight 2, fp32 main
# grad 4, fp32 master weight 4, Adam moments 4 + 4 = 18 bytes per parameter.
WEIGHT_BYTES_PER_PARAM = 2
GRADIENT_BYTES_PER_PARAM = 4
OPTIMIZER_BYTES_PER_PARAM = 12


@dataclass(frozen=True, slots=True)
class StaticMemory:
    weight_bytes: float
    gradient_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.gradient_bytes + self.optimizer_bytes


def static_memory(
    num_params: float,
    dp: int,
    distributed_optimizer: bool,
    gradient_bytes_per_param: int = GRADIENT_BYTES_PER_PARAM,
) -> StaticMemory:
    """18 bytes per parameter, or 6 + 12/d with the distributed optimizer, where d is the
    group the optimizer state is sharded over: d·c with context parallelism (Megatron-core's
    `get_megatron_optimizer` passes `intra_dp_cp_group`). With `--grad-reduce-in-bf16` the
    main-grad buffer is bf16 (Megatron-core `DistributedDataParallelConfig.grad_reduce_in_fp32`
    False: the buffer takes the param dtype), 2 bytes instead of 4."""
    optimizer_share = 1.0 / dp if distributed_optimizer else 1.0
    return StaticMemory(
        weight_bytes=WEIGHT_BYTES_PER_PARAM * num_params,
        gradient_bytes=gradient_bytes_per_param * num_params,
        optimizer_bytes=OPTIMIZER_BYTES_PER_PARAM * num_params * optimizer_share,
    )
