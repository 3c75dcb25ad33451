"""FLOPs, routed rows, dispatch messages, permute bytes, saved activations and static memory
of the MoE block: hand-computed cases and the invariants that must hold for any layout."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcluster.config.moe_choices import RecomputeModule, RouterScore, TokenDispatcher
from simcluster.workload.moe import (
    ExpertGroup,
    MessageKind,
    dispatch_messages,
    expert_gemms,
    moe_forward_flops,
    moe_params,
    permute_bytes,
    rank_forward_flops,
    routed_rows,
)
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_memory import (
    expert_gradient_reduce_bytes,
    expert_static_memory,
    moe_saved_bytes,
    router_saved_bytes,
)

MOE = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=32, shared_expert_ffn_hidden_size=16)


def test_forward_flops_by_hand():
    """T = 10, h = 4, E = 8, k = 2, f = 32, shared 16, SwiGLU: router 2·10·4·8 = 640;
    routed 10·2·2·(4·64 + 32·4) = 15360; shared 10·2·(4·32 + 16·4) = 3840."""
    assert moe_forward_flops(10, 4, MOE, gated=True) == 640 + 15360 + 3840
    # not gated: fc1 is f wide, routed 10·2·2·(4·32 + 32·4) = 10240, shared 10·2·(2·4·16) = 2560
    assert moe_forward_flops(10, 4, MOE, gated=False) == 640 + 10240 + 2560


def test_megatron_mfu_count_is_the_block_without_the_router():
    """training.py num_floating_point_operations for DeepSeek-V3's MLPs, transcribed:
    3·2·h·tokens·(ffn·3·dense + moe_ffn·k·3·moe + shared·3·moe) (SwiGLU, no latent)."""
    h, tokens = 7168, 4096 * 16
    moe = MoEConfig(256, 8, 2048, shared_expert_ffn_hidden_size=2048, first_k_dense_layers=3)
    megatron = 3 * 2 * h * tokens * (2048 * 8 * 3 * 58 + 2048 * 3 * 58)
    ours = 3 * 58 * (moe_forward_flops(tokens, h, moe, gated=True) - 2.0 * tokens * h * 256)
    assert ours == megatron


@given(k=st.integers(1, 64), tokens=st.integers(1, 1 << 20))
def test_routed_flops_are_linear_in_topk(k, tokens):
    """Each extra expert per token adds one expert's FLOPs for every token."""
    one = MoEConfig(num_experts=64, router_topk=1, ffn_hidden_size=96)
    many = MoEConfig(num_experts=64, router_topk=k, ffn_hidden_size=96)
    router = 2.0 * tokens * 48 * 64
    assert moe_forward_flops(tokens, 48, many, True) - router == k * (
        moe_forward_flops(tokens, 48, one, True) - router
    )


layouts = st.tuples(
    st.sampled_from([1, 2, 4, 8]),  # tp
    st.sampled_from([1, 2]),  # cp
    st.sampled_from([1, 2, 4, 8, 16]),  # dp
    st.sampled_from([1, 2, 4, 8]),  # ep
    st.sampled_from([1, 2, 4]),  # etp
).filter(lambda t: (t[0] * t[1] * t[2]) % (t[3] * t[4]) == 0)


@given(layout=layouts)
def test_ep_and_etp_do_not_change_the_stage_flops(layout):
    """Summed over the tp·cp·dp ranks of a stage, the mean rank's FLOPs are the block's FLOPs
    for the dp microbatches of s·b tokens, whatever ep and etp are."""
    tp, cp, dp, ep, etp = layout
    lay = ExpertLayout(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)
    s, b, h = 256, 2, 64
    rows = routed_rows(s, b, MOE, lay)
    per_rank = rank_forward_flops(rows, h, MOE, lay, gated=True, busiest=False).total
    assert math.isclose(
        per_rank * lay.attention_ranks, moe_forward_flops(s * b * dp, h, MOE, True), rel_tol=1e-12
    )


