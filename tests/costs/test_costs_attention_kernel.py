"""Which fused-attention kernels run (`training.attention_kernel`): FlashAttention-2 is priced
from the profile's `compute.flash_attn_2` tables, every other op and every saved byte of the
layer stays as with the default (cuDNN) kernels, and the context-parallel ring uses them too."""

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.choices import AttentionKernel, Dtype
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import require_hardware_fits
from simcluster.costs.chunk import op_time_s, price_layer_ops
from simcluster.costs.compute import attention_time_s, flash_attention_flop_per_s
from simcluster.costs.network import GroupPlacement
from simcluster.simulation import run_simulation
from simcluster.workload.context_parallel import ring_attention
from simcluster.workload.layer import flash_attention_shape, layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import AttentionShape, OpKind
from tests.modern_cases import LLAMA3_8B_LAYER, llama3_8b

H100 = load_hardware("h100-sxm5-80gb")
ONE = GroupPlacement(num_ranks=1, ranks_per_node=1)
LAYER = LLAMA3_8B_LAYER


def _shape(kernel: AttentionKernel, causal: bool, backward: bool) -> AttentionShape:
    return AttentionShape(
        batch=1, heads=32, kv_heads=8, seq_q=4096, seq_k=4096, head_dim=128, causal=causal,
        backward=backward, kernel=kernel,
    )  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backward", [False, True])
def test_flash_attn_2_is_priced_from_its_own_tables(causal, backward):
    """At a tabulated length the rate is the table's entry (× the causal ratio): FA2 at 4k
    from the profile's flash_attn_2 block, the default kernels from flash_attention_*."""
    fa2, compute = H100.compute.flash_attn_2, H100.compute
    assert fa2 is not None
    table = dict(fa2.bwd_tflop_per_s if backward else fa2.fwd_tflop_per_s)
    expected = table[4096] * (dict(fa2.causal_efficiency)[4096] if causal else 1.0)
    assert flash_attention_flop_per_s(_shape(AttentionKernel.FLASH_ATTN_2, causal, backward), H100) == (
        pytest.approx(expected * 1e12)
    )
    default = dict(
        (compute.flash_attention_bwd_tflop_per_s if backward else compute.flash_attention_fwd_tflop_per_s)
        or []
    )[4096] * (dict(compute.flash_attention_causal_efficiency or [])[4096] if causal else 1.0)
    assert flash_attention_flop_per_s(_shape(AttentionKernel.AUTO, causal, backward), H100) == (
        pytest.approx(default * 1e12)
    )
    # FlashAttention-2 is the slower kernel on Hopper (FlashAttention-3 paper, Fig. 5/6)
    slower = attention_time_s(_shape(AttentionKernel.FLASH_ATTN_2, causal, backward), H100)
    assert slower > attention_time_s(_shape(AttentionKernel.AUTO, causal, backward), H100)


def test_the_kernel_changes_only_the_attention_time_of_a_layer():
    """Same ops and saved bytes; the layer's compute grows by exactly the attention kernels'
    difference."""
    auto = layer_ops(LayerConfig(**LAYER))
    fa2 = layer_ops(LayerConfig(**LAYER, attention_kernel="flash_attn_2"))
    for part in ("forward", "backward"):
        before, after = getattr(auto, part), getattr(fa2, part)
        assert [op.name for op in before] == [op.name for op in after]
        assert [op.saved_bytes for op in before] == [op.saved_bytes for op in after]
        differ = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
        assert differ and all(a.kind is OpKind.ATTENTION for a, _ in differ)
        assert all(
            b.attention is not None and b.attention.kernel is AttentionKernel.FLASH_ATTN_2 for _, b in differ
        )
        grown = sum(
            op_time_s(b, H100, ONE, Dtype.BF16) - op_time_s(a, H100, ONE, Dtype.BF16) for a, b in differ
        )
        assert grown > 0
        priced = [getattr(price_layer_ops(ops, H100, ONE, Dtype.BF16), part) for ops in (auto, fa2)]
        assert priced[1].compute_s - priced[0].compute_s == pytest.approx(grown)


def test_the_context_parallel_ring_runs_the_chosen_kernel():
    cfg = LayerConfig(**LAYER, attention_kernel="flash_attn_2")
    for backward in (False, True):
        ring = ring_attention(cfg, cp=2, backward=backward)
        assert {s.kernel for s in (ring.diagonal, ring.lower, ring.upper)} == {AttentionKernel.FLASH_ATTN_2}
    assert flash_attention_shape(cfg).kernel is AttentionKernel.FLASH_ATTN_2


def test_auto_is_the_default_and_changes_nothing():
    implicit = parse_scenario(llama3_8b(model={"num_layers": 2}), "auto.yaml")
    explicit = parse_scenario(
        llama3_8b(model={"num_layers": 2}, training={"attention_kernel": "auto"}), "auto.yaml"
    )
    assert implicit == explicit
    slower = parse_scenario(
        llama3_8b(model={"num_layers": 2}, training={"attention_kernel": "flash_attn_2"}), "x"
    )
    times = [run_simulation(s, H100).result.iteration_time_s for s in (implicit, slower)]
    assert times[1] > times[0]


def test_flash_attn_2_needs_the_flash_backend():
    data = llama3_8b(training={"attention_backend": "unfused", "attention_kernel": "flash_attn_2"})
    with pytest.raises(
        ConfigError,
        match="training.attention_kernel: value flash_attn_2: needs training.attention_backend flash",
    ):
        parse_scenario(data, "kernel.yaml")


def test_a_profile_without_fa2_rates_is_named_with_the_ones_that_have_them():
    scenario = parse_scenario(
        llama3_8b("b200-sxm-180gb", training={"attention_kernel": "flash_attn_2"}), "k.yaml"
    )
    with pytest.raises(ConfigError) as error:
        require_hardware_fits(scenario, load_hardware("b200-sxm-180gb"), "k.yaml")
    text = str(error.value)
    assert "'b200-sxm-180gb' has no compute.flash_attn_2 rates" in text
    assert "h100-sxm5-80gb" in text and "h200-sxm-141gb" in text


def test_an_op_asking_for_missing_rates_is_a_clear_error():
    b200 = load_hardware("b200-sxm-180gb")
    with pytest.raises(ValueError, match="no compute.flash_attn_2 rates"):
        flash_attention_flop_per_s(_shape(AttentionKernel.FLASH_ATTN_2, True, False), b200)
