"""The real layer without linear biases (`add_bias_linear` false, Megatron's
--disable-bias-linear): it has no QKV / proj / fc1 / fc2 bias, computes what the biased layer
computes with those biases at zero, and keeps exactly the bytes the op graph counts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from simcluster.config.choices import Activation, AttentionBackend, Dtype, Normalization, Recompute
from simcluster.profiler.layer.accounting import expected_saved_bytes, measure_saved_bytes
from simcluster.profiler.layer.ops import SlicedMasks
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import ParallelTransformerLayer, layer_input
from simcluster.profiler.layer.weights import LINEAR_BIASES, param_names, serial_weights
from simcluster.workload.layer import layer_ops

LLAMA = {
    "num_query_groups": 4, "activation": Activation.SWIGLU, "normalization": Normalization.RMSNORM,
    "attention_backend": AttentionBackend.FLASH,
}  # fmt: skip
ROWS = [(Recompute.NONE, False), (Recompute.NONE, True), (Recompute.SELECTIVE, True), (Recompute.FULL, True)]


def _spec(options: dict, recompute: Recompute = Recompute.NONE, sp: bool = True, **kw: object) -> LayerSpec:
    """h 128, a 8, s 32, b 2, t 2, biases off."""
    return LayerSpec(
        128,
        8,
        32,
        2,
        tp=2,
        sequence_parallel=sp,
        recompute=recompute,
        add_bias_linear=False,
        **{**options, **kw},
    )


def test_the_layer_has_no_linear_biases():
    spec = _spec({})
    names = param_names(spec)
    assert not set(LINEAR_BIASES) & set(names) and {"ln1_bias", "ln2_bias"} <= set(names)
    assert set(LINEAR_BIASES) <= set(param_names(replace(spec, add_bias_linear=True)))


@pytest.mark.parametrize("recompute,sp", ROWS, ids=[f"{r.value}-sp{int(p)}" for r, p in ROWS])
@pytest.mark.parametrize("options", [{}, LLAMA], ids=["gpt", "llama"])
def test_measured_saved_bytes_equal_the_op_graph(options, recompute, sp):
    """bf16, rank 0 of t = 2, dropout 0.1 and 0: every saved byte is the op graph's (plus the
    named extras, as with biases), and the same count as the biased layer's."""
    for p in (0.1, 0.0):
        spec = _spec(options, recompute, sp, dropout_prob=p)
        measured = measure_saved_bytes(spec)
        assert measured.total_bytes == expected_saved_bytes(spec, "cpu")
        assert (
            layer_ops(spec.config()).saved_bytes
            == layer_ops(replace(spec.config(), add_bias_linear=True)).saved_bytes
        )


@pytest.mark.parametrize("activation", [Activation.GELU, Activation.SWIGLU])
def test_without_biases_it_is_the_biased_layer_with_zero_biases(activation):
    """Serial fp32, dropout 0.1 with the same masks: output, input gradient and every weight
    gradient equal the biased layer's whose linear biases are zero (residual + dropout(x) is
    Megatron's bias-dropout-add with bias None)."""
    biased = LayerSpec(64, 4, 16, 2, dtype=Dtype.FP32, dropout_prob=0.1, activation=activation)
    plain = replace(biased, add_bias_linear=False)
    weights = serial_weights(biased, seed=3)
    zeroed = {n: torch.zeros_like(w) if n in LINEAR_BIASES else w for n, w in weights.items()}
    runs = []
    for spec, params in ((biased, zeroed), (plain, {n: weights[n] for n in param_names(plain)})):
        layer = ParallelTransformerLayer(
            spec, {n: w.clone() for n, w in params.items()}, ShardStandInComm(1), SlicedMasks(5)
        )
        x = layer_input(spec, 7).requires_grad_()
        out = layer(x)
        out.backward(layer_input(spec, 8))
        runs.append((out.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}))
    (out_b, dx_b, grads_b), (out_p, dx_p, grads_p) = runs
    assert torch.allclose(out_p, out_b, rtol=1e-6, atol=1e-6)
    assert torch.allclose(dx_p, dx_b, rtol=1e-6, atol=1e-6)
    assert set(grads_p) == set(grads_b) - set(LINEAR_BIASES)
    for name, grad in grads_p.items():
        assert torch.allclose(grad, grads_b[name], rtol=1e-5, atol=1e-6), name
    assert all(grads_b[name].abs().sum() > 0 for name in LINEAR_BIASES)  # the biased layer used them
