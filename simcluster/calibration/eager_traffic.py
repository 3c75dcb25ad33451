"""The eager modern regions priced by the bytes their kernels move, where none was measured.

The op graph counts RMSNorm, RoPE and SwiGLU as one fused kernel each (inputs read and output
written once, `workload.layer`), what Megatron-core / TE run. The eager layer the check times
runs them as plain torch ops, in fp32 where the math is: the RMSNorm backward is 14 kernels
moving 15.7 times its op-graph bytes, the SwiGLU backward 13 kernels and 14.2 times
(`EAGER_TRAFFIC`; the dropout-0 bias add, `workload.layer.BIAS_ADD_KERNEL`, is two adds
forward, 1.67 times, and backward only the bias's sum, the op's own bytes; counted by
`python -m simcluster.profiler.layer.eager_traffic`, which traces
`profiler.layer.regions.EAGER_MATH` at Llama 3 8B's shapes; a test keeps this table equal to
its output). An eager profile whose microbench timed none of a kind (the committed
H100 `microbench.json` has no modern kinds; `--extra-kernels` adds forwards only) prices it
at the roofline of that traffic: op-graph bytes × ratio over the measured device-copy
bandwidth, i.e. a curve flat at copy / ratio GB/s of op-graph bytes. A roofline, so a lower
bound on the time: the forwards measured on the same H100
(`h100-2026-11-26/elementwise_host_optimizer.json`, finding 6) run at 247 (RMSNorm), 385
(RoPE) and 1,016 (SwiGLU) GB/s of op-graph bytes against the 262, 598 and 1,808 this gives
(RoPE and SwiGLU's eager kernels read strided halves, `chunk`, below the copy rate).
"""

from __future__ import annotations

# (kind, forward ratio, backward ratio); the backward's curve is the kind's ".bwd" curve, as
# the profile's elementwise kinds name it (config.hardware)
_RATIOS = (("rmsnorm", 11.5, 15.67), ("rope", 5.05, 5.05), ("swiglu", 1.67, 14.2), ("bias_add", 1.67, 1.0))
EAGER_TRAFFIC = {kind: forward for kind, forward, _ in _RATIOS} | {
    f"{kind}.bwd": backward for kind, _, backward in _RATIOS
}
"""Kind -> bytes the eager region's kernels read and write / the op graph's bytes for it."""


def roofline_points(copy_gb_per_s: float, measured: set[str]) -> dict[str, list[list[float]]]:
    """Kind -> a flat (bytes, GB/s) curve at copy / ratio for every `EAGER_TRAFFIC` kind not
    in `measured` (module docstring)."""
    return {
        kind: [[1e6, _rate(copy_gb_per_s, ratio)], [1e11, _rate(copy_gb_per_s, ratio)]]
        for kind, ratio in EAGER_TRAFFIC.items()
        if kind not in measured
    }


def _rate(copy_gb_per_s: float, ratio: float) -> float:
    return round(copy_gb_per_s / ratio, 1)
