"""`simcluster import-megatron`: Megatron-LM flags -> a scenario that loads, with every flag
accounted for (used, ignored, not modelled or unknown)."""

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import ConfigError, Recompute, load_scenario
from simcluster.config.choices import Dtype
from simcluster.config.megatron_args import DEFAULT_VOCAB_SIZE, parse_megatron_args, split_command_line
from simcluster.config.scenario import parse_scenario

GPT3_175B = (
    "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py "
    "--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
    "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 "
    "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 "
    "--num-layers-per-virtual-pipeline-stage 4 --sequence-parallel "
    "--recompute-granularity selective --bf16 --use-distributed-optimizer --overlap-grad-reduce "
    "--lr 6.0e-5 --train-iters 500000 --vocab-file gpt2-vocab.json --disable-bias-linear --frobnicate 3"
)
MINIMAL = "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 2"


def _invoke(*args):
    return CliRunner().invoke(app, ["import-megatron", *args])


def test_round_trip_yaml_loads_and_matches_the_flags(tmp_path):
    """The printed YAML loads with load_scenario and holds the command line's values."""
    result = _invoke(GPT3_175B)
    assert result.exit_code == 0, result.output
    path = tmp_path / "imported.yaml"
    path.write_text(result.stdout)
    scenario = load_scenario(path)
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length) == (96, 12288, 96, 2048)
    assert m.vocab_size == DEFAULT_VOCAB_SIZE
    assert (par.tp, par.pp, par.dp, par.vpp) == (8, 8, 1, 3)  # vpp = 96 / 8 / 4; dp = 64 / 64
    assert par.sequence_parallel
    assert m.add_bias_linear is False  # --disable-bias-linear (Megatron's add_bias_linear)
    assert (tr.micro_batch_size, tr.global_batch_size) == (1, 64)
    assert tr.recompute is Recompute.SELECTIVE and tr.dtype is Dtype.BF16
    assert tr.use_distributed_optimizer and tr.overlap_grad_reduce


def test_unknown_ignored_and_unmodelled_flags_are_listed_on_stderr_and_in_the_yaml():
    """Nothing is dropped silently: each leftover flag appears with its bucket."""
    result = _invoke(GPT3_175B)
    comments = [line for line in result.stdout.splitlines() if line.startswith("#")]
    for text in (result.stderr, "\n".join(comments)):
        assert "unknown flags (not recognised, not used): --frobnicate 3" in text
        assert "ignored (no effect on the simulation):" in text
        assert "--lr 6.0e-5" in text and "--train-iters 500000" in text
        assert "--disable-bias-linear" not in text  # read into model.add_bias_linear
        assert "vocab_size = 51200" in text


def test_out_file_and_unquoted_flags(tmp_path):
    """Flags may also come unquoted; --out writes the file and names the scenario."""
    out = tmp_path / "small-run.yaml"
    result = _invoke(*MINIMAL.split(), "--global-batch-size", "8", "--out", str(out))
    assert result.exit_code == 0, result.output
    scenario = load_scenario(out)
    assert scenario.name == "small-run"
    assert scenario.training.global_batch_size == 8


def test_missing_required_flag_exits_2_naming_it():
    result = _invoke("--hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 1")
    assert result.exit_code == 2
    assert "required flag missing: --num-layers" in result.stderr


def test_layout_the_scenario_rules_reject_exits_2_with_the_rule():
    result = _invoke(MINIMAL + " --pipeline-model-parallel-size 3")
    assert result.exit_code == 2
    assert "must be divisible by pp * vpp" in result.stderr


def test_unknown_hardware_profile_exits_2():
    result = _invoke(MINIMAL, "--hardware", "no-such-gpu")
    assert result.exit_code == 2
    assert "unknown hardware profile" in result.stderr


@pytest.mark.parametrize(
    ("extra", "num_gpus", "dp"),
    [
        ("--world-size 32 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2", None, 8),
        ("--data-parallel-size 4", None, 4),
        ("--tensor-model-parallel-size 2", 16, 8),
        ("", None, 1),
    ],
)
def test_dp_is_world_size_over_tp_times_pp(extra, num_gpus, dp):
    """Megatron derives d = world / (t·p); without a world size d = 1 with a note."""
    imported = parse_megatron_args(f"{MINIMAL} --global-batch-size 64 {extra}", num_gpus=num_gpus)
    assert imported.scenario["parallel"]["dp"] == dp
    if dp == 1:
        assert any(note.startswith("dp = 1: no world size") for note in imported.notes)


