"""A scenario -> a Megatron-LM launch line (`simcluster export-megatron`, `plan`)."""

from __future__ import annotations

import math
import shlex

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    AttentionKernel,
    CudaGraphImpl,
    Dtype,
    Fp8Recipe,
    Normalization,
    PositionEmbedding,
    Recompute,
    ScheduleKind,
)
from simcluster.config.errors import ConfigError
from simcluster.config.megatron_flags import (
    DEFAULT_VOCAB_DIVISOR,
    FUSED_ATTENTION_OFF,
    MODEL_FLOATS,
    MODEL_INTS,
    SOURCE,
)
from simcluster.config.megatron_moe_export import (
    moe_and_attention_flags,
    moe_parallel_flags,
    moe_training_flags,
)
from simcluster.config.scenario import Scenario


def _vocab_flags(vocab_size: int, tp: int) -> list[str]:
    """--make-vocab-size-divisible-by such that Megatron's padding keeps vocab_size (already
    the padded size); a size that is not a multiple of tp cannot come out of that padding."""
    if vocab_size % (DEFAULT_VOCAB_DIVISOR * tp) == 0:
        return []
    if vocab_size % tp:
        raise ConfigError(
            SOURCE,
            [
                f"model.vocab_size: value {vocab_size}: Megatron pads the vocabulary to a multiple of "
                f"make_vocab_size_divisible_by * tp; allowed: a multiple of tp ({tp})"
            ],
        )
    return ["--make-vocab-size-divisible-by", str(math.gcd(vocab_size // tp, DEFAULT_VOCAB_DIVISOR))]


def _model_flags(scenario: Scenario) -> list[str]:
    m = scenario.model
    flags: list[str] = []
    for flag, key in MODEL_INTS.items():
        value = getattr(m, key)
        if key == "ffn_hidden_size" and value is None and m.activation is Activation.SWIGLU:
            value = m.ffn_size  # Megatron's --swiglu default differs from the scenario's 4h
        if value is not None:
            flags += [f"--{flag}", str(value)]
    flags += _vocab_flags(m.vocab_size, scenario.parallel.tp)
    flags += ["--max-position-embeddings", str(m.seq_length)]
    if m.num_query_groups is not None:
        flags += ["--group-query-attention", "--num-query-groups", str(m.num_query_groups)]
    if m.activation is Activation.SWIGLU:
        flags.append("--swiglu")
    elif m.activation is Activation.SQUARED_RELU:
        flags.append("--squared-relu")
    if m.normalization is Normalization.RMSNORM:
        flags += ["--normalization", "RMSNorm"]
    if m.position_embedding is PositionEmbedding.ROPE:
        flags += ["--position-embedding-type", "rope"]
    if m.untie_embeddings_and_output_weights:
        flags.append("--untie-embeddings-and-output-weights")
    if not m.add_bias_linear:
        flags.append("--disable-bias-linear")
    for flag, key in MODEL_FLOATS.items():
        value = getattr(m, key)
        if value != type(m).model_fields[key].default:  # Megatron's default 0.1 needs no flag
            flags += [f"--{flag}", repr(value)]
    return flags


def _parallel_flags(scenario: Scenario) -> list[str]:
    par = scenario.parallel
    flags = ["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp)]
    if par.cp > 1:
        flags += ["--context-parallel-size", str(par.cp)]
    if par.account_for_embedding_in_pipeline_split:
        flags.append("--account-for-embedding-in-pipeline-split")
    if par.account_for_loss_in_pipeline_split:
        flags.append("--account-for-loss-in-pipeline-split")
    if par.first_pipeline_num_layers is not None:
        flags += ["--decoder-first-pipeline-num-layers", str(par.first_pipeline_num_layers)]
    if par.last_pipeline_num_layers is not None:
        flags += ["--decoder-last-pipeline-num-layers", str(par.last_pipeline_num_layers)]
    uneven = par.first_pipeline_num_layers is not None or par.last_pipeline_num_layers is not None
    uneven |= par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split
    if par.pipeline_layout is not None:
        # Megatron derives vpp from the layout's stage count and refuses the other vpp flags
        # beside it (arguments.py: 'No more than one of the following arguments ...')
        flags += ["--pipeline-model-parallel-layout", par.pipeline_layout]
    elif par.vpp > 1 and uneven:  # Megatron-core: uneven stages take VPP as stages per rank
        flags += ["--num-virtual-stages-per-pipeline-rank", str(par.vpp)]
    elif par.vpp > 1:
        flags += ["--num-layers-per-virtual-pipeline-stage", str(scenario.layers_per_chunk)]
    if par.sequence_parallel:
        flags.append("--sequence-parallel")
    return flags


def _training_flags(scenario: Scenario) -> list[str]:
    tr = scenario.training
    flags = ["--micro-batch-size", str(tr.micro_batch_size), "--global-batch-size", str(tr.global_batch_size)]
    if tr.recompute is Recompute.SELECTIVE:
        flags += ["--recompute-granularity", "selective"]
    elif tr.recompute is Recompute.FULL:
        flags += ["--recompute-granularity", "full"]
        flags += ["--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if tr.dtype is Dtype.FP8:
        flags += ["--bf16", "--fp8-format", "hybrid"]  # TE: E4M3 forward, E5M2 gradients
        if tr.fp8_recipe is not Fp8Recipe.DELAYED:
            flags += ["--fp8-recipe", tr.fp8_recipe.value]
    elif tr.dtype is Dtype.FP4:
        # Megatron-core: --fp4-format e2m1 with --fp4-recipe (TE NVFP4BlockScaling), bf16 elsewhere
        flags += ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", tr.fp4_recipe.value]
    elif tr.dtype is not Dtype.FP32:
        flags.append(f"--{tr.dtype.value}")
    # Always explicit: Megatron-core's default (auto) is a fused kernel, the scenario's unfused.
    backend = "flash" if tr.attention_backend is AttentionBackend.FLASH else "unfused"
    flags += ["--attention-backend", backend]
    if tr.cuda_graph_impl is not CudaGraphImpl.NONE:
        flags += ["--cuda-graph-impl", tr.cuda_graph_impl.value]
        if tr.cuda_graph_scope:
            flags += ["--cuda-graph-modules", *(scope.value for scope in tr.cuda_graph_scope)]
    for flag, on in (
        ("--use-distributed-optimizer", tr.use_distributed_optimizer),
        ("--overlap-grad-reduce", tr.overlap_grad_reduce),
        ("--overlap-param-gather", tr.overlap_param_gather),
        # Megatron asserts --tp-comm-overlap needs SP, which tp 1 cannot have: a no-op there
        ("--tp-comm-overlap", scenario.tp_comm_overlap_active),
        ("--grad-reduce-in-bf16", tr.grad_reduce_in_bf16),
        ("--fp8-param-gather", tr.fp8_param_gather),
        ("--fp4-param-gather", tr.fp4_param_gather),
    ):
        if on:
            flags.append(flag)
    return flags


def to_megatron_args(scenario: Scenario, gpus_per_node: int | None = None) -> str:
    """A scenario as a Megatron-LM launch line that `parse_megatron_args` reads back to the
    same scenario (hardware and name aside, which are not Megatron's): a torchrun prefix
    whose world size (tp · cp · pp · dp) gives dp, then `pretrain_gpt.py` and the flags of
    every field.

    `gpus_per_node` sets torchrun's --nproc_per_node (default: one node of all GPUs).
    Raises ConfigError for what Megatron cannot run (the GPipe schedule, a vocabulary that
    Megatron's padding cannot give).
    """
    if scenario.training.schedule is ScheduleKind.GPIPE:
        raise ConfigError(SOURCE, ["training.schedule: value 'gpipe': Megatron-LM has no GPipe schedule"])
    world = scenario.num_gpus
    per_node = gpus_per_node if gpus_per_node and world % gpus_per_node == 0 else world
    flash_attn_2 = scenario.training.attention_kernel is AttentionKernel.FLASH_ATTN_2
    environment = [FUSED_ATTENTION_OFF] if flash_attn_2 else []
    flags = [
        *environment,
        "torchrun",
        "--nnodes",
        str(world // per_node),
        "--nproc_per_node",
        str(per_node),
        "pretrain_gpt.py",
    ]
    flags += _model_flags(scenario) + moe_and_attention_flags(scenario.model)
    flags += _training_flags(scenario) + moe_training_flags(scenario)
    flags += _parallel_flags(scenario) + moe_parallel_flags(scenario.parallel)
    return shlex.join(flags)
