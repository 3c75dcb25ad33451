"""The grouped expert GEMM microbench kind on the CPU with tiny shapes
(`profiler.bench.grouped_gemm`): each call computes what the op graph's GEMM says, the
grouped kernel and the loop agree, a device without the grouped kernel falls back to the loop
and says so, and `microbench --grouped-gemm` records them."""

from __future__ import annotations

import json
import re

import pytest
import torch

from simcluster.calibration.grouped_shapes import GroupedShape, grouped_grid
from simcluster.profiler.bench import grouped_gemm
from simcluster.profiler.bench.grouped_gemm import _operands, build_grouped, time_grouped
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.microbench import main
from simcluster.profiler.bench.timing import Timer, TimingPolicy, device_generator
from tests.paths import ROOT

CPU = torch.device("cpu")


def _ctx(seed: int = 0) -> BuildContext:
    return BuildContext(CPU, torch.float32, device_generator(CPU, seed))


def _timer() -> Timer:
    return Timer(CPU, TimingPolicy.for_device("cpu", quick=True))


@pytest.mark.parametrize("shape", grouped_grid(quick=True)[12:18], ids=lambda s: s.kind)
def test_each_call_computes_the_op_graphs_gemm_per_expert(shape: GroupedShape):
    """The output is G blocks of the op graph's C[m, n] = A[m, k] B[k, n], and the grouped
    kernel's blocks equal the loop's on the same bf16 inputs (up to summation order)."""
    assert shape.groups == 2
    torch.manual_seed(0)
    ctx = _ctx()
    a, b = _operands(ctx, shape)
    t = shape.tokens
    if shape.kind.endswith(".wgrad"):
        blocks = [a[:, i * t : (i + 1) * t] @ b[i * t : (i + 1) * t] for i in range(shape.groups)]
    else:
        blocks = [a[i * t : (i + 1) * t] @ b[i] for i in range(shape.groups)]
    assert all(tuple(block.shape) == (shape.m, shape.n) for block in blocks)
    bf16 = BuildContext(CPU, torch.bfloat16, device_generator(CPU, 1))
    grouped = build_grouped(shape, "grouped_mm")(bf16)()
    loop = build_grouped(shape, "loop")(BuildContext(CPU, torch.bfloat16, device_generator(CPU, 1)))()
    stacked = torch.stack(list(loop)) if shape.kind.endswith(".wgrad") else torch.cat(list(loop))
    assert torch.allclose(grouped.float(), stacked.float(), rtol=2e-2, atol=2e-2)


def test_records_say_which_implementation_ran():
    shapes = grouped_grid(quick=True)[:6]
    grouped, skipped = time_grouped(_timer(), _ctx(), shapes, lambda: (None, None), impl="grouped_mm")
    loop, _ = time_grouped(_timer(), _ctx(), shapes, lambda: (None, None), impl="loop")
    assert not skipped and {r.impl for r in grouped} == {"grouped_mm"} and {r.impl for r in loop} == {"loop"}
    assert [(r.kind, r.groups, r.m, r.n, r.k) for r in grouped] == [
        (s.kind, s.groups, s.m, s.n, s.k) for s in shapes
    ]
    assert all(r.seconds > 0 and r.flops == s.flops for r, s in zip(grouped, shapes))


def test_auto_falls_back_to_the_loop_where_the_grouped_kernel_raises(monkeypatch):
    def unsupported(*args, **kwargs):
        raise RuntimeError("grouped gemm is not supported on this device")

    monkeypatch.setattr(grouped_gemm.torch, "_grouped_mm", unsupported)
    records, skipped = time_grouped(_timer(), _ctx(), grouped_grid(quick=True)[:2], lambda: (None, None))
    assert not skipped and [r.impl for r in records] == ["loop", "loop"]
    forced, forced_skipped = time_grouped(
        _timer(), _ctx(), grouped_grid(quick=True)[:1], lambda: (None, None), impl="grouped_mm"
    )
    assert forced == [] and "not supported" in forced_skipped[0]


def test_a_time_bound_skips_the_rest_and_says_why():
    records, skipped = time_grouped(
        _timer(), _ctx(), grouped_grid(quick=True)[:3], lambda: (None, None), max_s=-1
    )
    assert records == [] and len(skipped) == 3 and "--grouped-max-s" in skipped[0]
    with pytest.raises(ValueError, match="allowed: auto, grouped_mm, loop"):
        time_grouped(_timer(), _ctx(), [], lambda: (None, None), impl="cublas")


def test_microbench_records_the_grouped_kind(tmp_path):
    out = tmp_path / "mb.json"
    main(["--device", "cpu", "--quick", "--limit", "1", "--grouped-gemm", "--out", str(out)])
    data = json.loads(out.read_text())
    assert len(data["grouped_gemms"]) == len(grouped_grid(quick=True))
    assert {g["impl"] for g in data["grouped_gemms"]} <= {"grouped_mm", "loop"}
    assert {g["kind"] for g in data["grouped_gemms"]} == {
        "fc1", "fc2", "fc1.dgrad", "fc2.dgrad", "fc1.wgrad", "fc2.wgrad"
    }  # fmt: skip


def test_the_gpu_script_times_them_within_its_eight_minutes():
    """scripts/gpu_calibrate.sh runs the grouped kind in the full run, bounded by
    --grouped-max-s, and its step limits still sum to at most 480 s."""
    script = (ROOT / "scripts" / "gpu_calibrate.sh").read_text()
    full = next(line for line in script.splitlines() if line.strip().startswith("MB=(--modern"))
    assert "--grouped-gemm" in full and "--grouped-max-s 15" in full
    limits = [int(n) for n in re.findall(r"\$\(\((\d+) \* SCALE\)\)", script)]
    limits.remove(30)  # the smoke run's gpu_memory; the full run's is the literal below
    assert sum(limits) + int(re.search(r"step gpu_memory (\d+) ", script).group(1)) <= 480
