"""import-megatron / export-megatron for issue 18's flags: MoE, expert parallelism, MLA,
MTP, sliding windows, --kv-channels and --recompute-modules. A scenario exported and read
back is the same scenario; Megatron's per-layer patterns are read as Megatron reads them,
and what the scenario cannot say is one clear error."""

from __future__ import annotations

import copy
import json
import shlex

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import ConfigError, load_scenario
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.megatron_flags import KEY_FLAGS, bucket
from simcluster.config.scenario import (
    NOT_MODELLED_YET_MESSAGE,
    Scenario,
    cross_field_problems,
    parse_scenario,
    unpriced_keys,
)
from tests.megatron_line import as_read_back
from tests.paths import ROOT

MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"
QWEN3 = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"

# DeepSeek-V3's shape (HF deepseek-ai/DeepSeek-V3 config.json; arXiv:2412.19437): 61 layers,
# the first 3 dense, 256 routed experts top-8 with sigmoid scores, one shared expert, MLA,
# one MTP layer; on 1,024 GPUs with an uneven 8-stage split (7 + 6·8 + 6 = 61 layers).
DEEPSEEK_V3_LIKE = {
    "name": "deepseek-v3-like", "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128, "seq_length": 4096,
        "vocab_size": 129280, "ffn_hidden_size": 18432, "activation": "swiglu", "normalization": "rmsnorm",
        "position_embedding": "rope", "untie_embeddings_and_output_weights": True,
        "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "moe": {"num_experts": 256, "router_topk": 8, "ffn_hidden_size": 2048,
                "shared_expert_ffn_hidden_size": 2048, "first_k_dense_layers": 3, "router_score": "sigmoid"},
        "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                "v_head_dim": 128},
        "mtp_num_layers": 1,
    },
    "parallel": {"tp": 2, "pp": 8, "dp": 64, "ep": 64, "etp": 1, "sequence_parallel": True,
                 "first_pipeline_num_layers": 7, "last_pipeline_num_layers": 6},
    "training": {"micro_batch_size": 1, "global_batch_size": 8192, "recompute": "selective", "dtype": "bf16",
                 "attention_backend": "flash", "use_distributed_optimizer": True, "overlap_grad_reduce": True,
                 "moe_token_dispatcher": "flex", "moe_grouped_gemm": True,
                 "recompute_modules": ["mla_up_proj", "moe_act", "layernorm"]},
}  # fmt: skip

# gpt-oss-120b's shape (HF openai/gpt-oss-120b config.json): 36 layers, hidden 2880, 64 heads of
# width 64 (kv_channels: 2880 / 64 = 45 is not the head width), 8 KV heads, 128 experts top-4,
# a 128-token sliding window on every other layer (1-based odd layers: skip frequency 2).
GPT_OSS_LIKE = {
    "name": "gpt-oss-like", "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 36, "hidden_size": 2880, "num_attention_heads": 64, "num_query_groups": 8,
        "kv_channels": 64, "seq_length": 4096, "vocab_size": 201088, "ffn_hidden_size": 2880,
        "activation": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
        "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
        "moe": {"num_experts": 128, "router_topk": 4, "ffn_hidden_size": 2880},
        "window_size": 128, "window_attn_skip_freq": 2,
    },
    "parallel": {"tp": 1, "pp": 4, "dp": 16, "ep": 8, "sequence_parallel": False},
    "training": {"micro_batch_size": 1, "global_batch_size": 512, "dtype": "bf16",
                 "attention_backend": "flash", "use_distributed_optimizer": True, "overlap_grad_reduce": True,
                 "moe_token_dispatcher": "alltoall", "moe_grouped_gemm": True},
}  # fmt: skip

MOE_LINE = (
    "--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 256 --micro-batch-size 1 "
    "--ffn-hidden-size 1024 --swiglu --bf16 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 256 "
    "--world-size 8 --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall"
)


def _flags(scenario: Scenario) -> str:
    return to_megatron_args(scenario, 8)


def _requested(scenario: Scenario) -> Scenario:
    """The imported mapping as the flags ask for it (keys not priced yet included)."""
    return Scenario.model_validate(
        parse_megatron_args(_flags(scenario), scenario.hardware, scenario.name).requested
    )