def test_torchrun_prefix_gives_the_world_size():
    """torchrun --nnodes 2 --nproc_per_node=8 → 16 ranks; with t = 2, p = 2: d = 4."""
    imported = parse_megatron_args(
        "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes 2 --nproc_per_node=8 pretrain_gpt.py "
        f"{MINIMAL} --global-batch-size 64 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
    )
    assert imported.scenario["parallel"]["dp"] == 4
    assert imported.unknown == ()


def test_defaults_follow_megatron():
    """No --global-batch-size: b·d; no --bf16/--fp16: fp32; no recompute flags: none."""
    imported = parse_megatron_args(MINIMAL)
    training = imported.scenario["training"]
    assert training["global_batch_size"] == 2
    assert training["dtype"] == "fp32"
    assert training["recompute"] == "none"
    assert imported.validated().parallel.dp == 1


@pytest.mark.parametrize(
    ("flags", "recompute"),
    [
        ("--recompute-activations", Recompute.SELECTIVE),
        ("--checkpoint-activations", Recompute.FULL),
        ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 1", Recompute.FULL),
    ],
)
def test_recompute_flags(flags, recompute):
    assert parse_megatron_args(f"{MINIMAL} {flags}").validated().training.recompute is recompute


def test_partial_full_recompute_is_noted():
    imported = parse_megatron_args(
        f"{MINIMAL} --recompute-granularity full --recompute-method block --recompute-num-layers 2"
    )
    assert any("simulated as full recompute of every layer" in note for note in imported.notes)


def test_virtual_pipeline_flags_must_agree():
    """8 layers / p 2 / 2 per virtual stage = 2 chunks, not 4."""
    with pytest.raises(ConfigError, match="disagrees"):
        parse_megatron_args(
            f"{MINIMAL} --global-batch-size 8 --pipeline-model-parallel-size 2 "
            "--num-layers-per-virtual-pipeline-stage 2 --virtual-pipeline-model-parallel-size 4"
        )


def test_command_line_forms():
    """`--flag=value`, underscores, continuation lines and shell comments all parse."""
    words = split_command_line("python pretrain_gpt.py \\\n  --num_layers=8 \\\n  --bf16  # comment")
    assert words == ["python", "pretrain_gpt.py", "--num_layers=8", "--bf16"]
    imported = parse_megatron_args(
        "--num_layers=8 --hidden_size 256 --num-attention-heads=8 --seq-length 128 --micro-batch-size 1"
    )
    assert imported.scenario["model"]["num_layers"] == 8


def test_unexpanded_shell_variables_are_noted():
    imported = parse_megatron_args(f"torchrun pretrain_gpt.py {MINIMAL} $DATA_ARGS")
    assert any("$DATA_ARGS" in note for note in imported.notes)


def test_bad_values_are_reported_together():
    with pytest.raises(ConfigError) as error:
        parse_megatron_args(MINIMAL + " --tensor-model-parallel-size two --bf16 --fp16")
    text = str(error.value)
    assert "--tensor-model-parallel-size: value 'two': expected an integer" in text
    assert "--bf16 and --fp16: choose one" in text


def test_yaml_comments_do_not_change_the_mapping():
    imported = parse_megatron_args(MINIMAL + " --weird-flag")
    assert yaml.safe_load(imported.to_yaml()) == imported.scenario
    assert imported.unknown == ("--weird-flag",)


# Issue 11's Llama-3 line: world 32, tp 2, pp 2, cp 2 gives dp 4 (Megatron-core: world / (tp·cp·pp)).
LLAMA3 = (
    "torchrun --nnodes 4 --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
    "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
    "--swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
    "--seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 --micro-batch-size 1 "
    "--global-batch-size 128 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
    "--context-parallel-size 2 --sequence-parallel --bf16 --fp8-format hybrid --attention-backend fused "
    "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap "
    "--recompute-granularity selective --recompute-modules core_attn --attention-dropout 0"
)


