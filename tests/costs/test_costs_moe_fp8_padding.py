"""The quantized experts' row padding priced (`workload.moe_fp8_padding`): a plain row copy at
the profile's generic element-wise rate, the same kernel kind both ways, one launch each."""

from __future__ import annotations

import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.compute import elementwise_kind, elementwise_time_s
from simcluster.costs.moe_host import moe_op_kernels
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
H100 = load_hardware("h100-sxm5-80gb")


def _segment():
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update(ep=8, dp=8)
    data["training"].update(dtype="fp8", fp8_recipe="tensorwise", moe_token_dispatcher="alltoall")
    workload = build_workload(parse_scenario(data, "s.yaml"))
    return next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)


def test_each_padding_op_is_one_launch():
    segment = _segment()
    for ops in (segment.layer.forward, segment.layer.backward):
        counts = moe_op_kernels(ops, segment.kind.moe, quantized=True)
        assert [n for op, n in zip(ops, counts) if op.module is Module.EXPERT_FP8_PADDING] == [1, 1, 1]


def test_padding_is_one_kind_both_ways_at_the_generic_copy_rate():
    """No profile measures TE's multi-row padding kernel: it is priced on the generic
    element-wise curve, forward and backward alike."""
    layer = _segment().layer
    pads = [op for op in layer.forward + layer.backward if op.module is Module.EXPERT_FP8_PADDING]
    assert {elementwise_kind(op) for op in pads} == {"fp8_padding"}
    big = [op for op in pads if op.bytes_moved > 1e6]
    assert len(big) == 4
    for op in big:
        priced = elementwise_time_s(op.bytes_moved, H100, elementwise_kind(op))
        assert priced == elementwise_time_s(op.bytes_moved, H100)  # the generic curve
