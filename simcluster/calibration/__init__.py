"""Measured hardware profiles: fit `simcluster.profiler` measurements, write the YAML, check it.

- `records`     what the profiler measures, as torch-free dataclasses (JSON in, JSON out).
- `shapes`      which layers calibration measures and holds out; the stand-in comm's copies.
- `datasheets`  dense peaks and bandwidths of known GPUs; which shipped profile a device's
                network section starts from.
- `fit`         microbenchmark measurements -> the profile's `gpu` and `compute` sections.
- `profile`     the whole profile (network from a base profile or measured), atomic write.
- `check`       the real layer at held-out shapes vs the simulator's prediction.
- `report`      check-profile's table, CSV and markdown.

The measuring itself lives in `simcluster.profiler` (torch and the standard library only,
for bare GPU machines), which writes `records` over the grids of `shapes`: those two (and this
file) use the standard library alone. The rest needs pydantic, yaml and numpy, never a GPU."""

from __future__ import annotations

import enum


class DeviceKind(str, enum.Enum):
    """Where calibrate and check-profile measure."""

    CUDA = "cuda"
    CPU = "cpu"
