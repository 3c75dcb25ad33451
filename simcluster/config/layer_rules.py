"""Megatron-core's rules for a transformer layer's attention options, each written once.

Standard library only (with `config.choices`, plain enums): the scenario validator
(`config.scenario`), the one description of a layer (`workload.layer_config.LayerConfig`)
and the torch layer (`profiler.layer.spec.LayerSpec`, which runs where only torch is
installed) all ask here, each phrasing a broken rule in its own words (the scenario names
the YAML field a user would change; the layer names its own field). The shape rules (head
dim, what t divides) are `config.layer_shape`'s.
"""

from __future__ import annotations

import enum

from simcluster.config.choices import AttentionBackend, AttentionKernel, Dtype
from simcluster.config.layer_shape import Indivisible


def query_groups_or_default(num_attention_heads: int, num_query_groups: int | None) -> int:
    """g, Megatron's --num-query-groups: a (one key/value head per query head, no GQA)
    when unset (None or 0)."""
    return num_query_groups or num_attention_heads


def query_group_problems(num_attention_heads: int, query_groups: int, tp: int) -> list[Indivisible]:
    """GQA's divisibility, the first broken rule only: g must divide a (each K/V head serves
    a/g query heads), then t must divide g (Megatron-core never replicates K/V heads:
    megatron/core/transformer/attention.py divides num_query_groups by the TP size, which
    asserts)."""
    if num_attention_heads % query_groups:
        return [Indivisible("num_attention_heads", num_attention_heads, "num_query_groups", query_groups)]
    if query_groups % tp:
        return [Indivisible("num_query_groups", query_groups, "tp", tp)]
    return []


def flash_precision_allowed(backend: AttentionBackend, dtype: Dtype) -> bool:
    """Flash attention runs in 16 bit (fp16 / bf16, and bf16 under FP8 recipes); fp32
    layers use the unfused core."""
    return backend is not AttentionBackend.FLASH or dtype.num_bytes == 2


def attention_kernel_allowed(kernel: AttentionKernel, backend: AttentionBackend) -> bool:
    """A choice of flash kernel library other than auto needs the flash backend (the
    unfused core has its own kernels)."""
    return kernel is AttentionKernel.AUTO or backend is AttentionBackend.FLASH


class ContextParallelRule(enum.Enum):
    """The rules context parallelism (cp > 1) adds, in the order they are reported."""

    SEQUENCE_CHUNKS = "sequence_chunks"  # s splits into 2·cp chunks (causal load balance)
    SEQUENCE_PARALLEL = "sequence_parallel"  # with SP, t splits each cp rank's s/cp tokens
    FLASH_BACKEND = "flash_backend"  # the ring runs in TE's fused / flash attention


def context_parallel_problems(
    cp: int, seq_length: int, tp: int, sequence_parallel: bool, backend: AttentionBackend
) -> list[ContextParallelRule]:
    """The broken rules of context parallelism over the whole sequence `seq_length` (s):
    Megatron-core splits s into 2·cp chunks for the causal load balance (two per rank); with
    sequence parallelism t must split each rank's s/cp tokens (checked only where the chunks
    split); and the K/V ring needs the flash backend
    (megatron/core/transformer/dot_product_attention.py: DotProductAttention asserts
    context_parallel_size == 1). None for cp = 1."""
    if cp <= 1:
        return []
    problems = []
    if seq_length % (2 * cp):
        problems.append(ContextParallelRule.SEQUENCE_CHUNKS)
    elif sequence_parallel and (seq_length // cp) % tp:
        problems.append(ContextParallelRule.SEQUENCE_PARALLEL)
    if backend is AttentionBackend.UNFUSED:
        problems.append(ContextParallelRule.FLASH_BACKEND)
    return problems
