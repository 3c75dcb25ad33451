"""Measurements -> the profile's `gpu` and `compute` sections.

The fit is chosen so that `simcluster.costs.compute` returns the measured time at every
measured kernel (up to the binning of memory-bound kernels):

- kernel_launch_us, the fixed cost the model adds to every op: on a GPU the empty-kernel
  launch (32 back-to-back one-element adds, per add); the host runs ahead of the GPU, so
  the eager framework's own cost per op hides behind kernels and is only recorded
  (`calibration.layer_overhead_us`). On a CPU nothing runs ahead: every op pays the
  framework in full, so it is the tiny-layer cost per op-graph op
  (`profiler.bench.microbench.layer_overhead_s`).
- gemm_points: each GEMM's rate FLOPs / (t − launch), since the model prices a GEMM as
  launch + FLOPs / rate; duplicate shapes keep the median rate.
- elementwise_points: the op graph's bytes / (t − launch) for every memory-bound site,
  pooled in bins one octave of bytes wide: bin rate = Σ bytes / Σ (t − launch), so the
  bin prices the sum of its kernels exactly. These are *effective* bandwidths of the
  eager layer (several torch kernels per op-graph op, see `profiler.bench.sites`).
- elementwise_points_by_op: the same pooling within each kernel kind
  (`costs.compute.elementwise_kind` of the op a site was timed for: "softmax.bwd",
  "dropout", "layernorm", ...; and the modern RoPE / SwiGLU / RMSNorm kernels timed in the
  measurement's layer mode, `MODERN_KINDS`), so a kind far from the others at the same bytes (a CPU's
  bernoulli mask draws, a GPU's fp32 softmax backward) is priced by its own curve; the
  pooled curve above stays for kinds no site measured (the embedding lookup and its
  gradient, the loss, the optimizer step).
- device envelope (GPU only): the sites are torch code (several eager kernels, or a
  compiled region, and an autograd call each) timed with CUDA events while the host runs
  ahead; where the host's issue time exceeds the kernel's, the events see the host
  (`calibration.device_envelope`: the eager `attn.context_copy.bwd` takes 0.2-0.3 ms from
  0.5 MB to 67 MB, the fused bias-dropout-add backward 0.2-0.34 ms up to 0.7 GB). In the
  real layer the host issues those while the GPU runs earlier kernels, so a GPU-bound layer
  pays the device time only: each kind's records split at its saturation bytes (the bytes
  its kernel moves in its host issue time), and a bin below them is priced at no less than
  the kind's rate over the records above (Σ bytes / Σ busy time), with the launch on top;
  the host's own cost per op is recorded apart (`calibration.layer_overhead_us`).
- peak: the datasheet's (GPU) or the best measured GEMM (CPU, or a GPU not in the table);
  gemm_max_efficiency = best measured GEMM / peak, the best being FLOPs / median time
  (no launch taken off: a tiny GEMM's time minus the launch estimate says nothing of the
  tensor cores). It is the ceiling `costs.compute` holds every unmeasured shape to.
- measured grid: the ranges of M, N, K and batch of the GEMMs, the bytes of each
  memory-bound kind and the attention lengths measured (`measured_grid`), recorded under
  `calibration:` so a reader sees which shapes a price was measured at and which were
  placed by the roofline.
- memory bandwidth: the datasheet's (GPU), with memory_bound_efficiency = large copy /
  datasheet; on a CPU the copy itself, efficiency 1.
(t − launch is floored at t / 4, so a kernel faster than the launch estimate still
gets a finite rate.)
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from simcluster import units
from simcluster.calibration.datasheets import datasheet_for
from simcluster.calibration.device_envelope import device_envelope
from simcluster.calibration.eager_traffic import EAGER_TRAFFIC, roofline_points
from simcluster.calibration.records import ElementwiseRecord, GemmRecord, Measurements, recorded_op_kind

MIN_BUSY_FRACTION = 0.25


def _busy_s(seconds: float, launch_s: float) -> float:
    return max(seconds - launch_s, MIN_BUSY_FRACTION * seconds)


def _sig(value: float, digits: int = 4) -> float:
    """Round to `digits` significant digits (readable YAML)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))


def gemm_points(meas: Measurements) -> list[dict[str, float]]:
    """One point per distinct (m, n, k, batch), median rate over duplicates."""
    rates: dict[tuple[int, int, int, int], list[float]] = defaultdict(list)
    for g in meas.gemms:
        rates[(g.m, g.n, g.k, g.batch)].append(g.flops / _busy_s(g.seconds, meas.launch_s))
    return [
        {
            "m": m,
            "n": n,
            "k": k,
            "batch": b,
            "tflop_per_s": _sig(units.flop_per_s_to_tflop_per_s(statistics.median(r))),
        }
        for (m, n, k, b), r in sorted(rates.items())
    ]


