"""The EP overlap's compute beside the dispatcher's kernels (`costs.ep_overlap`,
`sm_shared_phase_s`): while an NCCL all-to-all (or DeepEP / Hybrid-EP kernel) runs on the
communication stream it holds its SMs, so the GEMMs and attention beside it run on the rest."""

from __future__ import annotations

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.config.moe_choices import FlexBackend
from simcluster.costs.chunk import OpsCost
from simcluster.costs.ep_overlap import (
    DEEPEP_SMS,
    HYBRIDEP_SMS,
    NCCL_P2P_CHANNELS,
    comm_kernel_sms,
    paired_saving_s,
    sm_shared_phase_s,
)
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    DeepEPMessage,
    GemmShape,
    Module,
    Op,
    OpKind,
    Pass,
    collective,
    elementwise,
    gemm,
)

H100 = load_hardware("h100-sxm5-80gb")
SHARE = (H100.gpu.num_sms - NCCL_P2P_CHANNELS) / H100.gpu.num_sms  # 100 of 132 SMs


def _work(name: str, pass_: Pass) -> Op:
    return elementwise(name, 1.0, module=Module.LAYERNORM, pass_=pass_)


def _expert(name: str, pass_: Pass) -> Op:
    return gemm(name, GemmShape(64, 64, 64), module=Module.EXPERT_FC1, pass_=pass_)


def _a2a(name: str, pass_: Pass) -> Op:
    return collective(
        name, CollectiveKind.ALL_TO_ALL, 1.0, module=Module.MOE_PERMUTE, pass_=pass_, group=CommGroup.EP
    )


def _pass(before: int, between: int, after: int, tag: str, pass_: Pass, experts: bool) -> tuple[Op, ...]:
    ops = [_work(f"{tag}.a{i}", pass_) for i in range(before)]
    ops.append(_a2a(f"{tag}.first", pass_))
    make = _expert if experts else _work
    ops += [make(f"{tag}.m{i}", pass_) for i in range(between)]
    ops.append(_a2a(f"{tag}.last", pass_))
    return tuple(ops + [_work(f"{tag}.p{i}", pass_) for i in range(after)])


def _layer(experts: bool) -> LayerOps:
    """tests/costs/test_costs_ep_overlap.py's layer: forward experts 2, backward 4 (as GEMMs
    with `experts`, else memory-bound kernels)."""
    return LayerOps(
        _pass(3, 2, 1, "f", Pass.FORWARD, experts), _pass(1, 4, 6, "b", Pass.INPUT_GRAD, experts), ()
    )


def _seconds(weights: dict[str, float]):
    def price(ops: tuple[Op, ...]) -> OpsCost:
        return OpsCost(compute_s=sum(weights.get(op.name, 1.0) for op in ops))

    return price


def test_a_phase_the_communication_leads_costs_the_communication():
    assert sm_shared_phase_s(10.0, 3.0, 1.0, 0.5) == 10.0  # 3 / 0.5 + 1 = 7 <= 10


def test_compute_that_outlasts_the_communication_runs_slowed_only_beside_it():
    """1 s of communication beside 2 s of GEMMs at half the SMs: 0.5 s of work done in the
    first second, the remaining 1.5 s at full speed."""
    assert sm_shared_phase_s(1.0, 2.0, 0.0, 0.5) == pytest.approx(2.5)
    # memory-bound work keeps its pace: W' = 1 / 0.5 + 1 = 3, W = 2: 1 + (1 - 1/3) * 2
    assert sm_shared_phase_s(1.0, 1.0, 1.0, 0.5) == pytest.approx(1.0 + 2.0 * 2.0 / 3.0)
    assert sm_shared_phase_s(1.0, 2.0, 1.0, 1.0) == pytest.approx(3.0)  # all the SMs: max(C, W)
    with pytest.raises(ValueError, match="sm_fraction"):
        sm_shared_phase_s(1.0, 1.0, 0.0, 0.0)


def test_each_dispatcher_holds_its_own_sms():
    a2a = _a2a("x", Pass.FORWARD)
    deepep = Op(
        name="d", kind=OpKind.COLLECTIVE, module=Module.MOE_PERMUTE, pass_=Pass.FORWARD, group=CommGroup.EP,
        deepep=DeepEPMessage(32, 1e6, ((4, 0.5e6),)),
    )  # fmt: skip
    hybrid = Op(
        name="h", kind=OpKind.COLLECTIVE, module=Module.MOE_PERMUTE, pass_=Pass.FORWARD, group=CommGroup.EP,
        deepep=DeepEPMessage(32, 1e6, ((4, 0.5e6),), FlexBackend.HYBRIDEP),
    )  # fmt: skip
    assert comm_kernel_sms((a2a,)) == NCCL_P2P_CHANNELS == 32
    assert comm_kernel_sms((deepep,)) == DEEPEP_SMS == 20
    assert comm_kernel_sms((hybrid,)) == HYBRIDEP_SMS == 32
    assert comm_kernel_sms((_work("w", Pass.FORWARD),)) == 0


def test_memory_bound_compute_beside_the_all_to_all_is_not_slowed():
    layer = _layer(experts=False)
    for delay in (False, True):
        assert paired_saving_s(layer, _seconds({}), delay, H100) == pytest.approx(
            paired_saving_s(layer, _seconds({}), delay)
        )


def test_expert_gemms_longer_than_the_dispatch_lose_what_the_nccl_sms_take():
    """Every op 1 s: without the SMs the pair hides 4 s (test_costs_ep_overlap.py). The two
    middle phases run 4 s and 2 s of expert GEMMs beside a 1-s all-to-all: each ends
    1 · (1 − 100/132) s later (`sm_shared_phase_s`), the two others hold no GEMM."""
    layer = _layer(experts=True)
    assert paired_saving_s(layer, _seconds({})) == pytest.approx(4.0)
    assert paired_saving_s(layer, _seconds({}), hw=H100) == pytest.approx(4.0 - 2 * (1 - SHARE))


def test_a_communication_bound_pair_hides_as_much_as_before():
    """Every collective 10 s: the slowed GEMMs (4 / SHARE = 5.3 s) still end under them."""
    layer = _layer(experts=True)
    long = _seconds({"f.first": 10.0, "f.last": 10.0, "b.first": 10.0, "b.last": 10.0})
    assert paired_saving_s(layer, long, hw=H100) == pytest.approx(paired_saving_s(layer, long))
    assert paired_saving_s(layer, long, True, H100) == pytest.approx(paired_saving_s(layer, long, True))


def test_delayed_weight_gradients_lose_at_most_the_compute_beside_the_dispatches():
    """With `delay_wgrad` the middle is priced slowed, capped by the plain chain plus the
    work the compute loses while the two dispatches run: never more saving than without the
    SMs, never less than that cap allows."""
    layer = _layer(experts=True)
    plain = paired_saving_s(layer, _seconds({}), True)
    shared = paired_saving_s(layer, _seconds({}), True, H100)
    assert shared < plain
    assert shared >= plain - 2 * (1 - SHARE) - 1e-12
