"""Megatron's rules for a transformer layer's shape: defaults and what t must divide.

Standard library only. The scenario validator (`config.scenario`) and the one description of
a layer (`workload.layer_config.LayerConfig`, which the torch layer's `LayerSpec` extends)
both ask here, so each rule is written once; an option that brings its own rule (query
groups, context parallelism) adds it to `indivisible_sizes`.
"""

from __future__ import annotations

from dataclasses import dataclass


def ffn_hidden_size_or_default(hidden_size: int, ffn_hidden_size: int | None) -> int:
    """Megatron's default MLP width: 4h when `ffn_hidden_size` is unset (None or 0)."""
    return ffn_hidden_size or 4 * hidden_size


@dataclass(frozen=True, slots=True)
class Indivisible:
    """`field` = `value` is not a multiple of `divisor` = `divisor_value`."""

    field: str
    value: int
    divisor: str
    divisor_value: int


def indivisible_sizes(
    hidden_size: int,
    num_attention_heads: int,
    ffn_hidden_size: int,
    seq_length: int,
    tp: int,
    sequence_parallel: bool,
) -> list[Indivisible]:
    """The sizes a layer cannot split as asked, in this order: heads must split h into equal
    head dims; t must split the heads and the MLP width (column/row-parallel GEMMs); with
    sequence parallelism t must also split the sequence (the layer-norm/dropout regions)."""
    checks = [
        ("hidden_size", hidden_size, "num_attention_heads", num_attention_heads),
        ("num_attention_heads", num_attention_heads, "tp", tp),
        ("ffn_hidden_size", ffn_hidden_size, "tp", tp),
    ]
    if sequence_parallel:
        checks.append(("seq_length", seq_length, "tp", tp))
    return [Indivisible(*check) for check in checks if check[1] % check[3]]