def _model(line: str) -> dict:
    return parse_megatron_args(line, "h100-sxm5-80gb").requested["model"]


@pytest.mark.parametrize("path", [MIXTRAL, QWEN3], ids=lambda p: p.stem)
def test_mixtral_and_qwen3_round_trip_to_the_same_runnable_scenario(path):
    """Every key of a priced MoE scenario survives scenario -> flags -> scenario, `==`."""
    scenario = load_scenario(path)
    imported = parse_megatron_args(_flags(scenario), scenario.hardware, scenario.name)
    assert imported.validated() == as_read_back(scenario)
    assert imported.not_modelled == () and imported.unknown == ()


def test_mixtral_exports_megatrons_moe_flags():
    """The Mixtral line holds Megatron's own MoE flags, the dispatcher written out (Megatron's
    default is allgather) and EP 8."""
    words = shlex.split(_flags(load_scenario(MIXTRAL)))
    pairs = {"--num-experts": "8", "--moe-router-topk": "2", "--moe-ffn-hidden-size": "14336",
             "--expert-model-parallel-size": "8", "--moe-token-dispatcher-type": "alltoall"}  # fmt: skip
    for flag, value in pairs.items():
        assert words[words.index(flag) + 1] == value, flag
    assert "--moe-grouped-gemm" in words and "--moe-layer-freq" not in words  # every layer MoE


@pytest.mark.parametrize("data", [DEEPSEEK_V3_LIKE, GPT_OSS_LIKE], ids=["deepseek-v3-like", "gpt-oss-like"])
def test_deepseek_and_gpt_oss_like_round_trip_and_import_as_a_runnable_scenario(data):
    """MLA + MTP + sigmoid + dense first layers + flex, and kv_channels + windows, come back
    equal as requested; the scenario itself loads under every rule, a flag is "not modelled"
    exactly when the simulator refuses the key it sets, and those keys keep their defaults."""
    scenario = Scenario.model_validate(data)
    imported = parse_megatron_args(_flags(scenario), scenario.hardware, scenario.name)
    assert Scenario.model_validate(imported.requested) == as_read_back(scenario)
    runnable = Scenario.model_validate(imported.scenario)
    if not imported.kept:  # else a key the layout needs is kept as given and `run` refuses it
        assert imported.validated() == runnable
    demoted = {line.split()[0].rstrip(":").removeprefix("--") for line in imported.not_modelled}
    demoted -= set(imported.kept)
    words = shlex.split(_flags(scenario))
    for key, flags in KEY_FLAGS.items():
        section, name = key.split(".")
        given_flags = {flag for flag in flags if f"--{flag}" in words}
        expected = as_read_back(scenario)
        if getattr(getattr(runnable, section), name) == getattr(getattr(expected, section), name):
            assert not given_flags & demoted, key
        else:  # dropped: its flags are listed and the key is back at its default
            assert given_flags <= demoted, key
            assert name not in imported.scenario[section], key
    assert imported.unknown == ()


def test_deepseek_moe_layer_freq_is_the_list_megatron_reads():
    """first_k_dense_layers 3 of 61 is Megatron's "([0]*3+[1]*58)" (one entry per layer)."""
    words = shlex.split(_flags(Scenario.model_validate(DEEPSEEK_V3_LIKE)))
    assert words[words.index("--moe-layer-freq") + 1] == "([0]*3+[1]*58)"
    assert words[words.index("--moe-router-score-function") + 1] == "sigmoid"


def test_a_refused_moe_value_is_not_modelled_and_the_scenario_keeps_the_default():
    """A dispatcher the simulator refuses for a MoE model (scenario.moe_problems) demotes its
    flag and leaves alltoall; once it is priced, the flag is used and the value kept."""
    imported = parse_megatron_args(MOE_LINE.replace("alltoall", "allgather"), "h100-sxm5-80gb")
    data = copy.deepcopy(imported.requested)
    try:
        parse_scenario(data, "q", refuse_unpriced=False)
        refused = False
    except ConfigError as error:
        refused = any(p.startswith("training.moe_token_dispatcher: value allgather") for p in error.problems)
    assert imported.requested["training"]["moe_token_dispatcher"] == "allgather"
    flagged = [line for line in imported.not_modelled if line.startswith("--moe-token-dispatcher-type")]
    assert bool(flagged) == refused
    assert imported.validated().training.moe_token_dispatcher.value == (
        "alltoall" if refused else "allgather"
    )


