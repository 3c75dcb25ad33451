"""The fused layer (memory-bound regions torch.compile'd) against the eager one: the same
outputs and gradients (numerically close), the same bytes saved for backward."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    LayerMode,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.profiler.layer import regions
from simcluster.profiler.layer.accounting import measure_saved_bytes
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.regions import EAGER_MATH, fused_math, region_math
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import layer_input, local_layer

LLAMA = {
    "num_query_groups": 2,
    "activation": Activation.SWIGLU,
    "normalization": Normalization.RMSNORM,
    "position_embedding": PositionEmbedding.ROPE,
    "attention_backend": AttentionBackend.FLASH,
}
PAPER: dict[str, object] = {}  # LayerNorm, unfused softmax + attention dropout, GeLU
SQUARED_RELU = {"activation": Activation.SQUARED_RELU}
LAYERS = {"llama": LLAMA, "paper": PAPER, "squared_relu": SQUARED_RELU}


def _spec(options: dict, recompute: Recompute = Recompute.NONE, dropout: float = 0.1) -> LayerSpec:
    """h 64, a 4, s 16, b 2, rank 0 of t = 2 with SP, fp32 (so eager and fused agree to
    rounding)."""
    return LayerSpec(
        64,
        4,
        16,
        2,
        tp=2,
        sequence_parallel=True,
        recompute=recompute,
        dropout_prob=dropout,
        dtype="fp32",
        **options,
    )


def _run(spec: LayerSpec, mode: LayerMode) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(output, input grad, parameter grads) of one forward + backward on fixed masks."""
    torch.manual_seed(0)  # LocalMasks draws from the global RNG: the same masks in both modes
    layer = local_layer(spec, ShardStandInComm(spec.tp), seed=3, mode=mode)
    x = layer_input(spec, seed=5).requires_grad_()
    out = layer(x)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(grad)
    assert x.grad is not None
    return out.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}


def test_region_math_picks_the_mode() -> None:
    """eager runs the plain functions; fused wraps every one of them in torch.compile."""
    assert region_math(LayerMode.EAGER) is EAGER_MATH
    fused = region_math(LayerMode.FUSED)
    assert fused is fused_math() and fused.mode is LayerMode.FUSED
    assert fused.rope_fwd is not EAGER_MATH.rope_fwd
    assert local_layer(_spec(LLAMA), ShardStandInComm(2), mode=LayerMode.FUSED).regions is fused


@pytest.mark.parametrize("name", list(LAYERS))
def test_fused_layer_matches_eager(name: str) -> None:
    """Output, input gradient and every parameter gradient agree to fp32 rounding."""
    spec = _spec(LAYERS[name], Recompute.SELECTIVE)
    out_e, gx_e, grads_e = _run(spec, LayerMode.EAGER)
    out_f, gx_f, grads_f = _run(spec, LayerMode.FUSED)
    # the fused run compiled its regions, each whole (a graph break would split a region)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"]
    torch.testing.assert_close(out_f, out_e, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gx_f, gx_e, rtol=1e-4, atol=1e-5)
    assert grads_f.keys() == grads_e.keys() and len(grads_e) >= 8
    for n in grads_e:
        torch.testing.assert_close(grads_f[n], grads_e[n], rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.parametrize("dropout", [0.1, 0.0])
@pytest.mark.parametrize("name", list(LAYERS))
def test_fused_layer_saves_the_same_bytes(name: str, dropout: float) -> None:
    """Autograd keeps the same bytes, by kind, in both modes (Table 2 holds for both)."""
    for recompute in (Recompute.NONE, Recompute.SELECTIVE):
        spec = _spec(LAYERS[name], recompute, dropout)
        eager = measure_saved_bytes(spec, mode=LayerMode.EAGER)
        fused = measure_saved_bytes(spec, mode=LayerMode.FUSED)
        assert fused == eager


def test_fused_regions_keep_the_row_length_static() -> None:
    """Every tensor argument's last dim is marked static before the compiled call (a symbolic
    row length makes Inductor loop over the row: slower softmax and norms on a GPU)."""
    seen: list[set[int]] = []

    def compiled(x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        seen.extend(getattr(t, "_dynamo_static_indices", set()) for t in (x, y))
        return x * scale

    call = regions._rows_static(compiled)
    out = call(torch.ones(2, 3, 5), torch.ones(7), 2.0)
    assert seen == [{2}, {0}]
    assert torch.equal(out, torch.full((2, 3, 5), 2.0))
