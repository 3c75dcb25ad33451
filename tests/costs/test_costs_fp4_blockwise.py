"""NVFP4 (`training.dtype: fp4`) and FP8 block scaling (`training.fp8_recipe: blockwise`) as
Transformer Engine runs them (issue 19): which GEMMs are quantized, the element and scale
bytes saved, cast and kept, the amax passes, the GEMM rates, and the errors where a profile
cannot run them."""

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import require_hardware_fits
from simcluster.costs.chunk import fp8_cast_bytes_per_element, op_time_s
from simcluster.costs.compute import fp4_gemm_time_s, fp8_gemm_time_s, gemm_time_s
from simcluster.costs.network import GroupPlacement
from simcluster.simulation import run_simulation
from simcluster.workload.fp8 import (
    fp8_bytes_per_element,
    is_te_linear_gemm,
    quantized_bytes_per_element,
    quantized_weight_bytes_per_element,
)
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape, OpKind
from tests.modern_cases import LLAMA3_8B_LAYER, llama3_8b

B300 = load_hardware("b300-sxm-288gb")
H100 = load_hardware("h100-sxm5-80gb")
TP2 = GroupPlacement(num_ranks=2, ranks_per_node=8)
LAYER = {**LLAMA3_8B_LAYER, "tp": 2, "sequence_parallel": True}
SHAPE = GemmShape(16384, 4096, 4096)


def _scenario(hardware="b300-sxm-288gb", **training):
    training = {"use_distributed_optimizer": True, **training}
    parallel = {"tp": 2, "dp": 4, "sequence_parallel": True}
    return parse_scenario(llama3_8b(hardware, {"num_layers": 4}, parallel, training), "q.yaml")


def test_element_and_scale_bytes():
    """NVFP4: 4-bit element + one E4M3 scale per 16; block scaling: one FP32 scale per 1×128
    tile (activations) and per 128×128 block (weights)."""
    assert quantized_bytes_per_element(Dtype.FP4, Fp8Recipe.DELAYED) == 0.5 + 1 / 16
    assert quantized_weight_bytes_per_element(Dtype.FP4, Fp8Recipe.DELAYED) == 0.5 + 1 / 16
    assert fp8_bytes_per_element(Fp8Recipe.BLOCKWISE) == 1 + 4 / 128
    assert quantized_weight_bytes_per_element(Dtype.FP8, Fp8Recipe.BLOCKWISE) == 1 + 4 / 16384
    assert quantized_weight_bytes_per_element(Dtype.FP8, Fp8Recipe.MXFP8) == 1 + 1 / 32


def test_casts_write_both_copies_under_nvfp4_and_block_scaling():
    """Read bf16 (2) + a row-wise and a column-wise copy, on Blackwell too (where per-tensor FP8
    writes one: 3 bytes)."""
    assert fp8_cast_bytes_per_element(B300, Fp8Recipe.DELAYED) == 3
    assert fp8_cast_bytes_per_element(B300, Fp8Recipe.DELAYED, Dtype.FP4) == 2 + 2 * (0.5 + 1 / 16)
    assert fp8_cast_bytes_per_element(B300, Fp8Recipe.BLOCKWISE) == 2 + 2 * (1 + 4 / 128)


def test_nvfp4_saves_the_te_linears_inputs_at_their_quantized_size():
    """QKV's, fc1's and fc2's saved inputs shrink from 2 bytes to 0.5625 per element; the
    attention core and norms keep theirs."""
    bf16 = {op.name: op.saved_bytes for op in layer_ops(LayerConfig(**LAYER)).forward}
    fp4 = {op.name: op.saved_bytes for op in layer_ops(LayerConfig(**LAYER, dtype="fp4")).forward}
    for name in ("attn.qkv", "mlp.fc1", "mlp.fc2"):
        assert fp4[name] == pytest.approx(bf16[name] * (0.5 + 1 / 16) / 2)
    assert fp4["attn.flash"] == bf16["attn.flash"] and fp4["ln1"] == bf16["ln1"]


