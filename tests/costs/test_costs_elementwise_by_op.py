"""Per-kind memory-bound curves: an op of a kind the profile measured uses its own curve,
any other op the generic one (or, with no measured curve at all, the datasheet roofline)."""

import pytest

from simcluster.calibration.records import recorded_op_kind
from simcluster.config.choices import Dtype, Recompute
from simcluster.config.hardware import known_profiles, load_hardware
from simcluster.costs.chunk import op_time_s
from simcluster.costs.compute import elementwise_kind, elementwise_time_s
from simcluster.costs.network import GroupPlacement
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, OpKind, Pass, elementwise

A100 = load_hardware("a100-sxm4-80gb-public")
ONE = GroupPlacement(num_ranks=1, ranks_per_node=1)
LAUNCH_S = A100.kernel_launch_s  # 2 µs


def _with_compute(**fields: object):
    return A100.model_copy(update={"compute": A100.compute.model_copy(update=fields)})


# Generic curve: 100 GB/s flat; softmax.bwd: 10 GB/s flat; dropout: 1 → 4 GB/s from 1 MB to 4 MB.
MEASURED = _with_compute(
    elementwise_points=[(1e6, 100.0)],
    elementwise_points_by_op={"softmax.bwd": [(1e6, 10.0)], "dropout": [(1e6, 1.0), (4e6, 4.0)]},
)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("ln1", "layernorm"),
        ("ln2.bwd", "layernorm.bwd"),
        ("output.ln", "layernorm"),
        ("ln1.residual_grad_add", "residual_grad_add"),
        ("attn.softmax", "softmax"),
        ("attn.softmax.bwd", "softmax.bwd"),
        ("attn.dropout", "dropout"),
        ("attn.dropout.bwd", "dropout.bwd"),
        ("attn.context_copy", "context_copy"),
        ("attn.context_copy.bwd", "context_copy.bwd"),
        ("mlp.bias_gelu", "bias_gelu"),
        ("mlp.bias_gelu.bwd", "bias_gelu.bwd"),
        ("attn.bias_dropout_add", "bias_dropout_add"),
        ("mlp.fc2.bias_dropout_add.bwd", "bias_dropout_add.bwd"),
        ("attn.proj.bias_dropout_add.bwd", "bias_dropout_add.bwd"),
        ("embedding.dropout", "dropout"),
        ("output.cross_entropy.bwd", "cross_entropy.bwd"),
        ("mlp.fc1.input_allgather.bwd.standin_all_gather", "standin_all_gather"),
    ],
)
def test_a_recorded_op_name_reads_back_to_its_kind(name: str, kind: str) -> None:
    """Measurement files key sites by op name: the key strips the block and keeps backward."""
    assert recorded_op_kind(name) == kind


@pytest.mark.parametrize(
    ("module", "pass_", "kind"),
    [
        (Module.LAYERNORM, Pass.INPUT_GRAD, "layernorm.bwd"),
        (Module.RESIDUAL_GRAD_ADD, Pass.INPUT_GRAD, "residual_grad_add"),
        (Module.ATTENTION_DROPOUT, Pass.FORWARD, "dropout"),
        (Module.EMBEDDING_DROPOUT, Pass.INPUT_GRAD, "dropout.bwd"),
        (Module.EMBEDDING, Pass.FORWARD, "lookup"),
        (Module.EMBEDDING, Pass.WEIGHT_GRAD, "wgrad"),
        (Module.FP8_AMAX, Pass.INPUT_GRAD, "amax"),
        (Module.STANDIN_ALL_GATHER, Pass.WEIGHT_GRAD, "standin_all_gather"),
    ],
)
def test_an_ops_kind_comes_from_its_module_and_pass(module: Module, pass_: Pass, kind: str) -> None:
    """The module's kernel, ".bwd" in the input-gradient pass unless one-way; not the name."""
    assert elementwise_kind(elementwise("any name", 1.0, module=module, pass_=pass_)) == kind


def test_every_layer_op_has_one_of_eleven_kinds() -> None:
    """Forward and backward of a t = 2, SP layer: ln, softmax, dropout, context copy, GeLU,
    bias-dropout-add (each forward and backward) and the residual-grad add."""
    cfg = LayerConfig(256, 8, 128, 2, 1024, tp=2, sequence_parallel=True, recompute=Recompute.SELECTIVE)
    ops = layer_ops(cfg)
    kinds = {elementwise_kind(op) for op in ops.forward + ops.backward if op.kind is OpKind.ELEMENTWISE}
    forward = {"layernorm", "softmax", "dropout", "context_copy", "bias_gelu", "bias_dropout_add"}
    assert kinds == forward | {f"{k}.bwd" for k in forward} | {"residual_grad_add"}


def test_a_kind_with_a_curve_uses_it() -> None:
    """1 MB of softmax backward at 10 GB/s: 100 µs + launch (the generic curve would say 10 µs)."""
    assert elementwise_time_s(1e6, MEASURED, "softmax.bwd") == pytest.approx(LAUNCH_S + 100e-6)


def test_the_kind_curve_is_interpolated_in_log_bytes() -> None:
    """2 MB lies halfway between 1 MB and 4 MB in log(bytes): 2.5 GB/s, so 800 µs + launch."""
    assert elementwise_time_s(2e6, MEASURED, "dropout") == pytest.approx(LAUNCH_S + 2e6 / 2.5e9)


@pytest.mark.parametrize("kind", [None, "softmax", "layernorm"])
def test_a_kind_without_a_curve_uses_the_generic_one(kind: str | None) -> None:
    """1 MB at the generic 100 GB/s: 10 µs + launch."""
    assert elementwise_time_s(1e6, MEASURED, kind) == pytest.approx(LAUNCH_S + 10e-6)


def test_without_any_measured_curve_a_kind_falls_back_to_the_roofline() -> None:
    """Per-kind table but no generic curve: an unlisted kind gets HBM × e_mem (A100: 2,039 × 0.85)."""
    hw = _with_compute(elementwise_points_by_op={"softmax": [(1e6, 10.0)]})
    assert elementwise_time_s(1e9, hw, "dropout") == pytest.approx(LAUNCH_S + 1e9 / (2039e9 * 0.85))
    assert elementwise_time_s(1e9, hw, "dropout") == elementwise_time_s(1e9, A100, "dropout")


def test_op_time_prices_an_op_by_its_kind() -> None:
    """The chunk pricer passes the op's kind: attn.softmax.bwd at 10 GB/s, mlp.bias_gelu generic."""
    softmax_bwd = elementwise("attn.softmax.bwd", 1e6, module=Module.SOFTMAX, pass_=Pass.INPUT_GRAD)
    gelu = elementwise("mlp.bias_gelu", 1e6, module=Module.BIAS_GELU, pass_=Pass.FORWARD)
    assert op_time_s(softmax_bwd, MEASURED, ONE, Dtype.BF16) == pytest.approx(LAUNCH_S + 100e-6)
    assert op_time_s(gelu, MEASURED, ONE, Dtype.BF16) == pytest.approx(LAUNCH_S + 10e-6)


@pytest.mark.parametrize("stem", known_profiles())
def test_datasheet_profiles_have_no_per_kind_table(stem: str) -> None:
    """Datasheet profiles price every memory-bound op alike: their numbers do not move."""
    hw = load_hardware(stem)
    if hw.provenance.kind == "measured":
        pytest.skip("a calibrated profile")
    assert hw.compute.elementwise_points_by_op == {}
