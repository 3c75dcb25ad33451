"""The fit: a calibrated profile gives back the measured time of every measured kernel."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from simcluster.calibration.fit import elementwise_points
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import DeviceInfo, ElementwiseRecord, GemmRecord, Measurements
from simcluster.config.hardware import parse_hardware
from simcluster.costs.compute import elementwise_time_s, gemm_time_s, measured_gemm_flop_per_s
from simcluster.workload.ops import GemmShape

H100 = DeviceInfo(
    device_type="cuda",
    name="NVIDIA H100 80GB HBM3",
    memory_bytes=85_000_000_000,
    num_sms=132,
    l2_cache_bytes=52_428_800,
    memory_clock_khz=2_619_000,
    memory_bus_width_bits=5120,
    driver_version="580.00",
    cuda_version="13.0",
    torch_version="2.11.0",
    num_threads=8,
    platform="linux",
    date="2026-01-01",
)
LAUNCH_S = 4e-6


def _measurements(gemms: list[GemmRecord], elementwise: list[ElementwiseRecord]) -> Measurements:
    square = GemmRecord("square", 8192, 8192, 8192, 1, 2 * 8192**3 / 750e12 + LAUNCH_S, 0.0)
    square32 = GemmRecord("square_fp32", 8192, 8192, 8192, 1, 2 * 8192**3 / 50e12 + LAUNCH_S, 0.0)
    return Measurements(
        device=H100,
        command="test",
        grid="quick",
        dtype="bf16",
        dropout_prob=0.1,
        shapes=[],
        policy={},
        launch_s=LAUNCH_S,
        copy_bytes=2e9,
        copy_s=2e9 / 3.0e12,
        peak_gemm=square,
        peak_gemm_fp32=square32,
        layer_overhead_s=30e-6,
        gemms=gemms,
        elementwise=elementwise,
    )


GEMMS = [
    GemmRecord("linear", 4096, 4096, 4096, 1, 250e-6, 0.0),
    GemmRecord("linear", 4096, 16384, 4096, 1, 900e-6, 0.0),
    GemmRecord("bmm_qk", 2048, 2048, 128, 32, 120e-6, 0.0),
]
SITES = [
    ElementwiseRecord("layer_norm.forward", (1024, 1024), 1024 * 1024.0, LAUNCH_S + 2e-6, 0.0),
    ElementwiseRecord("gelu.forward", (1024, 1536), 1536 * 1024.0, LAUNCH_S + 6e-6, 0.0),
    ElementwiseRecord("softmax.forward", (4, 4, 4, 4), 2**30, LAUNCH_S + 1e-3, 0.0),
]


@pytest.fixture(scope="module")
def profile():
    data = build_profile(_measurements(GEMMS, SITES))
    return parse_hardware(data, "synthetic.yaml")


def test_a_known_gpu_gets_its_datasheet_peak_and_the_base_network(profile) -> None:
    """H100: 989 TFLOP/s and 3,350 GB/s from the datasheet; efficiencies are measured ratios."""
    assert profile.gpu.peak_bf16_tflop_per_s == 989
    # the best GEMM is FLOPs / median time (the square one), the launch not taken off
    best_tflop_per_s = 2 * 8192**3 / (2 * 8192**3 / 750e12 + LAUNCH_S) / 1e12
    assert profile.compute.gemm_max_efficiency == pytest.approx(best_tflop_per_s / 989, rel=1e-3)
    assert profile.compute.memory_bound_efficiency == pytest.approx(3000 / 3350, rel=1e-3)
    assert profile.compute.kernel_launch_us == pytest.approx(4.0)
    assert profile.calibration["network_from"] == "h100-sxm5-80gb"
    assert profile.network.measured == "datasheet"


@pytest.mark.parametrize("record", GEMMS)
def test_measured_gemms_come_back_exactly(profile, record: GemmRecord) -> None:
    """launch + FLOPs / fitted rate == measured time at every measured shape."""
    shape = GemmShape(record.m, record.n, record.k, record.batch)
    assert gemm_time_s(shape, profile) == pytest.approx(record.seconds, rel=1e-3)


def test_between_two_measured_shapes_the_rate_is_between_theirs(profile) -> None:
    """n = 8192 lies between n = 4096 and n = 16384: its rate lies between theirs."""
    rates = [measured_gemm_flop_per_s(GemmShape(4096, n, 4096), profile) for n in (4096, 8192, 16384)]
    assert min(rates[0], rates[2]) <= rates[1] <= max(rates[0], rates[2])


def test_memory_bound_sites_are_pooled_per_octave() -> None:
    """1 MiB and 1.5 MiB share an octave: Σ bytes / Σ (t − launch) = 2.5 MiB / 8 µs; 1 GiB alone
    (a CPU: what was timed is what runs, no device envelope)."""
    cpu = dataclasses.replace(_measurements([], SITES), device=dataclasses.replace(H100, device_type="cpu"))
    points = elementwise_points(cpu)
    assert len(points) == 2
    assert points[0][1] == pytest.approx(2.5 * 1024**2 / 8e-6 / 1e9, rel=1e-3)
    assert points[1] == [pytest.approx(2**30, rel=1e-3), pytest.approx(2**30 / 1e-3 / 1e9, rel=1e-3)]


def test_on_a_gpu_small_sites_are_priced_at_no_less_than_the_large_sites_rate() -> None:
    """GPU: the 1-2 MiB octave (2.5 MiB / 8 µs = 328 GB/s, host-bound eager sites) is raised
    to the rate of the sites of at least 64 MiB (1 GiB / 1 ms = 1,074 GB/s); the large bin
    stays as measured."""
    points = elementwise_points(_measurements([], SITES))
    assert points[0][1] == pytest.approx(2**30 / 1e-3 / 1e9, rel=1e-3)
    assert points[1][1] == pytest.approx(2**30 / 1e-3 / 1e9, rel=1e-3)


def test_memory_bound_time_comes_back_at_a_lone_site(profile) -> None:
    """The 1 GiB softmax is alone in its octave: the model returns its measured time."""
    assert elementwise_time_s(2**30, profile) == pytest.approx(LAUNCH_S + 1e-3, rel=1e-3)


def test_measurements_survive_json() -> None:
    """The bare-GPU-machine JSON round-trips to an equal object."""
    meas = _measurements(GEMMS, SITES)
    assert Measurements.from_json(meas.to_json()) == meas


def test_the_profile_names_the_host_cpu_its_host_costs_were_measured_on() -> None:
    """Host issue costs are the host CPU's (an x86 DGX and an Arm Grace differ): a measurement
    records the CPU model, the profile's provenance carries it, and a file written before the
    field reads back with it empty."""
    from simcluster.profiler.bench.device_info import describe_device

    here = describe_device(torch.device("cpu"))
    assert here.host_cpu and here.host_cpu == here.name  # on a CPU run both are the CPU
    meas = _measurements([], [])
    assert build_profile(meas)["provenance"]["host_cpu"] == "not recorded"
    grace = dataclasses.replace(meas, device=dataclasses.replace(H100, host_cpu="Neoverse-V2"))
    assert build_profile(grace)["provenance"]["host_cpu"] == "Neoverse-V2"
    old = json.loads(meas.to_json())
    del old["device"]["host_cpu"]
    assert Measurements.from_json(json.dumps(old)).device.host_cpu == ""