def test_nvfp4_runs_an_amax_pass_before_every_quantized_input_norm_fed_too():
    """With the random Hadamard transform the norm does not fuse the amax (TE normalization.cpp
    Impl::UNFUSED), so QKV and fc1 get one, unlike FP8 current scaling."""
    fp4 = [op.name for op in layer_ops(LayerConfig(**LAYER, dtype="fp4")).forward]
    current = [
        op.name for op in layer_ops(LayerConfig(**LAYER, dtype="fp8", fp8_recipe="tensorwise")).forward
    ]
    assert "attn.qkv.amax" in fp4 and "mlp.fc1.amax" in fp4
    assert "attn.qkv.amax" not in current and "attn.proj.amax" in current
    assert sum(name.endswith(".amax_allreduce") for name in fp4) >= 2  # SP-gathered inputs


def test_block_scaling_adds_no_amax_pass():
    """Block scales are taken inside the cast: the op graph is delayed scaling's."""
    delayed = layer_ops(LayerConfig(**LAYER, dtype="fp8"))
    blocks = layer_ops(LayerConfig(**LAYER, dtype="fp8", fp8_recipe="blockwise"))
    assert [op.name for op in blocks.forward] == [op.name for op in delayed.forward]


def test_fp4_gemm_is_the_fp8_rate_times_the_measured_ratio():
    """A compute-bound TE GEMM under NVFP4 runs 1.81× the per-tensor FP8 kernel on B300."""
    launch = B300.kernel_launch_s
    fp8_s, fp4_s = fp8_gemm_time_s(SHAPE, B300) - launch, fp4_gemm_time_s(SHAPE, B300) - launch
    assert fp8_s / fp4_s == pytest.approx(1.81)


@pytest.mark.parametrize(("hw", "ratio"), [(H100, 0.866), (B300, 0.951)])
def test_block_scaled_gemm_rate_per_architecture(hw, ratio):
    """Hopper runs cuBLAS's block-scaled kernel (derived 0.866), Blackwell MXFP8's (0.951)."""
    launch = hw.kernel_launch_s
    per_tensor = fp8_gemm_time_s(SHAPE, hw) - launch
    blocks = fp8_gemm_time_s(SHAPE, hw, Fp8Recipe.BLOCKWISE) - launch
    assert per_tensor / blocks == pytest.approx(ratio)


def test_only_the_te_linears_run_in_fp4():
    """The attention core and the LM head stay BF16 (TE recipe: fp8_dpa False; Megatron's LM head
    is not a TE module): their GEMMs are priced as bf16 ones."""
    ops = layer_ops(LayerConfig(**LAYER, dtype="fp4")).forward
    gemms = [op for op in ops if op.kind is OpKind.GEMM]
    assert {op.name for op in gemms if is_te_linear_gemm(op)} == {
        "attn.qkv",
        "attn.proj",
        "mlp.fc1",
        "mlp.fc2",
    }
    for op in gemms:
        seconds = op_time_s(op, B300, TP2, Dtype.FP4)
        if is_te_linear_gemm(op):
            assert seconds == fp4_gemm_time_s(op.gemm, B300)
        else:
            assert seconds == gemm_time_s(op.gemm, B300, Dtype.FP4)


def test_fp4_weights_keep_two_quantized_copies():
    """Per TE-linear parameter: bf16 weight (2) + row-wise and column-wise NVFP4 copies."""
    fp8 = build_workload(_scenario(dtype="fp8"), B300.fp8_weight_copies).stages[0]
    fp4 = build_workload(_scenario(dtype="fp4"), B300.fp8_weight_copies).stages[0]
    bf16 = build_workload(_scenario(), B300.fp8_weight_copies).stages[0]
    fp8_extra = fp8.static.weight_bytes - bf16.static.weight_bytes  # 1 copy of 1 byte on Blackwell
    fp4_extra = fp4.static.weight_bytes - bf16.static.weight_bytes
    assert fp4_extra == pytest.approx(fp8_extra * 2 * (0.5 + 1 / 16))


