"""The modern layer options (GQA, SwiGLU, squared ReLU, RMSNorm, RoPE, flash attention) in the
real layer: saved bytes measured == the op graph + norm statistics, and the op graph ==
docs/memory.md's term-by-term formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.profiler.layer.accounting import (
    expected_saved_bytes,
    measure_saved_bytes,
    negligible_buffers,
    section4_terms,
    table2_bytes,
)
from simcluster.profiler.layer.ops import te_qkv_layout
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.workload.layer import qkv_output_held_bytes

GQA = {"num_query_groups": 4}
SWIGLU = {"activation": Activation.SWIGLU}
SQUARED_RELU = {"activation": Activation.SQUARED_RELU}
RMSNORM = {"normalization": Normalization.RMSNORM}
ROPE = {"position_embedding": PositionEmbedding.ROPE}
FLASH = {"attention_backend": AttentionBackend.FLASH}
LLAMA = {**GQA, **SWIGLU, **RMSNORM, **ROPE, **FLASH}
OPTIONS = {
    "gqa": GQA,
    "swiglu": SWIGLU,
    "squared_relu": SQUARED_RELU,
    "rmsnorm": RMSNORM,
    "rope": ROPE,
    "flash": FLASH,
    "flash_gqa": {**FLASH, **GQA},
    "llama": LLAMA,
}
ROWS = [(Recompute.NONE, False), (Recompute.NONE, True), (Recompute.SELECTIVE, True), (Recompute.FULL, True)]


def _spec(
    options: dict, recompute: Recompute = Recompute.NONE, sp: bool = True, tp: int = 2, **kw: object
) -> LayerSpec:
    """h 128, a 8, s 32, b 2: with g = 4 and t = 2 a rank holds 2 groups of 2 heads."""
    return LayerSpec(128, 8, 32, 2, tp=tp, sequence_parallel=sp, recompute=recompute, **{**options, **kw})


@pytest.mark.parametrize("recompute,sp", ROWS, ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_measured_equals_op_graph_plus_named_extras(name: str, recompute: Recompute, sp: bool) -> None:
    """bf16, rank 0 of t = 2, dropout 0.1 and 0: every saved byte is the op graph's or a norm
    statistic (the QKV output a selective checkpoint keeps through V's view included)."""
    for p in (0.1, 0.0):
        spec = _spec(OPTIONS[name], recompute, sp, dropout_prob=p)
        measured = measure_saved_bytes(spec)
        assert measured.total_bytes == expected_saved_bytes(spec, "cpu")
        assert measured.layernorm_stats_bytes == negligible_buffers(spec)["layernorm_stats"]
        assert table2_bytes(spec) == sum(section4_terms(spec).values())


def test_flash_keeps_q_k_v_o_and_lse_only() -> None:
    """MHA, no RoPE: Q, K, V views of one QKV storage, O (= proj's input) and an fp32 LSE
    [b, a/t, s]; no s² tensor. S = 64 tokens, t = 2, SP: 2·S·(2q + 2k)/t + 4·S·a/t."""
    spec = _spec(FLASH, dropout_prob=0.0)
    s4 = section4_terms(spec)
    assert s4["attention_qkv"] + s4["attention_output"] == 2 * 64 * (2 * 128 + 2 * 128) // 2
    assert s4["attention_lse"] == 4 * 64 * 4
    assert "attention_scores" not in s4 and qkv_output_held_bytes(spec.config()) == 0
    measured = measure_saved_bytes(spec)
    assert measured.total_bytes == table2_bytes(spec) + 2 * 2 * 32 * 2  # + bf16 LN mean, rstd
    assert measured.dropout_mask_bytes == 0


def test_swiglu_keeps_its_two_f_wide_input() -> None:
    """fc1 is 2f wide; SwiGLU keeps it (2·e·S·2f/t) and fc2 its f-wide output: 3f against
    GeLU's 2f, i.e. e·S·f/t = 2·64·512/2 more bytes."""
    gelu, swiglu = _spec({}), _spec(SWIGLU)
    assert (
        measure_saved_bytes(swiglu).total_bytes - measure_saved_bytes(gelu).total_bytes == 2 * 64 * 512 // 2
    )


def test_rmsnorm_keeps_fp32_rsigma() -> None:
    """One fp32 rsigma per token per norm (16 tokens on a rank with SP), no mean, no bias."""
    spec = _spec(RMSNORM)
    assert negligible_buffers(spec, "cpu") == {"layernorm_stats": 2 * 32 * 4}
    assert measure_saved_bytes(spec).layernorm_stats_bytes == 2 * 32 * 4


def _held(options: dict, recompute: Recompute = Recompute.NONE, **kw: object) -> int:
    """Bytes the real layer keeps beyond Q, K, V, O, LSE as new tensors: measured minus the
    op graph without the held term."""
    spec = _spec(options, recompute, dropout_prob=0.0, **kw)
    extra = sum(negligible_buffers(spec).values())
    return (
        measure_saved_bytes(spec).total_bytes
        - extra
        - (table2_bytes(spec) - int(qkv_output_held_bytes(spec.config())))
    )


@pytest.mark.parametrize("name", ["rope", "flash_rope", "gqa", "flash_gqa", "llama"])
def test_without_a_checkpoint_te_copies_so_the_qkv_output_is_freed(name: str) -> None:
    """RoPE (new Q, K beside V's view) and the GQA split (K, V views at an offset) are no
    layout TE's get_qkv_layout accepts, so DotProductAttention makes Q, K, V contiguous and
    the QKV output is freed: measured == the op graph, nothing held by a view. Reverting the
    real layer to hand V's view to the kernel keeps e·S·(q + k)/t (RoPE) more."""
    options = {**OPTIONS.get(name, {}), **({**ROPE, **FLASH} if name == "flash_rope" else {})}
    assert _held(options) == 0


@pytest.mark.parametrize(
    ("options", "held"),
    [
        # e·S·(q + k)/t = 2·64·(128 + 128)/2: RoPE'd Q and K beside the whole QKV output
        ({**ROPE, **FLASH}, 2 * 64 * (128 + 128) // 2),
        ({**ROPE}, 2 * 64 * (128 + 128) // 2),
        # GQA, a rank holding 2 groups of 2 heads: query.reshape copies Q (e·S·q/t = 2·64·128/2)
        ({**GQA, **FLASH}, 2 * 64 * 128 // 2),
        ({**GQA}, 2 * 64 * 128 // 2),
        # one group per rank: Q stays a view, the checkpoint keeps just the one output
        ({**FLASH, "num_query_groups": 2}, 0),
        # GQA and RoPE: q + k again, with k = 128·4/8 = 64
        (LLAMA, 2 * 64 * (128 + 64) // 2),
        # the paper's layer: MHA, learned positions, Q, K, V three views of one output
        ({}, 0),
    ],
)
def test_selective_checkpoint_keeps_the_qkv_output_through_v(options: dict, held: int) -> None:
    """Megatron's CheckpointFunction saves its inputs Q, K, V as given: V's view keeps the QKV
    output alive beside a new Q and K. The op graph counts it (qkv_output_held_bytes), and
    the measured bytes agree (the held term, removed from the op graph, is what is left)."""
    spec = _spec(options, Recompute.SELECTIVE, dropout_prob=0.0)
    assert int(qkv_output_held_bytes(spec.config())) == held
    assert _held(options, Recompute.SELECTIVE) == held
    assert measure_saved_bytes(spec).total_bytes == expected_saved_bytes(spec)


def test_te_qkv_layout_keeps_packed_layouts_and_copies_the_rest() -> None:
    """TE's get_qkv_layout, mirrored: Megatron's MHA split (sbh3d) stays three views of one
    storage; a RoPE'd Q and K beside V's view, or the GQA split, become contiguous copies."""
    s, b, n, d = 4, 2, 3, 8
    qkv = torch.randn(s, b, n, 3 * d)
    q, k, v = qkv.split([d, d, d], dim=-1)
    assert all(x is y for x, y in zip(te_qkv_layout(q, k, v), (q, k, v), strict=True))
    new_q, new_k = q * 2, k * 2  # what RoPE returns
    out = te_qkv_layout(new_q, new_k, v)
    assert out[2].untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    assert out[0] is new_q and out[2].is_contiguous() and torch.equal(out[2], v)
    groups = torch.randn(s, b, 1, (n + 2) * d)  # one group of n heads: K, V at an offset
    gq, gk, gv = groups.split([n * d, d, d], dim=-1)
    _, ck, cv = te_qkv_layout(gq.reshape(s, b, n, d), gk, gv)
    assert ck.is_contiguous() and cv.is_contiguous()
    assert cv.untyped_storage().data_ptr() != groups.untyped_storage().data_ptr()
    # contiguous, separate Q, K, V (sbhd_sbhd_sbhd) are kept as they are
    sep = [torch.randn(s, b, n, d) for _ in range(3)]
    assert all(x is y for x, y in zip(te_qkv_layout(*sep), sep, strict=True))


@settings(max_examples=200, deadline=None)
@given(
    t=st.sampled_from([1, 2, 4]),
    groups_per_rank=st.integers(1, 3),
    heads_per_group=st.integers(1, 3),
    d=st.sampled_from([2, 8, 64]),
    s=st.integers(1, 64),
    b=st.integers(1, 4),
    sp=st.booleans(),
    recompute=st.sampled_from(list(Recompute)),
    activation=st.sampled_from(list(Activation)),
    norm=st.sampled_from(list(Normalization)),
    pe=st.sampled_from(list(PositionEmbedding)),
    backend=st.sampled_from(list(AttentionBackend)),
    p=st.sampled_from([0.0, 0.1]),
)
def test_section4_formula_equals_op_graph(
    t, groups_per_rank, heads_per_group, d, s, b, sp, recompute, activation, norm, pe, backend, p
) -> None:
    """docs/memory.md's terms, written out here, equal the simulator's op graph for every mix."""
    g = groups_per_rank * t
    a = g * heads_per_group
    spec = LayerSpec(
        a * d,
        a,
        s * t,
        b,
        tp=t,
        sequence_parallel=sp,
        recompute=recompute,
        num_query_groups=g,
        activation=activation,
        normalization=norm,
        position_embedding=pe,
        attention_backend=backend,
        dropout_prob=p,
    )
    assert sum(section4_terms(spec).values()) == table2_bytes(spec)


def test_llama_8b_shape_is_34_sbh_over_t() -> None:
    """§4's worked value: h = q = 4096, k = 1024, f = 14336 gives 139264·sb/t bytes, 34·sbh/t,
    + the 4sb·a/t LSE; no dropout (the Llama recipes set both to 0)."""
    spec = LayerSpec(
        4096,
        32,
        16,
        1,
        ffn_hidden_size=14336,
        tp=8,
        sequence_parallel=True,
        dropout_prob=0.0,
        **{**LLAMA, "num_query_groups": 8},
    )
    sb = 16
    assert table2_bytes(spec) == 139264 * sb // 8 + 4 * sb * 32 // 8


def test_flash_runs_fp32_in_the_real_layer_only() -> None:
    """The simulator prices flash in 16 bit only; the real layer runs it in fp32 too (the
    exactness checks), but has no op-graph prediction there."""
    spec = _spec(FLASH, dtype=Dtype.FP32)
    assert measure_saved_bytes(spec).total_bytes > 0
    with pytest.raises(ValueError, match="attention_backend=flash"):
        spec.config()
