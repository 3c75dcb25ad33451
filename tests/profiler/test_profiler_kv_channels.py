"""The real torch layer with a head width apart from h / a (Megatron --kv-channels, as Qwen3
and gpt-oss): its weights have Megatron-core's shapes (linear_qkv h -> a·d + 2·g·d, linear_proj
a·d -> h), it saves exactly the op graph's bytes, and its flash and unfused cores agree."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.profiler.layer.accounting import expected_saved_bytes, measure_saved_bytes
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import layer_input, serial_layer
from simcluster.profiler.layer.weights import param_shapes

RTOL = 1e-5
LLAMA = {
    "num_query_groups": 4,
    "activation": Activation.SWIGLU,
    "normalization": Normalization.RMSNORM,
    "position_embedding": PositionEmbedding.ROPE,
}


def _spec(**kw: object) -> LayerSpec:
    """h 128, a 8 (h / a = 16) with heads of 24: q = 192 > h, as Qwen3's 4096 > 2048."""
    return LayerSpec(128, 8, 32, 2, kv_channels=24, **kw)  # type: ignore[arg-type]


def test_weights_have_megatrons_shapes() -> None:
    shapes = param_shapes(_spec(tp=2, **LLAMA))
    assert shapes["qkv_weight"] == ((8 * 24 + 2 * 4 * 24) // 2, 128)
    assert shapes["proj_weight"] == (128, 8 * 24 // 2)


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize("backend", list(AttentionBackend))
def test_saved_bytes_are_the_op_graphs(recompute: Recompute, backend: AttentionBackend) -> None:
    """bf16, rank 0 of t = 2 with SP, dropout 0.1: measured == the op graph (+ norm stats)."""
    spec = _spec(tp=2, sequence_parallel=True, recompute=recompute, attention_backend=backend,
                 dropout_prob=0.1, **LLAMA)  # fmt: skip
    assert measure_saved_bytes(spec).total_bytes == expected_saved_bytes(spec, "cpu")


def test_flash_matches_unfused_with_wide_heads() -> None:
    unfused = _spec(dtype=Dtype.FP32, dropout_prob=0.0, **LLAMA)
    flash = replace(unfused, attention_backend=AttentionBackend.FLASH)
    x = layer_input(unfused, seed=0)
    expected = serial_layer(unfused, seed=0)(x)
    assert (serial_layer(flash, seed=0)(x) - expected).abs().max() <= RTOL * expected.abs().max()


def test_the_torch_layer_refuses_a_window() -> None:
    """Sliding windows are priced by the simulator only; the real layer says so."""
    with pytest.raises(ValueError, match="LayerSpec.window_size=127: the torch layer has no sliding-window"):
        _spec(window_size=127)