def test_busiest_rank_scales_with_load_imbalance():
    """Dropless: the busiest rank computes load_imbalance times the mean rank's expert rows."""
    lay = ExpertLayout(tp=2, cp=1, dp=4, ep=4, etp=1)
    skewed = MoEConfig(8, 2, 32, load_imbalance=1.5)
    rows = routed_rows(512, 1, skewed, lay)
    assert (rows.tokens, rows.sent, rows.received) == (256, 512, 512)
    assert rows.busiest_received == 768 and rows.busiest_expert == 768
    flops = rank_forward_flops(rows, 64, skewed, lay, gated=True)
    mean = rank_forward_flops(rows, 64, skewed, lay, gated=True, busiest=False)
    assert flops.experts == 1.5 * mean.experts and flops.router == mean.router


def test_capacity_caps_the_busiest_rank():
    """T = 256, k = 2, E = 8, cf = 1.25: C = ceil(64·1.25) = 80 per expert and source, so at
    most 640 rows; load 1.5 would want 768. Padded: exactly 640 on every rank."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    capped = MoEConfig(8, 2, 32, capacity_factor=1.25, load_imbalance=1.5)
    rows = routed_rows(256, 1, capped, lay)
    assert rows.capacity == 80
    assert (rows.sent, rows.busiest_received) == (512, 640)
    padded = routed_rows(256, 1, MoEConfig(8, 2, 32, capacity_factor=1.25, pad_to_capacity=True), lay)
    assert (padded.sent, padded.busiest_received) == (640, 640)
    roomy = routed_rows(256, 1, MoEConfig(8, 2, 32, capacity_factor=4.0, load_imbalance=1.5), lay)
    assert (
        roomy.busiest_received
        == routed_rows(256, 1, MoEConfig(8, 2, 32, load_imbalance=1.5), lay).busiest_received
    )


def test_etp_gathers_rows_and_splits_widths():
    """etp = 2: the expert rows double after the all-gather, the GEMM widths halve."""
    lay = ExpertLayout(tp=2, cp=1, dp=2, ep=2, etp=2)
    rows = routed_rows(512, 1, MOE, lay)
    assert rows.expert == 2 * rows.received
    fc1, fc2 = expert_gemms(rows, 64, MOE, lay, gated=True)
    assert (fc1.batch, fc1.m, fc1.n, fc1.k) == (4, 256 * 2 * 2 // 4, 32, 64)
    assert (fc2.n, fc2.k) == (64, 16)


def test_alltoall_messages_by_hand():
    """ep = 4, etp = 1, T = 128, k = 2, h = 64, bf16: dispatch and combine move
    256·64·2 = 32768 bytes per rank; probs 256·2; the counts gather E·8·4 bytes."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4, etp=1)
    rows = routed_rows(128, 1, MOE, lay)
    msgs = {m.name: m for m in dispatch_messages(rows, 64, MOE, lay, TokenDispatcher.ALLTOALL)}
    assert set(msgs) == {"moe.tokens_per_expert", "moe.dispatch", "moe.dispatch_probs", "moe.combine"}
    assert msgs["moe.dispatch"].send_bytes == msgs["moe.combine"].send_bytes == 32768
    assert (
        msgs["moe.dispatch"].kind is MessageKind.ALL_TO_ALL and msgs["moe.dispatch"].group is ExpertGroup.EP
    )
    assert msgs["moe.dispatch_probs"].send_bytes == 512
    assert msgs["moe.tokens_per_expert"].send_bytes == 8 * 8 * 4


def test_alltoall_with_etp_adds_the_tensor_parallel_pair():
    lay = ExpertLayout(tp=2, cp=1, dp=4, ep=2, etp=2)
    rows = routed_rows(256, 1, MOE, lay)
    msgs = {m.name: m for m in dispatch_messages(rows, 64, MOE, lay, TokenDispatcher.ALLTOALL, probs_bytes=4)}
    assert msgs["moe.dispatch_etp"].send_bytes == rows.expert * 64 * 2
    assert msgs["moe.combine_etp"].kind is MessageKind.REDUCE_SCATTER
    assert msgs["moe.combine_etp"].send_bytes == rows.expert * 64 * 4  # reduced in the probs' fp32


