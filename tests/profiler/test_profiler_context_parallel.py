"""Context parallelism in the real layer (TE `AttnFuncWithCPAndKVP2P`): the K/V ring computes what the
serial layer computes, on real gloo process groups, and keeps what the op graph predicts."""

from __future__ import annotations

import pytest
import torch

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.profiler.bench.launch import run_distributed
from simcluster.profiler.layer.accounting import (
    expected_saved_bytes,
    measure_saved_bytes,
    negligible_buffers,
    section4_terms,
    table2_bytes,
)
from simcluster.profiler.layer.checks import compare_with_serial_cp
from simcluster.profiler.layer.context_parallel import (
    DIAGONAL,
    LOWER,
    UPPER,
    local_positions,
    ring_attention,
    step_kind,
)
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import sharded_layer
from simcluster.workload.context_parallel import ring_held_bytes
from simcluster.workload.layer import saved_activation_bytes

RTOL = 1e-5  # fp32, max |parallel - serial| / max |serial|
FLASH = {"attention_backend": AttentionBackend.FLASH}
ROPE = {"position_embedding": PositionEmbedding.ROPE}
LLAMA = {
    **FLASH,
    **ROPE,
    "num_query_groups": 4,
    "activation": Activation.SWIGLU,
    "normalization": Normalization.RMSNORM,
}


def _gloo_specs() -> list[LayerSpec]:
    """fp32, dropout 0.1, b = 3, s = 48 in all (4 chunks of 12 at cp = 2, 8 of 6 at cp = 4).
    World of 4: tp 1 × cp 2 (two data-parallel replicas), tp 2 × cp 2 (SP on and off, every
    recompute mode), tp 1 × cp 4 (ranks 1 and 2 see lower and upper tiles)."""

    def spec(
        tp: int, cp: int, sp: bool = False, recompute: Recompute = Recompute.NONE, **options: object
    ) -> LayerSpec:
        return LayerSpec(
            hidden_size=96,
            num_attention_heads=12,
            seq_length=48 // cp,
            micro_batch_size=3,
            tp=tp,
            cp=cp,
            sequence_parallel=sp,
            recompute=recompute,
            dtype=Dtype.FP32,
            dropout_prob=0.1,
            **options,
        )

    return (
        [spec(1, 2, **LLAMA), spec(1, 2, **FLASH)]
        + [spec(2, 2, True, recompute, **LLAMA) for recompute in Recompute]
        + [spec(2, 2, False, **LLAMA), spec(1, 4, **LLAMA)]
    )


@pytest.fixture(scope="module")
def comparisons() -> list:
    """Every rank's comparisons from one gloo world of 4 processes."""
    return [c for per_rank in run_distributed(compare_with_serial_cp, 4, _gloo_specs()) for c in per_rank]


def test_context_parallel_layer_matches_serial(comparisons: list) -> None:
    """Output, input gradient and every parameter gradient (summed over the cp group) equal
    the serial layer's on the whole causal sequence, for every rank and layout."""
    assert len(comparisons) == 4 * len(_gloo_specs())
    bad = [
        (c.rank, c.spec.tp, c.spec.cp, c.spec.recompute.value, c.worst) for c in comparisons if c.worst > RTOL
    ]
    assert not bad


def test_zigzag_chunks() -> None:
    """s = 16, cp = 2: four chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2."""
    assert local_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert local_positions(5, 1, 0).tolist() == [0, 1, 2, 3, 4]
    # cp = 4, rank 1: step 0 its own K/V, step 1 rank 0's (earlier), steps 2-3 later ranks'.
    assert [step_kind(i, 1) for i in range(4)] == [DIAGONAL, LOWER, UPPER, UPPER]


def test_ring_saves_q_last_kv_buffer_out_and_lse() -> None:
    """TE's save list (AttnFuncWithCPAndKVP2P, 16-bit path): Q as given, one K/V buffer of
    s/c tokens (a new storage, not the layer's K and V), O and the fp32 LSE [b, a/t, s/c]."""
    s, b, heads, groups, d = 8, 2, 4, 2, 16
    q, k, v = (
        torch.randn(s, b, n, d, dtype=torch.bfloat16, requires_grad=True) for n in (heads, groups, groups)
    )
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = ring_attention(q, k, v, ShardStandInComm(2))
    assert [(tuple(t.shape), t.dtype) for t in saved] == [
        ((s, b, heads, d), torch.bfloat16),
        ((2, s, b, groups, d), torch.bfloat16),
        ((s, b, heads, d), torch.bfloat16),
        ((b, heads, s), torch.float32),
    ]
    assert saved[0] is q and saved[2] is out
    assert saved[1].untyped_storage().data_ptr() not in (
        k.untyped_storage().data_ptr(),
        v.untyped_storage().data_ptr(),
    )


