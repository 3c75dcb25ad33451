"""Every norm of a `model.normalization: rmsnorm` model runs the RMSNorm kernel (`Op.kernel`
"rmsnorm", priced by a profile's RMSNorm curve where it has one): the dense layer's input and
pre-MLP norms, MLA's q / kv latent norms, the MoE layer's pre-MLP norm, the MTP layers' enorm
and hnorm (on the last stage or a standalone MTP stage), and the final norms before the output
layer. Megatron-core builds each with the model's `--normalization` (TENorm / TE's fused
LayerNormLinear). A LayerNorm model names no kernel (its module's, "layernorm"), and the
bytes each norm moves are the same either way."""

from __future__ import annotations

import pytest

from simcluster.config import load_hardware
from simcluster.costs.compute import elementwise_kind, elementwise_time_s
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module, Op
from tests.workload.test_mla_layer import _small

H100 = load_hardware("h100-sxm5-80gb")
# the MTP layer on its own virtual stage, the loss on the next (as test_workload_pipeline_layout)
STANDALONE = {"parallel.pp": 4, "parallel.pipeline_layout": "Ett|ttt|tm|L"}


def _norms(scenario) -> dict[str, Op]:
    """Every norm op of the workload (forward, backward, recompute), by name."""
    norms: dict[str, Op] = {}
    for stage in build_workload(scenario).stages:
        for chunk in stage.chunks:
            parts = [segment.layer for segment in chunk.segments]
            parts += [part for part in (chunk.embedding, chunk.output) if part is not None]
            for ops in parts:
                for op in (*ops.forward, *ops.backward, *ops.recompute):
                    if op.module is Module.LAYERNORM:
                        norms[op.name] = op
    return norms


# the norms the small DeepSeek-V3-shaped model (MLA, a dense then MoE layers, one MTP layer) has
EXPECTED = {
    f"{name}{suffix}"
    for name in (
        "ln1",
        "ln2",
        "attn.q_up.ln",
        "attn.kv_up.ln",
        "mtp0.mtp.enorm.ln",
        "mtp0.mtp.hnorm.ln",
        "mtp0.output.ln",
        "output.ln",
    )  # fmt: skip
    for suffix in ("", ".bwd")
}


@pytest.mark.parametrize("layout", [{}, STANDALONE], ids=["mtp-on-last-stage", "standalone-mtp-stage"])
def test_every_norm_of_an_rmsnorm_model_runs_the_rmsnorm_kernel(layout) -> None:
    norms = _norms(_small(**layout))
    assert set(norms) == EXPECTED
    assert {name: elementwise_kind(op) for name, op in norms.items()} == {
        name: "rmsnorm.bwd" if name.endswith(".bwd") else "rmsnorm" for name in EXPECTED
    }


def test_a_layernorm_model_names_no_norm_kernel_and_moves_the_same_bytes() -> None:
    rms = _norms(_small())
    layer = _norms(_small(**{"model.normalization": "layernorm"}))
    assert set(layer) == EXPECTED
    assert {op.kernel for op in layer.values()} == {None}
    assert {name: (op.bytes_moved, op.saved_bytes) for name, op in layer.items()} == {
        name: (op.bytes_moved, op.saved_bytes) for name, op in rms.items()
    }


def test_the_final_and_latent_norms_are_priced_by_the_rmsnorm_curve() -> None:
    """A profile with an RMSNorm curve 8x slower than its layer-norm curve prices the final
    norm and the kv latent norm 8x the layer norm's transfer time (the launch latency apart)."""
    curves = {"layernorm": [(1e3, 2000.0), (1e9, 2000.0)], "rmsnorm": [(1e3, 250.0), (1e9, 250.0)]}
    hw = H100.model_copy(
        update={"compute": H100.compute.model_copy(update={"elementwise_points_by_op": curves})}
    )
    rms = _norms(_small())
    layer = _norms(_small(**{"model.normalization": "layernorm"}))
    for name in ("output.ln", "attn.kv_up.ln", "mtp0.mtp.hnorm.ln"):
        moved = rms[name].bytes_moved
        assert elementwise_time_s(moved, hw, elementwise_kind(rms[name])) == pytest.approx(
            hw.kernel_launch_s + moved / 250e9
        )
        assert elementwise_time_s(moved, hw, elementwise_kind(layer[name])) == pytest.approx(
            hw.kernel_launch_s + moved / 2000e9
        )
