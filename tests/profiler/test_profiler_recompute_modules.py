"""The real torch layer under `--recompute-modules` (profiler/layer): `mlp` checkpoints the
MLP on its input and `core_attn` the attention core, each only when listed; what autograd
keeps is the op graph's bytes plus the named norm statistics, and the output and gradients
are the serial layer's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from simcluster.config.choices import (  # noqa: E402
    Activation,
    AttentionBackend,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.config.moe_choices import RecomputeModule as RM  # noqa: E402
from simcluster.profiler.layer.accounting import (  # noqa: E402
    expected_saved_bytes,
    measure_saved_bytes,
    negligible_buffers,
    section4_terms,
    table2_bytes,
)
from simcluster.profiler.layer.checks import compare_with_serial  # noqa: E402
from simcluster.profiler.layer.parallel import ShardStandInComm  # noqa: E402
from simcluster.profiler.layer.spec import LayerSpec  # noqa: E402

LLAMA = {
    "num_query_groups": 4,
    "activation": Activation.SWIGLU,
    "normalization": Normalization.RMSNORM,
    "position_embedding": PositionEmbedding.ROPE,
    "attention_backend": AttentionBackend.FLASH,
}
MODULES = [
    frozenset({RM.CORE_ATTN, RM.MLP}),
    frozenset({RM.MLP}),
    frozenset({RM.CORE_ATTN, RM.LAYERNORM}),
    frozenset(),
]


def _spec(options: dict, modules: frozenset, sp: bool = True, **kw: object) -> LayerSpec:
    return LayerSpec(
        128, 8, 32, 2, tp=2, sequence_parallel=sp, recompute=Recompute.SELECTIVE, recompute_modules=modules,
        **{**options, **kw},
    )  # fmt: skip


@pytest.mark.parametrize("modules", MODULES, ids=lambda m: "+".join(sorted(x.value for x in m)) or "empty")
@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("sp", [False, True])
def test_measured_equals_op_graph_plus_norm_statistics(modules, options, sp):
    """bf16, rank 0 of t = 2, dropout 0.1: every saved byte is the op graph's or a statistic of
    a norm outside the mlp checkpoint; the section-4 terms sum to the op graph."""
    spec = _spec(options, modules, sp, dropout_prob=0.1)
    assert sum(section4_terms(spec).values()) == table2_bytes(spec)
    assert measure_saved_bytes(spec).total_bytes == expected_saved_bytes(spec, "cpu")


def test_mlp_checkpoint_frees_fc1_activation_and_fc2_inputs_and_one_norm_statistic():
    """Measured: [core_attn, mlp] keeps e·(T·h + S·fc1/t + S·f/t) less than [core_attn], and
    norm 2's statistics (inside the checkpoint) go too."""
    base = _spec(LLAMA, frozenset({RM.CORE_ATTN}), dropout_prob=0.0)
    mlp = _spec(LLAMA, frozenset({RM.CORE_ATTN, RM.MLP}), dropout_prob=0.0)
    e, t, h, f = 2, 2, 128, mlp.ffn_hidden_size
    region, full = 32 * 2 // t, 32 * 2
    freed = e * (region * h + full * 2 * f // t + full * f // t)
    stats = negligible_buffers(base)["layernorm_stats"] - negligible_buffers(mlp)["layernorm_stats"]
    assert stats == region * 4  # one RMSNorm's fp32 rsigma per token
    assert measure_saved_bytes(base).total_bytes - measure_saved_bytes(mlp).total_bytes == freed + stats


@pytest.mark.parametrize("modules", MODULES[:2], ids=["core_attn+mlp", "mlp"])
def test_recomputed_layer_equals_the_serial_layer(modules):
    """fp32, t = 1: the checkpointed MLP re-runs to the same output and gradients."""
    spec = LayerSpec(
        64, 4, 16, 2, recompute=Recompute.SELECTIVE, recompute_modules=modules, dtype="fp32", **LLAMA
    )
    (comparison,) = compare_with_serial(ShardStandInComm(1), [spec])
    assert comparison.worst <= 1e-5
