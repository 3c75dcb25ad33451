"""Parameters, the tied-embedding all-reduce and model FLOPs of Llama-style models, and a
Llama-style scenario run end to end (Megatron-core `gpt_layer_specs.py`, `num_floating_point_operations`)."""

import pytest
import yaml

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import load_scenario_and_hardware
from simcluster.simulation import run_simulation
from simcluster.workload import flops
from simcluster.workload.embedding import padded_vocab_size
from simcluster.workload.model import build_workload, layer_config, layer_params_per_rank
from tests.modern_cases import LLAMA3_8B


def _scenario(**parallel):
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["parallel"].update(parallel)
    return parse_scenario(data, "llama.yaml")


def test_llama3_8b_layer_parameters_by_hand():
    """h(q + 2k) + qh + 3hf weights = 4096·6144 + 4096² + 3·4096·14336 = 218,103,808; plus
    Megatron's default biases (q + 2k + 2f + 2h) and two RMSNorm weights (2h)."""
    cfg = layer_config(_scenario())
    params = layer_params_per_rank(
        4096,
        14336,
        1,
        query_width=cfg.query_width,
        kv_width=cfg.kv_width,
        gated=True,
        normalization=cfg.normalization,
    )
    assert params == 218_103_808 + (6144 + 2 * 14336 + 2 * 4096) + 2 * 4096


def test_untied_output_weight_lives_on_the_last_stage_without_the_all_reduce():
    """Untied: the last stage holds its own output weight (even at p = 1) and the tied
    word-embedding all-reduce between first and last stage disappears."""
    vocab = padded_vocab_size(128256, 2) * 4096 / 2
    untied = build_workload(_scenario(tp=2, pp=2, dp=4))
    tied_data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    tied_data["model"]["untie_embeddings_and_output_weights"] = False
    tied_data["parallel"].update(tp=2, pp=2, dp=4)
    tied = build_workload(parse_scenario(tied_data, "tied.yaml"))
    assert [stage.embedding_grad_bytes for stage in untied.stages] == [0.0, 0.0]
    assert [stage.embedding_grad_bytes for stage in tied.stages] == [4 * vocab, 4 * vocab]
    assert untied.stages[1].num_params == tied.stages[1].num_params  # same weight, own copy
    single = build_workload(_scenario())
    no_output = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    no_output["model"]["untie_embeddings_and_output_weights"] = False
    tied_single = build_workload(parse_scenario(no_output, "t.yaml"))
    extra = single.stages[0].num_params - tied_single.stages[0].num_params
    assert extra == padded_vocab_size(128256, 1) * 4096


def test_model_flops_follow_megatron_core_v0_11():
    """6·B·s·[L·(h(q + 2k) + qh + 3hf) + hV] + 12·B·s²·L·q (no causal halving)."""
    scenario = _scenario()
    B, s, L, V, h = 16, 8192, 32, 128256, 4096
    widths = flops.layer_widths(layer_config(scenario))
    expected = 6 * B * s * (L * (h * 6144 + h * h + 3 * h * 14336) + h * V) + 12 * B * s * s * L * h
    assert flops.model_flops(B, s, L, V, widths) == pytest.approx(expected, rel=1e-12)


def test_llama_scenario_runs_on_h100():
    """Every layer key priced: the scenario loads and simulates with finite results."""
    result = run_simulation(_scenario(), load_hardware("h100-sxm5-80gb")).result
    assert 0 < result.mfu < 1 and result.iteration_time_s > 0


def test_flash_on_a_profile_without_rates_is_a_load_error(tmp_path):
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["hardware"] = "a100-sxm4-80gb"
    path = tmp_path / "llama-a100.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="flash_attention"):
        load_scenario_and_hardware(path)


def test_flash_in_fp32_is_refused_at_load():
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["training"]["dtype"] = "fp32"
    with pytest.raises(ConfigError, match="flash attention runs in 16-bit"):
        parse_scenario(data, "fp32.yaml")


