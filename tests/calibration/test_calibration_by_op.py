"""Per-kind element-wise curves: fitted from the sites' records, written, priced back."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simcluster.calibration.eager_traffic import EAGER_TRAFFIC
from simcluster.calibration.fit import elementwise_points, elementwise_points_by_op
from simcluster.calibration.profile import build_profile, to_yaml
from simcluster.calibration.records import ElementwiseRecord, Measurements, recorded_op_kind
from simcluster.calibration.shapes import TP_DEGREES, all_grids
from simcluster.config.choices import Dtype
from simcluster.config.hardware import parse_hardware
from simcluster.costs.chunk import op_time_s
from simcluster.costs.compute import elementwise_time_s
from simcluster.costs.network import GroupPlacement
from simcluster.profiler.bench.kernels import benchmark_for
from simcluster.profiler.bench.microbench import plan_benchmarks
from simcluster.workload.layer import layer_ops
from simcluster.workload.ops import Module, OpKind, Pass, elementwise
from tests.calibration.test_calibration_fit import LAUNCH_S, _measurements

MIB = 1024.0**2
ONE = GroupPlacement(num_ranks=1, ranks_per_node=1)

# Four sites in one octave (1-2 MiB): two layer norms at 1 MiB / 2 µs busy, a dropout at
# 1.5 MiB / 12 µs busy, and a record written before ops were recorded (op "").
SITES = [
    ElementwiseRecord("layer_norm.forward", (512, 1024), MIB, LAUNCH_S + 2e-6, 0.0, "ln1"),
    ElementwiseRecord("layer_norm.forward", (512, 1024), MIB, LAUNCH_S + 2e-6, 0.0, "ln2"),
    ElementwiseRecord(
        "attention_dropout.forward", (2, 4, 384), 1.5 * MIB, LAUNCH_S + 12e-6, 0.0, "attn.dropout"
    ),
    ElementwiseRecord("gelu.forward", (256, 2048), 1.5 * MIB, LAUNCH_S + 4e-6, 0.0),
]


@pytest.fixture(scope="module")
def profile():
    return parse_hardware(build_profile(_measurements([], SITES)), "by-op.yaml")


def test_sites_pool_per_kind_and_records_without_an_op_only_feed_the_generic_curve() -> None:
    """layernorm: 2 MiB / 4 µs; dropout: 1.5 MiB / 12 µs; generic: 5 MiB / 20 µs. (An eager
    GPU file: the eager modern kinds no site measured are at their traffic's roofline.)"""
    by_op = elementwise_points_by_op(_measurements([], SITES))
    assert sorted(set(by_op) - set(EAGER_TRAFFIC)) == ["dropout", "layernorm"]
    assert by_op["layernorm"] == [
        [pytest.approx(MIB, rel=1e-3), pytest.approx(2 * MIB / 4e-6 / 1e9, rel=1e-3)]
    ]
    assert by_op["dropout"] == [
        [pytest.approx(1.5 * MIB, rel=1e-3), pytest.approx(1.5 * MIB / 12e-6 / 1e9, rel=1e-3)]
    ]
    (generic,) = elementwise_points(_measurements([], SITES))
    assert generic[1] == pytest.approx(5 * MIB / 20e-6 / 1e9, rel=1e-3)


def test_each_kind_prices_back_its_own_measured_time(profile) -> None:
    """The generic curve would price both at 5 MiB / 20 µs; each kind gets its own time back."""
    assert elementwise_time_s(MIB, profile, "layernorm") == pytest.approx(LAUNCH_S + 2e-6, rel=1e-3)
    assert elementwise_time_s(1.5 * MIB, profile, "dropout") == pytest.approx(LAUNCH_S + 12e-6, rel=1e-3)
    assert elementwise_time_s(1.5 * MIB, profile, "softmax") == pytest.approx(
        LAUNCH_S + 1.5 * MIB / (5 * MIB / 20e-6), rel=1e-3
    )


def test_the_op_graph_pricer_uses_the_kind_curves(profile) -> None:
    """`ln2` and `attn.dropout` as the chunk pricer sees them: their sites' times."""
    norm = elementwise("ln2", MIB, module=Module.LAYERNORM, pass_=Pass.FORWARD)
    drop = elementwise("attn.dropout", 1.5 * MIB, module=Module.ATTENTION_DROPOUT, pass_=Pass.FORWARD)
    assert op_time_s(norm, profile, ONE, Dtype.BF16) == pytest.approx(LAUNCH_S + 2e-6, rel=1e-3)
    assert op_time_s(drop, profile, ONE, Dtype.BF16) == pytest.approx(LAUNCH_S + 12e-6, rel=1e-3)


def test_the_table_is_written_with_its_source(profile) -> None:
    text = to_yaml(build_profile(_measurements([], SITES)))
    assert "  elementwise_points_by_op:\n    dropout:\n" in text
    assert "elementwise_points_by_op" in profile.compute.sources


def test_older_measurements_without_ops_still_load() -> None:
    """A JSON written before `op` was recorded loads, with op '' on every site."""
    meas = _measurements([], SITES)
    data = json.loads(meas.to_json())
    for e in data["elementwise"]:
        e.pop("op")
    old = Measurements.from_json(json.dumps(data))
    assert [e.op for e in old.elementwise] == [""] * len(SITES)
    assert old == dataclasses.replace(meas, elementwise=[dataclasses.replace(e, op="") for e in SITES])


def test_every_site_stands_for_ops_of_one_kind() -> None:
    """Over every op of the quick grid (t, SP), a site benchmark stands for ops of one kind
    only (the fit cannot mix two kinds in one record), and it records the op it times."""
    kinds: dict[str, set[str]] = {}
    for shape in all_grids()["quick"][0]:
        for tp in TP_DEGREES:
            for sp in (False, True):
                cfg = shape.config(tp, sp)
                ops = layer_ops(cfg)
                for op in ops.forward + ops.backward:
                    bench = benchmark_for(op, cfg)
                    if bench is None or bench.gemm is not None:
                        continue
                    if op.kind is OpKind.ELEMENTWISE:
                        assert bench.op == op.name
                    kinds.setdefault(bench.name, set()).add(recorded_op_kind(bench.op))
    assert all(len(k) == 1 for k in kinds.values()), kinds
    assert kinds["softmax.backward"] == {"softmax.bwd"}
    assert kinds["attention_dropout.forward"] == {"dropout"}
    assert kinds["residual_add.forward"] == {"residual_grad_add"}
    assert kinds["standin_all_gather"] == {"standin_all_gather"}
    assert kinds["standin_reduce_scatter"] == {"standin_reduce_scatter"}


def test_the_plan_records_an_op_for_every_site() -> None:
    assert all(b.op for b in plan_benchmarks(all_grids()["quick"][0]) if b.gemm is None)