def test_an_fp4_run_is_faster_than_fp8_on_b300_and_keeps_every_default():
    fp8 = run_simulation(_scenario(dtype="fp8"), B300).result.iteration_time_s
    fp4 = run_simulation(_scenario(dtype="fp4"), B300).result.iteration_time_s
    bf16 = run_simulation(_scenario(), B300).result.iteration_time_s
    assert fp4 < fp8 < bf16
    assert _scenario(dtype="fp4").training.fp4_recipe.value == "nvfp4"


def test_fp4_on_a_gpu_without_fp4_tensor_cores_names_the_profiles_that_can():
    with pytest.raises(ConfigError) as error:
        require_hardware_fits(_scenario("h100-sxm5-80gb", dtype="fp4"), H100, "q.yaml")
    text = str(error.value)
    assert "training.dtype: value fp4" in text and "'h100-sxm5-80gb' has no FP4 tensor cores" in text
    assert "b300-sxm-288gb" in text and "gb300-nvl72" in text and "h200-sxm-141gb" not in text


def test_blockwise_without_the_kernels_names_the_profiles_that_can():
    hw = load_hardware("a100-sxm4-80gb")
    data = llama3_8b("a100-sxm4-80gb", {"num_layers": 4}, {"tp": 2, "dp": 4, "sequence_parallel": True})
    data["training"].update(dtype="fp8", fp8_recipe="blockwise", attention_backend="unfused")
    with pytest.raises(ConfigError) as error:
        require_hardware_fits(parse_scenario(data, "q.yaml"), hw, "q.yaml")
    text = str(error.value)
    assert "training.fp8_recipe: value blockwise" in text and "no FP8 block-scaled GEMM kernels" in text
    assert "h100-sxm5-80gb" in text and "b300-sxm-288gb" in text


def test_fp8_recipe_with_fp4_is_refused_as_megatron_refuses_both_formats():
    with pytest.raises(ConfigError, match="needs training.dtype fp8"):
        _scenario(dtype="fp4", fp8_recipe="blockwise")


def test_fp4_param_gather_makes_the_nvfp4_copies_the_parameter():
    """--fp4-param-gather (NeMo's NVFP4 recipes turn it on): the bf16 TE weights (2 bytes) are
    replaced by their two NVFP4 copies, and the all-gather moves NVFP4, not bf16."""
    plain = build_workload(_scenario(dtype="fp4"), B300.fp8_weight_copies).stages[0]
    gathered = build_workload(_scenario(dtype="fp4", fp4_param_gather=True), B300.fp8_weight_copies).stages[0]
    fp4_copies = plain.static.weight_bytes - build_workload(_scenario(), 1).stages[0].static.weight_bytes
    te_params = fp4_copies / (2 * (0.5 + 1 / 16))
    assert plain.static.weight_bytes - gathered.static.weight_bytes == pytest.approx(2 * te_params)
    assert plain.param_gather_bytes - gathered.param_gather_bytes == pytest.approx((2 - 0.5625) * te_params)
    with pytest.raises(ConfigError, match="fp4_param_gather: value True: needs training.dtype fp4"):
        _scenario(dtype="fp8", fp4_param_gather=True)


def test_block_scaling_keeps_two_weight_copies_even_on_blackwell():
    """Per-tensor FP8 keeps one FP8 weight copy on Blackwell (non-TN GEMMs); block scaling keeps
    the row-wise and column-wise ones, each 1 + 4/16384 bytes per weight."""
    delayed = build_workload(_scenario(dtype="fp8"), B300.fp8_weight_copies).stages[0]
    blocks = build_workload(_scenario(dtype="fp8", fp8_recipe="blockwise"), B300.fp8_weight_copies).stages[0]
    bf16 = build_workload(_scenario(), B300.fp8_weight_copies).stages[0]
    one_copy = delayed.static.weight_bytes - bf16.static.weight_bytes  # 1 byte per TE weight
    assert blocks.static.weight_bytes - bf16.static.weight_bytes == pytest.approx(
        2 * one_copy * (1 + 4 / 16384)
    )