def test_megatron_defaults_fill_what_the_line_leaves_out():
    """No --moe-router-topk: 2; no --moe-ffn-hidden-size: --ffn-hidden-size; no dispatcher:
    allgather; no --moe-grouped-gemm: off; --multi-latent-attention alone: 32 / 128 / 64 / 128
    and no query bottleneck (megatron/training/arguments.py, transformer_config.py)."""
    line = (
        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 256 --micro-batch-size 1 "
        "--ffn-hidden-size 1024 --swiglu --num-experts 4 --multi-latent-attention --bf16 "
        "--attention-backend flash"
    )
    imported = parse_megatron_args(line, "h100-sxm5-80gb")
    m, tr = imported.requested["model"], imported.requested["training"]
    # no --disable-bias-linear: Megatron's add_bias_linear gives the router and experts biases
    assert m["moe"] == {"num_experts": 4, "router_topk": 2, "ffn_hidden_size": 1024,
                        "router_bias": True, "expert_bias": True}  # fmt: skip
    assert m["mla"] == {"q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128,
                        "qk_pos_emb_head_dim": 64, "v_head_dim": 128}  # fmt: skip
    assert (tr["moe_token_dispatcher"], tr["moe_grouped_gemm"]) == ("allgather", False)
    assert any("router_topk = 2" in note for note in imported.notes)
    assert any("allgather" in note for note in imported.notes)


@pytest.mark.parametrize(
    ("freq", "first_k"),
    [("1", 0), ("([0]*3+[1]*5)", 3), ("[0,0,1,1,1,1,1,1]", 2), ("([1]*8)", 0), ("([0]+[1]*7)", 1)],
)
def test_moe_layer_freq_integer_one_or_dense_first_list(freq, first_k):
    """Megatron's 1 (every layer MoE) or a list [0]*k + [1]*(L-k) -> first_k_dense_layers k."""
    moe = _model(f"{MOE_LINE} --moe-layer-freq {shlex.quote(freq)}")["moe"]
    assert moe.get("first_k_dense_layers", 0) == first_k


@pytest.mark.parametrize(
    ("freq", "message"),
    [
        ("2", "one MoE layer every 2 layers"),
        ("([1]*3+[0]*5)", "dense layers after MoE layers"),
        ("([0]*3+[1]*6)", "9 entries for num_layers 8"),
        ("([0]*3 + [1]*5)", "character ' '"),  # Megatron's _eval_pattern refuses spaces
        ("__import__('os').system('true')", "expected an integer or a list"),
        ("[__import__('os')]", "character '_'"),
        ("[1]*99999999", "longer than 100,000"),
        ("[[0]]*8", "integers only"),
        ("([0]*2,[1]*6)", "Tuple is not allowed"),
        ("([0]*3+[2]*5)", "dense layers after MoE layers"),
    ],
)
def test_bad_moe_layer_freq_is_one_clear_error(freq, message):
    """A pattern the scenario cannot express, or Megatron would refuse, names the flag, the
    value and what is allowed; nothing in it is evaluated as code."""
    with pytest.raises(ConfigError, match="--moe-layer-freq") as error:
        parse_megatron_args(f"{MOE_LINE} --moe-layer-freq {shlex.quote(freq)}")
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("window", "message"),
    [("128", "allowed: w,0"), ("128,128", "allowed: w,0"), ("-1,0", "allowed: w,0"),
     ("0,0", "allowed: w,0"), ("w,0", "integers separated by a comma"), ("128,0,0", "allowed: w,0")],
)  # fmt: skip
def test_window_size_other_than_w_0_is_one_clear_error(window, message):
    """--window-size is TE's (left, right): only a causal window "w,0" has a scenario key."""
    with pytest.raises(ConfigError, match=f"--window-size: value '{window}'") as error:
        parse_megatron_args(f"{MOE_LINE} --window-size {window}")
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("skip", "expected"),
    [("4", 4), ("([1,0]*4)", 2), ("([1]*3+[0])*2", 4), ("[1]*8", None), ("1", 1)],
)
def test_window_size_and_skip_frequency_forms(skip, expected):
    """ "128,0" and "(128,0)" are a 128-token window; a per-layer skip list (1 = window) is read
    as the N whose rule (layer n full when n % N == 0) gives it; all ones is no skip."""
    for window in ("128,0", "(128,0)"):
        model = _model(f"{MOE_LINE} --window-size {window} --window-attn-skip-freq {shlex.quote(skip)}")
        assert model["window_size"] == 128
        assert model.get("window_attn_skip_freq") == expected


