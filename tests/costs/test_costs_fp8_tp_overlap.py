"""FP8 GEMM pricing, TE userbuffers' TP comm overlap and FP8's extras, worked by hand."""

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import require_hardware_fits
from simcluster.costs.chunk import (
    fp8_amax_reduction_s,
    fp8_cast_bytes_per_element,
    op_time_s,
    pipelined_s,
    price_ops,
    ring_exchange_s,
)
from simcluster.costs.compute import elementwise_time_s, fp8_gemm_time_s, gemm_time_s
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from simcluster.workload.ops import CollectiveKind, GemmShape, Module, Pass, collective, gemm

F = Pass.FORWARD

H100 = load_hardware("h100-sxm5-80gb")
NODE = GroupPlacement(num_ranks=8, ranks_per_node=8)
LAUNCH_S = 2e-6
# 256×128 tiles: ⌈33792/256⌉·⌈1024/128⌉ = 132·8 tiles = 8 full waves on 132 SMs
FULL_WAVES = GemmShape(m=256 * 132, n=1024, k=8192)


H100_CEILING_ONLY = H100.model_copy(
    update={"compute": H100.compute.model_copy(update={"fp8_gemm_points": [], "gemm_points": []})}
)
"""The H100 profile without its measured GEMMs: the ceilings with wave quantization."""


def test_fp8_gemm_runs_at_the_fp8_mamf_without_measured_points():
    """Compute-bound, whole waves: FLOPs / (1979 TFLOP/s · 0.6136) + launch, against
    989 · 0.6951 in BF16 (the sustained ceilings): 1.77× faster."""
    flops = 2 * 33792 * 1024 * 8192
    assert fp8_gemm_time_s(FULL_WAVES, H100_CEILING_ONLY) == pytest.approx(
        LAUNCH_S + flops / (1979e12 * 0.6136)
    )
    bf16 = gemm_time_s(FULL_WAVES, H100_CEILING_ONLY)
    assert bf16 == pytest.approx(LAUNCH_S + flops / (989e12 * 0.6951))


def test_measured_fp8_gemm_points_set_the_rate_at_their_shapes():
    """At a measured shape the FP8 GEMM runs at the measured rate: the Llama 3 70B t 8 proj
    GEMM (8192 × 8192 × 1024) at 907.3 TFLOP/s on the project's H100, 23 % below the
    ceiling × waves (1214.3 · 0.97) the profile would give without it."""
    shape = GemmShape(m=8192, n=8192, k=1024)
    flops = 2 * 8192 * 8192 * 1024
    assert fp8_gemm_time_s(shape, H100) == pytest.approx(LAUNCH_S + flops / 907.3e12)
    assert fp8_gemm_time_s(shape, H100) > 1.25 * fp8_gemm_time_s(shape, H100_CEILING_ONLY) - LAUNCH_S


def test_h200_prices_fp8_from_its_own_measured_gemms():
    """H200's cuBLASLt table (Azure ND H200 v5) scaled to sustained load: 4096³ at 1249.1 ×
    0.9324 = 1165 TFLOP/s, not the H100's measured rates."""
    h200 = load_hardware("h200-sxm-141gb")
    shape = GemmShape(m=4096, n=4096, k=4096)
    assert fp8_gemm_time_s(shape, h200) == pytest.approx(LAUNCH_S + 2 * 4096**3 / 1165e12)


def test_measured_fp8_rates_never_exceed_the_ceiling():
    """Between and beyond the points the blend is capped at the FP8 ceiling (1979 · 0.6136)."""
    for shape in (FULL_WAVES, GemmShape(m=65536, n=65536, k=65536), GemmShape(m=3000, n=5000, k=7000)):
        rate = shape.flops / (fp8_gemm_time_s(shape, H100) - LAUNCH_S)
        assert rate <= 1979e12 * 0.6136 * (1 + 1e-9)


def test_fp8_gemm_points_need_the_fp8_ceiling():
    data = H100.model_dump()
    data["compute"]["fp8_gemm_max_efficiency"] = None
    data["compute"]["sources"].pop("fp8_gemm_max_efficiency")
    with pytest.raises(ValueError, match="fp8_gemm_points needs compute.fp8_gemm_max_efficiency"):
        type(H100).model_validate(data)


