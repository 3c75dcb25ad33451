"""The flex dispatcher's kernels hold SMs under the EP overlap (`costs.ep_overlap.stolen_sm_s`):
the compute they run beside slows by their SMs' share while they run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.config.moe_choices import FlexBackend
from simcluster.config.scenario import load_scenario
from simcluster.costs.chunk import OpsCost, price_ops
from simcluster.costs.ep_overlap import (
    DISPATCHER_NUM_SMS,
    delayed_mlp_phase_s,
    overlap_phase_s,
    paired_saving_s,
    pass_phases,
    stolen_sm_s,
)
from simcluster.costs.stage_pricing import pricing_layout
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import build_workload
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    DeepEPMessage,
    Module,
    Op,
    Pass,
    collective,
    elementwise,
)
from tests.paths import ROOT

GB200_RUN = ROOT / "benchmarks" / "public_runs" / "bridge26.04-gpt-oss-120b-gb200-bf16.yaml"


def _work(name: str, pass_: Pass) -> Op:
    return elementwise(name, 1.0, module=Module.LAYERNORM, pass_=pass_)


def _comm(name: str, pass_: Pass, backend: FlexBackend | None) -> Op:
    message = (
        None if backend is None else DeepEPMessage(ep=8, send_bytes=1.0, internode_bytes=(), backend=backend)
    )
    op = collective(
        name, CollectiveKind.ALL_TO_ALL, 1.0, module=Module.MOE_PERMUTE, pass_=pass_, group=CommGroup.EP
    )
    return replace(op, deepep=message)


def _pass(before: int, between: int, after: int, tag: str, pass_: Pass, backend: FlexBackend | None):
    ops = [_work(f"{tag}.a{i}", pass_) for i in range(before)]
    ops.append(_comm(f"{tag}.first", pass_, backend))
    ops += [_work(f"{tag}.m{i}", pass_) for i in range(between)]
    ops.append(_comm(f"{tag}.last", pass_, backend))
    return tuple(ops + [_work(f"{tag}.p{i}", pass_) for i in range(after)])


def _layer(backend: FlexBackend | None) -> LayerOps:
    """As tests/costs/test_costs_ep_overlap.py's LAYER: forward 3 | comm | 2 | comm | 1,
    backward 1 | comm | 4 | comm | 6."""
    return LayerOps(
        _pass(3, 2, 1, "f", Pass.FORWARD, backend), _pass(1, 4, 6, "b", Pass.INPUT_GRAD, backend), ()
    )


def _one_second_each(ops: tuple[Op, ...]) -> OpsCost:
    return OpsCost(compute_s=float(len(ops)))


def test_a_phase_is_its_compute_plus_the_sm_seconds_taken_unless_the_comm_is_longer():
    assert overlap_phase_s(4.0, 3.0, 0.5) == 4.0  # the compute, slowed, still ends first
    assert overlap_phase_s(2.0, 3.0, 0.5) == 3.5
    assert overlap_phase_s(2.0, 3.0) == 3.0


def test_hybridep_kernels_take_32_of_the_gpus_sms():
    """A 1-s Hybrid-EP kernel on a 128-SM GPU holds 32/128 of it: 0.25 SM-seconds; DeepEP's 20."""
    hybrid = _layer(FlexBackend.HYBRIDEP).forward
    assert stolen_sm_s(hybrid, _one_second_each, 128) == pytest.approx(2 * 0.25)
    deepep = _layer(FlexBackend.DEEPEP).forward
    assert stolen_sm_s(deepep, _one_second_each, 128) == pytest.approx(2 * 20 / 128)
    assert stolen_sm_s(hybrid, _one_second_each, None) == 0.0
    assert DISPATCHER_NUM_SMS == {FlexBackend.DEEPEP: 20, FlexBackend.HYBRIDEP: 32}


def test_the_pair_loses_the_stolen_seconds_where_compute_is_the_longer_stream():
    """Every op 1 s, 128 SMs: paired 1 + (3 + .25) + (4 + .25) + (2 + .25) + (6 + .25) + 1 = 18 s
    against 21 s separate: saving 3 s, not 4. NCCL's all-to-all (no kernel SMs priced) keeps 4."""
    assert paired_saving_s(_layer(FlexBackend.HYBRIDEP), _one_second_each, num_sms=128) == pytest.approx(3.0)
    assert paired_saving_s(_layer(FlexBackend.HYBRIDEP), _one_second_each) == pytest.approx(4.0)
    assert paired_saving_s(_layer(None), _one_second_each, num_sms=128) == pytest.approx(4.0)


def test_delayed_wgrad_middle_with_stolen_seconds():
    """D_f 1, dgrad 2, wgrad 3, D_b 1, M_f 4, each dispatch holding 0.25 SM-s: compute
    max(2 + 3 + .25, 1) + 4 + .25 = 9.5, comm max(1, 2.25) + 1 = 3.25."""
    assert delayed_mlp_phase_s(1.0, 2.0, 3.0, 1.0, 4.0, 0.25, 0.25) == pytest.approx(9.5)
    assert delayed_mlp_phase_s(1.0, 2.0, 3.0, 1.0, 4.0) == pytest.approx(9.0)


def test_gpt_oss_on_gb200_hides_less_by_the_hybridep_kernels_share():
    """The published GB200 layout: the forward and backward compute outlast every dispatch and
    combine, so the pair is longer by 32/148 of the four Hybrid-EP kernels' seconds."""
    scenario = load_scenario(GB200_RUN)
    hw = load_hardware(scenario.hardware)
    layout = pricing_layout(scenario, hw)
    layer = next(seg for seg in build_workload(scenario).stages[0].chunks[0].segments if seg.kind.moe).layer

    def price(ops: tuple[Op, ...]) -> OpsCost:
        return price_ops(ops, hw, layout.tp, layout.dtype, layout.cp, False, layer.fp8_recipe, layout.experts)

    forward, backward = pass_phases(layer.forward), pass_phases(layer.backward)
    assert forward is not None and backward is not None
    runs = (forward.first_comm, forward.last_comm, backward.first_comm, backward.last_comm)
    kernels_s = sum(price((op,)).total_s for run in runs for op in run if op.deepep is not None)
    assert kernels_s > 0
    lost = paired_saving_s(layer, price, True) - paired_saving_s(layer, price, True, hw.gpu.num_sms)
    assert lost == pytest.approx(kernels_s * 32 / 148, rel=1e-9)
