"""Issue 20's record fields are additive: older measurement files read as an eager layer
measured in a burst, new fields round-trip through JSON, and a fitted profile names the
layer mode it was measured in."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simcluster.calibration.records import (
    GemmRecord,
    LayerRun,
    LayerTiming,
    Measurements,
    ModernKernelRecord,
)

H100 = Path(__file__).resolve().parents[2] / "docs/calibration/h100-2026-11-26"


def test_committed_h100_files_read_as_eager_burst() -> None:
    meas = Measurements.from_json((H100 / "microbench.json").read_text())
    assert (meas.layer_mode, meas.load, meas.warmup, meas.modern) == ("eager", "burst", None, [])
    assert meas.gemms[0].sm_clock_mhz is None and meas.gemms[0].power_w is None
    run = LayerRun.from_json((H100 / "layer_timing.json").read_text())
    assert (run.layer_mode, run.load, len(run.timings)) == ("eager", "burst", 96)
    assert run.timings[0].layer is None


def test_new_fields_round_trip() -> None:
    meas = Measurements.from_json((H100 / "microbench.json").read_text())
    kernel = ModernKernelRecord(
        "rope.forward",
        "memory_bound",
        (8192, 32, 128),
        0.0,
        1.5e8,
        1.3e-4,
        0.02,
        "fused",
        "llama3-8b t1",
        1350.0,
        698.0,
    )
    new = replace(
        meas,
        gemms=[replace(meas.gemms[0], sm_clock_mhz=1350.0, power_w=698.0)],
        layer_mode="fused",
        load="sustained",
        warmup={"blocks": 40, "settled": True},
        modern=[kernel],
        skipped=["fc1.gemm_fp8 (1, 2, 3): no FP8 here"],
    )
    back = Measurements.from_json(new.to_json())
    assert back == new and isinstance(back.gemms[0], GemmRecord)
    timing = LayerTiming(
        4096,
        32,
        8192,
        1,
        8,
        True,
        "none",
        1e-3,
        3e-3,
        0.01,
        10,
        1740.0,
        690.0,
        {"name": "llama3-8b", "activation": "swiglu"},
    )
    run = LayerRun(meas.device, "cmd", "modern", "bf16", 0.0, [timing], "fused", "sustained", {"blocks": 3})
    assert LayerRun.from_json(run.to_json()) == run


def test_fitted_profile_names_the_layer_mode() -> None:
    from simcluster.calibration.profile import build_profile

    meas = Measurements.from_json((H100 / "microbench.json").read_text())
    for mode, load in (("eager", "burst"), ("fused", "sustained")):
        provenance = build_profile(replace(meas, layer_mode=mode, load=load))["provenance"]
        assert (provenance["layer_mode"], provenance["load"]) == (mode, load)
