"""Fused-attention measurements -> the profile's three flash-attention tables.

`costs.compute.attention_time_s` prices one fused attention call as
    t = launch + FLOPs / (rate(s) · causal_efficiency(s) if causal)
with rate(s) the forward or backward table at the key length s, FLOPs 4·b·h·s²·d forward
(half under a causal mask) and 2.5 × that backward (`records.AttentionRecord`). The fit
inverts it at every measured length, from the head-dim-128 records (the tables' head
dim; the model uses them for every head dim), median over duplicate records:

- forward rate(s)  = F / busy(t_fwd)                        non-causal record
- backward rate(s) = 2.5·F / busy(t_fwd+bwd − t_fwd)        non-causal record
- causal_efficiency(s) = causal (fwd + bwd) rate / non-causal (fwd + bwd) rate, each
  FLOPs_fwd+bwd / (busy(t_fwd) + busy(t_bwd)), capped at 1 (the profile's rule: a causal
  kernel is at most as fast). One factor scales both directions in the model; taken over
  forward + backward it gives back the measured causal forward + backward time, which is
  what a training step pays (the shipped profiles' factor is the forward's, the only one
  FlashAttention-3 publishes).

busy(t) = t − launch, floored at t / 4 (`fit._busy_s`, as for GEMMs); the backward's time
t_fwd+bwd − t_fwd is floored at a quarter of t_fwd+bwd. Lengths where either mask is
missing (skipped for memory) get no efficiency point; the three tables are written only
when every one has a point, else the profile has none (and cannot price flash attention,
as before). Records at other head dims (`--attention-head-dim`) are fitted the same way
and reported under `calibration:`, not used by the model.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from simcluster import units
from simcluster.calibration.fit import MIN_BUSY_FRACTION, _busy_s, _sig
from simcluster.calibration.records import AttentionRecord, Measurements
from simcluster.calibration.shapes import FLASH_TABLE_HEAD_DIM

TABLES = (
    "flash_attention_fwd_tflop_per_s",
    "flash_attention_bwd_tflop_per_s",
    "flash_attention_causal_efficiency",
)


def _backward_s(record: AttentionRecord) -> float:
    return max(record.total_s - record.forward_s, MIN_BUSY_FRACTION * record.total_s)


def forward_flop_per_s(record: AttentionRecord, launch_s: float) -> float:
    return record.forward_flops / _busy_s(record.forward_s, launch_s)


def backward_flop_per_s(record: AttentionRecord, launch_s: float) -> float:
    return record.backward_flops / _busy_s(_backward_s(record), launch_s)


def total_flop_per_s(record: AttentionRecord, launch_s: float) -> float:
    busy = _busy_s(record.forward_s, launch_s) + _busy_s(_backward_s(record), launch_s)
    return (record.forward_flops + record.backward_flops) / busy


def flash_tables(records: list[AttentionRecord], launch_s: float) -> dict[str, list[list[float]]]:
    """The three tables (TABLES), sorted by length, or {} when some table would be empty."""
    by_length: dict[bool, dict[int, list[AttentionRecord]]] = {
        False: defaultdict(list),
        True: defaultdict(list),
    }
    for r in records:
        by_length[r.causal][r.seq_length].append(r)
    full, causal = by_length[False], by_length[True]

    def median_tflop(rs: list[AttentionRecord], rate: Any) -> float:
        return units.flop_per_s_to_tflop_per_s(statistics.median(rate(r, launch_s) for r in rs))

    tables = {
        TABLES[0]: [[s, _sig(median_tflop(full[s], forward_flop_per_s))] for s in sorted(full)],
        TABLES[1]: [[s, _sig(median_tflop(full[s], backward_flop_per_s))] for s in sorted(full)],
        TABLES[2]: [
            [
                s,
                _sig(
                    min(
                        1.0,
                        median_tflop(causal[s], total_flop_per_s) / median_tflop(full[s], total_flop_per_s),
                    )
                ),
            ]
            for s in sorted(full)
            if s in causal
        ],
    }
    return tables if all(tables.values()) else {}


def table_records(meas: Measurements) -> list[AttentionRecord]:
    """The records the profile's tables are fitted to: head dim 128."""
    return [r for r in meas.attention if r.head_dim == FLASH_TABLE_HEAD_DIM]


def flash_section(meas: Measurements) -> tuple[dict[str, Any], dict[str, str]]:
    """(the compute section's three tables, their sources); ({}, {}) without head-dim-128
    records (older measurements, or every shape skipped)."""
    records = table_records(meas)
    tables = flash_tables(records, meas.launch_s)
    if not tables:
        return {}, {}
    dev = meas.device
    first = min(records, key=lambda r: r.seq_length)
    backends = ", ".join(sorted({r.backend for r in records}))
    where = (
        f"torch.nn.functional.scaled_dot_product_attention (SDPA backend: {backends}) on {dev.name}, "
        f"torch {dev.torch_version}, CUDA {dev.cuda_version}, {dev.date}; {meas.dtype}, head dim "
        f"{FLASH_TABLE_HEAD_DIM}, {first.heads} heads, batch × seqlen = {first.batch * first.seq_length}, "
        "inputs requiring grad, no dropout, median of repeats"
    )
    mechanics = (
        " (FlashAttention-3 Fig. 5/6 shapes)"
        if dev.device_type == "cuda"
        else ". CPU: tiny shapes, mechanics only, says nothing about a GPU"
    )
    sources = {
        TABLES[
            0
        ]: f"measured forward, not causal, FLOPs 4·b·h·s²·d / (median time − launch): {where}{mechanics}",
        TABLES[1]: (
            "measured backward, not causal, FLOPs 2.5 × forward / (median forward+backward time − median "
            f"forward time − launch): {where}{mechanics}"
        ),
        TABLES[2]: (
            "measured causal / non-causal forward+backward TFLOP/s at the same length (causal FLOPs "
            f"half the dense ones), capped at 1; applied to both directions: {where}{mechanics}"
        ),
    }
    return tables, sources


def other_head_dims(meas: Measurements) -> dict[int, dict[str, list[list[float]]]]:
    """head dim -> its three tables, for head dims other than 128 (information only)."""
    dims = sorted({r.head_dim for r in meas.attention} - {FLASH_TABLE_HEAD_DIM})
    out = {}
    for d in dims:
        tables = flash_tables([r for r in meas.attention if r.head_dim == d], meas.launch_s)
        if tables:
            out[d] = {name.removeprefix("flash_attention_"): rows for name, rows in tables.items()}
    return out