def test_gqa_unfused_scenario_runs_and_keeps_s_squared_terms():
    """The unfused core with GQA (K/V repeated) runs; its layer keeps more than flash's."""
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["training"]["attention_backend"] = "unfused"
    data["model"]["seq_length"] = 2048
    unfused = build_workload(parse_scenario(data, "u.yaml"))
    data["training"]["attention_backend"] = "flash"
    flash = build_workload(parse_scenario(data, "f.yaml"))
    assert unfused.layer.saved_bytes > flash.layer.saved_bytes
    assert run_simulation(unfused.scenario, load_hardware("a100-sxm4-80gb")).result.iteration_time_s > 0


def _training(**training):
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["training"].update(training)
    return parse_scenario(data, "llama.yaml")


def test_grad_reduce_in_bf16_halves_the_grad_buffer_and_the_dp_bytes():
    """--grad-reduce-in-bf16: the main-grad buffer takes the bf16 param dtype, so 2 bytes per
    parameter are kept and reduced instead of 4; weights and optimizer state do not change."""
    fp32 = build_workload(_training(use_distributed_optimizer=True)).stages[0]
    bf16 = build_workload(_training(use_distributed_optimizer=True, grad_reduce_in_bf16=True)).stages[0]
    assert fp32.static.gradient_bytes == 4 * fp32.num_params
    assert bf16.static.gradient_bytes == 2 * bf16.num_params
    assert bf16.dp_gradient_bytes == fp32.dp_gradient_bytes / 2
    assert (bf16.static.weight_bytes, bf16.static.optimizer_bytes) == (
        fp32.static.weight_bytes,
        fp32.static.optimizer_bytes,
    )


def test_distributed_optimizer_steps_only_its_shard_but_zeroes_every_grad():
    """Without sharding 42 B/param (grad norm 4, Adam 16 + 12, master→bf16 6, zeroing 4); the
    distributed optimizer over d = 8 runs all but the zeroing on 1/8 of the parameters."""
    plain = build_workload(_training()).stages[0]
    sharded = build_workload(_training(use_distributed_optimizer=True)).stages[0]
    assert plain.optimizer_step_bytes == 42 * plain.num_params
    assert sharded.optimizer_step_bytes == pytest.approx((4 + 38 / 8) * sharded.num_params)
    bf16 = build_workload(_training(use_distributed_optimizer=True, grad_reduce_in_bf16=True)).stages[0]
    assert bf16.optimizer_step_bytes == pytest.approx((2 + 34 / 8) * bf16.num_params)


def _step_bytes(copies: int = 1, **training):
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["training"].update(training)
    workload = build_workload(parse_scenario(data, "step.yaml"), copies)
    (stage,) = workload.stages
    return stage.num_params, stage.optimizer_step_bytes, workload


TE_LINEAR_WEIGHTS = 32 * 218_103_808  # 32 layers × h(q + 2k) + qh + 3hf on tp = 1


def test_fp8_step_casts_each_te_linear_weight_once():
    """FP8 adds TE's once-per-step weight cast over the TE linears' weights: read 2 bytes,
    write each cached FP8 copy (Hopper: row- and column-wise, 1 + 1; Blackwell: row-wise)."""
    _, bf16, _ = _step_bytes()
    _, hopper, _ = _step_bytes(2, dtype="fp8")
    _, blackwell, _ = _step_bytes(1, dtype="fp8")
    assert hopper - bf16 == pytest.approx(4 * TE_LINEAR_WEIGHTS)
    assert blackwell - bf16 == pytest.approx(3 * TE_LINEAR_WEIGHTS)


def test_hopper_keeps_a_transposed_fp8_weight_copy_blackwell_does_not():
    """TE caches row-wise and column-wise FP8 weights where FP8 GEMMs need the TN layout
    (H100, H200: 2 bytes per TE-linear weight beside the bf16 one), one copy on B200/GB200;
    the profile decides, and `run` follows it."""
    assert load_hardware("h100-sxm5-80gb").fp8_weight_copies == 2
    assert load_hardware("h200-sxm-141gb").fp8_weight_copies == 2
    assert load_hardware("b200-sxm-180gb").fp8_weight_copies == 1
    assert load_hardware("gb200-nvl72").fp8_weight_copies == 1
    *_, bf16 = _step_bytes()
    *_, one = _step_bytes(1, dtype="fp8")
    *_, two = _step_bytes(2, dtype="fp8")
    weights = [w.stages[0].static.weight_bytes for w in (bf16, one, two)]
    assert weights[1] - weights[0] == TE_LINEAR_WEIGHTS
    assert weights[2] - weights[0] == 2 * TE_LINEAR_WEIGHTS
    fp8 = _training(dtype="fp8")
    h100 = run_simulation(fp8, load_hardware("h100-sxm5-80gb")).result.stages[0].weight_bytes
    assert h100 == weights[2]


