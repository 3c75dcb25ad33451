"""Memory capacity and headroom. Capacity (`capacity_bytes`) is what every `fits` compares
with (run, memory, sweep, plan); `plan` and `sweep` also keep headroom: a layout fits only
if its fullest stage leaves `headroom_fraction` of the device's usable capacity free,
peak ≤ (1 − headroom) · capacity (issue 9).

Capacity is `HardwareProfile.usable_memory_bytes`: the driver-reported capacity minus the
CUDA context and NCCL buffers, each with its source in the profile.
"""

from __future__ import annotations

import math

from simcluster.config.hardware import HardwareProfile

DEFAULT_HEADROOM_FRACTION = 0.1


def capacity_bytes(hardware: HardwareProfile) -> float:
    """The device memory a layout may fill: the driver-reported capacity minus the CUDA
    context and NCCL buffers, each with its source in the profile (issue 9)."""
    return hardware.usable_memory_bytes


def headroom_problem(headroom_fraction: float, option: str = "--headroom") -> str | None:
    """Why `headroom_fraction` is not allowed (it must be in [0, 1)), or None."""
    if 0.0 <= headroom_fraction < 1.0 and not math.isnan(headroom_fraction):
        return None
    return (
        f"{option}: value {headroom_fraction}: must be at least 0 and below 1 "
        "(the fraction of device memory left free, e.g. 0.1)"
    )


def memory_limit_bytes(hardware: HardwareProfile, headroom_fraction: float) -> float:
    """The largest peak that fits: (1 − headroom) · usable capacity."""
    return (1.0 - headroom_fraction) * capacity_bytes(hardware)
