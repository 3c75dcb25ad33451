"""A shipped profile's grouped expert GEMMs, fitted from a committed microbench file (issue 18).

    python -m simcluster.calibration.grouped_profile \\
        docs/calibration/h100-2026-11-27-script/microbench.json --profile h100-sxm5-80gb

prints the YAML that `hwprofiles/h100-sxm5-80gb.yaml` holds: `compute.grouped_gemm_points`,
their `compute.sources` entry and `calibration.measured_grid.grouped_gemm`. Only the grouped
points are fitted; the profile's other fields (its GEMM points, ceilings, launch) stay what
they were measured as, and the fit is made against them:

- rate = FLOPs / (median time − the profile's `kernel_launch_us`), so that `costs.grouped_gemm`
  (launch + FLOPs / rate) returns the measured time at every measured shape;
- each rate held to the profile's sustained GEMM ceiling, peak · `gemm_max_efficiency` (the
  dense GEMM measured at the 700 W cap): the grouped kernels were timed in short runs between
  re-heats, and where they read above that ceiling they ran above the sustained clock
  (docs/calibration/grouped_gemm.md, "Burst or sustained").

`tests/config/test_config_h100_grouped.py` holds the shipped profile to this fit, so the points
are never edited by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from simcluster import units
from simcluster.calibration.grouped_fit import _sig_floor, grouped_gemm_points, grouped_measured_grid
from simcluster.calibration.records import Measurements
from simcluster.config.choices import Dtype
from simcluster.config.hardware import HardwareProfile, load_hardware

H100_MICROBENCH = "docs/calibration/h100-2026-11-27-script/microbench.json"
COMMAND = "python -m simcluster.calibration.grouped_profile {file} --profile {profile}"


def sustained_ceiling_tflop_per_s(hw: HardwareProfile) -> float:
    """peak · gemm_max_efficiency: the best dense GEMM the profile prices (its sustained rate)."""
    return units.flop_per_s_to_tflop_per_s(hw.peak_flop_per_s(Dtype.BF16) * hw.compute.gemm_max_efficiency)


def profile_grouped_points(meas: Measurements, hw: HardwareProfile) -> list[dict[str, Any]]:
    """The grouped points of `hw` fitted from `meas` (module docstring)."""
    return grouped_gemm_points(meas, hw.kernel_launch_s, sustained_ceiling_tflop_per_s(hw))


def capped_shapes(meas: Measurements, hw: HardwareProfile) -> int:
    """How many measured shapes ran above the sustained ceiling (their points are held to it)."""
    raw = grouped_gemm_points(meas, hw.kernel_launch_s)
    return sum(p != q for p, q in zip(raw, profile_grouped_points(meas, hw)))


def grouped_source(meas: Measurements, hw: HardwareProfile, file: str, profile: str) -> str:
    """The `compute.sources.grouped_gemm_points` entry: file, date, load, rule, command."""
    records = meas.grouped_gemms
    ceiling = _sig_floor(sustained_ceiling_tflop_per_s(hw))
    impls = ", ".join(sorted({g.impl for g in records}))
    models = ", ".join(sorted({g.model for g in records if g.model}))
    return (
        f"measured: {file} `grouped_gemms` ({meas.device.name}, {meas.device.date}, "
        f"torch {meas.device.torch_version}, {meas.load} load): {len(records)} grouped expert GEMMs "
        f"(fc1 / fc2 forward, dgrad, wgrad) of {models} at G 1-16 local experts and 128-8192 tokens "
        f"per expert, run as {impls}; rate = FLOPs / (median time − kernel_launch_us), held to the "
        f"sustained GEMM ceiling peak · gemm_max_efficiency = {ceiling:g} "
        f"TFLOP/s ({capped_shapes(meas, hw)} shapes ran above it: docs/calibration/grouped_gemm.md, "
        f"'Burst or sustained'). Fitted by `{COMMAND.format(file=file, profile=profile)}`; "
        "tests/config/test_config_h100_grouped.py holds this file to it"
    )


def yaml_block(meas: Measurements, hw: HardwareProfile, file: str, profile: str) -> str:
    """The three pieces of the profile, as YAML text to paste (flow-style points)."""
    lines = ["compute:", "  grouped_gemm_points:"]
    for p in profile_grouped_points(meas, hw):
        lines.append(
            f"    - {{kind: {p['kind']}, groups: {p['groups']}, m: {p['m']}, n: {p['n']}, k: {p['k']}, "
            f"tflop_per_s: {p['tflop_per_s']}}}"
        )
    source = json.dumps(grouped_source(meas, hw, file, profile), ensure_ascii=False)
    lines += ["  sources:", f"    grouped_gemm_points: {source}"]
    grid = json.dumps(grouped_measured_grid(meas), ensure_ascii=False)
    lines += ["calibration:", "  measured_grid:", f"    grouped_gemm: {grid}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("measurements", help="a microbench JSON with `grouped_gemms`")
    parser.add_argument("--profile", default="h100-sxm5-80gb", help="the profile fitted into (name or path)")
    args = parser.parse_args(argv)
    path = Path(args.measurements)
    try:
        meas = Measurements.from_json(path.read_text())
    except OSError as error:
        sys.exit(f"{path}: cannot read ({error.strerror})")
    if not meas.grouped_gemms:
        sys.exit(f"{path}: field grouped_gemms: no grouped GEMM was measured in this file")
    sys.stdout.write(yaml_block(meas, load_hardware(args.profile), args.measurements, args.profile))


if __name__ == "__main__":
    main()