def test_tp_comm_overlap_at_tp_1_changes_nothing_and_is_not_exported():
    """tp = 1 has no TP collectives: the switch (a recipe default NeMo turns off below TP 2)
    gives the same iteration, and export-megatron leaves out the flag Megatron would refuse
    without SP."""
    from simcluster.config.megatron_export import to_megatron_args

    hw = load_hardware("h100-sxm5-80gb")
    off, on = _training(), _training(tp_comm_overlap=True)
    assert run_simulation(on, hw).result.iteration_time_s == run_simulation(off, hw).result.iteration_time_s
    assert "--tp-comm-overlap" not in to_megatron_args(on)


def test_parameter_all_gather_moves_bf16_parameters_whatever_the_grad_dtype():
    """The distributed optimizer all-gathers the updated bf16 parameters, 2 bytes each, with
    fp32 or bf16 main grads alike (it once took half the grad bytes, so bf16 grads halved it)."""
    from simcluster.costs.stage_pricing import StagePricing

    hw = load_hardware("h100-sxm5-80gb")
    fp32 = _training(use_distributed_optimizer=True)
    bf16 = _training(use_distributed_optimizer=True, grad_reduce_in_bf16=True)
    stages = [build_workload(s).stages[0] for s in (fp32, bf16)]
    assert [s.param_gather_bytes for s in stages] == [2 * stages[0].num_params] * 2
    gathers = [
        StagePricing(hw).stage(s, build_workload(s), stage).param_gather
        for s, stage in zip((fp32, bf16), stages)
    ]
    assert gathers[0].buckets == gathers[1].buckets


def test_fp8_param_gather_keeps_fp8_parameters_and_gathers_them_in_fp8():
    """--fp8-param-gather: the TE linears' FP8 parameter replaces the bf16 one (Hopper keeps its
    transposed copy too, so 2 bytes as before; Blackwell 1), the all-gather moves 1 byte for
    them instead of 2, and no bf16 → FP8 weight cast is left, only Hopper's transpose."""
    base = {"use_distributed_optimizer": True, "dtype": "fp8"}
    for copies in (1, 2):
        *_, cast = _step_bytes(copies, **base)
        *_, fp8 = _step_bytes(copies, **base, fp8_param_gather=True)
        *_, bf16 = _step_bytes(copies, use_distributed_optimizer=True)
        cast_stage, stage, bf16_stage = cast.stages[0], fp8.stages[0], bf16.stages[0]
        te = TE_LINEAR_WEIGHTS
        assert stage.static.weight_bytes == bf16_stage.static.weight_bytes - 2 * te + copies * te
        assert cast_stage.static.weight_bytes == bf16_stage.static.weight_bytes + copies * te
        assert stage.param_gather_bytes == 2 * stage.num_params - te
        assert cast_stage.param_gather_bytes == 2 * stage.num_params
        step = bf16_stage.optimizer_step_bytes
        assert stage.optimizer_step_bytes - step == pytest.approx(2 * (copies - 1) * te)
        assert cast_stage.optimizer_step_bytes - step == pytest.approx((2 + copies) * te)


def test_fp8_param_gather_needs_fp8_and_the_distributed_optimizer():
    from simcluster.config import ConfigError

    for training, needs in (
        ({"fp8_param_gather": True, "use_distributed_optimizer": True}, "needs training.dtype fp8"),
        ({"fp8_param_gather": True, "dtype": "fp8"}, "needs training.use_distributed_optimizer"),
    ):
        with pytest.raises(ConfigError, match=needs):
            _training(**training)