def elementwise_points(meas: Measurements) -> list[list[float]]:
    """(bytes, effective GB/s) per octave of bytes over every site, pooled as Σ bytes / Σ
    busy time (with the device envelope on a GPU)."""
    return _pooled_points(meas.elementwise, meas.launch_s, _is_gpu(meas))


def _is_gpu(meas: Measurements) -> bool:
    return meas.device.device_type == "cuda"


MODERN_KINDS = {
    "rms_norm.forward": "rmsnorm",
    "rms_norm.backward": "rmsnorm.bwd",
    "rope.forward": "rope",
    "rope.backward": "rope.bwd",
    "swiglu.forward": "swiglu",
    "swiglu.backward": "swiglu.bwd",
}
"""The modern memory-bound kernels (`profiler.bench.modern_kernels`) -> the kind their curve is
kept under: the op graph's kind (`costs.compute.elementwise_kind`), whose bytes are counted
alike there (SwiGLU 3·e·T·f forward, 5·e·T·f backward; RoPE one read and one write of the
rotated tensor; a norm 2·e per element forward). An RMSNorm op is of kind "rmsnorm" (`Op.kernel`)
and priced by this curve; a profile without one prices it as "layernorm" (the paper layer's
one-kernel LayerNorm sites)."""


def modern_elementwise(meas: Measurements) -> dict[str, list[ElementwiseRecord]]:
    """kind -> the modern memory-bound records timed in the measurement's own layer mode
    (a fused microbench times them eager too; an eager profile takes only the eager ones)."""
    by_kind: dict[str, list[ElementwiseRecord]] = defaultdict(list)
    for k in meas.modern:
        if k.kind == "memory_bound" and k.layer_mode == meas.layer_mode and k.name in MODERN_KINDS:
            by_kind[MODERN_KINDS[k.name]].append(
                ElementwiseRecord(k.name, k.dims, k.bytes_moved, k.seconds, k.spread, k.name)
            )
    return by_kind


def elementwise_points_by_op(meas: Measurements) -> dict[str, list[list[float]]]:
    """kind -> (bytes, effective GB/s) per octave of bytes over that kind's sites, pooled as
    in `elementwise_points`, with the modern kinds of the measurement's mode
    (`modern_elementwise`). Records without an op (older measurements) are left out. On a
    GPU in eager mode, the eager RMSNorm / RoPE / SwiGLU kinds no record measured are priced
    at the roofline of the bytes their eager kernels move (`eager_traffic`)."""
    by_kind: dict[str, list[ElementwiseRecord]] = defaultdict(list)
    for e in meas.elementwise:
        if e.op:
            by_kind[recorded_op_kind(e.op)].append(e)
    for kind, records in modern_elementwise(meas).items():
        by_kind[kind] += records
    curves = {kind: _pooled_points(by_kind[kind], meas.launch_s, _is_gpu(meas)) for kind in sorted(by_kind)}
    measured = {kind: points for kind, points in curves.items() if points}
    if _eager_gpu(meas):  # the eager modern regions none timed
        return {**measured, **roofline_points(copy_gb_per_s(meas), set(measured))}
    return measured


def _eager_gpu(meas: Measurements) -> bool:
    """A GPU's eager sites: its unmeasured eager regions are priced by their traffic."""
    return _is_gpu(meas) and meas.layer_mode == "eager"


def _pooled_points(records: list[ElementwiseRecord], launch_s: float, envelope: bool) -> list[list[float]]:
    """(bytes, GB/s) per octave of bytes, Σ bytes / Σ busy time; with `envelope`, a bin that
    starts below the records' saturation bytes is priced at no less than their device rate
    (`device_envelope.device_envelope`)."""
    bins: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in records:
        if e.bytes_moved > 0:
            bins[math.floor(math.log2(e.bytes_moved))].append((e.bytes_moved, _busy_s(e.seconds, launch_s)))
    floor, saturation = device_envelope(records, lambda s: _busy_s(s, launch_s)) if envelope else (0.0, 0.0)
    points = []
    for key in sorted(bins):
        members = bins[key]
        size = math.exp(statistics.fmean(math.log(b) for b, _ in members))
        rate = sum(b for b, _ in members) / sum(s for _, s in members)
        if 2.0**key < saturation:
            rate = max(rate, floor)
        points.append([_sig(size), _sig(units.bytes_to_gb(rate))])
    return points