def test_only_the_te_linears_run_in_fp8():
    """QKV, proj, fc1, fc2 (fprop, dgrad, wgrad) in FP8; attention BMMs and the LM head BF16."""
    f, b, w = Pass.FORWARD, Pass.INPUT_GRAD, Pass.WEIGHT_GRAD
    for name, module, pass_ in (
        ("attn.qkv", Module.QKV, f), ("attn.proj.dgrad", Module.PROJ, b), ("mlp.fc1.wgrad", Module.FC1, w),
        ("mlp.fc2", Module.FC2, f),
    ):  # fmt: skip
        op = gemm(name, FULL_WAVES, module=module, pass_=pass_)
        assert op_time_s(op, H100, NODE, Dtype.FP8) == fp8_gemm_time_s(FULL_WAVES, H100)
    for name, module, pass_ in (
        ("attn.qk", Module.QK, f), ("attn.av.dgrad_v", Module.AV, b), ("output.logits", Module.LOGITS, f),
        ("output.logits.wgrad", Module.LOGITS, w),
    ):  # fmt: skip
        op = gemm(name, FULL_WAVES, module=module, pass_=pass_)
        assert op_time_s(op, H100, NODE, Dtype.FP8) == gemm_time_s(FULL_WAVES, H100)


def test_fp8_casts_the_local_shard_and_gathers_one_byte_elements():
    """SP all-gather feeding QKV: TE casts the s·b·h/t shard (read 2, write 1 + 1 bytes) and
    gathers FP8, half the bf16 message."""
    tokens, h, t = 4096, 8192, 8
    message = 2 * tokens * h
    ops = (
        collective("attn.allgather", CollectiveKind.ALL_GATHER, message, module=Module.QKV, pass_=F),
        gemm("attn.qkv", GemmShape(m=tokens, n=3 * h // t, k=h), module=Module.QKV, pass_=Pass.FORWARD),
    )
    cost = price_ops(ops, H100, NODE, Dtype.FP8)
    cast_s = elementwise_time_s(fp8_cast_bytes_per_element(H100) * tokens * h / t, H100)
    assert cost.comm_s == pytest.approx(collective_time_s(CollectiveKind.ALL_GATHER, message / 2, NODE, H100))
    assert cost.compute_s == pytest.approx(fp8_gemm_time_s(ops[1].gemm, H100) + cast_s)


def test_pipeline_formulas():
    # two-stage pipeline of 4 chunks: the first GEMM chunk and the last comm chunk stick out
    assert pipelined_s(4.0, 2.0, 4) == pytest.approx(4.0 + 0.5)
    assert pipelined_s(1.0, 2.0, 4) == pytest.approx(2.0 + 0.25)
    # ring exchange in 8: comm-bound pays the last GEMM chunk; GEMM-bound hides it all
    assert ring_exchange_s(1.0, 2.0, 8) == pytest.approx(2.125)
    assert ring_exchange_s(4.0, 1.0, 8) == pytest.approx(4.0)


def _tp_pair(first, second):
    return price_ops((first, second), H100, NODE, Dtype.BF16, tp_comm_overlap=True)


def test_userbuffers_ring_exchange_all_gather():
    message, shape = 2 * 4096 * 8192, GemmShape(m=4096, n=3072, k=8192)
    ag = collective("attn.allgather", CollectiveKind.ALL_GATHER, message, module=Module.QKV, pass_=F)
    qkv = gemm("attn.qkv", shape, module=Module.QKV, pass_=Pass.FORWARD)
    cost = _tp_pair(ag, qkv)
    g, c = gemm_time_s(shape, H100), collective_time_s(CollectiveKind.ALL_GATHER, message, NODE, H100)
    assert cost.compute_s == pytest.approx(g)  # ring exchange: no SM margin
    assert cost.total_s == pytest.approx(max(g, c + g / 8))
    plain = price_ops((ag, qkv), H100, NODE, Dtype.BF16)
    assert plain.total_s == pytest.approx(g + c)


def test_userbuffers_pipelined_reduce_scatter_loses_16_sms():
    message, shape = 2 * 4096 * 8192, GemmShape(m=4096, n=8192, k=1024)
    f = Pass.FORWARD
    cost = _tp_pair(
        gemm("attn.proj", shape, module=Module.PROJ, pass_=f),
        collective("attn.reducescatter", CollectiveKind.REDUCE_SCATTER, message, module=Module.PROJ, pass_=f),
    )
    g = LAUNCH_S + (gemm_time_s(shape, H100) - LAUNCH_S) * 132 / (132 - 16)
    c = 4 * collective_time_s(CollectiveKind.REDUCE_SCATTER, message / 4, NODE, H100)
    assert cost.compute_s == pytest.approx(g)
    assert cost.total_s == pytest.approx(max(g, c) + min(g, c) / 4)


def test_userbuffers_bulk_overlap_in_backward():
    message, shape = 2 * 4096 * 8192, GemmShape(m=4096, n=8192, k=3072)
    ag = collective(
        "attn.qkv.input_allgather.bwd", CollectiveKind.ALL_GATHER, message, overlaps_next=True,
        module=Module.QKV, pass_=Pass.WEIGHT_GRAD,
    )  # fmt: skip
    cost = _tp_pair(ag, gemm("attn.qkv.dgrad", shape, module=Module.QKV, pass_=Pass.INPUT_GRAD))
    g = LAUNCH_S + (gemm_time_s(shape, H100) - LAUNCH_S) * 132 / 116
    c = collective_time_s(CollectiveKind.ALL_GATHER, message, NODE, H100)
    assert cost.total_s == pytest.approx(max(g, c))


def test_amax_reduction_is_latency_bound_on_a_tree():
    """256 ranks across nodes: base 8.4 µs + 2·⌈log2 256⌉ = 16 hops × 14 µs (IB step)."""
    assert fp8_amax_reduction_s(GroupPlacement(256, 8), H100) == pytest.approx((8.4 + 16 * 14) * 1e-6)
    assert fp8_amax_reduction_s(NODE, H100) == pytest.approx((8.4 + 6 * 3.4) * 1e-6)
    assert fp8_amax_reduction_s(GroupPlacement(1, 1), H100) == 0.0


GPT3 = {
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 96,
        "hidden_size": 12288,
        "num_attention_heads": 96,
        "seq_length": 2048,
        "vocab_size": 51200,
    },
    "parallel": {"tp": 8, "pp": 8, "dp": 2, "sequence_parallel": True},
    "training": {"micro_batch_size": 1, "global_batch_size": 32, "recompute": "selective"},
}


def _gpt3(**training):
    return parse_scenario({**GPT3, "training": {**GPT3["training"], **training}}, "s.yaml")


def test_fp8_weight_copies_add_one_byte_per_linear_parameter():
    """12 layers per stage × 12h²/t linear weights at 1 byte."""
    bf16, fp8 = build_workload(_gpt3()), build_workload(_gpt3(dtype="fp8"))
    extra = fp8.stages[3].static.weight_bytes - bf16.stages[3].static.weight_bytes
    assert extra == pytest.approx(12 * 12 * 12288**2 / 8)


def test_fp8_and_tp_overlap_speed_up_gpt3_on_h100():
    base = run_simulation(_gpt3(), H100).result
    fp8 = run_simulation(_gpt3(dtype="fp8"), H100).result
    overlap = run_simulation(_gpt3(tp_comm_overlap=True), H100).result
    assert fp8.iteration_time_s < base.iteration_time_s
    assert overlap.iteration_time_s < base.iteration_time_s
    assert fp8.model_flops == base.model_flops
    # MFU stays against the BF16 peak
    assert fp8.mfu == pytest.approx(fp8.model_flops / (fp8.iteration_time_s * 128 * 989e12))


def test_fp8_on_a100_is_one_clear_error():
    scenario = parse_scenario(
        {**GPT3, "hardware": "a100-sxm4-80gb", "training": {**GPT3["training"], "dtype": "fp8"}}, "s.yaml"
    )
    a100 = load_hardware("a100-sxm4-80gb")
    with pytest.raises(ConfigError) as caught:
        require_hardware_fits(scenario, a100, "s.yaml")
    message = str(caught.value)
    assert "training.dtype: value fp8" in message and "'a100-sxm4-80gb'" in message
    assert "h100-sxm5-80gb" in message and "b200-sxm-180gb" in message
    with pytest.raises(ConfigError, match="no FP8 tensor cores"):
        run_simulation(scenario, a100)


def _llama_8b_layer(dtype, recompute="none"):
    from simcluster.config.choices import Activation, AttentionBackend, Recompute
    from simcluster.workload.layer_config import LayerConfig

    return LayerConfig(
        hidden_size=4096,
        num_attention_heads=32,
        seq_length=8192,
        micro_batch_size=1,
        ffn_hidden_size=14336,
        tp=8,
        sequence_parallel=True,
        num_query_groups=8,
        activation=Activation.SWIGLU,
        attention_backend=AttentionBackend.FLASH,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        dtype=dtype,
        recompute=Recompute(recompute),
    )


def test_fp8_saved_bytes_follow_modern_md_section_4():
    """(sb/t)(8h + 4q + 4k + 6f) in BF16 → (sb/t)(6h + 5q + 4k + 5f) in FP8: ln_out ×2 and
    fc2's input drop to 1 byte, proj adds an FP8 copy of O; plus the fp32 LSE 4·sb·n/t."""
    from simcluster.workload.layer import layer_ops

    s, b, t, h, q, k, f, n = 8192, 1, 8, 4096, 4096, 1024, 14336, 32
    lse = 4 * s * b * n / t
    bf16 = layer_ops(_llama_8b_layer(Dtype.BF16)).saved_bytes
    fp8 = layer_ops(_llama_8b_layer(Dtype.FP8)).saved_bytes
    assert bf16 == pytest.approx(s * b / t * (8 * h + 4 * q + 4 * k + 6 * f) + lse)
    assert fp8 == pytest.approx(s * b / t * (6 * h + 5 * q + 4 * k + 5 * f) + lse)
    assert fp8 / (s * b * h / t) == pytest.approx(29.5 + lse / (s * b * h / t))
    # core_attn checkpoint: DPA's bf16 O goes, proj keeps only its FP8 copy
    selective = layer_ops(_llama_8b_layer(Dtype.FP8, "selective")).saved_bytes
    assert selective == pytest.approx(s * b / t * (6 * h + 3 * q + 4 * k + 5 * f))
    # full recompute keeps the bf16 layer input only
    full = layer_ops(_llama_8b_layer(Dtype.FP8, "full")).saved_bytes
    assert full == pytest.approx(2 * s * b * h / t)


def test_amax_reduction_is_paid_once_per_chunk_pass():
    """A chunk's price adds one amax all-reduce to its forward and one to its backward,
    whatever its number of layers; BF16 adds none."""
    from dataclasses import replace

    from simcluster.costs.stage_pricing import StagePricing, pricing_layout
    from simcluster.costs.stage_transfers import amax_group

    scenario = _gpt3(dtype="fp8")
    chunk = build_workload(scenario).stages[3].chunks[0]
    layout, group = pricing_layout(scenario, H100), amax_group(scenario, H100)
    assert group is not None and group.num_ranks == 16 and layout.amax == group
    with_amax = StagePricing(H100).chunk(chunk, layout).cost
    without = StagePricing(H100).chunk(chunk, replace(layout, amax=None)).cost
    amax_s = fp8_amax_reduction_s(group, H100)
    assert with_amax.forward.comm_s - without.forward.comm_s == pytest.approx(amax_s)
    assert with_amax.backward.comm_s - without.backward.comm_s == pytest.approx(amax_s)
    assert amax_group(_gpt3(), H100) is None


def test_cli_fp8_errors_are_clear(tmp_path):
    """`run` on A100 and `memory --measure` (plain torch layer) refuse FP8 with one line."""
    import yaml
    from typer.testing import CliRunner

    from simcluster.cli import app

    data = {**GPT3, "training": {**GPT3["training"], "dtype": "fp8"}}
    h100 = tmp_path / "fp8.yaml"
    h100.write_text(yaml.safe_dump(data))
    a100 = tmp_path / "fp8-a100.yaml"
    a100.write_text(yaml.safe_dump({**data, "hardware": "a100-sxm4-80gb"}))
    runner = CliRunner()
    refused = runner.invoke(app, ["run", str(a100)])
    assert refused.exit_code == 2 and "no FP8 tensor cores" in refused.output
    measured = runner.invoke(app, ["memory", str(h100), "--measure"])
    assert measured.exit_code == 2 and "no Transformer Engine FP8 linears" in measured.output
