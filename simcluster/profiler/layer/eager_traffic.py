"""Count what the eager layer's modern regions launch: kernels and the bytes they move.

    python -m simcluster.profiler.layer.eager_traffic [--json]

The eager layer (`regions.EAGER_MATH`) runs RMSNorm, RoPE and SwiGLU as plain torch ops, in
fp32 where the math is (the upcasts, products, reductions and the downcast are each a
kernel), while the op graph counts each region as one fused kernel's bytes (its inputs read
and its output written once, `workload.layer`). This traces each region's forward and
backward at Llama 3 8B's shapes (t 1, s 8192) on the meta device under a dispatch mode that
counts every aten call that is not a view (one kernel each) and the bytes of its tensor
inputs and outputs, and divides by the op graph's bytes for that op. The ratios are what
`calibration.eager_traffic.EAGER_TRAFFIC` holds (the test checks it is what this prints):
an eager region moves that many times its op-graph bytes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from simcluster.calibration.named_layers import LLAMA3_8B
from simcluster.costs.compute import elementwise_kind
from simcluster.profiler.layer.ops import bias_dropout_add
from simcluster.profiler.layer.regions import EAGER_MATH
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module

SEQ_LENGTH = 8192  # Llama 3 8B's (the measured modern layers' length)


class _Traffic(TorchDispatchMode):
    """Kernels (non-view aten calls) and the bytes of their tensor inputs and outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels = 0
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.overloadpacket is torch.ops.aten.detach:
            return out
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self.kernels += 1
        self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


@dataclass(frozen=True)
class RegionTraffic:
    """One op-graph kind as the eager layer runs it."""

    kind: str
    kernels: int  # eager kernels per op-graph op
    bytes: float  # bytes they read and write
    op_graph_bytes: float

    @property
    def ratio(self) -> float:
        return self.bytes / self.op_graph_bytes


def _count(calls: Sequence[Callable[[], object]]) -> tuple[int, int]:
    with _Traffic() as traffic:
        for call in calls:
            call()
    return traffic.kernels, traffic.bytes


def llama_config() -> LayerConfig:
    """Llama 3 8B at t 1 (`named_layers.LLAMA3_8B`), no dropout."""
    return LayerConfig(seq_length=SEQ_LENGTH, micro_batch_size=1, tp=1, hidden_dropout=0.0,
                       attention_dropout=0.0, **LLAMA3_8B)  # fmt: skip


def region_traffic() -> list[RegionTraffic]:
    """RMSNorm, RoPE, SwiGLU and the dropout-0 bias add, forward and backward, at
    `llama_config`'s shapes."""
    cfg = llama_config()
    meta, bf16 = torch.device("meta"), torch.bfloat16
    tokens, h, f, d = SEQ_LENGTH, cfg.hidden_size, cfg.ffn_hidden_size, cfg.head_dim

    def t(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.empty(shape, device=meta, dtype=dtype)

    x, w, rstd = t(tokens, h), t(h), t(tokens, 1, dtype=torch.float32)
    cos, sin = t(tokens, 1, 1, d), t(tokens, 1, 1, d)
    q, k = t(tokens, 1, cfg.num_attention_heads, d), t(tokens, 1, cfg.query_groups, d)
    fc1, act = t(tokens, 2 * f), t(tokens, f)
    calls: dict[tuple[Module, bool], list[Callable[[], object]]] = {
        (Module.LAYERNORM, False): [lambda: EAGER_MATH.rms_norm_fwd(x, w, 1e-5)],
        (Module.LAYERNORM, True): [lambda: EAGER_MATH.rms_norm_bwd(x, x, w, rstd)],
        (Module.ROPE, False): [partial(EAGER_MATH.rope_fwd, y, cos, sin) for y in (q, k)],
        (Module.ROPE, True): [partial(EAGER_MATH.rope_bwd, y, cos, sin) for y in (q, k)],
        (Module.SWIGLU, False): [lambda: EAGER_MATH.swiglu_fwd(fc1)],
        (Module.SWIGLU, True): [lambda: EAGER_MATH.swiglu_bwd(act, fc1)],
        # dropout 0: `residual + dropout(x + bias)` is two adds; backward, the adds pass the
        # gradient through and only the bias's broadcast sum runs
        (Module.BIAS_DROPOUT_ADD, False): [lambda: bias_dropout_add(x, w, x, None, 0.0)],
        (Module.BIAS_DROPOUT_ADD, True): [lambda: EAGER_MATH.bias_grad(x)],
    }  # fmt: skip
    ops = layer_ops(cfg)
    out = []
    for (module, backward), region in calls.items():
        op = next(o for o in (ops.backward if backward else ops.forward) if o.module is module)
        kernels, moved = _count(region)
        out.append(RegionTraffic(elementwise_kind(op), kernels, moved, op.bytes_moved))
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print {kind: ratio} as JSON")
    args = parser.parse_args(argv)
    regions = region_traffic()
    ratios = {r.kind: round(r.ratio, 2) for r in regions}
    if args.json:
        print(json.dumps(ratios, indent=1))
    else:
        for r in regions:
            print(f"{r.kind:12} {r.kernels:3} kernels  {r.bytes / 1e6:9.1f} MB  op graph "
                  f"{r.op_graph_bytes / 1e6:8.1f} MB  ratio {r.ratio:6.2f}")  # fmt: skip
    return ratios


if __name__ == "__main__":
    main()
