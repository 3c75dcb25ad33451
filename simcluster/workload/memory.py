"""Memory formulas of Korthikanti et al. (Table 2, Eq. 5–6, §4.2.3) and mixed-precision Adam.

These are the paper's closed forms; the op graph in `layer.py` must agree with them (a test
proves it), and the engine's memory tracker must reproduce the first-stage total.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from simcluster.config.choices import Recompute


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


def static_memory(num_params: float, dp: int, distributed_optimizer: bool) -> StaticMemory:
    """18 bytes per parameter, or 6 + 12/d with the distributed optimizer, where d is the
    group the optimizer state is sharded over: d·c with context parallelism (Megatron-core's
    `get_megatron_optimizer` passes `intra_dp_cp_group`)."""
    optimizer_share = 1.0 / dp if distributed_optimizer else 1.0
    return StaticMemory(
        weight_bytes=WEIGHT_BYTES_PER_PARAM * num_params,
        gradient_bytes=GRADIENT_BYTES_PER_PARAM * num_params,
        optimizer_bytes=OPTIMIZER_BYTES_PER_PARAM * num_params * optimizer_share,
    )
