"""Kernel measurements made beside the microbench, taken as extra microbench records.

    simcluster calibrate --measurements microbench.json --extra-kernels FILE --out p.yaml

FILE holds memory-bound kernels timed on the same GPU by another script; each becomes a
`ModernKernelRecord` of the kind the fit keeps a curve for (`fit.MODERN_KINDS`), in the
layer mode it was timed in, with its file and field in `detail`. The fit takes the records of
the measurement's own mode only (`fit.modern_elementwise`), so an eager microbench gains the
eager kernels, a fused one the compiled kernels.

The format read is the `elementwise` rows of `measure2.py`
(docs/calibration/h100-2026-11-26/elementwise_host_optimizer.json and measure2.py beside it):
single kernels (not layers) at Llama 3 8B shapes, 8192 tokens, hidden 4096, FFN 14336, 32
query heads of 128, each timed eager (`eager_s`) and torch.compile'd with static shapes
(`compiled_s`), median of CUDA-event times with a synchronize after each call. The rows'
bytes are measure2.py's ideal traffic (each input read once, each output written once), the
op graph's count for the same kernel (`workload.layer`: a norm 2·e per element, SwiGLU
3·e·T·f, RoPE one read and one write of the rotated tensor). Forward kernels only: the
RMSNorm, RoPE and SwiGLU backward are not in the file. Its bias-dropout-add row is the paper
site the microbench already times, and its cross-entropy row (forward and backward as one
time) has no op-graph kind of its own: both are left out.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from simcluster.calibration.records import Measurements, ModernKernelRecord

MEASURE2_TOKENS, MEASURE2_HIDDEN, MEASURE2_FFN, MEASURE2_HEADS, MEASURE2_HEAD_DIM = 8192, 4096, 14336, 32, 128
MEASURE2_ROWS = {
    "rmsnorm.fwd": ("rms_norm.forward", (MEASURE2_TOKENS, MEASURE2_HIDDEN)),
    "swiglu.fwd": ("swiglu.forward", (MEASURE2_TOKENS, 2 * MEASURE2_FFN)),
    "rope.fwd(q)": ("rope.forward", (MEASURE2_TOKENS, MEASURE2_HEADS, MEASURE2_HEAD_DIM)),
}
"""measure2.py's op -> (the microbench's kernel name, dims as `profiler.bench.modern_kernels`
writes them)."""
MODES = {"eager_s": "eager", "compiled_s": "fused"}


def measure2_records(doc: dict[str, Any], source: str) -> list[ModernKernelRecord]:
    """The RMSNorm, SwiGLU and RoPE rows of a measure2.py JSON as modern kernel records, one
    per mode timed (module docstring). Raises ValueError naming `source` and the field for a
    file without `elementwise` rows."""
    rows = doc.get("elementwise")
    if not isinstance(rows, list):
        raise ValueError(f"{source}: field 'elementwise': missing (allowed: a measure2.py JSON)")
    records = []
    for row in rows:
        known = MEASURE2_ROWS.get(row.get("op"))
        if known is None:
            continue
        name, dims = known
        for field, mode in MODES.items():
            if field in row:
                records.append(
                    ModernKernelRecord(
                        name=name,
                        kind="memory_bound",
                        dims=dims,
                        flops=0.0,
                        bytes_moved=float(row["bytes"]),
                        seconds=float(row[field]),
                        spread=0.0,  # measure2.py keeps the median only
                        layer_mode=mode,
                        detail=f"{source}: measure2.py row {row['op']!r}, {field}",
                    )
                )
    return records


def with_extra_kernels(meas: Measurements, text: str, source: str) -> tuple[Measurements, dict[str, Any]]:
    """`meas` with the kernels of the file `source` (its `text`) appended to its modern
    records, and the provenance the profile keeps (`calibration.extra_kernels`). Raises
    ValueError when the file is not JSON, not a measure2.py file, or from another GPU."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not JSON ({error})") from error
    device = doc.get("device") if isinstance(doc, dict) else None
    if device != meas.device.name:
        raise ValueError(
            f"{source}: field 'device': {device!r} is not the microbench's device "
            f"({meas.device.name!r}); extra kernels must come from the same GPU"
        )
    records = measure2_records(doc, source)
    own = [r for r in records if r.layer_mode == meas.layer_mode]
    provenance = {
        "file": source,
        "format": "measure2.py elementwise rows",
        "records": len(records),
        "used": sorted(f"{r.name} ({r.layer_mode})" for r in own),
    }
    return dataclasses.replace(meas, modern=[*meas.modern, *records]), provenance
