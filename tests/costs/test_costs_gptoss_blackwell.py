"""gpt-oss on Blackwell (docs/moe.md, "gpt-oss on Blackwell"): the eager kernels' measured
rate and what it does to one op's price; the head-dim-64 cuDNN ratio carried to Blackwell."""

from dataclasses import replace

import pytest

from simcluster.config.choices import SoftmaxType
from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import elementwise_kind, elementwise_time_s, flash_attention_flop_per_s
from simcluster.workload.gptoss_experts import expert_bias_forward_ops, glu_clamp_backward_ops
from simcluster.workload.ops import AttentionShape
from tests.h100_measured import h100_measured

H100 = load_hardware("h100-sxm5-80gb")
GB200 = load_hardware("gb200-nvl72")


def test_eager_rates_are_the_eager_rows_at_their_kernels_bytes():
    """swiglu eager: 5·8192·14336·2 bytes in 0.6932 ms = 1,694 GB/s = 0.506 of 3,350; rope
    eager 0.521; their mean 0.513. bias-dropout-add eager 15·8192·4096 (+2·4096) bytes in
    0.2443 ms = 0.615."""
    assert h100_measured.eager_kind_efficiencies() == {"glu_clamp": 0.513, "expert_bias": 0.615}


def test_eager_kernels_run_below_a_copy_and_above_the_fused_norms():
    """Bare PyTorch kernels on strided halves reach ~57 % of what a copy does (0.901), more
    than the fused RMSNorm (0.353): the rates sit where the measurements put them."""
    kinds = H100.compute.memory_bound_efficiency_by_kind
    for kind in ("glu_clamp", "expert_bias"):
        assert kinds["layernorm"] < kinds[kind] < H100.compute.memory_bound_efficiency


def test_a_clamp_backward_kernel_is_priced_at_the_eager_rate_on_gb200():
    """The gate's `where` over [re, f] = [65536, 2880] reads a bool mask and a bf16 gradient
    and writes bf16: 5 bytes an element, 943.7 MB at 0.513 × 8 TB/s = 230.0 µs + 2 µs launch
    (0.835, a copy's rate, gave 141.3 µs)."""
    op = next(op for op in glu_clamp_backward_ops(2, 65536, 2880) if "gate_where" in op.name)
    assert elementwise_kind(op) == "glu_clamp.bwd"
    assert op.bytes_moved == 5 * 65536 * 2880
    assert elementwise_time_s(op.bytes_moved, GB200, elementwise_kind(op)) == pytest.approx(
        2e-6 + 943_718_400 / (0.513 * 8e12), rel=1e-9
    )


def test_the_fc2_bias_loop_is_priced_at_the_eager_broadcast_rate():
    """`t + b·p` on one expert's [32768, 2880] rows: 3·2 bytes an element at 0.615 × 8 TB/s."""
    op = next(op for op in expert_bias_forward_ops(2, 65536, 2880, 2) if "add_0" in op.name)
    seconds = elementwise_time_s(op.bytes_moved, GB200, elementwise_kind(op))
    assert seconds == pytest.approx(2e-6 + 6 * 32768 * 2880 / (0.615 * 8e12), rel=1e-9)


BLACKWELL = ["gb200-nvl72", "b200-sxm-180gb", "gb300-nvl72", "b300-sxm-288gb"]


def _sinks(seq: int, window: int | None = None, backward: bool = False) -> AttentionShape:
    shape = AttentionShape(
        batch=4, heads=64, kv_heads=8, seq_q=seq, seq_k=seq, head_dim=64, causal=True, backward=backward
    )
    return replace(shape, window_size=window, softmax_type=SoftmaxType.LEARNABLE)


@pytest.mark.parametrize("profile", BLACKWELL)
def test_full_causal_sinks_run_at_the_gb200_measured_rate(profile):
    """cuDNN 9.27 on a GB200 (cudnn-frontend's gpt-oss benchmark): the full causal layer with
    sinks at 8,192 tokens, 0.552673 ms = 994.7 TFLOP/s; the profile gives 1207 × 0.882 × 0.934."""
    rate = flash_attention_flop_per_s(_sinks(8192), load_hardware(profile))
    assert rate == pytest.approx(1207e12 * 0.882 * 0.934, rel=1e-9)
    assert rate == pytest.approx(2 * 64 * 8192**2 * 64 / 0.552673e-3, rel=0.001)


@pytest.mark.parametrize("profile", BLACKWELL)
def test_the_sliding_window_runs_at_the_gb200_measured_band_rate(profile):
    """The 128-key window, 0.106461 ms at 8,192 tokens: 160.1 TFLOP/s of the band's pairs, a
    quarter of the 512-key causal rate it was read at before (999 × 0.634)."""
    rate = flash_attention_flop_per_s(_sinks(4096, window=127), load_hardware(profile))
    assert rate == pytest.approx(999e12 * 0.634 * 0.253, rel=1e-9)
    assert rate == pytest.approx(4 * 64 * 64 * (8192 * 128 - 128**2 / 2) / 0.106461e-3, rel=0.002)


@pytest.mark.parametrize("profile", BLACKWELL)
def test_the_backward_keeps_the_h100_ratio_and_vanilla_the_head_dim_128_rate(profile):
    """At 2,048 keys the backward runs at the H100 table's 0.849; a vanilla softmax at 1."""
    hw = load_hardware(profile)
    sinks = _sinks(2048, backward=True)
    vanilla = replace(sinks, softmax_type=SoftmaxType.VANILLA)
    assert flash_attention_flop_per_s(sinks, hw) == pytest.approx(
        0.849 * flash_attention_flop_per_s(vanilla, hw)
    )
