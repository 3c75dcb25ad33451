"""The routed experts' grouped GEMMs, timed as Megatron-core runs them (issue 18).

With `--moe-grouped-gemm` Megatron-core runs each local expert's fc1 and fc2, forward and
backward, as one grouped call over the G local experts with the tokens of each expert
contiguous (Transformer Engine `GroupedLinear`, `m_splits`; megatron/core/transformer/moe/
experts.py `TEGroupedMLP`); without it, `SequentialMLP` loops over the experts with one GEMM
each. Here every shape of `calibration.grouped_shapes.grouped_grid` runs as

- "grouped_mm": `torch._grouped_mm` with `offs` (the cumulative tokens per expert), one
  kernel over the groups (CUTLASS's grouped kernel on Hopper), where torch has it and it runs
  on this device and dtype; otherwise
- "loop": one `torch.matmul` per expert on its slice, as SequentialMLP does,

and each record says which ran (`GroupedGemmRecord.impl`). Layouts as the layer holds them
(op graph coordinates C[m, n] = A[m, k] B[k, n], `workload.moe_layer`):

- forward (fc1, fc2): x [G·M, k] times each expert's weight [n, k] transposed;
- dgrad: grad [G·M, k] times each expert's weight [k, n] (the weight as stored, [out, in]);
- wgrad: per expert xᵀ [m, T] times grad [T, n] (T = tokens per expert, the k axis); the
  output is bf16 here, where TE accumulates into fp32 main_grad (the op graph's
  `accumulate_fp32` bytes; the FLOPs are the same).

Tokens are split evenly (M per expert): the busiest rank's mean expert, as the op graph
prices it. `max_s` stops starting new shapes after that many seconds, so a step under a time
limit still writes its file (the rest are listed as skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import Tensor

from simcluster.calibration.grouped_shapes import GroupedShape
from simcluster.calibration.records import GroupedGemmRecord
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.timing import Call, Timer, median_and_spread

IMPLS = ("auto", "grouped_mm", "loop")


def _offsets(shape: GroupedShape, device: torch.device) -> Tensor:
    """Cumulative tokens at the end of each expert's rows (int32, as `_grouped_mm` takes them)."""
    return torch.arange(1, shape.groups + 1, device=device, dtype=torch.int32) * shape.tokens


def _operands(ctx: BuildContext, shape: GroupedShape) -> tuple[Tensor, Tensor]:
    """(A stacked over the experts' rows, B per expert) as the layer holds them (module
    docstring): the grouped call computes A_g @ B_g for each expert g."""
    g, m, n, k = shape.groups, shape.m, shape.n, shape.k
    if shape.kind.endswith(".wgrad"):
        x = ctx.randn(g * k, m)  # the expert's input rows [T, m]
        grad = ctx.randn(g * k, n)  # its output gradient [T, n]
        return x.t(), grad  # [m, G·T] and [G·T, n]: K-grouped
    if shape.kind.endswith(".dgrad"):
        return ctx.randn(g * m, k), ctx.randn(g, k, n, scale=0.02)  # grad rows, weights [out, in]
    return ctx.randn(g * m, k), ctx.randn(g, n, k, scale=0.02).transpose(1, 2)  # x rows, Wᵀ views


def build_grouped(shape: GroupedShape, impl: str) -> Callable[[BuildContext], Call]:
    """A builder of one input set and the call that runs `shape` with `impl` ("grouped_mm",
    "loop"); the grouped call runs once at build, so a device without it raises here."""

    def build(ctx: BuildContext) -> Call:
        a, b = _operands(ctx, shape)
        offs = _offsets(shape, ctx.device)
        if impl == "grouped_mm":
            call = lambda: torch._grouped_mm(a, b, offs=offs)  # noqa: E731
            call()
            return call
        t = shape.tokens
        if shape.kind.endswith(".wgrad"):
            return lambda: [a[:, i * t : (i + 1) * t] @ b[i * t : (i + 1) * t] for i in range(shape.groups)]
        return lambda: [a[i * t : (i + 1) * t] @ b[i] for i in range(shape.groups)]

    return build


def time_grouped(
    timer: Timer,
    ctx: BuildContext,
    shapes: list[GroupedShape],
    read_sensors: Callable[[], tuple[float | None, float | None]],
    before_each: Callable[[], None] = lambda: None,
    on_step: Callable[[str], None] = lambda label: None,
    impl: str = "auto",
    max_s: float | None = None,
) -> tuple[list[GroupedGemmRecord], list[str]]:
    """(records, skipped 'grouped kind G m n k: reason') of every shape; "auto" takes
    `torch._grouped_mm` where it runs and the loop otherwise."""
    if impl not in IMPLS:
        raise ValueError(f"grouped GEMM impl {impl!r}: allowed: {', '.join(IMPLS)}")
    records: list[GroupedGemmRecord] = []
    skipped: list[str] = []
    start = time.monotonic()
    for shape in shapes:
        label = f"grouped {shape.kind} {(shape.groups, shape.m, shape.n, shape.k)}"
        if max_s is not None and time.monotonic() - start > max_s:
            skipped.append(f"{label}: not started, past --grouped-max-s {max_s:g}")
            continue
        before_each()
        try:
            used, seconds, spread = _time_one(timer, ctx, shape, impl)
        except (RuntimeError, TypeError, NotImplementedError) as error:
            skipped.append(f"{label}: {str(error).splitlines()[0][:160]}")
            on_step(f"{label} skipped")
            continue
        clock, power = read_sensors()
        records.append(
            GroupedGemmRecord(
                shape.kind, shape.groups, shape.m, shape.n, shape.k, seconds, spread, used, shape.model,
                clock, power,
            )
        )  # fmt: skip
        on_step(f"{label} {used}")
    return records, skipped


def _time_one(timer: Timer, ctx: BuildContext, shape: GroupedShape, impl: str) -> tuple[str, float, float]:
    """(impl used, median seconds, spread); "auto" falls back to the loop where the grouped
    kernel raises (no `torch._grouped_mm`, an unsupported device, dtype or alignment)."""
    order = ("grouped_mm", "loop") if impl == "auto" else (impl,)
    for i, candidate in enumerate(order):
        if candidate == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
            if i + 1 < len(order):
                continue
            raise NotImplementedError("torch has no _grouped_mm")
        builder = build_grouped(shape, candidate)
        try:
            io_bytes = 2.0 * (shape.groups * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n))
            calls = [builder(ctx) for _ in range(timer.num_buffers(io_bytes))]
        except (RuntimeError, TypeError, NotImplementedError):
            if i + 1 < len(order):
                continue
            raise
        seconds, spread = median_and_spread(timer.times_s(calls))
        del calls
        return candidate, seconds, spread
    raise RuntimeError("no grouped GEMM implementation ran")  # unreachable: the loop raises first
