"""Which microbench sites timed the device and which the host (`calibration.device_envelope`):
synthetic records with a known host time and device rate, and the committed H100 files."""

from __future__ import annotations

from pathlib import Path

import pytest

from simcluster.calibration.device_envelope import device_envelope, host_issue_s
from simcluster.calibration.fit import elementwise_points_by_op
from simcluster.calibration.records import ElementwiseRecord, Measurements

DOCS = Path(__file__).resolve().parents[2] / "docs" / "calibration"
HOST_S = 3e-4  # a compiled backward through autograd
DEVICE_BYTES_PER_S = 3e12


def _site(bytes_moved: float, host_s: float = HOST_S, rate: float = DEVICE_BYTES_PER_S) -> ElementwiseRecord:
    """A site timed as the events see it: the host's issue time where it is the slower stage
    (plus the kernel, the GPU having drained), else the kernel alone."""
    device_s = bytes_moved / rate
    seconds = host_s + device_s if host_s > device_s else device_s
    return ElementwiseRecord("site", (1,), bytes_moved, seconds, 0.01, "attn.softmax.bwd")


def _identity(seconds: float) -> float:
    return seconds


def test_the_host_time_is_the_smallest_sites_time() -> None:
    records = [_site(2.0**k) for k in range(20, 34)]
    assert host_issue_s(records, _identity) == pytest.approx(HOST_S, rel=0.01)


def test_the_split_is_where_the_device_takes_the_host_time() -> None:
    """Host 0.3 ms at 3 TB/s: the records from 0.9 GB up are the device's; the rate is exact."""
    records = [_site(2.0**k) for k in range(20, 34)]
    rate, saturation = device_envelope(records, _identity)
    assert rate == pytest.approx(DEVICE_BYTES_PER_S, rel=1e-9)
    assert saturation == pytest.approx(HOST_S * DEVICE_BYTES_PER_S, rel=0.01)


def test_a_short_host_time_splits_low() -> None:
    """An eager one-kernel site (20 µs of host) saturates at 60 MB, near the fixed 64 MiB used
    before; every record above is the device's."""
    records = [_site(2.0**k, host_s=2e-5) for k in range(20, 34)]
    rate, saturation = device_envelope(records, _identity)
    assert rate == pytest.approx(DEVICE_BYTES_PER_S, rel=1e-9)
    assert 2**25 < saturation < 2**26


def test_no_sized_records_give_no_envelope() -> None:
    assert device_envelope([], _identity) == (0.0, float("inf"))


def test_the_fused_bias_dropout_add_backward_is_priced_at_its_device_rate() -> None:
    """Committed fused sites: bias-dropout-add backward takes 0.16-0.39 ms at 37 of its 40
    sizes (0.9 MB - 0.7 GB). Its curve at the held-out h 6144, b 4, t 8 site (352 MB) is now
    the device rate, 1,608 GB/s of op-graph bytes (1,151 with a fixed 64 MiB split, 712-948
    from the host-bound bins around it before)."""
    meas = Measurements.from_json(
        (DOCS / "h100-2026-11-26-script" / "microbench_static_rows.json").read_text()
    )
    curve = elementwise_points_by_op(meas)["bias_dropout_add.bwd"]
    below = [rate for size, rate in curve if size < 4.5e8]
    assert below and all(rate >= 1608 for rate in below)
    assert max(rate for _, rate in curve) == pytest.approx(3447, rel=1e-3)  # the 1.4 GB site's own bin