def test_llama3_line_reads_every_key_and_counts_dp_with_cp():
    """Every flag of issue 11 reaches the requested mapping; dp = 32 / (2·2·2) = 4."""
    imported = parse_megatron_args(LLAMA3, "h100-sxm5-80gb")
    m, par, tr = (imported.requested[k] for k in ("model", "parallel", "training"))
    assert (m["num_query_groups"], m["activation"], m["normalization"]) == (8, "swiglu", "rmsnorm")
    assert (m["position_embedding"], m["untie_embeddings_and_output_weights"]) == ("rope", True)
    assert m["vocab_size"] == 128256 and m["ffn_hidden_size"] == 14336
    assert (par["tp"], par["cp"], par["pp"], par["dp"]) == (2, 2, 2, 4)
    assert (tr["dtype"], tr["attention_backend"], tr["recompute"]) == ("fp8", "flash", "selective")
    assert tr["overlap_param_gather"] and tr["tp_comm_overlap"] and tr["use_distributed_optimizer"]
    assert imported.validated().parallel.dp == 4
    assert m["attention_dropout"] == 0.0 and "hidden_dropout" not in m  # absent: Megatron's 0.1
    assert imported.validated().model.hidden_dropout == 0.1


def test_a_flag_whose_key_is_not_priced_yet_is_not_modelled_and_its_key_keeps_the_default():
    """Honest buckets: the flags of a key the simulator refuses are "not modelled" and the
    scenario (which runs) leaves the key at its default; a priced key's flags are used."""
    from simcluster.config.megatron_flags import KEY_FLAGS
    from simcluster.config.scenario import Scenario, unpriced_keys

    imported = parse_megatron_args(LLAMA3, "h100-sxm5-80gb")
    unpriced = unpriced_keys(Scenario.model_validate(imported.requested))
    scenario = imported.validated()
    default = Scenario.model_validate(imported.scenario)
    written = " ".join(imported.not_modelled)
    for key, flags in KEY_FLAGS.items():
        section, name = key.split(".")
        given = [flag for flag in flags if f"--{flag}" in LLAMA3.split()]
        if not given:
            continue
        if key in unpriced:
            assert all(f"--{flag}" in written for flag in given), key
            assert name not in imported.scenario[section] or key == "training.dtype"
        else:
            assert not any(f"--{flag}" in written for flag in given), key
            assert getattr(getattr(scenario, section), name) == getattr(getattr(default, section), name)
    assert "--recompute-modules" not in written  # core_attn is what selective prices
    assert "--attention-dropout" not in " ".join(imported.ignored)  # read into model.attention_dropout


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("flash", "flash"), ("fused", "flash"), ("auto", "flash"), ("unfused", "unfused"), ("local", "unfused")],
)
def test_attention_backends(backend, expected):
    imported = parse_megatron_args(f"{MINIMAL} --bf16 --attention-backend {backend}")  # flash needs 16 bits
    assert imported.requested["training"].get("attention_backend", "unfused") == expected


def test_context_parallel_without_a_backend_flag_imports_as_flash():
    """Megatron-core's default `--attention-backend auto` runs TE's fused attention, the only
    backend with CP, so a cp > 1 line without the flag runs in Megatron and must import as a
    scenario that runs (flash), not as the unfused core `run` refuses with cp > 1."""
    line = f"{MINIMAL} --bf16 --global-batch-size 4 --context-parallel-size 2 --world-size 2"
    imported = parse_megatron_args(line, "h100-sxm5-80gb")
    assert imported.requested["training"]["attention_backend"] == "flash"
    scenario = imported.validated()
    assert (scenario.parallel.cp, scenario.parallel.dp) == (2, 1)
    assert any("only backend with --context-parallel-size > 1" in note for note in imported.notes)
    without_cp = parse_megatron_args(f"{MINIMAL} --bf16", "h100-sxm5-80gb")
    assert "attention_backend" not in without_cp.requested["training"]  # unfused, as before


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (
            "--attention-backend cudnn",
            "--attention-backend: value 'cudnn': allowed: flash, fused, auto, unfused, local",
        ),
        ("--normalization BatchNorm", "--normalization: value 'BatchNorm': allowed: LayerNorm, RMSNorm"),
        (
            "--position-embedding-type alibi",
            "--position-embedding-type: value 'alibi': allowed: learned_absolute",
        ),
        ("--bf16 --fp8-format e5m2", "--fp8-format: value 'e5m2': allowed: e4m3, hybrid"),
        ("--swiglu --squared-relu", "--swiglu and --squared-relu: choose one"),
        ("--hidden-dropout none", "--hidden-dropout: value 'none': expected a number"),
        ("--attention-dropout 1.5", "model.attention_dropout: value 1.5"),
        ("--group-query-attention --num-query-groups 3", "model.num_query_groups: value 3: must divide"),
        (
            "--context-parallel-size 3 --world-size 6",
            "model.seq_length: value 128: must be divisible by 2 * cp",
        ),
        (
            "--tensor-model-parallel-size 2 --context-parallel-size 2 --world-size 6",
            "not a multiple of tp * cp * pp",
        ),
    ],
)
def test_bad_values_name_the_flag_the_value_and_what_is_allowed(flags, problem):
    with pytest.raises(ConfigError) as error:
        parse_megatron_args(f"{MINIMAL} {flags}")
    assert any(problem in line for line in error.value.problems), error.value.problems