def _rate_tflop(record: GemmRecord, launch_s: float) -> float:
    return units.flop_per_s_to_tflop_per_s(record.flops / _busy_s(record.seconds, launch_s))


def best_gemm_tflop_per_s(meas: Measurements) -> float:
    """The fastest GEMM measured: FLOPs / median time over the layer's GEMMs and the square
    one (module docstring)."""
    return max(units.flop_per_s_to_tflop_per_s(g.flops / g.seconds) for g in [*meas.gemms, meas.peak_gemm])


def copy_gb_per_s(meas: Measurements) -> float:
    return units.bytes_to_gb(meas.copy_bytes / meas.copy_s)


def gpu_section(meas: Measurements) -> dict[str, Any]:
    """Name, peaks, memory, bandwidth and SMs (or cores), each with its source."""
    dev = meas.device
    best = _sig(best_gemm_tflop_per_s(meas))
    fp32 = _sig(_rate_tflop(meas.peak_gemm_fp32, meas.launch_s))
    copy = _sig(copy_gb_per_s(meas))
    where = f"measured on this device, {dev.date}"
    sheet = datasheet_for(dev.name) if dev.device_type == "cuda" else None
    section: dict[str, Any] = {
        "name": dev.name,
        "peak_bf16_tflop_per_s": best,
        "peak_fp32_tflop_per_s": fp32,
        "memory_gb": _sig(dev.memory_gb),
        "memory_bandwidth_gb_per_s": copy,
        "num_sms": dev.num_sms,
    }
    sources = {
        "peak_bf16_tflop_per_s": f"best measured bf16 GEMM ({where}); no datasheet peak used",
        "peak_fp32_tflop_per_s": f"measured fp32 {meas.peak_gemm_fp32.m}³ GEMM ({where})",
        "memory_gb": "total_memory (torch.cuda.get_device_properties)"
        if dev.device_type == "cuda"
        else "host RAM (sysconf)",
        "memory_bandwidth_gb_per_s": f"large device copy, bytes read + written / time ({where})",
        "num_sms": (
            "multi_processor_count (torch.cuda.get_device_properties)"
            if dev.device_type == "cuda"
            else f"os.cpu_count(); timed on {dev.num_threads} intra-op thread(s)"
        ),
    }
    if sheet is not None:
        section.update(
            peak_bf16_tflop_per_s=sheet.peak_bf16_tflop_per_s,
            peak_fp32_tflop_per_s=sheet.peak_fp32_tflop_per_s,
            memory_bandwidth_gb_per_s=sheet.memory_bandwidth_gb_per_s,
        )
        for key in ("peak_bf16_tflop_per_s", "peak_fp32_tflop_per_s", "memory_bandwidth_gb_per_s"):
            sources[key] = sheet.source
    elif dev.device_type == "cuda" and dev.memory_clock_khz and dev.memory_bus_width_bits:
        section["memory_bandwidth_gb_per_s"] = _sig(
            2 * dev.memory_clock_khz * 1e3 * dev.memory_bus_width_bits / 8 / 1e9
        )
        sources["memory_bandwidth_gb_per_s"] = "2 × memory clock × bus width (device properties)"
    section["sources"] = sources
    return section


def compute_section(meas: Measurements, gpu: dict[str, Any], gemm_tiles: list[Any]) -> dict[str, Any]:
    """The compute model: measured tables plus the three scalar constants."""
    where = f"{meas.device.name}, {meas.device.date}"
    best = _sig(best_gemm_tflop_per_s(meas))
    copy = _sig(copy_gb_per_s(meas))
    points = gemm_points(meas)
    by_op = elementwise_points_by_op(meas)
    return {
        "gemm_max_efficiency": _sig(min(1.0, best / gpu["peak_bf16_tflop_per_s"])),
        "memory_bound_efficiency": _sig(min(1.0, copy / gpu["memory_bandwidth_gb_per_s"])),
        "kernel_launch_us": _sig(per_op_s(meas) / units.SECONDS_PER_US),
        "gemm_tiles": [list(t) for t in gemm_tiles],
        "gemm_points": points,
        "elementwise_points": elementwise_points(meas),
        "elementwise_points_by_op": by_op,
        "sources": {
            "gemm_max_efficiency": f"best measured bf16 GEMM, {_sig(best)} TFLOP/s, over the peak ({where})",
            "memory_bound_efficiency": f"large device copy, {_sig(copy)} GB/s, over the bandwidth ({where})",
            "kernel_launch_us": f"{_PER_OP_NOTE[meas.device.device_type == 'cuda']} ({where})",
            "gemm_points": (
                f"{len(points)} distinct GEMM shapes of the layer's op graph (forward, input "
                f"grad, weight grad, attention) at shard shapes, rate = FLOPs / (median time − "
                f"launch) ({where})"
            ),
            "elementwise_points": (
                "the layer's memory-bound sites as eager torch runs them, op-graph "
                f"bytes / (median time − launch), pooled per octave ({where})"
            ),
            "elementwise_points_by_op": (
                f"the same sites per kernel kind ({len(by_op)} kinds: "
                "simcluster.costs.compute.elementwise_kind of the op each site was timed for), "
                f"pooled per octave within a kind ({where})" + _roofline_note(meas, by_op)
            ),
        },
    }


