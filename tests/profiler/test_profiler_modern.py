"""The modern layer options (GQA, SwiGLU, squared ReLU, RMSNorm, RoPE, flash attention) in the
real layer: saved bytes measured == the op graph + named extras, and the op graph == modern.md
§4's term-by-term formula."""

from __future__ import annotations

import pytest
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
    view_held_terms,
)
from simcluster.profiler.layer.spec import LayerSpec

GQA = {"num_query_groups": 4}
SWIGLU = {"activation": Activation.SWIGLU}
SQUARED_RELU = {"activation": Activation.SQUARED_RELU}
RMSNORM = {"normalization": Normalization.RMSNORM}
ROPE = {"position_embedding": PositionEmbedding.ROPE}
FLASH = {"attention_backend": AttentionBackend.FLASH}
LLAMA = {**GQA, **SWIGLU, **RMSNORM, **ROPE, **FLASH}
OPTIONS = {"gqa": GQA, "swiglu": SWIGLU, "squared_relu": SQUARED_RELU, "rmsnorm": RMSNORM,
           "rope": ROPE, "flash": FLASH, "flash_gqa": {**FLASH, **GQA}, "llama": LLAMA}
ROWS = [(Recompute.NONE, False), (Recompute.NONE, True), (Recompute.SELECTIVE, True),
        (Recompute.FULL, True)]


def _spec(options: dict, recompute: Recompute = Recompute.NONE, sp: bool = True, tp: int = 2,
          **kw: object) -> LayerSpec:
    """h 128, a 8, s 32, b 2: with g = 4 and t = 2 a rank holds 2 groups of 2 heads."""
    return LayerSpec(128, 8, 32, 2, tp=tp, sequence_parallel=sp, recompute=recompute,
                     **{**options, **kw})


@pytest.mark.parametrize("recompute,sp", ROWS, ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_measured_equals_op_graph_plus_named_extras(name: str, recompute: Recompute,
                                                    sp: bool) -> None:
    """bf16, rank 0 of t = 2, dropout 0.1 and 0: every saved byte is the op graph's, a view's
    storage the op graph does not count, or a norm statistic."""
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
    assert "attention_scores" not in s4 and view_held_terms(spec) == {}
    measured = measure_saved_bytes(spec)
    assert measured.total_bytes == table2_bytes(spec) + 2 * 2 * 32 * 2  # + bf16 LN mean, rstd
    assert measured.dropout_mask_bytes == 0


def test_swiglu_keeps_its_two_f_wide_input() -> None:
    """fc1 is 2f wide; SwiGLU keeps it (2·e·S·2f/t) and fc2 its f-wide output: 3f against
    GeLU's 2f, i.e. e·S·f/t = 2·64·512/2 more bytes."""
    gelu, swiglu = _spec({}), _spec(SWIGLU)
    assert (measure_saved_bytes(swiglu).total_bytes - measure_saved_bytes(gelu).total_bytes
            == 2 * 64 * 512 // 2)


def test_rmsnorm_keeps_fp32_rsigma() -> None:
    """One fp32 rsigma per token per norm (16 tokens on a rank with SP), no mean, no bias."""
    spec = _spec(RMSNORM)
    assert negligible_buffers(spec, "cpu") == {"layernorm_stats": 2 * 32 * 4}
    assert measure_saved_bytes(spec).layernorm_stats_bytes == 2 * 32 * 4


def test_rope_keeps_the_qkv_output_alive_through_v() -> None:
    """RoPE makes Q and K new tensors; V stays a view of the QKV output, so the whole output
    stays alive beside them: e·S·(q + k)/t beyond the op graph (modern.md open question 1)."""
    spec = _spec({**ROPE, **FLASH})
    assert view_held_terms(spec) == {"qkv_output_held_by_views": 2 * 64 * (128 + 128) // 2}
    assert measure_saved_bytes(spec).total_bytes == expected_saved_bytes(spec)
    # RoPE's cos/sin tables are layer buffers: no activation bytes of their own.
    assert view_held_terms(_spec(FLASH)) == {}


def test_gqa_query_reshape_copies_when_a_rank_holds_several_groups() -> None:
    """Megatron's query.reshape is a view with one group per rank and a copy with two
    groups of two heads: then the QKV output is kept beside Q (e·S·q/t more)."""
    assert view_held_terms(_spec({**FLASH, "num_query_groups": 2})) == {}
    assert view_held_terms(_spec({**FLASH, **GQA})) == {
        "qkv_output_held_by_views": 2 * 64 * 128 // 2}


@settings(max_examples=200, deadline=None)
@given(t=st.sampled_from([1, 2, 4]), groups_per_rank=st.integers(1, 3),
       heads_per_group=st.integers(1, 3), d=st.sampled_from([2, 8, 64]),
       s=st.integers(1, 64), b=st.integers(1, 4), sp=st.booleans(),
       recompute=st.sampled_from(list(Recompute)), activation=st.sampled_from(list(Activation)),
       norm=st.sampled_from(list(Normalization)), pe=st.sampled_from(list(PositionEmbedding)),
       backend=st.sampled_from(list(AttentionBackend)), p=st.sampled_from([0.0, 0.1]))
def test_section4_formula_equals_op_graph(t, groups_per_rank, heads_per_group, d, s, b, sp,
                                          recompute, activation, norm, pe, backend, p) -> None:
    """modern.md §4's terms, written out here, equal the simulator's op graph for every mix."""
    g = groups_per_rank * t
    a = g * heads_per_group
    spec = LayerSpec(a * d, a, s * t, b, tp=t, sequence_parallel=sp, recompute=recompute,
                     num_query_groups=g, activation=activation, normalization=norm,
                     position_embedding=pe, attention_backend=backend, dropout_prob=p)
    assert sum(section4_terms(spec).values()) == table2_bytes(spec)


def test_llama_8b_shape_is_34_sbh_over_t() -> None:
    """§4's worked value: h = q = 4096, k = 1024, f = 14336 gives 139264·sb/t bytes, 34·sbh/t,
    + the 4sb·a/t LSE; no dropout (the Llama recipes set both to 0)."""
    spec = LayerSpec(4096, 32, 16, 1, ffn_hidden_size=14336, tp=8, sequence_parallel=True,
                     dropout_prob=0.0, **{**LLAMA, "num_query_groups": 8})
    sb = 16
    assert table2_bytes(spec) == 139264 * sb // 8 + 4 * sb * 32 // 8


def test_flash_runs_fp32_in_the_real_layer_only() -> None:
    """The simulator prices flash in 16 bit only; the real layer runs it in fp32 too (the
    exactness checks), but has no op-graph prediction there."""
    spec = _spec(FLASH, dtype=Dtype.FP32)
    assert measure_saved_bytes(spec).total_bytes > 0
    with pytest.raises(ValueError, match="attention_backend=flash"):
        spec.config()