def test_skip_frequency_pattern_no_integer_gives_is_an_error():
    with pytest.raises(ConfigError, match="--window-attn-skip-freq: value '\\[1,0,0,1,1,1,1,1\\]'"):
        parse_megatron_args(f"{MOE_LINE} --window-size 64,0 --window-attn-skip-freq [1,0,0,1,1,1,1,1]")


def test_deepep_is_the_flex_dispatcher_and_needs_it():
    """--moe-enable-deepep (deprecated) means flex; with another dispatcher Megatron raises."""
    alone = parse_megatron_args(
        MOE_LINE.replace("--moe-token-dispatcher-type alltoall", "--moe-enable-deepep")
    )
    assert alone.requested["training"]["moe_token_dispatcher"] == "flex"
    with pytest.raises(ConfigError, match="--moe-enable-deepep with --moe-token-dispatcher-type alltoall"):
        parse_megatron_args(f"{MOE_LINE} --moe-enable-deepep")


def test_recompute_modules_and_the_deprecated_moe_layer_recompute():
    """--recompute-modules is read as the list under selective; --moe-layer-recompute is
    selective with `moe` added; Megatron's modules simcluster has no layer for are dropped
    as not modelled; a name Megatron does not know is an error."""
    selective = "--recompute-granularity selective --recompute-modules moe_act layernorm"
    line = f"{MOE_LINE} --moe-grouped-gemm {selective}"
    assert parse_megatron_args(line).requested["training"]["recompute_modules"] == ["moe_act", "layernorm"]
    layer = parse_megatron_args(f"{MOE_LINE} --moe-grouped-gemm --moe-layer-recompute").requested["training"]
    assert (layer["recompute"], layer["recompute_modules"]) == ("selective", ["core_attn", "moe"])
    mhc = parse_megatron_args(f"{line} mhc")
    assert mhc.requested["training"]["recompute_modules"] == ["moe_act", "layernorm"]
    assert any(flag.startswith("--recompute-modules moe_act layernorm mhc: ") for flag in mhc.not_modelled)
    with pytest.raises(ConfigError, match="--recompute-modules: value attn: allowed: core_attn"):
        parse_megatron_args(f"{line} attn")
    with pytest.raises(ConfigError, match="--moe-layer-recompute with --recompute-granularity full"):
        parse_megatron_args(f"{MOE_LINE} --moe-layer-recompute --recompute-granularity full")


def test_moe_flags_without_num_experts_have_no_effect_and_say_so():
    dense = MOE_LINE.replace("--num-experts 8 ", "").replace("--expert-model-parallel-size 4 ", "")
    imported = parse_megatron_args(dense)
    assert "moe" not in imported.requested["model"]
    assert "moe_token_dispatcher" not in imported.requested["training"]
    assert any("without --num-experts: no effect" in note for note in imported.notes)


@pytest.mark.parametrize(
    ("flag", "kind"),
    [("moe-router-load-balancing-type", "used"), ("moe-aux-loss-coeff", "used"),
     ("moe-permute-fusion", "used"), ("moe-router-fusion", "used"), ("moe-router-dtype", "not_modelled"),
     ("moe-z-loss-coeff", "used"), ("moe-shared-expert-overlap", "not_modelled"),
     ("qk-layernorm", "used"), ("moe-router-bias-update-rate", "ignored"),
     ("mtp-loss-scaling-factor", "ignored"), ("num-experts", "used"), ("expert-tensor-parallel-size", "used"),
     ("moe-layer-freq", "used"), ("window-size", "used"), ("kv-channels", "used")],
)  # fmt: skip
def test_moe_flags_without_a_key_are_sorted_not_dropped(flag, kind):
    assert bucket(flag) == kind