def test_no_parallelism_sends_nothing():
    lay = ExpertLayout(tp=1, cp=1, dp=8)
    rows = routed_rows(128, 1, MOE, lay)
    for dispatcher in (TokenDispatcher.ALLTOALL, TokenDispatcher.ALLGATHER):
        assert dispatch_messages(rows, 64, MOE, lay, dispatcher) == ()
    with pytest.raises(ValueError, match="flex"):
        dispatch_messages(rows, 64, MOE, lay, TokenDispatcher.FLEX)


def test_allgather_moves_every_token_of_the_group():
    """etp·ep = 4, T = 128: the gathered tokens 512·64·2 bytes, the probs 512·8·2, the map 512·8."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    rows = routed_rows(128, 1, MOE, lay)
    msgs = {m.name: m.send_bytes for m in dispatch_messages(rows, 64, MOE, lay, TokenDispatcher.ALLGATHER)}
    assert msgs == {
        "moe.routing_map_allgather": 512 * 8,
        "moe.probs_allgather": 512 * 8 * 2,
        "moe.dispatch_allgather": 512 * 64 * 2,
        "moe.combine_reduce_scatter": 512 * 64 * 2,
    }


def test_permute_bytes_by_hand():
    """R = 256 sent rows, T = 128, h = 64: permute 2·256·(128 + 2), sort 2·256·128, unpermute 384·128."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    rows = routed_rows(128, 1, MOE, lay)
    pb = permute_bytes(rows, 64, MOE, lay)
    assert (pb.permute, pb.sort_chunks, pb.unpermute) == (2 * 256 * 130, 2 * 256 * 128, 384 * 128)
    one_expert_each = ExpertLayout(tp=1, cp=1, dp=8, ep=8)
    assert permute_bytes(routed_rows(128, 1, MOE, one_expert_each), 64, MOE, one_expert_each).sort_chunks == 0
    # allgather: Re = 256 rows of the 512 gathered tokens, 2 local experts, no sort
    gathered = permute_bytes(rows, 64, MOE, lay, dispatcher=TokenDispatcher.ALLGATHER)
    assert (gathered.permute, gathered.sort_chunks, gathered.unpermute) == (
        2 * 256 * 128 + 2 * 512 * 3 + 256 * 2,
        0,
        (256 + 512) * 128,
    )


def test_router_saved_bytes_by_score():
    """T = 10, k = 2, E = 8: softmax 10·2·12; sigmoid 10·8·4 + 10·2·12 + 10·4; the aux loss
    adds T·E·4 + E·8 + 4 (and T·4 with sigmoid); a capacity factor the bool mask T·E."""
    assert router_saved_bytes(10, MOE) == 240
    sigmoid = MoEConfig(8, 2, 32, router_score=RouterScore.SIGMOID)
    assert router_saved_bytes(10, sigmoid) == 320 + 240 + 40
    assert router_saved_bytes(10, MoEConfig(8, 1, 32, router_score="sigmoid")) == 320 + 80
    assert router_saved_bytes(10, MOE, aux_loss=True) == 240 + 320 + 64 + 4
    assert router_saved_bytes(10, sigmoid, aux_loss=True) == 600 + 320 + 64 + 4 + 40
    assert router_saved_bytes(10, MoEConfig(8, 2, 32, capacity_factor=1.0)) == 240 + 80
    assert router_saved_bytes(10, MoEConfig(8, 2, 32, capacity_factor=1.0, pad_to_capacity=True)) == 240 + 80
    grouped = MoEConfig(8, 4, 32, router_num_groups=4, router_group_topk=2)  # 4 groups, top 2 scored each
    assert router_saved_bytes(10, grouped) == 10 * 4 * 12 + 10 * 4 * 2 * 8 + 10 * 8