def _roofline_note(meas: Measurements, by_op: dict[str, list[list[float]]]) -> str:
    """Which kinds of `by_op` no site measured: priced by their eager traffic's roofline."""
    measured = _measured_kinds(meas)
    placed = [kind for kind in EAGER_TRAFFIC if kind in by_op and kind not in measured]
    if not placed or not _eager_gpu(meas):
        return ""
    return (
        f"; not measured, at the roofline of their eager kernels' bytes (copy bandwidth / bytes "
        f"ratio, simcluster.calibration.eager_traffic): {', '.join(placed)}"
    )


def _measured_kinds(meas: Measurements) -> set[str]:
    kinds = {recorded_op_kind(e.op) for e in meas.elementwise if e.op}
    return kinds | set(modern_elementwise(meas))


def per_op_s(meas: Measurements) -> float:
    """The model's fixed seconds per op for this device (module docstring)."""
    return meas.launch_s if meas.device.device_type == "cuda" else meas.layer_overhead_s


_PER_OP_NOTE = {
    True: "32 back-to-back one-element in-place adds, median time per add",
    False: "eager cost per op-graph op of a real layer too small for its kernels to matter "
    "(h 64, s 8, b 1; t 1 and 8, SP off / on, every recompute; median)",
}


GEMM_RULE = (
    "measured: a measured shape, its own rate; interpolated: a batched GEMM inside [min, max] "
    "of M, N and K, batch at least the smallest measured (e.g. attention head dim 96 between "
    "measured 64 and 128), the blend of its nearest measured shapes held within their rates "
    "(beyond the largest batch: their plateau); wave_model: any other shape, the "
    "blend moved by the wave model, at most the best GEMM, its time at least its bytes over "
    "the copy bandwidth (simcluster.costs.compute.gemm_placement)"
)


def measured_grid(meas: Measurements) -> dict[str, Any]:
    """Which shapes were measured: [min, max] of the GEMMs' M, N, K and batch, of each
    memory-bound kind's bytes, and of the fused-attention lengths. `costs.compute` prices a
    measured GEMM shape as measured and holds every other to the roofline of the measured
    ceilings (best GEMM, copy bandwidth); a memory-bound kind is held flat beyond its range."""
    grid: dict[str, Any] = {}
    if meas.gemms:
        grid["gemm"] = {
            dim: [min(getattr(g, dim) for g in meas.gemms), max(getattr(g, dim) for g in meas.gemms)]
            for dim in ("m", "n", "k", "batch")
        }
        grid["gemm_shapes"] = len({(g.m, g.n, g.k, g.batch) for g in meas.gemms})
        grid["gemm_rule"] = GEMM_RULE
        head_dims = sorted({g.k for g in meas.gemms if g.name == "bmm_qk"})
        if head_dims:
            grid["attention_bmm_head_dims"] = head_dims
    by_kind: dict[str, list[float]] = defaultdict(list)
    for e in meas.elementwise:
        by_kind[recorded_op_kind(e.op) if e.op else "unlabelled"].append(e.bytes_moved)
    for kind, records in modern_elementwise(meas).items():
        by_kind[kind] += [r.bytes_moved for r in records]
    if by_kind:
        grid["memory_bound_bytes"] = {
            kind: [_sig(min(sizes)), _sig(max(sizes))] for kind, sizes in sorted(by_kind.items())
        }
    if meas.attention:
        lengths = [a.seq_length for a in meas.attention]
        grid["attention_seq_lengths"] = [min(lengths), max(lengths)]
        grid["attention_head_dims"] = sorted({a.head_dim for a in meas.attention})
    return grid