def test_flags_without_keys_are_listed_with_their_reason():
    line = f"{MOE_LINE} --moe-input-jitter-eps 1e-2 --moe-permute-fusion --moe-router-bias-update-rate 1e-3"
    imported = parse_megatron_args(line)
    assert any(f.startswith("--moe-input-jitter-eps 1e-2: the router's input") for f in imported.not_modelled)
    assert imported.requested["training"]["moe_permute_fusion"] is True  # a key since issue 18's fusion work
    assert "--moe-router-bias-update-rate 1e-3" in imported.ignored and imported.unknown == ()


def test_load_imbalance_has_no_megatron_flag_and_imports_as_balanced():
    """The router decides the imbalance in a real run: export writes no flag for it, and the
    line reads back at 1.0 (the one MoE key a launch line cannot carry)."""
    data = load_scenario(MIXTRAL).model_dump(mode="json")
    data["model"]["moe"]["load_imbalance"] = 1.5
    scenario = parse_scenario(data, "q")
    back = _requested(scenario)
    assert back.model.moe is not None and back.model.moe.load_imbalance == 1.0
    assert back.model_copy(update={"model": scenario.model}) == scenario


def test_an_empty_recompute_module_list_has_no_command_line():
    data = load_scenario(MIXTRAL).model_dump(mode="json")
    data["training"].update(recompute="selective", recompute_modules=[])
    with pytest.raises(ConfigError, match="training.recompute_modules: value \\[\\]"):
        _flags(Scenario.model_validate(data))


@st.composite
def moe_scenarios(draw):
    """Random MoE scenarios over every issue-18 key (load_imbalance aside: no flag)."""
    tp, dp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 4, 8]))
    experts = draw(st.sampled_from([8, 16, 64]))
    etp = draw(st.sampled_from([None, 1, tp]))
    eps = [e for e in (1, 2, 4, 8) if experts % e == 0 and (tp * dp) % (e * (etp or tp)) == 0]
    attention = draw(st.sampled_from(["standard", "mla", "window"]))
    model = {
        "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 512,
        "vocab_size": 32000, "ffn_hidden_size": 2816, "activation": "swiglu",
        "mtp_num_layers": draw(st.sampled_from([0, 1, 2])),
        "moe": {
            "num_experts": experts, "router_topk": draw(st.sampled_from([1, 2, 8])),
            "ffn_hidden_size": draw(st.sampled_from([256, 704])),
            "shared_expert_ffn_hidden_size": draw(st.sampled_from([0, 512])),
            "first_k_dense_layers": draw(st.sampled_from([0, 1, 3])),
            "capacity_factor": draw(st.sampled_from([None, 1.0, 1.25])),
            "router_score": draw(st.sampled_from(["softmax", "sigmoid"])),
        },
    }  # fmt: skip
    modules = [["core_attn"], ["moe_act"], ["core_attn", "moe", "layernorm"], ["shared_experts", "mlp"]]
    if attention == "mla":
        model["mla"] = {"q_lora_rank": draw(st.sampled_from([None, 384])), "kv_lora_rank": 128,
                        "qk_head_dim": 64, "qk_pos_emb_head_dim": draw(st.sampled_from([0, 32])),
                        "v_head_dim": 64}  # fmt: skip
        modules.append(["mla_up_proj", "moe_act"])
    else:
        model["num_query_groups"] = draw(st.sampled_from([None, 4]))
        model["kv_channels"] = draw(st.sampled_from([None, 32, 128]))
    model["qk_layernorm"] = draw(st.booleans())  # Qwen3's --qk-layernorm (its latent norms with MLA)
    if attention == "window":
        model["window_size"] = draw(st.sampled_from([64, 128]))
        model["window_attn_skip_freq"] = draw(st.sampled_from([None, 2, 4]))
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    data = {
        "name": "random-moe", "hardware": "h100-sxm5-80gb", "model": model,
        "parallel": {"tp": tp, "pp": draw(st.sampled_from([1, 2])), "dp": dp, "sequence_parallel": tp > 1,
                     "ep": draw(st.sampled_from(eps)), "etp": etp},
        "training": {
            "micro_batch_size": 1, "global_batch_size": dp * 4, "recompute": recompute, "dtype": "bf16",
            "attention_backend": "flash", "use_distributed_optimizer": draw(st.booleans()),
            "moe_token_dispatcher": (dispatcher := draw(st.sampled_from(["alltoall", "allgather", "flex"]))),
            "moe_flex_dispatcher_backend": draw(st.sampled_from(["deepep", "hybridep"]))
            if dispatcher == "flex" else "deepep",
            "moe_grouped_gemm": draw(st.booleans()),
            "moe_router_fusion": draw(st.booleans()),
            "moe_permute_fusion": draw(st.booleans()),
            "recompute_modules": draw(st.sampled_from([None, *modules])) if recompute == "selective"
            else None,
        },
    }  # fmt: skip
    scenario = Scenario.model_validate(data)
    # every rule of the scenario but the refusals of what is not priced yet
    problems = cross_field_problems(scenario, refuse_unpriced=False)
    assume(not [problem for problem in problems if NOT_MODELLED_YET_MESSAGE not in problem])
    return scenario


