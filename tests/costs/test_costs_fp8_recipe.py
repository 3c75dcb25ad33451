"""What each FP8 scaling recipe (`training.fp8_recipe`) costs: current scaling's amax work
is priced op by op, and only delayed scaling reduces the amaxes once per pass."""

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import require_hardware_fits
from simcluster.costs.chunk import fp8_cast_bytes_per_element, op_time_s, price_layer_ops
from simcluster.costs.compute import elementwise_time_s, fp8_gemm_time_s
from simcluster.costs.network import GroupPlacement
from simcluster.costs.stage_transfers import amax_group
from simcluster.simulation import run_simulation
from simcluster.workload.fp8 import is_te_linear_gemm
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import GemmShape, Module, OpKind, Pass, gemm
from tests.modern_cases import LLAMA3_8B_LAYER, llama3_8b

H100 = load_hardware("h100-sxm5-80gb")
TP2 = GroupPlacement(num_ranks=2, ranks_per_node=8)
LAYER = {**LLAMA3_8B_LAYER, "dtype": "fp8", "tp": 2, "sequence_parallel": True}


@pytest.mark.parametrize("userbuffers", [False, True])
def test_current_scaling_costs_exactly_its_added_ops(userbuffers):
    """Tensorwise minus delayed = the amax and scale kernels (compute) plus the blocking TP
    amax all-reduces (comm), with or without TE userbuffers: the GEMMs, casts and overlaps
    of the delayed layer are priced as before."""
    delayed = layer_ops(LayerConfig(**LAYER))
    current = layer_ops(LayerConfig(**LAYER, fp8_recipe="tensorwise"))
    for part in ("forward", "backward"):
        added = [op for op in getattr(current, part) if op not in getattr(delayed, part)]
        kernels = sum(op_time_s(op, H100, TP2, Dtype.FP8) for op in added if op.kind is OpKind.ELEMENTWISE)
        reduces = sum(op_time_s(op, H100, TP2, Dtype.FP8) for op in added if op.kind is OpKind.COLLECTIVE)
        assert kernels > 0 and reduces > 0
        before = getattr(price_layer_ops(delayed, H100, TP2, Dtype.FP8, tp_comm_overlap=userbuffers), part)
        after = getattr(price_layer_ops(current, H100, TP2, Dtype.FP8, tp_comm_overlap=userbuffers), part)
        assert after.compute_s - before.compute_s == pytest.approx(kernels)
        assert after.comm_s - before.comm_s == pytest.approx(reduces)


def _scenario(hardware="h100-sxm5-80gb", **training):
    """Llama 3 8B, 4 layers, TP 2 with SP, FP8 with the distributed optimizer."""
    training = {"dtype": "fp8", "use_distributed_optimizer": True, **training}
    parallel = {"tp": 2, "dp": 4, "sequence_parallel": True}
    return parse_scenario(llama3_8b(hardware, {"num_layers": 4}, parallel, training), "recipe.yaml")


def test_only_delayed_scaling_reduces_amaxes_once_per_pass():
    """Delayed scaling all-reduces every amax over TP×DP×CP at the end of each autocast pass;
    current scaling and MXFP8 take each scale from the tensor itself (no such reduction),
    and bf16 has no amax at all."""
    assert amax_group(_scenario(), H100) is not None
    assert amax_group(_scenario(fp8_recipe="tensorwise"), H100) is None
    assert amax_group(_scenario(fp8_recipe="mxfp8"), load_hardware("b200-sxm-180gb")) is None
    assert amax_group(_scenario(dtype="bf16"), H100) is None


def test_recipes_run_end_to_end_and_current_scaling_is_the_slower_on_hopper():
    delayed = run_simulation(_scenario(), H100).result.iteration_time_s
    current = run_simulation(_scenario(fp8_recipe="tensorwise"), H100).result.iteration_time_s
    assert current > delayed
    b200 = load_hardware("b200-sxm-180gb")
    mx = run_simulation(_scenario("b200-sxm-180gb", fp8_recipe="mxfp8"), b200).result
    assert mx.iteration_time_s > 0


def test_recipe_errors_name_the_key_and_what_is_allowed():
    """MXFP8 needs Blackwell's block-scaled tensor cores (TE `check_mxfp8_support`); any
    recipe other than the default needs dtype fp8; an unknown recipe lists the choices."""
    with pytest.raises(
        ConfigError,
        match="fp8_recipe: value mxfp8: .*'h100-sxm5-80gb'.*allowed here: delayed, tensorwise, blockwise",
    ):
        require_hardware_fits(_scenario(fp8_recipe="mxfp8"), H100)
    with pytest.raises(ConfigError, match="fp8_recipe: value tensorwise: needs training.dtype fp8"):
        _scenario(dtype="bf16", fp8_recipe="tensorwise")
    with pytest.raises(ConfigError, match="'delayed', 'tensorwise', 'mxfp8' or 'blockwise'"):
        _scenario(fp8_recipe="custom")