ROWS = [
    (Recompute.NONE, False, 1),
    (Recompute.NONE, True, 2),
    (Recompute.SELECTIVE, True, 2),
    (Recompute.FULL, True, 2),
]
OPTIONS = {
    "flash": FLASH,
    "flash_rope": {**FLASH, **ROPE},
    "flash_gqa": {**FLASH, "num_query_groups": 4},
    "llama": LLAMA,
}


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("recompute,sp,tp", ROWS, ids=[f"{r.value}-sp{int(p)}-t{t}" for r, p, t in ROWS])
@pytest.mark.parametrize("name", list(OPTIONS))
def test_measured_equals_op_graph_with_cp(
    name: str, recompute: Recompute, sp: bool, tp: int, cp: int
) -> None:
    """bf16, rank 0 of the cp ring (stand-in comms), h 128, a 8, s/c = 16, b 2, dropout 0.1
    and 0: measured == the op graph's CP layer + named view-held bytes + norm statistics;
    the op graph's CP layer keeps what the local flash layer on s/c tokens keeps."""
    for p in (0.1, 0.0):
        spec = LayerSpec(
            128,
            8,
            16,
            2,
            tp=tp,
            cp=cp,
            sequence_parallel=sp,
            recompute=recompute,
            dropout_prob=p,
            **OPTIONS[name],
        )
        measured = measure_saved_bytes(spec)
        assert measured.total_bytes == expected_saved_bytes(spec, "cpu")
        assert measured.layernorm_stats_bytes == negligible_buffers(spec)["layernorm_stats"]
        held = ring_held_bytes(spec.config())
        assert table2_bytes(spec) == saved_activation_bytes(spec.config()) + held
        assert table2_bytes(spec) == sum(section4_terms(spec).values()) + held


def test_ring_frees_the_qkv_output_unless_q_is_its_view() -> None:
    """Without recompute, RoPE or a copied Q (two groups of two heads per rank) leave nothing
    holding the QKV output: measured == op graph exactly. MHA without RoPE: Q is a view, so
    the QKV output's K and V part, e·S·2k/t = 2 · 32 · 256 / 2, stays beside the K/V buffer."""
    for options in (LLAMA, {**FLASH, **ROPE}, {**FLASH, "num_query_groups": 4}):
        spec = LayerSpec(128, 8, 16, 2, tp=2, cp=2, sequence_parallel=True, **options)
        assert ring_held_bytes(spec.config()) == 0
        measured = measure_saved_bytes(spec).total_bytes
        assert measured == table2_bytes(spec) + negligible_buffers(spec)["layernorm_stats"]
    spec = LayerSpec(128, 8, 16, 2, tp=2, cp=2, sequence_parallel=True, **FLASH)
    assert ring_held_bytes(spec.config()) == 8192
    local = saved_activation_bytes(spec.config())
    assert measure_saved_bytes(spec).total_bytes == (
        local + 8192 + negligible_buffers(spec)["layernorm_stats"]
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"cp": 2}, "cp=2 needs attention_backend=flash"),
        ({"cp": 2, **FLASH, "seq_length": 15}, r"seq_length=15 \(tokens per cp rank, s/cp\) must be even"),
        ({"cp": 0, **FLASH}, "cp must be >= 1"),
    ],
)
def test_context_parallel_spec_rules(kwargs: dict, message: str) -> None:
    base = {"hidden_size": 96, "num_attention_heads": 12, "seq_length": 16, "micro_batch_size": 2}
    with pytest.raises(ValueError, match=message):
        LayerSpec(**{**base, **kwargs})


def test_layer_rejects_mismatched_cp_comm() -> None:
    spec = LayerSpec(96, 12, 16, 2, cp=2, dtype=Dtype.FP32, **FLASH)
    with pytest.raises(ValueError, match="cp_comm has world_size 1, spec.cp is 2"):
        sharded_layer(spec, ShardStandInComm(1))
    assert sharded_layer(spec, ShardStandInComm(1), cp_comm=ShardStandInComm(2)).spec.cp == 2


def test_serial_spec_is_the_whole_sequence() -> None:
    spec = LayerSpec(96, 12, 16, 2, tp=2, cp=4, sequence_parallel=True, **FLASH)
    serial = spec.serial()
    assert (serial.seq_length, serial.cp, serial.tp, serial.sequence_parallel) == (64, 1, 1, False)
    assert spec.full_seq_length == 64


def test_dropout_row_runs_are_found_once_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bias-dropout-add masks' row runs depend on the ranks alone: the layer finds them
    when built, not in every forward (a Python loop over the rows was eager host time the
    measured layer spent and Megatron does not)."""
    import simcluster.profiler.layer.transformer as transformer

    spec = LayerSpec(
        hidden_size=64, num_attention_heads=4, seq_length=16, micro_batch_size=1, tp=1, dropout_prob=0.1
    )
    layer = transformer.local_layer(spec, ShardStandInComm(1), 0, "cpu")
    assert layer._dropout_runs == [(0, 16)]
    calls: list[object] = []
    monkeypatch.setattr(transformer, "contiguous_runs", lambda rows: calls.append(rows) or [(0, 16)])
    x = torch.randn(16, 1, 64, dtype=spec.torch_dtype, requires_grad=True)
    layer(x).sum().backward()
    assert calls == []
