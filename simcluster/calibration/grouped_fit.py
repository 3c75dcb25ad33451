"""Measured grouped expert GEMMs -> the profile's `compute.grouped_gemm_points` (issue 18).

The fit keeps what `costs.grouped_gemm` needs to return the measured time at every measured
shape: each distinct (kind, G, m, n, k) at rate = FLOPs / (median time − launch) (the model
prices launch + FLOPs / rate; the busy time floored at a quarter of the time, as for the
layer's GEMMs in `fit`), the median rate over duplicates. Per kind, the points of one G and
hidden shape form the efficiency curve over tokens per expert that `costs.grouped_gemm`
interpolates (log rate linear in log M, series blended in log G and the hidden dims), and
bounds outside the grid by the physical ceilings: at most the best large GEMM
(peak · gemm_max_efficiency), at least the bytes over the copy bandwidth.

`grouped_measured_grid` records under `calibration.measured_grid.grouped_gemm` which shapes
were measured (per kind: G, tokens per expert and the hidden dims as [min, max]), the models
whose expert shapes were timed, and which implementation ran (`torch._grouped_mm` or a loop of
GEMMs), so a reader sees which prices are measured and which are bounded.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any

from simcluster import units
from simcluster.calibration.fit import _busy_s, _sig
from simcluster.calibration.records import GroupedGemmRecord, Measurements
from simcluster.workload.grouped_gemm import series_key, tokens_per_expert

GROUPED_RULE = (
    "measured: a measured (kind, G, m, n, k), its own rate; interpolated / bounded: per kind, "
    "log rate linear in log tokens per expert along each measured (G, hidden dims) series and "
    "flat beyond its ends, the two nearest series in log(G, hidden dims) blended by 1/distance², "
    "at most the best GEMM (peak · gemm_max_efficiency), its time at least its bytes over the copy "
    "bandwidth (simcluster.costs.grouped_gemm)"
)


def grouped_gemm_points(
    meas: Measurements, launch_s: float | None = None, ceiling_tflop_per_s: float | None = None
) -> list[dict[str, Any]]:
    """One point per distinct (kind, G, m, n, k), the median rate over duplicates.

    rate = FLOPs / (time − `launch_s`), `launch_s` being the launch the pricing profile adds
    (`costs.grouped_gemm` prices launch + FLOPs / rate); default the file's own, as `calibrate`
    writes it into the profile it fits. With `ceiling_tflop_per_s` a rate is held to it (the
    sustained GEMM ceiling of a profile whose other rates were measured at the power cap:
    docs/calibration/grouped_gemm.md, "Burst or sustained")."""
    launch = meas.launch_s if launch_s is None else launch_s
    rates: dict[tuple[str, int, int, int, int], list[float]] = defaultdict(list)
    for g in meas.grouped_gemms:
        rates[(g.kind, g.groups, g.m, g.n, g.k)].append(g.flops / _busy_s(g.seconds, launch))
    cap = math.inf if ceiling_tflop_per_s is None else _sig_floor(ceiling_tflop_per_s)
    return [
        {
            "kind": kind,
            "groups": groups,
            "m": m,
            "n": n,
            "k": k,
            "tflop_per_s": min(_sig(units.flop_per_s_to_tflop_per_s(statistics.median(r))), cap),
        }
        for (kind, groups, m, n, k), r in sorted(rates.items())
    ]


def _sig_floor(value: float, digits: int = 4) -> float:
    """`value` rounded down to `digits` significant digits: a ceiling written to a file is never
    above the one it stands for."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(value))))
    return math.floor(value * scale) / scale


def grouped_source(meas: Measurements) -> str:
    """The `sources` entry of `grouped_gemm_points`."""
    impls = ", ".join(sorted({g.impl for g in meas.grouped_gemms}))
    models = ", ".join(sorted({g.model for g in meas.grouped_gemms if g.model}))
    return (
        f"{len(grouped_gemm_points(meas))} grouped expert GEMMs (fc1 / fc2 forward, dgrad, wgrad) "
        f"of {models} over G local experts and M tokens per expert, run as {impls}, rate = FLOPs / "
        f"(median time − launch) ({meas.device.name}, {meas.device.date}; "
        "simcluster.profiler.bench.grouped_gemm)"
    )


def grouped_measured_grid(meas: Measurements) -> dict[str, Any]:
    """Per kind the [min, max] of G, tokens per expert and the two hidden dims measured; the
    models, the implementations that ran, the number of shapes and the pricing rule. {} where
    no grouped GEMM was measured."""
    if not meas.grouped_gemms:
        return {}
    by_kind: dict[str, list[GroupedGemmRecord]] = defaultdict(list)
    for g in meas.grouped_gemms:
        by_kind[g.kind].append(g)
    kinds = {}
    for kind, records in sorted(by_kind.items()):
        keys = [series_key(kind, r.groups, r.m, r.n, r.k) for r in records]
        tokens = [tokens_per_expert(kind, r.m, r.k) for r in records]
        kinds[kind] = {
            "groups": [min(k[0] for k in keys), max(k[0] for k in keys)],
            "tokens_per_expert": [min(tokens), max(tokens)],
            "hidden_dims": [[min(k[i] for k in keys), max(k[i] for k in keys)] for i in (1, 2)],
        }
    return {
        "kinds": kinds,
        "models": sorted({g.model for g in meas.grouped_gemms if g.model}),
        "impl": sorted({g.impl for g in meas.grouped_gemms}),
        "shapes": len({(g.kind, g.groups, g.m, g.n, g.k) for g in meas.grouped_gemms}),
        "rule": GROUPED_RULE,
    }


def with_grouped_points(meas: Measurements, compute: dict[str, Any]) -> dict[str, Any]:
    """`compute` with `grouped_gemm_points` and its source (before `sources`); unchanged where
    no grouped GEMM was measured."""
    if not meas.grouped_gemms:
        return compute
    head = {key: value for key, value in compute.items() if key != "sources"}
    sources = {**compute["sources"], "grouped_gemm_points": grouped_source(meas)}
    return {**head, "grouped_gemm_points": grouped_gemm_points(meas), "sources": sources}
