"""FP8 experts and TE userbuffers with MoE priced (`costs.chunk`): the experts' grouped GEMMs
run at the quantized rate with their casts, the router at the BF16 rate; the dispatcher's
collectives carry BF16 tokens whatever the dtype, and are never paired with a GEMM by
userbuffers (`tp_comm_overlap` overlaps only the TP linears' collectives)."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.chunk import fp8_cast_s, op_time_s
from simcluster.costs.compute import elementwise_kind, elementwise_time_s, gemm_time_s, quantized_gemm_time_s
from simcluster.costs.grouped_gemm import quantized_expert_gemm_time_s
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module, OpKind
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"


def _priced(dtype="bf16", overlap=False, etp=None, path=QWEN):
    data = yaml.safe_load(path.read_text())
    data["model"]["moe"]["shared_expert_ffn_hidden_size"] = 1536
    dp = data["parallel"]["dp"] * data["parallel"].get("tp", 1) // 2
    data["parallel"].update(tp=2, dp=dp, sequence_parallel=True, etp=etp)
    data["training"].update(dtype=dtype, tp_comm_overlap=overlap)
    scenario = parse_scenario(data, "s.yaml")
    workload = build_workload(scenario, H100.fp8_weight_copies)
    seg = next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)
    layout = pricing_layout(scenario, H100)
    return seg.layer, StagePricing(H100).segment(seg, layout), layout


def test_expert_gemms_run_quantized_with_their_cast_and_the_router_in_bf16():
    layer, _, layout = _priced("fp8")
    ops = layer.forward
    for index, op in enumerate(ops):
        if op.kind is not OpKind.GEMM:
            continue
        seconds = op_time_s(op, H100, layout.tp, layout.dtype, experts=layout.experts)
        if op.module in (Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC1, Module.SHARED_FC2):
            quantized = quantized_gemm_time_s(op.gemm, H100, layout.dtype, layer.fp8_recipe)
            # The H100 carries its measured grouped ratio to the routed experts
            # (compute.grouped_ratio_for_quantized, tests/costs/test_costs_grouped_fp8.py).
            carried = quantized_expert_gemm_time_s(op, H100, layout.dtype, layer.fp8_recipe)
            assert (carried is None) is (op.module in (Module.SHARED_FC1, Module.SHARED_FC2))
            assert seconds == (quantized if carried is None else carried)
            assert fp8_cast_s(ops, index, H100, layout.tp) > 0
        elif op.module is Module.ROUTER:
            assert seconds == gemm_time_s(op.gemm, H100, layout.dtype)


@pytest.mark.parametrize(("etp", "path"), [(None, QWEN), (1, QWEN), (None, MIXTRAL)])
def test_dispatch_is_bf16_under_fp8_and_userbuffers_leave_it_alone(etp, path):
    """ep_comm is the same for bf16 and fp8 (Megatron's dispatchers send BF16 hidden states)
    and with or without tp_comm_overlap; FP8 makes the experts' compute faster, apart from
    the row padding TE adds around the quantized experts under the alltoall dispatcher
    (`workload.moe_fp8_padding`: two row copies a pass, which at Qwen3-30B's small experts
    cost more than FP8 saves). Mixtral at ep 8 holds one expert a rank: its fc2 is followed
    directly by the etp reduce-scatter, which userbuffers must not take for a TP linear's."""
    _, bf16, _ = _priced("bf16", etp=etp, path=path)
    fp8_layer, fp8, _ = _priced("fp8", etp=etp, path=path)
    _, fp8_ub, _ = _priced("fp8", overlap=True, etp=etp, path=path)
    for a, b, c, ops in (
        (bf16.forward, fp8.forward, fp8_ub.forward, fp8_layer.forward),
        (bf16.backward, fp8.backward, fp8_ub.backward, fp8_layer.backward),
    ):
        assert a.ep_comm_s == b.ep_comm_s == c.ep_comm_s > 0
        pads = [op for op in ops if op.module is Module.EXPERT_FP8_PADDING]
        assert len(pads) == 3
        padding_s = sum(elementwise_time_s(op.bytes_moved, H100, elementwise_kind(op)) for op in pads)
        assert b.compute_s - padding_s < a.compute_s
    # userbuffers hide part of the shared experts' and attention's TP comm
    assert fp8_ub.forward.comm_s < fp8.forward.comm_s
