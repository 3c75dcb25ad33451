"""An RMSNorm is priced by the profile's RMSNorm curve where it has one (`Op.kernel`,
`costs.compute.elementwise_kind`), and as a layer norm where it has none."""

from __future__ import annotations

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import elementwise_kind, elementwise_time_s, priced_kind
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, OpKind
from tests.modern_cases import LLAMA3_8B_LAYER

H100 = load_hardware("h100-sxm5-80gb")
LAYER = LayerConfig(**LLAMA3_8B_LAYER)


def _norm_kinds(cfg: LayerConfig) -> set[str]:
    ops = layer_ops(cfg)
    return {elementwise_kind(op) for op in (*ops.forward, *ops.backward) if op.module is Module.LAYERNORM}


def test_an_rmsnorm_layer_names_its_norm_kernel() -> None:
    assert _norm_kinds(LAYER) == {"rmsnorm", "rmsnorm.bwd"}
    assert _norm_kinds(LayerConfig(**{**LLAMA3_8B_LAYER, "normalization": "layernorm"})) == {
        "layernorm",
        "layernorm.bwd",
    }


def test_a_profile_without_an_rmsnorm_curve_prices_it_as_a_layer_norm() -> None:
    """The shipped profiles: results unchanged (their "layernorm" efficiency is the fused
    RMSNorm's, measured)."""
    assert priced_kind(H100, "rmsnorm") == "layernorm" and priced_kind(H100, "rmsnorm.bwd") == "layernorm.bwd"
    for size in (1e6, 1.34e8):
        assert elementwise_time_s(size, H100, "rmsnorm.bwd") == elementwise_time_s(
            size, H100, "layernorm.bwd"
        )


def test_a_profile_with_an_rmsnorm_curve_prices_it_from_the_curve() -> None:
    """250 GB/s flat (the eager RMSNorm forward of elementwise_host_optimizer.json) against a
    layer norm at 2,000: an RMSNorm forward of 134 MB takes 0.537 ms, the layer norm 0.067."""
    curves = {"layernorm": [(1e8, 2000.0)], "rmsnorm": [(1e8, 250.0)]}
    hw = H100.model_copy(
        update={"compute": H100.compute.model_copy(update={"elementwise_points_by_op": curves})}
    )
    norm = next(
        op
        for op in layer_ops(LAYER).forward
        if op.module is Module.LAYERNORM and op.kind is OpKind.ELEMENTWISE
    )
    assert elementwise_kind(norm) == "rmsnorm"
    assert elementwise_time_s(1.342e8, hw, "rmsnorm") == pytest.approx(hw.kernel_launch_s + 1.342e8 / 250e9)
    assert elementwise_time_s(1.342e8, hw, "layernorm") == pytest.approx(
        hw.kernel_launch_s + 1.342e8 / 2000e9
    )
    assert priced_kind(hw, "rmsnorm.bwd") == "layernorm.bwd"  # no backward curve: as before