@settings(max_examples=120, deadline=None)
@given(moe_scenarios())
def test_random_moe_scenarios_round_trip(scenario):
    """Every issue-18 key survives scenario -> flags -> scenario at the level of the mapping
    the line asks for; where every key is priced, the runnable scenario is the same too."""
    assert _requested(scenario) == as_read_back(scenario)
    imported = parse_megatron_args(_flags(scenario), scenario.hardware, scenario.name)
    if not unpriced_keys(scenario) and imported.scenario == imported.requested:
        assert imported.validated() == as_read_back(scenario)


def test_an_fp8_moe_line_the_simulator_refuses_imports_in_bf16_with_its_fp8_flags_not_modelled():
    """Where FP8 experts are refused for a MoE model, the FP8 flags (format, recipe, FP8
    parameter gather) are all not modelled and the scenario, in bf16, loads; where they
    are priced, the scenario keeps them."""
    fp8 = "--fp8-format hybrid --fp8-recipe blockwise --fp8-param-gather --use-distributed-optimizer"
    line = f"{MOE_LINE} {fp8}"
    imported = parse_megatron_args(line, "h100-sxm5-80gb")
    scenario = imported.validated()
    demoted = {flag.split()[0].rstrip(":") for flag in imported.not_modelled}
    fp8_flags = {"--fp8-format", "--fp8-recipe", "--fp8-param-gather"}
    if scenario.training.dtype.value == "bf16":
        assert fp8_flags <= demoted and not scenario.training.fp8_param_gather
    else:
        assert not fp8_flags & demoted and scenario.training.fp8_param_gather
    assert imported.requested["training"]["dtype"] == "fp8"


def test_cli_export_and_import_of_a_moe_scenario(tmp_path):
    """`export-megatron mixtral --json` gives Megatron's MoE flags; `import-megatron` of that
    line writes a YAML that loads as the same scenario."""
    runner = CliRunner()
    exported = runner.invoke(app, ["export-megatron", str(MIXTRAL), "--json"])
    assert exported.exit_code == 0, exported.output
    payload = json.loads(exported.stdout)
    assert {"--num-experts", "--expert-model-parallel-size", "--moe-grouped-gemm"} <= set(payload["args"])
    out = tmp_path / "mixtral-8x7b-h100.yaml"
    imported = runner.invoke(
        app, ["import-megatron", payload["command"], "--hardware", "h100-sxm5-80gb", "--out", str(out)]
    )
    assert imported.exit_code == 0, imported.output
    assert load_scenario(out) == as_read_back(load_scenario(MIXTRAL))


def test_an_mla_line_without_an_attention_backend_runs_megatrons_fused_default():
    """Megatron-core's default backend (auto) runs MLA in TE's fused attention: flash, noted."""
    line = f"{MOE_LINE} --multi-latent-attention"
    imported = parse_megatron_args(line, "h100-sxm5-80gb")
    assert imported.requested["training"]["attention_backend"] == "flash"
    assert any(
        note.startswith("attention_backend = flash") and "multi-latent" in note for note in imported.notes
    )