def test_vocabulary_is_padded_as_megatron_pads_it():
    """--vocab-size is padded to a multiple of --make-vocab-size-divisible-by (128) · tp."""
    gpt2 = parse_megatron_args(f"{MINIMAL} --vocab-size 50257 --tensor-model-parallel-size 8 --world-size 8")
    assert gpt2.scenario["model"]["vocab_size"] == 51200 and "padded" in " ".join(gpt2.notes)
    small = f"{MINIMAL} --vocab-size 50257 --make-vocab-size-divisible-by 1"
    assert parse_megatron_args(small).scenario["model"]["vocab_size"] == 50257


def test_swiglu_without_ffn_hidden_size_takes_megatrons_default():
    imported = parse_megatron_args(f"{MINIMAL} --swiglu")
    assert imported.requested["model"]["ffn_hidden_size"] == int(4 * 256 * 2 / 3 / 64) * 64


def test_uneven_splits_and_virtual_stages():
    """126 layers, embedding and loss counted: pp 16 x vpp 8 (1 layer per chunk), given either
    as virtual stages per rank or as layers per virtual stage; the scenario keeps the split
    (the layout needs it), and the scenario loads now that the split is priced."""
    base = (
        "--num-layers 126 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 --micro-batch-size 1 "
        "--global-batch-size 64 --pipeline-model-parallel-size 16 --world-size 64 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
    )
    for vpp_flag in ("--num-virtual-stages-per-pipeline-rank 8", "--num-layers-per-virtual-pipeline-stage 1"):
        imported = parse_megatron_args(f"{base} {vpp_flag}")
        par = imported.requested["parallel"]
        assert (par["pp"], par["vpp"], par["dp"]) == (16, 8, 4)
        assert par["account_for_embedding_in_pipeline_split"] and par["account_for_loss_in_pipeline_split"]
    explicit = (
        "--num-layers 14 --hidden-size 1024 --num-attention-heads 8 --seq-length 128 --micro-batch-size 1 "
        "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 3 "
        "--decoder-last-pipeline-num-layers 3"
    )
    par = parse_megatron_args(explicit).requested["parallel"]
    assert (par["first_pipeline_num_layers"], par["last_pipeline_num_layers"]) == (3, 3)
    priced = parse_megatron_args(f"{base} --num-virtual-stages-per-pipeline-rank 8")
    # The split is priced now: nothing is kept aside, and the flags are used.
    assert priced.scenario == priced.requested and priced.kept == ()
    assert parse_scenario(priced.scenario, "imported").parallel.account_for_loss_in_pipeline_split
    with pytest.raises(ConfigError, match="--num-layers-per-virtual-pipeline-stage: cannot be combined"):
        parse_megatron_args(f"{explicit} --num-layers-per-virtual-pipeline-stage 1")


def test_recompute_modules_other_than_core_attn_are_not_modelled_while_the_key_is_refused():
    """--recompute-modules sets training.recompute_modules: while the simulator refuses
    modules other than core_attn (NOT_MODELLED_YET) the flag is not modelled and the
    scenario keeps selective without the list; once priced, the list is kept."""
    from simcluster.config.scenario import NOT_MODELLED_YET

    imported = parse_megatron_args(
        f"{MINIMAL} --recompute-granularity selective --recompute-modules core_attn mlp"
    )
    assert imported.scenario["training"]["recompute"] == "selective"
    assert imported.requested["training"]["recompute_modules"] == ["core_attn", "mlp"]
    refused = "training.recompute_modules" in NOT_MODELLED_YET
    flagged = any(line.startswith("--recompute-modules core_attn mlp: ") for line in imported.not_modelled)
    assert flagged == refused
    assert ("recompute_modules" in imported.scenario["training"]) != refused


def test_llama3_line_drops_nothing_now_that_every_key_is_priced():
    """cp, FP8 and both overlaps are priced: the Llama-3 line imports with every flag used
    (none "not modelled"), and the scenario keeps them as given."""
    imported = parse_megatron_args(LLAMA3, "h100-sxm5-80gb")
    scenario = imported.validated()
    written = " ".join(imported.not_modelled)
    for flag in ("--context-parallel-size", "--fp8-format", "--tp-comm-overlap", "--overlap-param-gather"):
        assert flag not in written
    tr = scenario.training
    assert scenario.parallel.cp == 2 and tr.dtype.value == "fp8"
    assert tr.tp_comm_overlap and tr.overlap_param_gather and tr.overlap_grad_reduce