def test_casts_write_the_transposed_copy_only_where_a_gemm_needs_it():
    """TE writes the column-wise FP8 copy of a per-tensor-scaled activation only on GPUs
    whose FP8 GEMMs take the TN layout alone (Hopper: read 2 + write 1 + 1 bytes; Blackwell:
    2 + 1); MXFP8 writes both copies everywhere, each with a scale byte per 32 elements."""
    b200 = load_hardware("b200-sxm-180gb")
    assert fp8_cast_bytes_per_element(H100, Fp8Recipe.DELAYED) == 4
    assert fp8_cast_bytes_per_element(H100, Fp8Recipe.TENSORWISE) == 4
    assert fp8_cast_bytes_per_element(b200, Fp8Recipe.DELAYED) == 3
    assert fp8_cast_bytes_per_element(b200, Fp8Recipe.TENSORWISE) == 3
    assert fp8_cast_bytes_per_element(b200, Fp8Recipe.MXFP8) == 2 + 2 * (1 + 1 / 32)


def test_mxfp8_gemms_run_at_the_profiles_block_scaled_rate():
    """A compute-bound TE GEMM under MXFP8 takes the per-tensor FP8 kernel time divided by
    `compute.mxfp8_gemm_rate_ratio` (B200: 0.951, TE's B300 GEMM profiling); a profile
    without the ratio prices both alike; only TE linears' GEMMs are FP8 at all."""
    b200 = load_hardware("b200-sxm-180gb")
    ratio = b200.compute.mxfp8_gemm_rate_ratio
    assert ratio == 0.951
    shape = GemmShape(m=8192, n=8192, k=8192)
    launch = b200.kernel_launch_s
    per_tensor = fp8_gemm_time_s(shape, b200, Fp8Recipe.TENSORWISE) - launch
    assert fp8_gemm_time_s(shape, b200, Fp8Recipe.MXFP8) - launch == pytest.approx(per_tensor / ratio)
    assert fp8_gemm_time_s(shape, b200, Fp8Recipe.DELAYED) - launch == pytest.approx(per_tensor)
    no_ratio = b200.compute.model_copy(update={"mxfp8_gemm_rate_ratio": None})
    without = b200.model_copy(update={"compute": no_ratio})
    assert fp8_gemm_time_s(shape, without, Fp8Recipe.MXFP8) == pytest.approx(launch + per_tensor)
    lm_head = gemm("output.logits", shape, module=Module.LOGITS, pass_=Pass.FORWARD)
    assert not is_te_linear_gemm(lm_head)
    one = GroupPlacement(num_ranks=1, ranks_per_node=1)
    bf16_head = op_time_s(lm_head, b200, one, Dtype.FP8)
    assert op_time_s(lm_head, b200, one, Dtype.FP8, Fp8Recipe.MXFP8) == bf16_head


def test_mxfp8_layer_costs_its_wider_casts_and_slower_gemms_and_nothing_else():
    """On B200, MXFP8 minus delayed = the casts' extra bytes plus the block-scaled GEMMs'
    extra time (no amax work either way)."""
    b200 = load_hardware("b200-sxm-180gb")
    single = {**LAYER, "tp": 1, "sequence_parallel": False}
    delayed = layer_ops(LayerConfig(**single))
    mx = layer_ops(LayerConfig(**single, fp8_recipe="mxfp8"))
    one = GroupPlacement(num_ranks=1, ranks_per_node=1)
    for part in ("forward", "backward"):
        ops = getattr(delayed, part)
        assert [op.name for op in ops] == [op.name for op in getattr(mx, part)]
        casts = [
            op.gemm.m * op.gemm.k
            for op in ops
            if op.gemm is not None and is_te_linear_gemm(op) and op.pass_ is not Pass.WEIGHT_GRAD
        ]
        extra = sum(
            elementwise_time_s(fp8_cast_bytes_per_element(b200, Fp8Recipe.MXFP8) * n, b200)
            - elementwise_time_s(3 * n, b200)
            for n in casts
        )
        te_gemms = [op.gemm for op in ops if op.gemm is not None and is_te_linear_gemm(op)]
        for g in te_gemms:
            extra += fp8_gemm_time_s(g, b200, Fp8Recipe.MXFP8) - fp8_gemm_time_s(g, b200, Fp8Recipe.DELAYED)
        before = getattr(price_layer_ops(delayed, b200, one, Dtype.FP8), part).compute_s
        after = getattr(price_layer_ops(mx, b200, one, Dtype.FP8), part).compute_s
        assert len(casts) == 4 and after - before == pytest.approx(extra)
