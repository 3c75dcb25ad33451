"""The four once-unpriced kernels (tests/workload/test_walked_kernels.py) as the pricing sees
them: one host launch each (the MoE add a MoE-block launch, weighted as one), and the generic
memory-bound rate (no profile measures these kinds)."""

from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.compute import achieved_bandwidth_bytes_per_s, elementwise_kind, elementwise_time_s
from simcluster.costs.host import op_kernels
from simcluster.costs.moe_host import moe_op_kernels, weighted_moe_kernels
from simcluster.workload.layer import layer_ops
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module
from tests.paths import ROOT
from tests.workload.test_walked_kernels import QWEN

NEW = (Module.QUERY_COPY, Module.VALUE_COPY, Module.QKV_GRAD_CONCAT, Module.MOE_INPUT_GRAD_ADD)


def _moe_segment():
    workload = build_workload(load_scenario(ROOT / "scenarios/moe/qwen3-30b-a3b-h100.yaml"))
    return next(s for st in workload.stages for c in st.chunks for s in c.segments if s.kind.moe is not None)


def test_each_attention_kernel_is_one_launch():
    ops = layer_ops(QWEN)
    for seq in (ops.forward, ops.backward):
        counts = op_kernels(seq, Dtype.BF16)
        new = [n for op, n in zip(seq, counts) if op.module in NEW]
        assert new == [1] * len(new) and new
    # three more launches than the same layer without them (two forward, one backward)
    assert sum(op.module in NEW for op in ops.forward) == 2
    assert sum(op.module in NEW for op in ops.backward) == 1


def test_the_moe_add_is_one_moe_block_launch():
    segment = _moe_segment()
    backward, spec = segment.layer.backward, segment.kind.moe
    at = [i for i, op in enumerate(backward) if op.module is Module.MOE_INPUT_GRAD_ADD]
    assert len(at) == 1
    assert moe_op_kernels(backward, spec, quantized=False)[at[0]] == 1  # counted by the MoE block
    counts = op_kernels(backward, Dtype.BF16, spec)
    weighted = weighted_moe_kernels(backward, counts, spec, False, (2.5, 0.7))
    assert counts[at[0]] == 1 and weighted[at[0]] == 2.5  # a MoE-block launch's weight


def test_priced_at_the_generic_memory_bound_rate():
    hw = load_hardware("h100-sxm5-80gb")
    segment = _moe_segment()
    layer = segment.layer
    new = [op for op in layer.forward + layer.backward if op.module in NEW]
    kinds = {elementwise_kind(op) for op in new}
    assert kinds == {"query_copy", "value_copy", "qkv_grad_concat.bwd", "input_grad_add"}
    for op in new:
        kind = elementwise_kind(op)
        generic = achieved_bandwidth_bytes_per_s(op.bytes_moved, hw, None)
        assert achieved_bandwidth_bytes_per_s(op.bytes_moved, hw, kind) == generic
        assert elementwise_time_s(op.bytes_moved, hw, kind) > op.bytes_moved / hw.memory_bandwidth_bytes_per_s
