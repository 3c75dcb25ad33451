"""What calibration measures: exactly the op graph's kernels, never the held-out shapes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simcluster.calibration.shapes import TP_DEGREES, LayerShape, all_grids, standin_ops
from simcluster.profiler.bench.kernels import benchmark_for
from simcluster.profiler.bench.microbench import plan_benchmarks
from simcluster.workload.layer import layer_ops
from simcluster.workload.ops import CollectiveKind, Module, OpKind, Pass, collective, elementwise
from tests.paths import ROOT

F = Pass.FORWARD


@pytest.mark.parametrize("grid", list(all_grids()))
def test_held_out_shapes_share_no_hidden_size_or_token_count(grid: str) -> None:
    """check-profile's h and s·b values appear in no calibration shape."""
    calibration, held_out = all_grids()[grid]
    assert not {s.hidden_size for s in held_out} & {s.hidden_size for s in calibration}
    assert not {s.tokens for s in held_out} & {s.tokens for s in calibration}


@pytest.mark.parametrize("grid", list(all_grids()))
def test_every_shape_splits_over_eight_ranks(grid: str) -> None:
    """a and s divide by every t, so each grid runs t ∈ {1, 2, 4, 8} with SP."""
    for shape in (*all_grids()[grid][0], *all_grids()[grid][1]):
        assert shape.num_attention_heads % 8 == 0 and shape.seq_length % 8 == 0


def test_plan_times_every_gemm_of_the_op_graph() -> None:
    """Each GEMM of forward and backward at t = 1, 2, 4, 8 (SP on and off) is planned."""
    shapes = all_grids()["quick"][0]
    planned = {b.gemm for b in plan_benchmarks(shapes) if b.gemm is not None}
    wanted = set()
    for shape in shapes:
        for tp in TP_DEGREES:
            for sp in (False, True):
                ops = layer_ops(shape.config(tp, sp))
                wanted |= {
                    (g.m, g.n, g.k, g.batch)
                    for op in ops.forward + ops.backward
                    if (g := op.gemm) is not None
                }
    assert planned == wanted


def test_every_element_wise_op_has_a_site() -> None:
    """No op of the op graph is left without a benchmark (a new op must add one)."""
    cfg = LayerShape(256, 8, 64, 2).config(4, True)
    ops = layer_ops(cfg)
    for op in ops.forward + ops.backward:
        bench = benchmark_for(op, cfg)
        assert bench is not None or op.collective is CollectiveKind.ALL_REDUCE


def test_standin_copies_are_priced_as_the_stand_in_makes_them() -> None:
    """t = 4: all-gather of 8 MB → 16 MB copied; reduce-scatter of 8 MB → 4 MB; all-reduce: 0."""
    ops = (
        collective("ag", CollectiveKind.ALL_GATHER, 8e6, module=Module.QKV, pass_=F),
        collective("rs", CollectiveKind.REDUCE_SCATTER, 8e6, module=Module.PROJ, pass_=F),
        collective("ar", CollectiveKind.ALL_REDUCE, 8e6, module=Module.PROJ, pass_=F),
        elementwise("ln", 1e6, module=Module.LAYERNORM, pass_=F),
    )
    out = standin_ops(ops, 4)
    assert [(op.kind, op.bytes_moved) for op in out] == [
        (OpKind.ELEMENTWISE, 16e6),
        (OpKind.ELEMENTWISE, 4e6),
        (OpKind.ELEMENTWISE, 1e6),
    ]
    assert standin_ops(ops[:2], 1) == ()


def test_measuring_code_needs_torch_and_the_standard_library_only() -> None:
    """The profiler's measuring modules import with pydantic, yaml, simpy, numpy blocked."""
    blocked = ["pydantic", "yaml", "simpy", "numpy", "pandas", "typer", "tqdm"]
    code = (
        f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
        "import simcluster.profiler.bench.microbench, simcluster.profiler.bench.layer_timing, "
        "simcluster.profiler.bench.netbench\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_fitting_and_checking_saved_measurements_need_no_torch() -> None:
    """`calibrate --measurements` / `check-profile --measurements` run where torch is absent."""
    code = (
        "import sys\nsys.modules['torch'] = None\n"
        "import simcluster.calibration.profile, simcluster.calibration.check, "
        "simcluster.calibration.report, simcluster.cli\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
