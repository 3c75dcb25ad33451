"""FP8 scaling recipes in the op graph (`training.fp8_recipe`, `workload.fp8`): what current
scaling adds before each quantization and what MXFP8's scales add to memory."""

import pytest

from simcluster.config import parse_scenario
from simcluster.config.choices import Fp8Recipe
from simcluster.workload.fp8 import AMAX_READ_BYTES_PER_ELEMENT, is_te_linear_gemm
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload
from simcluster.workload.ops import CollectiveKind, OpKind
from tests.modern_cases import llama3_8b

LLAMA_LAYER = {
    "hidden_size": 512, "num_attention_heads": 8, "seq_length": 256, "micro_batch_size": 1,
    "ffn_hidden_size": 1536, "num_query_groups": 4, "activation": "swiglu", "normalization": "rmsnorm",
    "position_embedding": "rope", "attention_backend": "flash", "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "dtype": "fp8",
}  # fmt: skip

EXTRA_SUFFIXES = (".amax", ".amax_allreduce", ".fp8_scale")


def _ops(**overrides):
    return layer_ops(LayerConfig(**(LLAMA_LAYER | overrides)))


def _extras(ops):
    return [op for op in ops if op.name.endswith(EXTRA_SUFFIXES)]


@pytest.mark.parametrize(
    ("tp", "sp", "recompute"),
    [(1, False, "none"), (2, True, "none"), (2, False, "selective"), (4, True, "full")],
)
def test_current_scaling_adds_only_its_quantization_ops_and_keeps_the_rest(tp, sp, recompute):
    """Tensorwise = delayed plus amax / scale / amax-reduction ops, nothing else moved or
    changed, and the same saved bytes (the amax pass keeps nothing)."""
    layout = {"tp": tp, "sequence_parallel": sp, "recompute": recompute}
    delayed, current = _ops(**layout), _ops(**layout, fp8_recipe="tensorwise")
    for part in ("forward", "backward", "recompute"):
        kept = [op for op in getattr(current, part) if op not in _extras(getattr(current, part))]
        assert kept == list(getattr(delayed, part))
    assert current.saved_bytes == delayed.saved_bytes
    assert _extras(current.recompute) == (_extras(current.forward) if recompute == "full" else [])


def test_each_fprop_and_dgrad_input_gets_an_amax_pass_except_the_norm_fed_ones():
    """The amax kernel reads the bf16 A operand of every TE fprop and dgrad (2 bytes per
    element); QKV and fc1 fprops read a norm output whose amax the norm kernel computed."""
    ops = _ops(fp8_recipe="tensorwise")
    gemms = [
        op for op in ops.forward + ops.backward if is_te_linear_gemm(op) and not op.name.endswith(".wgrad")
    ]
    amax = {op.name.removesuffix(".amax"): op.bytes_moved for op in _extras(ops.forward + ops.backward)
            if op.name.endswith(".amax")}  # fmt: skip
    expected = {
        op.name: AMAX_READ_BYTES_PER_ELEMENT * op.gemm.m * op.gemm.k
        for op in gemms
        if op.name not in ("attn.qkv", "mlp.fc1")
    }
    assert amax == expected and len(expected) == 6  # proj, fc2 fprops; four dgrads
    scales = [op for op in _extras(ops.forward + ops.backward) if op.name.endswith(".fp8_scale")]
    assert len(scales) == len(gemms) == 8


def test_sequence_parallel_gathers_reduce_the_amax_over_tp_on_the_local_shard():
    """Under SP the column-parallel inputs and row-parallel grad-outputs are quantized on the
    local shard and gathered in FP8, so their amax is all-reduced over TP first (4 per layer);
    the amax pass reads 1/t of the tensor. Without SP nothing is all-reduced."""
    sp, plain = (
        _ops(tp=4, sequence_parallel=True, fp8_recipe="tensorwise"),
        _ops(tp=4, fp8_recipe="tensorwise"),
    )
    reduced = [op for op in _extras(sp.forward + sp.backward) if op.collective is CollectiveKind.ALL_REDUCE]
    assert sorted(op.name for op in reduced) == sorted(
        f"{n}.amax_allreduce" for n in ("attn.qkv", "mlp.fc1", "mlp.fc2.dgrad", "attn.proj.dgrad")
    )
    assert all(op.message_bytes == 4 for op in reduced)
    assert not [op for op in _extras(plain.forward + plain.backward) if op.kind is OpKind.COLLECTIVE]

    def fc2_amax(ops):
        return next(op.bytes_moved for op in ops.backward if op.name == "mlp.fc2.dgrad.amax")

    assert 4 * fc2_amax(sp) == fc2_amax(plain) > 0


def test_quantization_runs_before_the_collective_its_gemm_reads_or_overlaps():
    """TE quantizes, then gathers (or starts the bulk ln_out gather beside the dgrad): the
    GEMM keeps its collective right before it, so the overlap and userbuffers pairing stay."""
    ops = _ops(tp=2, sequence_parallel=True, fp8_recipe="tensorwise").backward
    names = [op.name for op in ops]
    for gemm in ("mlp.fc1.dgrad", "mlp.fc2.dgrad", "attn.qkv.dgrad", "attn.proj.dgrad"):
        assert ops[names.index(gemm) - 1].kind is OpKind.COLLECTIVE, gemm
        assert ops[names.index(gemm) - 2].name == f"{gemm}.fp8_scale"


TE_WEIGHTS = 4 * 218_103_808  # 4 layers × h(q + 2k) + qh + 3hf


def _stage(recipe, copies):
    data = llama3_8b("b200-sxm-180gb", {"num_layers": 4}, training={"dtype": "fp8", "fp8_recipe": recipe})
    return build_workload(parse_scenario(data, "mx.yaml"), copies).stages[0]


def test_mxfp8_keeps_two_scaled_weight_copies_and_scaled_saved_inputs():
    """MXFP8 scales run along the reduction axis, so W and Wᵀ are two copies even on
    Blackwell, each 1 + 1/32 bytes per weight; the TE linears' saved FP8 inputs carry the
    same 1/32 of scales; the once-per-step cast writes both copies."""
    delayed, mx = _stage("delayed", 1), _stage("mxfp8", 1)
    per_copy = 1 + 1 / 32
    assert mx.static.weight_bytes - delayed.static.weight_bytes == pytest.approx(
        (2 * per_copy - 1) * TE_WEIGHTS
    )
    assert mx.optimizer_step_bytes - delayed.optimizer_step_bytes == pytest.approx(
        (2 * per_copy - 1) * TE_WEIGHTS
    )
    layer = {k: v for k, v in LLAMA_LAYER.items() if k != "dtype"}
    fp8_saved = {
        op.name: op.saved_bytes
        for op in layer_ops(LayerConfig(**layer, dtype="fp8")).forward
        if is_te_linear_gemm(op)
    }
    mx_saved = {
        op.name: op.saved_bytes
        for op in layer_ops(LayerConfig(**layer, dtype="fp8", fp8_recipe=Fp8Recipe.MXFP8)).forward
        if is_te_linear_gemm(op)
    }
    assert mx_saved == {name: pytest.approx(saved * per_copy) for name, saved in fp8_saved.items()}
    assert all(saved > 0 for saved in fp8_saved.values())
