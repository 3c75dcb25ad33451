"""MoE / MLA configuration and parallel folding: each bad input is one clear error that names
the field, the value and what is allowed; the folding's group sizes are Megatron-core's."""

import pytest

from simcluster.config.moe_choices import RecomputeModule, RouterScore, parse_recompute_modules
from simcluster.workload.moe_config import (
    ExpertLayout,
    MLAConfig,
    MoEConfig,
    check_mla_attention,
    check_moe_parallel,
)


def test_topk_above_the_expert_count_is_refused():
    """router_topk=9 of 8 experts: the message names both values and the allowed range."""
    with pytest.raises(ValueError, match=r"router_topk=9 .* num_experts=8 .*1 <= router_topk <= num_experts"):
        MoEConfig(num_experts=8, router_topk=9, ffn_hidden_size=64)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("num_experts", 0, "num_experts=0"),
        ("ffn_hidden_size", 0, "ffn_hidden_size=0"),
        ("shared_expert_ffn_hidden_size", -1, "shared_expert_ffn_hidden_size=-1"),
        ("first_k_dense_layers", -2, "first_k_dense_layers=-2"),
        ("capacity_factor", 0.0, "capacity_factor=0.0"),
        ("load_imbalance", 0.5, "load_imbalance=0.5"),
    ],
)
def test_bad_sizes_name_the_field(field, value, needle):
    """Each bad size is refused with its field and value in the message."""
    kwargs = {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 64, field: value}
    with pytest.raises(ValueError, match=needle):
        MoEConfig(**kwargs)


def test_padding_needs_a_capacity_factor():
    with pytest.raises(ValueError, match="pad_to_capacity=true .* capacity_factor=null"):
        MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=64, pad_to_capacity=True)


def test_group_limited_routing_rules():
    """Megatron's checks: both numbers, groups divide E, group_topk <= groups, enough experts."""
    base = {"num_experts": 256, "router_topk": 8, "ffn_hidden_size": 64}
    ok = MoEConfig(**base, router_num_groups=8, router_group_topk=4, router_score=RouterScore.SIGMOID)
    assert ok.router_score is RouterScore.SIGMOID
    with pytest.raises(ValueError, match="needs both"):
        MoEConfig(**base, router_num_groups=8)
    with pytest.raises(ValueError, match="router_num_groups=7 .* divide num_experts=256"):
        MoEConfig(**base, router_num_groups=7, router_group_topk=4)
    with pytest.raises(ValueError, match="router_group_topk=9 .* <= router_num_groups=8"):
        MoEConfig(**base, router_num_groups=8, router_group_topk=9)
    with pytest.raises(ValueError, match="router_group_topk=4 .* <= router_topk=2"):
        MoEConfig(num_experts=16, router_topk=2, ffn_hidden_size=64, router_num_groups=8, router_group_topk=4)
    with pytest.raises(ValueError, match="fewer than router_topk=8"):
        MoEConfig(num_experts=16, router_topk=8, ffn_hidden_size=64, router_num_groups=8, router_group_topk=2)


def test_router_score_is_read_from_its_name_and_refused_otherwise():
    assert MoEConfig(8, 2, 64, router_score="sigmoid").router_score is RouterScore.SIGMOID
    with pytest.raises(ValueError, match="'tanh' is not a valid RouterScore"):
        MoEConfig(8, 2, 64, router_score="tanh")


def test_first_k_dense_layers_is_megatrons_layer_freq_list():
    """DeepSeek-V3: 3 dense layers then 58 MoE: --moe-layer-freq ([0]*3+[1]*58)."""
    moe = MoEConfig(256, 8, 2048, first_k_dense_layers=3)
    assert [moe.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert moe.num_moe_layers(61) == 58
    assert moe.megatron_moe_layer_freq(61) == "([0]*3+[1]*58)"
    assert MoEConfig(8, 2, 64).megatron_moe_layer_freq(32) == "1"


def test_ep_times_etp_must_divide_tp_cp_dp():
    """Folding carves expert groups from tp·cp·dp: ep·etp = 8 does not divide 2·1·3 = 6."""
    with pytest.raises(ValueError, match=r"ep=4 with etp=2 .* ep·etp=8 must divide tp·cp·dp=6"):
        ExpertLayout(tp=2, cp=1, dp=3, ep=4)


def test_folding_group_sizes():
    """etp defaults to tp; edp = tp·cp·dp / (ep·etp) (parallel_state.py
    expert_data_parallel_size = world // (etp·ep·pp))."""
    layout = ExpertLayout(tp=2, cp=2, dp=8, ep=8, etp=1)
    assert (layout.expert_tp, layout.expert_dp, layout.expert_shards) == (1, 4, 8)
    default = ExpertLayout(tp=4, cp=1, dp=8, ep=2)
    assert (default.expert_tp, default.expert_dp) == (4, 4)


def test_experts_must_divide_over_ep():
    moe = MoEConfig(num_experts=10, router_topk=2, ffn_hidden_size=64)
    with pytest.raises(ValueError, match="num_experts=10 .*parallel.ep=4.*ep must divide num_experts"):
        check_moe_parallel(moe, ExpertLayout(tp=1, cp=1, dp=8, ep=4), sequence_parallel=True)


def test_tensor_parallel_moe_needs_sequence_parallel():
    moe = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=64)
    with pytest.raises(ValueError, match="sequence_parallel=false .* tp=2"):
        check_moe_parallel(moe, ExpertLayout(tp=2, cp=1, dp=4, ep=2), sequence_parallel=False)
    check_moe_parallel(moe, ExpertLayout(tp=2, cp=1, dp=4, ep=2), sequence_parallel=True)


def test_load_imbalance_cannot_exceed_ep():
    moe = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=64, load_imbalance=3.0)
    with pytest.raises(ValueError, match="load_imbalance=3.0 .*ep=2"):
        check_moe_parallel(moe, ExpertLayout(tp=1, cp=1, dp=4, ep=2), sequence_parallel=True)


def test_mla_with_gqa_is_refused():
    mla = MLAConfig(
        q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128
    )
    with pytest.raises(ValueError, match="num_query_groups=8 .*model.mla.*num_attention_heads=128"):
        check_mla_attention(mla, 128, 8)
    check_mla_attention(mla, 128, 0)
    check_mla_attention(mla, 128, 128)
    assert mla.q_head_dim == 192


def test_mla_sizes_are_checked():
    with pytest.raises(ValueError, match="kv_lora_rank=0"):
        MLAConfig(q_lora_rank=None, kv_lora_rank=0, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)


def test_unknown_recompute_module_is_one_clear_error():
    assert parse_recompute_modules(["moe_act", "core_attn"]) == (
        RecomputeModule.MOE_ACT,
        RecomputeModule.CORE_ATTN,
    )
    with pytest.raises(ValueError, match="'moe_acts' is not a Megatron-core recompute module .*moe_act"):
        parse_recompute_modules(["moe_acts"])
