"""Which layers calibration measures, which it holds out, and what the stand-in comm costs.

Standard library only (no torch): the fitting side imports it too.

`calibrate` measures the kernels of the simulator's op graph (`simcluster.workload.layer`)
for every shape in `calibration_shapes(...)` at each t in `TP_DEGREES`; `check-profile`
runs the whole real layer at `held_out_shapes(...)`, whose hidden sizes and token counts
(s·b) appear in no calibration shape (`test_calibration_shapes` checks it). Three grids:
`quick` (tiny shapes, seconds on any CPU: the tests' smoke test of the mechanics, whose
errors say nothing about accuracy), `cpu` (minutes on a CPU with fast bf16) and `cuda`
(GPU-sized: Table 3's 22B shape h = 6144, a = 64, s = 2048, b = 4 is a held-out shape).

`standin_ops` rewrites a layer's op graph for what one process running
`ShardStandInComm` really does: an all-reduce is the identity (nothing), an all-gather
concatenates t copies of the shard (reads the message once, writes it once), a
reduce-scatter copies the first 1/t of its input (reads and writes message/t). Each copy
becomes an element-wise op priced by the profile like any other memory-bound kernel;
nothing is overlapped, as nothing overlaps in the stand-in.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.choices import Dtype, Recompute
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, Module, Op, OpKind, elementwise

TP_DEGREES = (1, 2, 4, 8)
DROPOUT_PROB = 0.1  # attention and block-output dropout of every measured layer


@dataclass(frozen=True, slots=True)
class LayerShape:
    """A layer's model shape and micro-batch (Table 1: h, a, s, b); f = 4h."""

    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int

    @property
    def tokens(self) -> int:
        """s·b: rows of every linear GEMM."""
        return self.seq_length * self.micro_batch_size

    @property
    def head_dim(self) -> int:
        return self.config(tp=1).head_dim

    def config(
        self,
        tp: int,
        sequence_parallel: bool = False,
        recompute: Recompute = Recompute.NONE,
        dtype: Dtype = Dtype.BF16,
    ) -> LayerConfig:
        """The simulator's description of this layer on one rank of `tp` (f = 4h)."""
        return LayerConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            tp=tp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            dtype=dtype,
        )


def _shapes(*rows: tuple[int, int, int, int]) -> tuple[LayerShape, ...]:
    return tuple(LayerShape(*row) for row in rows)


# (h, a, s, b). Heads divisible by 8 (t = 8); head dims 32-128; token counts s·b.
_CALIBRATION = {
    # h ∈ {64, 128}, s·b ∈ {32, 64}; head dims 8 and 16. A smoke test of the mechanics:
    # its largest GEMM is 8 MFLOP, a few ms even where bf16 runs at ~1 GFLOP/s (a CPU
    # without native bf16, e.g. an AMD EPYC of CI), so the grid takes seconds anywhere.
    "quick": _shapes((64, 8, 16, 2), (64, 8, 32, 2), (128, 8, 16, 2), (128, 8, 32, 2)),
    # h ∈ {256, 512, 1024}, s·b ∈ {256, 1024}
    "cpu": _shapes(
        (256, 8, 128, 2),
        (256, 8, 512, 2),
        (512, 8, 128, 2),
        (512, 8, 512, 2),
        (1024, 16, 128, 2),
        (1024, 16, 512, 2),
    ),
    # h ∈ {1024, 2048, 4096, 8192, 12288}, s·b ∈ {1024, 4096, 16384}; head dims 64, 128
    "cuda": _shapes(
        *[
            (h, a, s, b)
            for h, a in ((1024, 16), (2048, 16), (4096, 32), (8192, 64), (12288, 96))
            for s, b in ((1024, 1), (2048, 2), (4096, 4))
        ]
    ),
}
# Shapes whose attention core's batched GEMMs alone are timed (the linears and sites of such a
# layer add nothing the grid above lacks): head dims the grid above does not have, held-out
# ones included (the cuda grid's 64 and 128 bracket the held-out h 6144's 96, which the
# first H100 fits priced by the tile model alone: docs/calibration/h100-2026-11-26-script/).
# Their h and s·b follow the same rule: none is a held-out one.
_ATTENTION_BMM = {
    "quick": _shapes((192, 16, 16, 2)),  # head dim 12, the quick held-out's
    "cpu": _shapes((1536, 16, 128, 2), (1152, 24, 512, 2)),  # head dims 96 and 48
    "cuda": _shapes((3072, 32, 1024, 1), (3072, 32, 2048, 2), (3072, 32, 4096, 4)),  # head dim 96
}
_HELD_OUT = {
    # h = 96 (head dim 12), s·b = 48
    "quick": _shapes((96, 8, 24, 2)),
    # h ∈ {384, 768}, s·b ∈ {384, 768}
    "cpu": _shapes((384, 8, 192, 2), (768, 8, 384, 2)),
    # h ∈ {6144, 10240}, s·b ∈ {2048, 8192}; head dims 96 and 128. Table 3's 22B layer
    # (h 6144, a 64, s 2048, b 4) is one of them. Smaller shards than these run host-bound
    # in eager torch (see check.CheckSummary.num_host_bound).
    "cuda": _shapes((6144, 64, 2048, 1), (6144, 64, 2048, 4), (10240, 80, 2048, 1), (10240, 80, 2048, 4)),
}


