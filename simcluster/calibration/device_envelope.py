"""Which memory-bound sites the microbench timed on the device, and which on the host.

A site is timed with CUDA events while the host runs ahead (`profiler.bench.timing`). When
the host needs longer to issue a call than the device needs to run it, the GPU drains
between calls and the events see the host's issue time (plus the kernel); when the device
is the slower stage, the calls queue up and the events see the device alone. So a kind's
records split at the bytes its kernel moves in its host issue time:

    saturation_bytes = device_rate · host_issue_s

where `host_issue_s` is the kind's time at its smallest sites (whose kernels take
microseconds: the median busy time of the records within `HOST_OCTAVES` octaves of the
smallest bytes) and `device_rate` is Σ bytes / Σ busy time over the records at or above
`saturation_bytes` (the fixed point of the two, found from below: the rate over every
record, then over the records above the bytes it implies, until the set stops growing).

On the first H100 session's eager sites this comes out at 25-60 MB for most kinds (the
eager `attn.context_copy.bwd`: 0.2-0.3 ms at every size up to 67 MB, 200 GB/s beyond), about
the fixed 64 MiB the fit used before, and at 110-300 MB for the eager backward sites with
the longest host time (layer norm, GeLU, bias-dropout-add, dropout). The fused sites
(torch.compile'd regions, docs/calibration/h100-2026-11-26-script/microbench_static_rows.json)
issue for longer (0.21-0.28 ms for a compiled backward through autograd) and run faster
(1.6-3.1 TB/s of op-graph bytes), so those backward kinds stay host-bound up to 0.45-0.8 GB:
the fused bias-dropout-add backward takes 0.16-0.39 ms at 37 of its 40 sizes, from 0.9 MB
to 0.7 GB. A fixed 64 MiB took those host times for device times (that kind's large-site
rate 1.15 TB/s, its device rate 1.61 TB/s) and priced the fused layer's large sites slow.
The records at or above the saturation bytes are the device's; the ones below say only
that the device takes no longer than they do.

`calibration.fit` applies this to every per-kind curve, and to the generic curve over all
sites (where it is the same rule over a mixture of kinds: its smallest sites set the host
time).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from simcluster.calibration.records import ElementwiseRecord

HOST_OCTAVES = 2  # the smallest sites: within a factor 4 of the kind's smallest bytes
MAX_STEPS = 32  # the fixed point moves up one record set per step; 40-odd records per kind


def host_issue_s(records: list[ElementwiseRecord], busy_s: Callable[[float], float]) -> float:
    """Median busy seconds of the records within `HOST_OCTAVES` octaves of the smallest."""
    smallest = min(e.bytes_moved for e in records)
    return statistics.median(
        busy_s(e.seconds) for e in records if e.bytes_moved < smallest * 2.0**HOST_OCTAVES
    )


def _rate(records: list[ElementwiseRecord], busy_s: Callable[[float], float]) -> float:
    return sum(e.bytes_moved for e in records) / sum(busy_s(e.seconds) for e in records)


def device_envelope(
    records: list[ElementwiseRecord], busy_s: Callable[[float], float]
) -> tuple[float, float]:
    """(device bytes per second, saturation bytes) of one kind's records (module
    docstring); (0, inf) when there are no records with bytes."""
    sized = [e for e in records if e.bytes_moved > 0]
    if not sized:
        return 0.0, math.inf
    host_s = host_issue_s(sized, busy_s)
    saturation = 0.0
    rate = _rate(sized, busy_s)
    for _ in range(MAX_STEPS):
        above = [e for e in sized if e.bytes_moved >= rate * host_s]
        if not above or rate * host_s <= saturation:
            break
        saturation = rate * host_s
        rate = _rate(above, busy_s)
    return rate, saturation