def test_saved_bytes_by_hand_and_what_recompute_frees():
    """T = 128, R = Re = 256, h = 64, f = 32, shared 16, bf16, SwiGLU:
    experts 256·2·(64 + 64 + 32) + 256·2; shared 128·2·(32 + 16); permute (128·8 + 256)·8."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    rows = routed_rows(128, 1, MOE, lay)
    saved = moe_saved_bytes(rows, 64, MOE, lay, gated=True)
    assert saved.experts == 256 * 2 * 160 + 512
    assert saved.shared == 128 * 2 * 48
    assert saved.permute == (128 * 8 + 256) * 8
    act = moe_saved_bytes(rows, 64, MOE, lay, gated=True, recompute=(RecomputeModule.MOE_ACT,))
    assert saved.total - act.total == 256 * 32 * 2
    shared = moe_saved_bytes(rows, 64, MOE, lay, gated=True, recompute=(RecomputeModule.SHARED_EXPERTS,))
    assert shared.shared == 0 and shared.experts == saved.experts
    assert moe_saved_bytes(rows, 64, MOE, lay, gated=True, recompute=(RecomputeModule.MOE,)).total == 0
    plain = moe_saved_bytes(rows, 64, MOE, lay, gated=False)
    assert plain.experts == 256 * 2 * (64 + 3 * 32) + 512  # fc1 out, act out, fc2 in are f wide


def test_static_memory_shards_experts_over_ep_etp_and_edp():
    """E = 8, h = 64, f = 32, SwiGLU: one expert 3·64·32 = 6144 params; ep = 4, etp = 2 leaves
    2 experts at half width = 6144 per rank; optimizer over edp = 16/8 = 2."""
    lay = ExpertLayout(tp=2, cp=1, dp=8, ep=4, etp=2)
    mem = expert_static_memory(64, MOE, lay, gated=True, distributed_optimizer=True)
    assert mem.expert_params_per_rank == 6144
    assert mem.experts.weight_bytes == 2 * 6144 and mem.experts.gradient_bytes == 4 * 6144
    assert mem.experts.optimizer_bytes == 12 * 6144 / 2
    assert mem.dense_params_per_rank == 8 * 64 + 3 * 64 * 16 / 2  # router + shared / tp
    assert mem.dense.optimizer_bytes == 12 * mem.dense_params_per_rank / 8
    assert expert_gradient_reduce_bytes(64, MOE, lay, gated=True) == 4 * 6144


@given(layout=layouts)
def test_expert_weights_over_ep_etp_ranks_are_all_experts(layout):
    """ep·etp ranks together hold each routed expert weight exactly once."""
    tp, cp, dp, ep, etp = layout
    lay = ExpertLayout(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp)
    moe = MoEConfig(num_experts=16, router_topk=2, ffn_hidden_size=64)
    mem = expert_static_memory(128, moe, lay, gated=True, distributed_optimizer=False)
    assert mem.expert_params_per_rank * ep * etp == moe_params(128, moe, gated=True).routed


def test_fused_permutation_keeps_int32_row_maps():
    """--moe-permute-fusion: T·(2E + 1)·4 for the mask-map permute (kept by the unpermute too)
    and Re·4 for each chunk sort when a rank has several experts: T = 128, E = 8, Re = 256."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    rows = routed_rows(128, 1, MOE, lay)
    fused = moe_saved_bytes(rows, 64, MOE, lay, gated=True, permute_fusion=True)
    assert fused.permute == 128 * 17 * 4 + 2 * 256 * 4
    one_each = ExpertLayout(tp=1, cp=1, dp=8, ep=8)
    rows8 = routed_rows(128, 1, MOE, one_each)
    assert moe_saved_bytes(rows8, 64, MOE, one_each, gated=True, permute_fusion=True).permute == 128 * 17 * 4


def test_allgather_permutation_keeps_row_indices_and_the_masked_select_pair():
    """allgather, ep = 4, T = 128, E = 8, Re = 256, bf16 probs: Re·8 row indices, and
    masked_select's input probs and mask over the 2 local experts x 512 gathered tokens."""
    lay = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    rows = routed_rows(128, 1, MOE, lay)
    saved = moe_saved_bytes(rows, 64, MOE, lay, gated=True, dispatcher=TokenDispatcher.ALLGATHER)
    assert saved.permute == 256 * 8 + 2 * 512 * (2 + 1)
