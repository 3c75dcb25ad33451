"""Measured hardware profiles: fit `simcluster.profiler` measurements, write the YAML, check it.

- `datasheets`  dense peaks and bandwidths of known GPUs; which shipped profile a device's
                network section starts from.
- `fit`         microbenchmark measurements -> the profile's `gpu` and `compute` sections.
- `profile`     the whole profile (network from a base profile or measured), atomic write.
- `check`       the real layer at held-out shapes vs the simulator's prediction.
- `report`      check-profile's table, CSV and markdown.

The measuring itself lives in `simcluster.profiler` (torch and the standard library only,
for bare GPU machines); this package needs pydantic, yaml and numpy, never a GPU.
"""

from __future__ import annotations

import enum


class DeviceKind(str, enum.Enum):
    """Where calibrate and check-profile measure."""

    CUDA = "cuda"
    CPU = "cpu"