@pytest.mark.parametrize(
    ("recipe", "key"),
    [("tensorwise", "tensorwise"), ("mxfp8", "mxfp8"), ("blockwise", "blockwise"), ("delayed", None)],
)
def test_fp8_recipe_sets_its_key(recipe, key):
    """--fp8-recipe reaches training.fp8_recipe (the default, delayed, is left out)."""
    imported = parse_megatron_args(f"{MINIMAL} --bf16 --fp8-format hybrid --fp8-recipe {recipe}")
    assert imported.scenario["training"].get("fp8_recipe") == key
    assert not [line for line in imported.not_modelled if "--fp8-recipe" in line]


def test_fp8_recipes_without_a_model_are_not_modelled_and_simulated_as_delayed():
    imported = parse_megatron_args(f"{MINIMAL} --bf16 --fp8-format e4m3 --fp8-recipe custom")
    assert "fp8_recipe" not in imported.scenario["training"]
    assert any(
        line.startswith("--fp8-recipe custom: the custom FP8 recipe") for line in imported.not_modelled
    )
    without_fp8 = parse_megatron_args(f"{MINIMAL} --bf16 --fp8-recipe tensorwise")
    assert "fp8_recipe" not in without_fp8.scenario["training"]
    assert any("--fp8-recipe without --fp8-format has no effect" in note for note in without_fp8.notes)
    with pytest.raises(
        ConfigError, match="--fp8-recipe: value 'nvfp4': allowed: delayed, tensorwise, mxfp8, blockwise"
    ):
        parse_megatron_args(f"{MINIMAL} --bf16 --fp8-format hybrid --fp8-recipe nvfp4")


def test_fp4_format_imports_as_dtype_fp4_and_refuses_fp8_beside_it():
    """Megatron-core --fp4-format e2m1 (--fp4-recipe nvfp4, its default) is dtype fp4; Megatron
    refuses --fp4-format with --fp8-format, and so does the import."""
    imported = parse_megatron_args(f"{MINIMAL} --bf16 --fp4-format e2m1 --fp4-recipe nvfp4", "b300-sxm-288gb")
    assert imported.scenario["training"]["dtype"] == "fp4"
    assert "fp4_recipe" not in imported.scenario["training"]  # the default, left out
    assert not [line for line in imported.not_modelled if "--fp4" in line]
    assert imported.validated().training.dtype.value == "fp4"
    with pytest.raises(ConfigError, match="--fp4-format and --fp8-format: choose one"):
        parse_megatron_args(f"{MINIMAL} --bf16 --fp4-format e2m1 --fp8-format hybrid")
    with pytest.raises(ConfigError, match="--fp4-format: value 'e3m2'"):
        parse_megatron_args(f"{MINIMAL} --bf16 --fp4-format e3m2")
    first_last = parse_megatron_args(f"{MINIMAL} --bf16 --fp4-format e2m1 --first-last-layers-bf16")
    assert any(line.startswith("--first-last-layers-bf16") for line in first_last.not_modelled)


def test_cudnn_attention_turned_off_imports_as_flash_attention_2():
    """NeMo's launch scripts set NVTE_FUSED_ATTN=0 before the launcher to run flash-attn's
    kernels instead of cuDNN's: the import prices FlashAttention-2 and says why."""
    line = f"NVTE_FUSED_ATTN=0 torchrun --nproc_per_node 8 pretrain_gpt.py {MINIMAL} --bf16"
    imported = parse_megatron_args(f"{line} --attention-backend auto")
    assert imported.scenario["training"]["attention_kernel"] == "flash_attn_2"
    why = "attention_kernel = flash_attn_2: NVTE_FUSED_ATTN=0"
    assert any(note.startswith(why) for note in imported.notes)
    default = parse_megatron_args(f"torchrun pretrain_gpt.py {MINIMAL} --bf16 --attention-backend auto")
    assert "attention_kernel" not in default.scenario["training"]
    unfused = parse_megatron_args(f"{line} --attention-backend unfused")
    assert "attention_kernel" not in unfused.scenario["training"]
    assert "NVTE_FUSED_ATTN=0 has no effect here: the attention is unfused" in unfused.notes
