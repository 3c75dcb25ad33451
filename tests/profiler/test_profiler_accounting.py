"""Bytes autograd keeps for one real layer == Table 2 + the named negligible buffers, exactly."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcluster.config.choices import Dtype, Recompute
from simcluster.profiler.layer.accounting import (
    expected_saved_bytes,
    measure_saved_bytes,
    negligible_buffers,
    table2_bytes,
    table2_row,
)
from simcluster.profiler.layer.spec import LayerSpec

# (hidden_size, num_attention_heads, seq_length, micro_batch_size, tp)
SHAPES = [(96, 3, 40, 3, 1), (96, 6, 40, 3, 2), (128, 4, 64, 2, 2), (128, 4, 64, 2, 4)]
# The six rows of Table 2 (t = 1 is "no parallelism"), plus full recompute with SP.
ROWS = [
    (Recompute.NONE, False),
    (Recompute.NONE, True),
    (Recompute.SELECTIVE, False),
    (Recompute.SELECTIVE, True),
    (Recompute.FULL, False),
    (Recompute.FULL, True),
]


def _spec(shape: tuple[int, ...], recompute: Recompute, sp: bool, **kw: object) -> LayerSpec:
    h, a, s, b, t = shape
    return LayerSpec(h, a, s, b, tp=t, sequence_parallel=sp, recompute=recompute, **kw)


@pytest.mark.parametrize("recompute,sp", ROWS, ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_measured_equals_table2_plus_negligible(
    shape: tuple[int, ...], recompute: Recompute, sp: bool
) -> None:
    """bf16, stand-in rank 0: every saved byte is a Table 2 term or a named buffer."""
    spec = _spec(shape, recompute, sp)
    measured = measure_saved_bytes(spec)
    negligible = negligible_buffers(spec, "cpu")
    assert measured.total_bytes == table2_bytes(spec) + sum(negligible.values())
    assert measured.layernorm_stats_bytes == negligible["layernorm_stats"]


@pytest.mark.parametrize("recompute,sp", ROWS[:4], ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS[:4]])
def test_dropout_masks_are_one_byte_per_element(recompute: Recompute, sp: bool) -> None:
    """Masks: sbh after each block (÷t with SP) and as²b/t on the attention probabilities."""
    spec = _spec((128, 4, 64, 2, 2), recompute, sp)
    sbh = spec.local_seq_length * 2 * 128
    attention = 4 * 64 * 64 * 2 // 2 if recompute is Recompute.NONE else 0
    assert measure_saved_bytes(spec).dropout_mask_bytes == 2 * sbh + attention


def test_no_parallelism_by_hand() -> None:
    """h=96, a=3, s=40, b=3: sbh(34 + 5as/h) = 11520 × 40.25, plus 2·2·120 bf16 LN stats."""
    spec = LayerSpec(96, 3, 40, 3)
    assert table2_row(spec) == "no parallelism"
    assert table2_bytes(spec) == 463_680
    assert measure_saved_bytes(spec).total_bytes == 463_680 + 960
    assert measure_saved_bytes(spec).num_storages == 17  # Q, K, V share one storage


@pytest.mark.parametrize("recompute,sp", ROWS, ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS])
def test_fp32_and_no_dropout_are_accounted_too(recompute: Recompute, sp: bool) -> None:
    """4-byte activations and fp32 stats; with p = 0 no masks and no separate dropout output."""
    for kw in ({"dtype": Dtype.FP32}, {"dropout_prob": 0.0}):
        spec = _spec((96, 6, 40, 3, 2), recompute, sp, **kw)
        assert measure_saved_bytes(spec).total_bytes == expected_saved_bytes(spec, "cpu")


@given(
    t=st.sampled_from([1, 2, 4, 8]),
    heads=st.integers(1, 16),
    d=st.integers(1, 128),
    s=st.integers(1, 4096),
    b=st.integers(1, 8),
    row=st.sampled_from(ROWS),
)
def test_table2_formulas_as_printed(
    t: int, heads: int, d: int, s: int, b: int, row: tuple[Recompute, bool]
) -> None:
    """table2_bytes equals the paper's printed expressions for every row."""
    recompute, sp = row
    a, h = heads * t, heads * t * d
    spec = LayerSpec(h, a, s * t, b, tp=t, sequence_parallel=sp, recompute=recompute)
    sbh, q = Fraction(s * t * b * h), Fraction(5 * a * s * t, h * t)
    printed = {
        (Recompute.NONE, False): sbh * (10 + Fraction(24, t) + q),
        (Recompute.NONE, True): sbh * (Fraction(34, t) + q),
        (Recompute.SELECTIVE, False): sbh * (10 + Fraction(24, t)),
        (Recompute.SELECTIVE, True): sbh * Fraction(34, t),
        (Recompute.FULL, False): sbh * 2,
        (Recompute.FULL, True): sbh * Fraction(2, t),
    }[row]
    assert table2_bytes(spec) == printed
    if t == 1 and row == (Recompute.NONE, False):
        assert table2_bytes(spec) == sbh * (34 + Fraction(5 * a * s, h))


def test_cuda_keeps_fp32_layernorm_stats() -> None:
    """On CUDA the mean/rstd are fp32 whatever the activation dtype; on CPU bf16 ones."""
    spec = LayerSpec(128, 4, 64, 2, tp=2, sequence_parallel=True)
    assert negligible_buffers(spec, "cuda") == {"layernorm_stats": 2 * 2 * 32 * 2 * 4}
    assert negligible_buffers(spec, "cpu") == {"layernorm_stats": 2 * 2 * 32 * 2 * 2}
    assert negligible_buffers(replace(spec, recompute=Recompute.FULL), "cuda") == {"layernorm_stats": 0}


def test_spec_rejects_heads_not_divisible_by_tp() -> None:
    """Fail at construction, naming the fields."""
    with pytest.raises(ValueError, match="num_attention_heads=3 must be divisible by tp=2"):
        LayerSpec(96, 3, 40, 3, tp=2)