def grid_name(device_type: str, quick: bool) -> str:
    """'quick', or the device's full grid ('cuda' for a GPU, 'cpu' otherwise)."""
    if quick:
        return "quick"
    return "cuda" if device_type == "cuda" else "cpu"


def calibration_shapes(device_type: str, quick: bool) -> tuple[LayerShape, ...]:
    return _CALIBRATION[grid_name(device_type, quick)]


def held_out_shapes(device_type: str, quick: bool) -> tuple[LayerShape, ...]:
    return _HELD_OUT[grid_name(device_type, quick)]


def attention_bmm_shapes(device_type: str, quick: bool) -> tuple[LayerShape, ...]:
    """Shapes of which calibrate times only the attention core's batched GEMMs (`_ATTENTION_BMM`)."""
    return _ATTENTION_BMM[grid_name(device_type, quick)]


def all_grids() -> dict[str, tuple[tuple[LayerShape, ...], tuple[LayerShape, ...]]]:
    """grid name -> (calibration shapes, the attention-BMM-only ones included; held-out shapes)."""
    return {name: ((*_CALIBRATION[name], *_ATTENTION_BMM[name]), _HELD_OUT[name]) for name in _CALIBRATION}


def standin_copy_bytes(op: Op, tp: int) -> float:
    """HBM bytes of the local copy `ShardStandInComm` makes for a collective op."""
    if op.kind is not OpKind.COLLECTIVE or tp == 1:
        return 0.0
    if op.collective is CollectiveKind.ALL_GATHER:
        return 2.0 * op.message_bytes
    if op.collective is CollectiveKind.REDUCE_SCATTER:
        return 2.0 * op.message_bytes / tp
    return 0.0  # all-reduce: the identity


def standin_ops(ops: tuple[Op, ...], tp: int) -> tuple[Op, ...]:
    """`ops` with each collective replaced by the stand-in's copy (or dropped)."""
    out = []
    for op in ops:
        if op.kind is not OpKind.COLLECTIVE:
            out.append(op)
        elif (copy_bytes := standin_copy_bytes(op, tp)) > 0:
            out.append(
                elementwise(standin_op_name(op), copy_bytes, module=standin_module(op), pass_=op.pass_)
            )
    return tuple(out)


def standin_module(op: Op) -> Module:
    """The stand-in's copy for collective `op` (one that copies: all-gather, reduce-scatter)."""
    if op.collective is CollectiveKind.ALL_GATHER:
        return Module.STANDIN_ALL_GATHER
    return Module.STANDIN_REDUCE_SCATTER


def standin_op_name(op: Op) -> str:
    """The element-wise op that stands for collective `op`, "<name>.standin_<collective>":
    its kernel kind (`costs.compute.elementwise_kind`) is "standin_all_gather" or
    "standin_reduce_scatter", the name of the benchmark that times it (`kernels`)."""
    assert op.collective is not None
    return f"{op.name}.standin_{op.collective.value}"


# ---------------------------------------------------------------- fused attention

FLASH_TABLE_HEAD_DIM = 128  # the profile's flash tables are at head dim 128 (costs.compute)


@dataclass(frozen=True, slots=True)
class AttentionGrid:
    """The fused-attention benchmark's shapes: `heads` heads of each of `head_dims`, every
    length of `seq_lengths`, batch = tokens // s (at least 1), causal and not.

    The `cuda` grid is the FlashAttention-3 figures' (Shah et al., arXiv 2407.08608, Fig. 5/6:
    batch × seqlen = 16k, 16 heads, head dim 128) at the h100 profile's table lengths, so a
    calibrated table and the shipped one are measured alike. The CPU grids are tiny: CPU
    rates say nothing about a GPU; they exercise the mechanics (the `quick` grid's largest
    forward is 4 MFLOP)."""

    seq_lengths: tuple[int, ...]
    tokens: int
    heads: int
    head_dims: tuple[int, ...] = (FLASH_TABLE_HEAD_DIM,)

    def batch(self, seq_length: int) -> int:
        return max(1, self.tokens // seq_length)


_ATTENTION = {
    "quick": AttentionGrid(seq_lengths=(16, 32, 64), tokens=64, heads=2),
    "cpu": AttentionGrid(seq_lengths=(64, 128, 256, 512), tokens=512, heads=2),
    "cuda": AttentionGrid(seq_lengths=(512, 1024, 2048, 4096, 8192, 16384), tokens=16384, heads=16),
}
_ATTENTION_QUICK_CUDA = AttentionGrid(seq_lengths=(512, 2048, 8192), tokens=16384, heads=16)


def attention_grid(device_type: str, quick: bool, head_dim: int | None = None) -> AttentionGrid:
    """The attention grid of this device and speed; `head_dim` (the layer's, when given and
    not 128) is measured beside 128 (the tables use 128; the other is recorded only)."""
    grid = (
        _ATTENTION_QUICK_CUDA
        if quick and device_type == "cuda"
        else _ATTENTION[grid_name(device_type, quick)]
    )
    if head_dim is None or head_dim == FLASH_TABLE_HEAD_DIM:
        return grid
    if head_dim <= 0:
        raise ValueError(f"attention head dim: value {head_dim}: allowed: a positive integer")
    return AttentionGrid(grid.seq_lengths, grid.tokens, grid.heads, (FLASH_TABLE_HEAD_DIM, head_dim))
