"""Scenario files: a model, a parallel layout, a training setup and a hardware profile.

The YAML keys are a public contract (Megatron's names). Unknown keys are errors; every
cross-field rule is checked at load and reported with the file, the field, the value and
what is allowed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    AttentionKernel,
    CudaGraphImpl,
    Dtype,
    Fp4Recipe,
    Fp8Recipe,
    Normalization,
    PositionEmbedding,
    Recompute,
    ScheduleKind,
    SoftmaxType,
)
from simcluster.config.errors import ConfigError, describe_validation_error
from simcluster.config.files import read_yaml
from simcluster.config.graph_scope import CudaGraphScope, cuda_graph_scope_problems
from simcluster.config.hardware import HardwareProfile, known_profiles, load_hardware
from simcluster.config.layer_rules import (
    ContextParallelRule,
    attention_kernel_allowed,
    context_parallel_problems,
    flash_precision_allowed,
    query_group_problems,
    query_groups_or_default,
)
from simcluster.config.layer_shape import Indivisible, ffn_hidden_size_or_default, indivisible_sizes
from simcluster.config.moe_choices import (
    FlexBackend,
    LoadBalancingType,
    RecomputeModule,
    RouterScore,
    TokenDispatcher,
)
from simcluster.config.moe_config import (
    ExpertLayout,
    MLAConfig,
    MoEConfig,
    check_mla_attention,
    check_moe_parallel,
)
from simcluster.config.pipeline_layout import PipelineLayout, parse_layout
from simcluster.config.pipeline_split import PipelineSplit, SplitRequest, pipeline_split, split_problems
from simcluster.config.strict import StrictModel

MAX_SIMULATED_TASKS = 1_000_000
"""Most pipeline tasks (2 · pp · vpp · m: a forward and a backward per microbatch and
chunk on every stage) one simulation may build. Each task costs the engine about 0.6 kB
and 7-50 µs, so this bounds a run near 1 GB and a minute on a shared 2-core machine; the
largest paper scenario (1T: 64 stages × 512 microbatches) has 65,536."""


class MoESpec(StrictModel):
    """`model.moe`: the routed-expert MLP of a mixture-of-experts model (Megatron-core's MoE
    flags; `workload.moe_config.MoEConfig` holds the same fields and their rules)."""

    num_experts: int = Field(gt=0, description="Megatron --num-experts")
    router_topk: int = Field(gt=0, description="Megatron --moe-router-topk")
    ffn_hidden_size: int = Field(gt=0, description="per expert, Megatron --moe-ffn-hidden-size")
    shared_expert_ffn_hidden_size: int = Field(
        default=0,
        ge=0,
        description="all shared experts together, --moe-shared-expert-intermediate-size; 0 = none",
    )
    first_k_dense_layers: int = Field(
        default=0, ge=0, description="the first k layers keep the dense MLP (--moe-layer-freq)"
    )
    capacity_factor: float | None = Field(
        default=None, gt=0, description="--moe-expert-capacity-factor; null = dropless"
    )
    load_imbalance: float = Field(
        default=1.0, ge=1.0, description="the busiest expert rank's routed tokens over the mean"
    )
    router_score: RouterScore = RouterScore.SOFTMAX
    router_bias: bool = Field(
        default=False,
        description="the router's bias (Megatron add_bias_linear on router.py TopKRouter; gpt-oss)",
    )
    expert_bias: bool = Field(
        default=False,
        description="the routed experts' fc1 / fc2 biases (Megatron add_bias_linear on "
        "TEGroupedMLP; gpt-oss): fc2's bias is added per local expert in eager PyTorch "
        "(docs/moe.md, 'gpt-oss layer')",
    )
    activation_func_clamp_value: float | None = Field(
        default=None,
        gt=0,
        description="Megatron-core TransformerConfig.activation_func_clamp_value on the experts' GLU "
        "(gpt-oss 7.0): eager clamp and concatenation kernels before the fused GLU; null = none",
    )
    aux_loss_coeff: float = Field(
        default=0.0,
        ge=0.0,
        description="Megatron --moe-aux-loss-coeff: the load-balancing loss's weight; 0 = no loss "
        "(Megatron's default; docs/moe.md, 'Load-balancing loss')",
    )
    load_balancing_type: LoadBalancingType = Field(
        default=LoadBalancingType.AUX_LOSS,
        description="Megatron --moe-router-load-balancing-type: aux_loss (default; counts all-reduced "
        "over tp·cp) | seq_aux_loss (per sequence) | global_aux_loss (over tp·cp·dp) | none; "
        "acts only when aux_loss_coeff > 0",
    )
    z_loss_coeff: float | None = Field(
        default=None,
        ge=0.0,
        description="Megatron --moe-z-loss-coeff: the router z-loss (ST-MoE); null = none (default)",
    )


class MLASpec(StrictModel):
    """`model.mla`: DeepSeek multi-latent attention (Megatron-core `--multi-latent-attention`;
    `config.moe_config.MLAConfig` holds the same fields and their rules, docs/moe.md)."""

    q_lora_rank: int | None = Field(
        gt=0, description="Megatron --q-lora-rank; null = one linear_q_proj (no query bottleneck)"
    )
    kv_lora_rank: int = Field(gt=0, description="Megatron --kv-lora-rank")
    qk_head_dim: int = Field(gt=0, description="Megatron --qk-head-dim")
    qk_pos_emb_head_dim: int = Field(ge=0, description="Megatron --qk-pos-emb-head-dim (decoupled RoPE)")
    v_head_dim: int = Field(gt=0, description="Megatron --v-head-dim")


class ModelSpec(StrictModel):
    """Transformer shape (Korthikanti Table 1: L, h, a, s, v)."""

    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    ffn_hidden_size: int | None = Field(default=None, gt=0, description="default 4 * hidden_size")
    num_query_groups: int | None = Field(
        default=None, gt=0, description="GQA / MQA key-value head groups; default num_attention_heads"
    )
    activation: Activation = Activation.GELU
    normalization: Normalization = Normalization.LAYERNORM
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    untie_embeddings_and_output_weights: bool = Field(
        default=False, description="separate output-layer weights (no tied-embedding all-reduce)"
    )
    hidden_dropout: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Megatron --hidden-dropout (default 0.1, Table 2's masks); 0 keeps no mask "
        "(Llama recipes)",
    )
    attention_dropout: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Megatron --attention-dropout (default 0.1); 0 keeps no s² mask in the unfused core",
    )
    moe: MoESpec | None = Field(default=None, description="mixture of experts; absent = dense (docs/moe.md)")
    kv_channels: int | None = Field(
        default=None,
        gt=0,
        description="Megatron --kv-channels: the per-head width of Q, K and V; default hidden_size / "
        "num_attention_heads (Qwen3 and gpt-oss set it apart)",
    )
    mla: MLASpec | None = Field(
        default=None, description="multi-latent attention (DeepSeek-V2/V3); absent = standard attention"
    )
    mtp_num_layers: int = Field(
        default=0, ge=0, description="Megatron --mtp-num-layers: DeepSeek-V3 multi-token prediction layers"
    )
    window_size: int | None = Field(
        default=None,
        gt=0,
        description="Megatron --window-size (w, 0): sliding-window attention, a query sees w keys before "
        "it; null = full causal attention",
    )
    window_attn_skip_freq: int | None = Field(
        default=None,
        gt=0,
        description="Megatron --window-attn-skip-freq N: every N-th layer (1-based) keeps full attention",
    )
    softmax_type: SoftmaxType = Field(
        default=SoftmaxType.VANILLA,
        description="Megatron --softmax-type: vanilla (default) | off-by-one | learnable (gpt-oss's "
        "attention sinks): TE's cuDNN fused attention, priced at the layer's head dim where the "
        "profile has cuDNN's head-dim rates (docs/moe.md, 'gpt-oss layer')",
    )
    qk_layernorm: bool = Field(
        default=False,
        description="Megatron --qk-layernorm: a norm (the model's kind) over each query and key head "
        "before RoPE (Qwen3); with MLA the latent norms are the MLA layer's own",
    )
    add_bias_linear: bool = Field(
        default=True,
        description="Megatron-core TransformerConfig.add_bias_linear (default true; --disable-bias-linear "
        "sets false, as Llama, Qwen3, DeepSeek-V3, Mixtral and Nemotron recipes do): the QKV, projection, "
        "fc1 and fc2 linears' biases, and the bias-grad reductions and bias-GeLU fusion they bring "
        "(docs/scenario.md, 'Linear biases'); false also forbids model.moe.router_bias / expert_bias",
    )

    @property
    def query_groups(self) -> int:
        """g: key/value heads (Megatron's num_query_groups), a without GQA."""
        return query_groups_or_default(self.num_attention_heads, self.num_query_groups)

    @property
    def ffn_size(self) -> int:
        return ffn_hidden_size_or_default(self.hidden_size, self.ffn_hidden_size)

    @property
    def head_dim(self) -> int:
        """d_h: `kv_channels`, or hidden_size / num_attention_heads (Megatron's default)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads


class ParallelSpec(StrictModel):
    """Tensor (t), pipeline (p), data (d) and virtual-pipeline (m in the paper) degrees."""

    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    dp: int = Field(default=1, gt=0)
    vpp: int = Field(default=1, gt=0)
    sequence_parallel: bool = False
    cp: int = Field(default=1, gt=0, description="context parallelism; GPUs = tp * cp * pp * dp")
    account_for_embedding_in_pipeline_split: bool = Field(
        default=False, description="Megatron-core: the embedding takes a layer's slot on the first stage"
    )
    account_for_loss_in_pipeline_split: bool = Field(
        default=False, description="Megatron-core: the loss takes a layer's slot on the last stage"
    )
    first_pipeline_num_layers: int | None = Field(
        default=None, gt=0, description="Megatron-core --decoder-first-pipeline-num-layers"
    )
    last_pipeline_num_layers: int | None = Field(
        default=None, gt=0, description="Megatron-core --decoder-last-pipeline-num-layers"
    )
    ep: int = Field(
        default=1, gt=0, description="expert parallelism (--expert-model-parallel-size), folded into tp·cp·dp"
    )
    etp: int | None = Field(
        default=None,
        gt=0,
        description="expert tensor parallelism (--expert-tensor-parallel-size); default tp",
    )
    pipeline_layout: str | None = Field(
        default=None,
        description="Megatron-core --pipeline-model-parallel-layout, e.g. 'Et*3|(tt|)*29,m|L': the layers "
        "of each of the pp * vpp virtual stages (E embedding, t transformer layer, m MTP layer, L loss); "
        "null = Megatron's split (docs/pipeline_layout.md)",
    )


class TrainingSpec(StrictModel):
    micro_batch_size: int = Field(gt=0)
    global_batch_size: int = Field(gt=0)
    recompute: Recompute = Recompute.NONE
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B
    dtype: Dtype = Dtype.BF16
    overlap_grad_reduce: bool = Field(
        default=False, description="overlap the DP gradient all-reduce with the last backwards"
    )
    use_distributed_optimizer: bool = Field(
        default=False, description="shard optimizer state over DP (Megatron's distributed optimizer)"
    )
    attention_backend: AttentionBackend = AttentionBackend.UNFUSED
    overlap_param_gather: bool = Field(
        default=False, description="distributed optimizer: all-gather parameters during the next forward"
    )
    tp_comm_overlap: bool = Field(
        default=False, description="pipeline the SP all-gather / reduce-scatter with the GEMMs (TE)"
    )
    fp8_param_gather: bool = Field(
        default=False,
        description="Megatron --fp8-param-gather (with dtype fp8 and the distributed optimizer): the "
        "TE linears' parameters are kept in FP8 (no bf16 copy) and all-gathered in FP8",
    )
    grad_reduce_in_bf16: bool = Field(
        default=False,
        description="Megatron --grad-reduce-in-bf16: bf16 main grads (2 B/param) reduced in bf16; "
        "default fp32 (Megatron's default with --bf16; NeMo's performance recipes turn this on)",
    )
    fp8_recipe: Fp8Recipe = Field(
        default=Fp8Recipe.DELAYED,
        description="Megatron --fp8-recipe with dtype fp8: delayed (default) | tensorwise (current "
        "scaling) | mxfp8 (Blackwell) | blockwise (1x128 activation tiles, 128x128 weight blocks; "
        "Hopper and Blackwell)",
    )
    fp4_param_gather: bool = Field(
        default=False,
        description="Megatron-core --fp4-param-gather (with dtype fp4 and the distributed optimizer): the "
        "TE linears' parameters are kept in NVFP4 (no bf16 copy) and all-gathered in NVFP4",
    )
    fp4_recipe: Fp4Recipe = Field(
        default=Fp4Recipe.NVFP4,
        description="Megatron-core --fp4-recipe with dtype fp4 (--fp4-format e2m1): nvfp4 (default; "
        "Transformer Engine NVFP4BlockScaling, Blackwell)",
    )
    attention_kernel: AttentionKernel = Field(
        default=AttentionKernel.AUTO,
        description="with attention_backend flash: auto (default; Transformer Engine's own choice, "
        "cuDNN fused attention on Hopper and later) | flash_attn_2 (FlashAttention-2: TE with "
        "NVTE_FUSED_ATTN=0 and flash-attn 2 installed)",
    )
    cuda_graph_impl: CudaGraphImpl = Field(
        default=CudaGraphImpl.NONE,
        description="Megatron --cuda-graph-impl: none (default) | local | transformer_engine (whole "
        "layers captured per microbatch) | full_iteration (the whole forward-backward pass): removes "
        "the host issue time of what is captured (only where the profile prices it: "
        "compute.host_issue_us_per_op)",
    )
    cuda_graph_scope: tuple[CudaGraphScope, ...] = Field(
        default=(),
        description="Megatron --cuda-graph-modules (formerly --cuda-graph-scope) with cuda_graph_impl "
        "local / transformer_engine: [] (default: whole layers) or any of attn, mlp, moe_router, "
        "moe_preprocess (moe: drop-and-pad only); what is not captured stays priced per kernel "
        "(docs/moe_host.md)",
    )
    moe_token_dispatcher: TokenDispatcher = Field(
        default=TokenDispatcher.ALLTOALL,
        description="Megatron --moe-token-dispatcher-type: alltoall (default) | allgather | flex "
        "(flex: DeepEP or HybridEP kernels by moe_flex_dispatcher_backend, etp = 1)",
    )
    moe_grouped_gemm: bool = Field(
        default=True, description="Megatron --moe-grouped-gemm: the experts as TE grouped GEMMs"
    )
    moe_flex_dispatcher_backend: FlexBackend = Field(
        default=FlexBackend.DEEPEP,
        description="Megatron-core --moe-flex-dispatcher-backend, with moe_token_dispatcher flex: deepep "
        "(default: DeepEP's kernels, costs.deepep) | hybridep (NVIDIA's Hybrid-EP kernels, costs.hybridep; "
        "the only backend for an EP group across compute trays of a multi-node NVLink domain)",
    )
    moe_router_fusion: bool = Field(
        default=False,
        description="Megatron-core --moe-router-fusion: the router's score function and top-k as Transformer "
        "Engine's one fused kernel each way (`fused_topk_with_score_function`); needs model.moe "
        "(docs/moe.md, section Router and permute fusion)",
    )
    moe_permute_fusion: bool = Field(
        default=False,
        description="Megatron-core --moe-permute-fusion: permute, unpermute and the chunk sorts as "
        "Transformer Engine's fused permutation kernels; needs model.moe; priced with alltoall, no effect "
        "under flex with hybridep, not priced yet with allgather or deepep (docs/moe.md, section Router "
        "and permute fusion)",
    )
    overlap_moe_expert_parallel_comm: bool = Field(
        default=False,
        description="Megatron-core --overlap-moe-expert-parallel-comm: the combined 1F1B schedule runs "
        "one microbatch's forward and another's backward layer by layer, the dispatch and combine of "
        "each under the other's compute (costs.ep_overlap); alltoall or flex, ep > 1, vpp > 1 when pp > 1",
    )
    delay_wgrad_compute: bool = Field(
        default=False,
        description="Megatron-core --delay-wgrad-compute: under the EP overlap, the experts' weight "
        "gradients run after their input gradients, so the backward's dispatch starts sooner "
        "(costs.ep_overlap); needs training.overlap_moe_expert_parallel_comm",
    )
    recompute_modules: list[RecomputeModule] | None = Field(
        default=None,
        description="Megatron-core --recompute-modules under recompute: selective (core_attn, moe_act, "
        "moe, shared_experts, layernorm, mla_up_proj, mlp); null = core_attn, Megatron's default",
    )


class Scenario(StrictModel):
    name: str
    hardware: str
    model: ModelSpec
    parallel: ParallelSpec
    training: TrainingSpec

    @property
    def num_gpus(self) -> int:
        """tp · cp · pp · dp (Megatron-core's world size)."""
        par = self.parallel
        return par.tp * par.cp * par.pp * par.dp

    @property
    def tp_comm_overlap_active(self) -> bool:
        """`training.tp_comm_overlap` where there is TP communication to overlap: at tp = 1 it
        is a no-op, as NeMo's `MegatronCommOverlapCallback` disables it below TP 2 (so a
        recipe's default switch does not make a tp-1 scenario invalid)."""
        return self.training.tp_comm_overlap and self.parallel.tp > 1

    @property
    def num_microbatches(self) -> int:
        """m = B / (b · d) (Megatron)."""
        return self.training.global_batch_size // (self.training.micro_batch_size * self.parallel.dp)

    @property
    def layers_per_chunk(self) -> int:
        """L/(p·v): the layers of every chunk of the default (even) split; see
        `pipeline_split` for the layers each chunk builds."""
        return self.model.num_layers // (self.parallel.pp * self.parallel.vpp)

    @property
    def split_request(self) -> SplitRequest:
        par = self.parallel
        return SplitRequest(
            num_layers=self.model.num_layers,
            pp=par.pp,
            vpp=par.vpp,
            account_for_embedding=par.account_for_embedding_in_pipeline_split,
            account_for_loss=par.account_for_loss_in_pipeline_split,
            first_pipeline_num_layers=par.first_pipeline_num_layers,
            last_pipeline_num_layers=par.last_pipeline_num_layers,
            pipeline_layout=par.pipeline_layout,
            mtp_num_layers=self.model.mtp_num_layers,
        )

    @property
    def pipeline_split(self) -> PipelineSplit:
        """The transformer layers each (stage, chunk) builds (Megatron-core's
        get_num_layers_to_build, `config.pipeline_split`)."""
        return pipeline_split(self.split_request)

    @property
    def pipeline_layer_layout(self) -> PipelineLayout | None:
        """`parallel.pipeline_layout` parsed (None without one); the loader has checked it."""
        layout = self.parallel.pipeline_layout
        return None if layout is None else parse_layout(layout)

    @property
    def mtp_virtual_stage(self) -> int:
        """The virtual stage that runs the MTP layers: the one the layout names, else the
        last (Megatron-core `mtp_on_this_rank`: without a layout, the last pipeline stage)."""
        layout = self.pipeline_layer_layout
        stage = layout.mtp_stage if layout is not None else None
        return stage if stage is not None else self.parallel.pp * self.parallel.vpp - 1


def divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """The divisors of n (at most `limit`) in order, by trial division up to √n (n is at
    most 2³¹ - 1 here, so this is at most ~46,000 steps, never a loop over n)."""
    if limit is not None and limit * limit < n:
        return tuple(d for d in range(1, limit + 1) if n % d == 0)
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
        d += 1
    bound = n if limit is None else limit
    return tuple(x for x in small + large[::-1] if x <= bound)


def _divisors(n: int) -> str:
    values: list[object] = list(divisors(n))
    shown = values if len(values) <= 12 else values[:12] + ["…"]
    return ", ".join(str(v) for v in shown)


def _shape_problem(bad: Indivisible) -> str:
    """A layer-shape rule broken, phrased on the scenario field a user would change."""
    if bad.field == "hidden_size":
        return (
            f"model.hidden_size: value {bad.value}: must be divisible by num_attention_heads "
            f"({bad.divisor_value})"
        )
    if bad.field == "num_attention_heads":
        return (
            f"parallel.tp: value {bad.divisor_value}: must divide num_attention_heads "
            f"({bad.value}); allowed: {_divisors(bad.value)}"
        )
    if bad.field == "ffn_hidden_size":
        return f"parallel.tp: value {bad.divisor_value}: must divide ffn_hidden_size ({bad.value})"
    return (
        f"model.{bad.field}: value {bad.value}: must be divisible by {bad.divisor} ({bad.divisor_value}) "
        "with sequence_parallel"
    )


def _too_many_tasks(scenario: Scenario, tasks: int) -> str:
    par, tr = scenario.parallel, scenario.training
    per_step = tr.micro_batch_size * par.dp
    most = MAX_SIMULATED_TASKS // (2 * par.pp * par.vpp)
    if par.vpp > 1:  # interleaving needs m a multiple of pp
        most -= most % par.pp
    largest = most * per_step
    return (
        f"training.global_batch_size: value {tr.global_batch_size}: gives {scenario.num_microbatches:,} "
        f"microbatches, {tasks:,} pipeline tasks (2 * pp * vpp * m), over the {MAX_SIMULATED_TASKS:,} "
        f"one run simulates; simulate a smaller global_batch_size (at most {largest:,} here) and scale: "
        "past the pipeline fill the iteration time grows linearly in m, so two runs at m1 < m2 give "
        "t(m) = t(m2) + (m - m2) * (t(m2) - t(m1)) / (m2 - m1)"
    )


def cross_field_problems(scenario: Scenario, refuse_unpriced: bool = True) -> list[str]:
    """The rules pydantic's per-field checks cannot see (also used to filter sweeps)."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    problems: list[str] = []
    shape = indivisible_sizes(
        m.hidden_size, m.num_attention_heads, m.ffn_size, m.seq_length, par.tp, par.sequence_parallel
    )
    # The sequence rule is reported last, after the rules of the layout around the layer.
    problems += [_shape_problem(bad) for bad in shape if bad.field != "seq_length"]
    request = scenario.split_request
    both_kinds = request.explicit and (request.account_for_embedding or request.account_for_loss)
    # the exclusion itself is reported with Megatron-core's other rules (a layout's here)
    if not both_kinds or request.pipeline_layout is not None:
        problems += split_problems(request)
    per_step = tr.micro_batch_size * par.dp
    if tr.global_batch_size % per_step:
        problems.append(
            f"training.global_batch_size: value {tr.global_batch_size}: must be a multiple of "
            f"micro_batch_size * dp ({tr.micro_batch_size} * {par.dp} = {per_step})"
        )
    elif (tasks := 2 * par.pp * par.vpp * scenario.num_microbatches) > MAX_SIMULATED_TASKS:
        problems.append(_too_many_tasks(scenario, tasks))
    elif par.vpp > 1 and tr.schedule is ScheduleKind.ONE_F_ONE_B and scenario.num_microbatches % par.pp:
        problems.append(
            f"parallel.vpp: value {par.vpp}: interleaved 1F1B needs the number of microbatches "
            f"({scenario.num_microbatches}) to be a multiple of pp ({par.pp})"
        )
    if par.vpp > 1 and par.pp == 1:
        problems.append(f"parallel.vpp: value {par.vpp}: interleaving needs pp > 1")
    if par.sequence_parallel and par.tp == 1:
        problems.append("parallel.sequence_parallel: value True: needs tp > 1")
    problems += [_shape_problem(bad) for bad in shape if bad.field == "seq_length"]
    problems += modern_layout_problems(scenario, refuse_unpriced)
    problems += moe_problems(scenario)
    problems += flex_backend_problems(scenario)
    problems += moe_fusion_problems(scenario)
    problems += attention_variant_problems(scenario)
    return problems


def attention_variant_problems(scenario: Scenario) -> list[str]:
    """Megatron-core's rules for MLA, sliding windows, multi-token prediction and
    `--recompute-modules` (docs/moe.md), phrased on the YAML fields."""
    m, tr = scenario.model, scenario.training
    problems: list[str] = []
    if m.mla is not None:
        try:
            check_mla_attention(MLAConfig(**m.mla.model_dump()), m.num_attention_heads, m.num_query_groups)
        except ValueError as error:
            problems.append(str(error).replace("MLAConfig.", "model.mla."))
    if m.softmax_type is not SoftmaxType.VANILLA and (
        tr.attention_backend is not AttentionBackend.FLASH or tr.attention_kernel is not AttentionKernel.AUTO
    ):
        # TE dot_product_attention/utils.py get_attention_backend: FlashAttention and the unfused
        # core take no softmax offset; only the cuDNN fused attention (TE's auto on Hopper+) runs it
        problems.append(
            f"model.softmax_type: value {m.softmax_type.value}: needs training.attention_backend flash "
            f"with attention_kernel auto (TE's cuDNN fused attention; got {tr.attention_backend.value}, "
            f"{tr.attention_kernel.value})"
        )
    if m.window_attn_skip_freq is not None and m.window_size is None:
        problems.append(
            f"model.window_attn_skip_freq: value {m.window_attn_skip_freq}: needs model.window_size "
            "(which layers keep full attention only means something with a window)"
        )
    if m.window_size is not None and m.mla is not None:
        problems.append(f"model.window_size: value {m.window_size}: not allowed with model.mla")
    problems += mla_unpriced_problems(scenario)
    if m.window_size is not None and scenario.parallel.cp > 1:
        # TransformerEngine attn_forward_func_with_cp: "The context parallel running configs
        # cannot support sliding window attention" unless cp_comm_type is a2a / all_gather
        problems.append(
            f"model.window_size: value {m.window_size}: not allowed with parallel.cp > 1 (got "
            f"{scenario.parallel.cp}): Transformer Engine's p2p context-parallel ring, the one "
            "this version models, has no sliding window; allowed: cp 1"
        )
    modules = tr.recompute_modules
    if modules is not None:
        names = ", ".join(module.value for module in modules)
        if tr.recompute is not Recompute.SELECTIVE:
            problems.append(
                f"training.recompute_modules: value [{names}]: needs training.recompute: selective "
                f"(Megatron-core reads --recompute-modules only with --recompute-granularity selective), "
                f"got {tr.recompute.value}"
            )
        needs = {
            RecomputeModule.MOE: ("model.moe", m.moe),
            RecomputeModule.MOE_ACT: ("model.moe", m.moe),
            RecomputeModule.SHARED_EXPERTS: ("model.moe", m.moe),
            RecomputeModule.MLA_UP_PROJ: ("model.mla", m.mla),
        }
        problems += [
            f"training.recompute_modules: {module.value!r} needs {needs[module][0]} (the module it re-runs)"
            for module in dict.fromkeys(modules)
            if module in needs and needs[module][1] is None
        ]
        problems += _recompute_module_problems(scenario, modules)
    problems += cuda_graph_scope_problems(scenario)
    return problems


def _recompute_module_problems(scenario: Scenario, modules: list[RecomputeModule]) -> list[str]:
    """Megatron-core's `TransformerConfig.__post_init__` rules for `--recompute-modules`
    (transformer_config.py @d98e8a64ddf34856e74b24714e3bedb2f5a39553)."""
    tr, problems = scenario.training, []
    if RecomputeModule.MOE_ACT in modules and not tr.moe_grouped_gemm:
        problems.append(
            "training.recompute_modules: 'moe_act' needs training.moe_grouped_gemm: true "
            "(Megatron-core: moe_act recompute is only supported with moe_grouped_gemm)"
        )
    fp8_output_discarding = {RecomputeModule.MOE_ACT, RecomputeModule.LAYERNORM} & set(modules)
    if fp8_output_discarding and tr.dtype is Dtype.FP8 and tr.fp8_recipe is Fp8Recipe.DELAYED:
        names = ", ".join(sorted(repr(module.value) for module in fp8_output_discarding))
        problems.append(
            f"training.recompute_modules: {names} with training.dtype fp8 needs a training.fp8_recipe "
            "other than delayed (Megatron-core: delayed scaling does not support moe_act and "
            "layernorm recompute for fp8)"
        )
    return problems


def mla_unpriced_problems(scenario: Scenario) -> list[str]:
    """MLA settings this version does not price (docs/moe.md, "MLA and MTP in the simulator"):
    the unfused attention core (the MLA op graph is the fused kernel's), context parallelism
    (no ring for the MLA core yet)."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    if m.mla is None:
        return []
    unpriced = {
        "training.attention_backend": (
            tr.attention_backend is not AttentionBackend.FLASH,
            tr.attention_backend.value,
            "flash with model.mla",
        ),
        "parallel.cp": (par.cp > 1, par.cp, "1 with model.mla"),
    }
    return [
        f"{key}: value {value}: {NOT_MODELLED_YET_MESSAGE} with multi-latent attention; allowed: {allowed}"
        for key, (is_set, value, allowed) in unpriced.items()
        if is_set
    ]


def moe_problems(scenario: Scenario) -> list[str]:
    """Megatron-core's MoE rules (`workload.moe_config`: top-k <= experts, experts divisible
    by ep, ep·etp dividing tp·cp·dp, SP with tp > 1, load_imbalance <= ep), phrased on the
    YAML fields, and the MoE options this version does not price yet (docs/moe.md,
    "Status")."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    if m.moe is None:
        return [
            f"{key}: value {value}: needs model.moe (expert parallelism of a dense model)"
            for key, value, default in (
                ("parallel.ep", par.ep, 1),
                ("parallel.etp", par.etp, None),
                ("training.overlap_moe_expert_parallel_comm", tr.overlap_moe_expert_parallel_comm, False),
                ("training.delay_wgrad_compute", tr.delay_wgrad_compute, False),
            )
            if value != default
        ]
    problems: list[str] = []
    try:
        moe = MoEConfig(**m.moe.model_dump())
        layout = ExpertLayout(tp=par.tp, cp=par.cp, dp=par.dp, ep=par.ep, etp=par.etp)
        check_moe_parallel(moe, layout, par.sequence_parallel)
    except ValueError as error:
        problems.append(str(error).replace("MoEConfig.", "model.moe.").replace("ExpertLayout.", "parallel."))
    if m.moe.first_k_dense_layers >= m.num_layers:
        problems.append(
            f"model.moe.first_k_dense_layers: value {m.moe.first_k_dense_layers}: must be below "
            f"num_layers ({m.num_layers}); a model without MoE layers leaves model.moe out"
        )
    problems += _moe_bias_problems(m)
    unpriced = {
        "training.moe_token_dispatcher": (
            tr.moe_token_dispatcher is TokenDispatcher.FLEX and (par.etp or par.tp) != 1,
            f"{tr.moe_token_dispatcher.value} with parallel.etp {par.etp or par.tp}",
            "flex (DeepEP) with etp = 1 only; alltoall or allgather with any etp",
        ),
        "model.activation": (not m.activation.gated, m.activation.value, "swiglu with model.moe"),
    }
    problems += _flex_problems(scenario)
    problems += _ep_overlap_problems(scenario)
    problems += [
        f"{key}: value {value}: {NOT_MODELLED_YET_MESSAGE} for a MoE model; allowed: {allowed}"
        for key, (is_set, value, allowed) in unpriced.items()
        if is_set
    ]
    return problems


def _moe_bias_problems(m: ModelSpec) -> list[str]:
    """Megatron-core builds the router's and the experts' biases from the one
    `add_bias_linear` (router.py `Router.__init__`, experts.py `TEGroupedMLP`: `bias=
    self.config.add_bias_linear`), so neither exists where it is false."""
    if m.add_bias_linear or m.moe is None:
        return []
    return [
        f"model.moe.{key}: value true with model.add_bias_linear false: Megatron-core builds the "
        "router's and the experts' biases only with add_bias_linear; allowed: false"
        for key, on in (("router_bias", m.moe.router_bias), ("expert_bias", m.moe.expert_bias))
        if on
    ]


def _ep_overlap_problems(scenario: Scenario) -> list[str]:
    """Megatron-core's rules for `overlap_moe_expert_parallel_comm`
    (transformer_config.py `TransformerConfig.__post_init__`, Megatron-LM @d98e8a64): a
    virtual pipeline when pp > 1, ep > 1, the alltoall or flex dispatcher, no full
    recompute, no `moe` recompute module, at most one MTP layer; a 1F1B schedule (the
    combined schedule is Megatron's 1F1B, schedules.py); and `delay_wgrad_compute` only
    with the overlap."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    if m.moe is None:
        return []
    if not tr.overlap_moe_expert_parallel_comm:
        # transformer_config.py: "overlap_moe_expert_parallel_comm must be enabled when
        # enabling delay_wgrad_compute"
        return (
            ["training.delay_wgrad_compute: value true: needs training.overlap_moe_expert_parallel_comm "
             "true (Megatron-core)"]
            if tr.delay_wgrad_compute
            else []
        )  # fmt: skip
    key = "training.overlap_moe_expert_parallel_comm: value true"
    rules = [
        (par.pp > 1 and par.vpp == 1, "needs parallel.vpp > 1 when parallel.pp > 1"),
        (par.ep == 1, "needs parallel.ep > 1"),
        (
            tr.moe_token_dispatcher is TokenDispatcher.ALLGATHER,
            "needs training.moe_token_dispatcher alltoall or flex",
        ),
        (tr.recompute is Recompute.FULL, "cannot be combined with training.recompute full"),
        (
            RecomputeModule.MOE in (tr.recompute_modules or []),
            "cannot be combined with 'moe' in training.recompute_modules",
        ),
        (m.mtp_num_layers > 1, "supports at most one MTP layer (model.mtp_num_layers)"),
        (tr.schedule is ScheduleKind.GPIPE, "runs Megatron's 1F1B schedules, not training.schedule gpipe"),
    ]
    return [f"{key}: {why} (Megatron-core)" for broken, why in rules if broken]


def _flex_problems(scenario: Scenario) -> list[str]:
    """Megatron-core's rule for the flex dispatcher with DeepEP: it needs tp·ep > 1
    (token_dispatcher.py `MoEFlexTokenDispatcher`: "DeepEP dispatcher requires TPxEP > 1",
    its tp being the expert tensor-parallel size). Padding to capacity, which it refuses, has
    no scenario key."""
    par, tr = scenario.parallel, scenario.training
    if tr.moe_token_dispatcher is not TokenDispatcher.FLEX or scenario.model.moe is None:
        return []
    problems = []
    if tr.moe_flex_dispatcher_backend is FlexBackend.DEEPEP and (par.etp or par.tp) * par.ep == 1:
        problems.append(
            "training.moe_token_dispatcher: value flex: DeepEP needs etp·ep > 1 (Megatron-core); "
            "use alltoall at ep = 1"
        )
    return problems


def flex_backend_problems(scenario: Scenario) -> list[str]:
    """`training.moe_flex_dispatcher_backend` set away from its default without the flex
    dispatcher: Megatron-core reads the backend only in `MoEFlexTokenDispatcher`
    (token_dispatcher.py), so hybridep beside alltoall or allgather would silently not run."""
    tr = scenario.training
    if tr.moe_flex_dispatcher_backend is FlexBackend.DEEPEP:
        return []
    if scenario.model.moe is None or tr.moe_token_dispatcher is not TokenDispatcher.FLEX:
        return [
            f"training.moe_flex_dispatcher_backend: value {tr.moe_flex_dispatcher_backend.value}: "
            "the backend of the flex dispatcher; it needs model.moe and training.moe_token_dispatcher flex "
            f"(here {tr.moe_token_dispatcher.value}); allowed otherwise: deepep (the default)"
        ]
    return []


def moe_fusion_problems(scenario: Scenario) -> list[str]:
    """`training.moe_router_fusion` / `moe_permute_fusion` (Megatron-core `TransformerConfig`,
    Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c): they act on the MoE router and token
    dispatcher only, so either one on a dense model would silently do nothing. Permute fusion
    is priced with alltoall (and changes nothing under flex with hybridep); the allgather
    dispatcher's and DeepEP's fused paths (`_DeepepManager.get_permuted_hidden_states_by_experts`:
    TE's `moe_permute_and_pad_with_probs` with its padding bookkeeping) are not priced yet."""
    tr = scenario.training
    keys = (
        ("training.moe_router_fusion", tr.moe_router_fusion),
        ("training.moe_permute_fusion", tr.moe_permute_fusion),
    )
    if scenario.model.moe is None:
        return [
            f"{key}: value true: fuses the MoE router / token permutation, so it needs model.moe; "
            "allowed for a dense model: false (the default)"
            for key, value in keys
            if value
        ]
    dispatcher = tr.moe_token_dispatcher
    if dispatcher is TokenDispatcher.FLEX:
        if tr.moe_flex_dispatcher_backend is FlexBackend.HYBRIDEP:
            return []
        unpriced = "flex (deepep): DeepEP's fused permute-and-pad"
    else:
        unpriced = f"{dispatcher.value}: the fused permute of the gathered tokens"
    if tr.moe_permute_fusion and dispatcher is not TokenDispatcher.ALLTOALL:
        return [
            f"training.moe_permute_fusion: value true with moe_token_dispatcher {unpriced} is "
            f"{NOT_MODELLED_YET_MESSAGE}; allowed: alltoall, or flex with moe_flex_dispatcher_backend "
            "hybridep (which permutes in its own kernel either way)"
        ]
    return []


# Keys of the contract that load and are checked, but that the simulator does not price yet:
# a run with one of them set is refused rather than priced as if it were unset. Empty now
# (context parallelism, the uneven splits, FP8 and both overlaps are priced); the rule stays
# for the next key that loads before it is priced.
NOT_MODELLED_YET_MESSAGE = "not modelled by this version of the simulator yet"
NOT_MODELLED_YET: dict[str, Callable[[Scenario], bool]] = {}


def unpriced_keys(scenario: Scenario) -> list[str]:
    """The keys of NOT_MODELLED_YET this scenario sets away from their defaults."""
    return [key for key, is_set in NOT_MODELLED_YET.items() if is_set(scenario)]


def modern_layout_problems(scenario: Scenario, refuse_unpriced: bool = True) -> list[str]:
    """Megatron-core's rules for GQA, context parallelism, the overlaps and uneven pipeline
    splits (docs/scenario.md), then (unless `refuse_unpriced` is off, for tools that only
    describe a run, never price it: `export-megatron`) the keys set that are not priced yet."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    problems: list[str] = []
    g = m.query_groups
    for bad in query_group_problems(m.num_attention_heads, g, par.tp):
        if bad.field == "num_attention_heads":
            problems.append(
                f"model.num_query_groups: value {g}: must divide num_attention_heads "
                f"({m.num_attention_heads}); allowed: {_divisors(m.num_attention_heads)}"
            )
        else:
            problems.append(
                f"parallel.tp: value {par.tp}: must divide num_query_groups ({g}); Megatron-core's "
                f"attention asserts num_query_groups % tp == 0; allowed tp: {_divisors(g)}"
            )
    if not flash_precision_allowed(tr.attention_backend, tr.dtype):
        problems.append(
            "training.attention_backend: value flash: flash attention runs in 16-bit "
            "(fp16 / bf16 / fp8 recipes); dtype fp32 allows only unfused"
        )
    if not attention_kernel_allowed(tr.attention_kernel, tr.attention_backend):
        problems.append(
            f"training.attention_kernel: value {tr.attention_kernel.value}: needs "
            f"training.attention_backend flash (got {tr.attention_backend.value}, whose kernels are "
            "the paper's unfused ones); allowed with it: auto"
        )
    problems += [
        _context_parallel_problem(rule, scenario)
        for rule in context_parallel_problems(
            par.cp, m.seq_length, par.tp, par.sequence_parallel, tr.attention_backend
        )
    ]
    if tr.tp_comm_overlap and not par.sequence_parallel and par.tp > 1:
        problems.append("training.tp_comm_overlap: value True: needs parallel.sequence_parallel (Megatron)")
    if tr.overlap_param_gather and not tr.use_distributed_optimizer:
        problems.append(
            "training.overlap_param_gather: value True: needs training.use_distributed_optimizer (Megatron)"
        )
    if tr.fp8_param_gather and tr.dtype is not Dtype.FP8:
        problems.append(
            f"training.fp8_param_gather: value True: needs training.dtype fp8 (got {tr.dtype.value})"
        )
    if tr.fp8_recipe is not Fp8Recipe.DELAYED and tr.dtype is not Dtype.FP8:
        problems.append(
            f"training.fp8_recipe: value {tr.fp8_recipe.value}: needs training.dtype fp8 "
            f"(got {tr.dtype.value}); Megatron reads --fp8-recipe only with --fp8-format"
        )
    if tr.fp4_param_gather and tr.dtype is not Dtype.FP4:
        # megatron/training/arguments.py: "--fp4-param-gather must be used together with --fp4-format."
        problems.append(
            f"training.fp4_param_gather: value True: needs training.dtype fp4 (got {tr.dtype.value})"
        )
    if tr.fp4_param_gather and not tr.use_distributed_optimizer:
        # the parameter shards are gathered by the distributed optimizer (or FSDP, which the
        # contract does not have), as for --fp8-param-gather
        problems.append(
            "training.fp4_param_gather: value True: needs training.use_distributed_optimizer (Megatron)"
        )
    if tr.fp8_param_gather and not tr.use_distributed_optimizer:
        # megatron/training/arguments.py: --fp8-param-gather needs the distributed optimizer
        # (or FSDP, which the contract does not have)
        problems.append(
            "training.fp8_param_gather: value True: needs training.use_distributed_optimizer (Megatron)"
        )
    if tr.overlap_param_gather and not tr.overlap_grad_reduce:
        # megatron/training/arguments.py: '--overlap-grad-reduce should be turned on when
        # using --overlap-param-gather'
        problems.append(
            "training.overlap_param_gather: value True: needs training.overlap_grad_reduce (Megatron)"
        )
    accounts = par.account_for_embedding_in_pipeline_split or par.account_for_loss_in_pipeline_split
    explicit = par.first_pipeline_num_layers is not None or par.last_pipeline_num_layers is not None
    if accounts and explicit:
        problems.append(
            "parallel.first_pipeline_num_layers / last_pipeline_num_layers: cannot be combined with "
            "account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split (Megatron-core)"
        )
    if refuse_unpriced:
        problems += [
            f"{key}: value {_shown_value(scenario, key)}: {NOT_MODELLED_YET_MESSAGE}; leave it at its default"
            for key in unpriced_keys(scenario)
        ]
    return problems


def _context_parallel_problem(rule: ContextParallelRule, scenario: Scenario) -> str:
    """A context-parallel rule broken, phrased on the scenario field a user would change."""
    m, par = scenario.model, scenario.parallel
    if rule is ContextParallelRule.SEQUENCE_CHUNKS:
        return (
            f"model.seq_length: value {m.seq_length}: must be divisible by 2 * cp ({2 * par.cp}); "
            "Megatron-core splits the sequence into 2·cp chunks for causal load balance"
        )
    if rule is ContextParallelRule.SEQUENCE_PARALLEL:
        return (
            f"model.seq_length: value {m.seq_length}: each context-parallel rank's "
            f"{m.seq_length // par.cp} tokens (seq_length / cp) must be divisible by tp ({par.tp}) "
            "with sequence_parallel"
        )
    # megatron/core/transformer/dot_product_attention.py: DotProductAttention.__init__
    # asserts context_parallel_size == 1 ("Context parallelism is only supported by
    # TEDotProductAttention!"); the ring runs inside TE's fused / flash attention.
    return (
        f"parallel.cp: value {par.cp}: needs training.attention_backend flash; Megatron-core's "
        "unfused DotProductAttention asserts 'Context parallelism is only supported by "
        "TEDotProductAttention!'"
    )


def _shown_value(scenario: Scenario, key: str) -> object:
    section, field = key.split(".")
    value = getattr(getattr(scenario, section), field)
    return value.value if isinstance(value, enum.Enum) else value


def parse_scenario(
    data: Any, source: str | Path, default_name: str = "scenario", refuse_unpriced: bool = True
) -> Scenario:
    """Validate a scenario mapping; raise ConfigError naming every problem at once.
    `refuse_unpriced=False` keeps every rule but accepts keys not priced yet (for tools that
    describe a run without simulating it)."""
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): a scenario must be a mapping of keys"])
    data = {"name": default_name, **data}
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, describe_validation_error(error, Scenario)) from None
    problems = cross_field_problems(scenario, refuse_unpriced)
    if problems:
        raise ConfigError(source, problems)
    return scenario


def load_scenario(path: str | Path, refuse_unpriced: bool = True) -> Scenario:
    path = Path(path)
    return parse_scenario(read_yaml(path), path, default_name=path.stem, refuse_unpriced=refuse_unpriced)


def profiles_with(can_price: Callable[[HardwareProfile], bool]) -> list[str]:
    """The profiles on the search path (sorted) that `can_price` accepts; unreadable ones are skipped."""
    names = []
    for name in known_profiles():
        try:
            profile = load_hardware(name)
        except ConfigError:
            continue
        if can_price(profile):
            names.append(name)
    return sorted(names)


def fp8_profiles() -> list[str]:
    """The profiles on the search path that can price FP8 GEMMs (an FP8 tensor-core peak and
    an FP8 GEMM ceiling)."""
    return profiles_with(
        lambda profile: (
            profile.peak_fp8_flop_per_s is not None and profile.compute.fp8_gemm_max_efficiency is not None
        )
    )


def hardware_problems(scenario: Scenario, hw: HardwareProfile) -> list[str]:
    """What the scenario asks of its hardware profile that the profile cannot price."""
    problems = []
    if scenario.training.attention_backend is AttentionBackend.FLASH and not hw.compute.has_flash_attention:
        problems.append(
            f"training.attention_backend: value flash: hardware profile {hw.name!r} has no "
            "compute.flash_attention_* rates (achieved TFLOP/s with sources), so flash attention "
            "cannot be priced on it; use attention_backend: unfused or a profile with the rates"
        )
    if scenario.training.attention_kernel is AttentionKernel.FLASH_ATTN_2 and hw.compute.flash_attn_2 is None:
        with_rates = profiles_with(lambda profile: profile.compute.flash_attn_2 is not None)
        problems.append(
            f"training.attention_kernel: value flash_attn_2: hardware profile {hw.name!r} has no "
            "compute.flash_attn_2 rates (FlashAttention-2's achieved TFLOP/s with sources); "
            f"profiles with them: {', '.join(with_rates) or 'none found'}; or use attention_kernel: auto"
        )
    fp8_ready = hw.peak_fp8_flop_per_s is not None and hw.compute.fp8_gemm_max_efficiency is not None
    problems += quantized_recipe_problems(scenario, hw)
    if scenario.training.dtype is Dtype.FP8 and not fp8_ready:
        problems.append(
            f"training.dtype: value fp8: hardware profile {hw.name!r} has no FP8 tensor cores "
            "(it needs gpu.peak_fp8_tflop_per_s and compute.fp8_gemm_max_efficiency); "
            f"profiles with FP8: {', '.join(fp8_profiles()) or 'none found'}"
        )
    tr = scenario.training
    problems += flex_hardware_problems(scenario, hw)
    if tr.dtype is Dtype.FP8 and tr.fp8_recipe is Fp8Recipe.MXFP8 and not hw.compute.mxfp8_block_scaling:
        # transformer_engine/pytorch/fp8.py::check_mxfp8_support: "Device compute capability
        # 10.0 or higher required for MXFP8 execution."
        problems.append(
            f"training.fp8_recipe: value mxfp8: hardware profile {hw.name!r} has no MXFP8 "
            "block-scaled tensor cores (compute.mxfp8_block_scaling; Transformer Engine needs "
            "compute capability 10.0, Blackwell); allowed here: delayed, tensorwise"
            + (", blockwise" if hw.compute.fp8_block_scaling else "")
        )
    return problems


def flex_hardware_problems(scenario: Scenario, hw: HardwareProfile) -> list[str]:
    """Which flex backend a GPU and an NVLink domain allow (docs/hybridep.md, "Rules").

    * deepep across compute trays of a multi-node NVLink domain (GB200 / GB300 NVL72: four
      GPUs a tray, 72 a domain): Megatron-core's `moe_flex_dispatcher_backend` docstring
      (transformer_config.py, Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553):
      "Currently only hybridep backend supports the MNNVL case". DeepEP would reach the
      other trays over RDMA, which simcluster does not price for it: refused.
    * hybridep on a GPU older than Hopper: its kernels move tokens with the Tensor Memory
      Accelerator (DeepEP hybrid-ep branch @94a9f8f6b146c07d97ec58f67cd6d303296d6098,
      DeepEP/docs/README_Hybrid-EP.md: TMA instructions; built for `TORCH_CUDA_ARCH_LIST="9.0 10.0"`),
      compute capability 9.0 or later, and its published figures are Hopper's and Blackwell's
      (Megatron-Bridge's `validate_flex_dispatcher_backend` also lists Ampere): not priced
      there, refused. A profile without FP8 tensor cores (`gpu.peak_fp8_tflop_per_s`) is taken
      as pre-Hopper (the A100 profiles)."""
    tr, par = scenario.training, scenario.parallel
    if scenario.model.moe is None or tr.moe_token_dispatcher is not TokenDispatcher.FLEX:
        return []
    tray, domain = hw.network.gpus_per_node, hw.nvlink_domain_size
    group = par.ep * (par.etp or par.tp)
    if tr.moe_flex_dispatcher_backend is FlexBackend.DEEPEP:
        if domain > tray and group > tray:
            return [
                f"training.moe_flex_dispatcher_backend: value deepep: the EP group ({group} ranks) spans "
                f"compute trays ({tray} GPUs each) of {hw.name!r}'s multi-node NVLink domain "
                f"({domain} GPUs); Megatron-core supports that (MNNVL) with hybridep only "
                f"(DeepEP would go over RDMA, not priced); allowed: hybridep, or ep·etp <= {tray}"
            ]
        return []
    if hw.peak_fp8_flop_per_s is None:
        return [
            "training.moe_flex_dispatcher_backend: value hybridep: Hybrid-EP's TMA kernels are built and "
            "measured for compute capability 9.0 (Hopper) or later, not priced before; hardware profile "
            f"{hw.name!r} has no FP8 tensor cores (pre-Hopper); allowed here: deepep, or "
            "training.moe_token_dispatcher alltoall"
        ]
    return []


def fp4_profiles() -> list[str]:
    """The profiles on the search path that can price NVFP4 GEMMs (an FP4 tensor-core peak)."""
    return profiles_with(lambda profile: profile.peak_fp4_flop_per_s is not None)


def quantized_recipe_problems(scenario: Scenario, hw: HardwareProfile) -> list[str]:
    """dtype fp4 and fp8_recipe blockwise on a profile that cannot run them. Transformer Engine
    `quantization.py`: `_compute_nvfp4_support` ("Device compute capability 10.0 or higher
    required for NVFP4 execution") and `_compute_fp8_block_scaling_support` ("FP8 block scaled
    GEMM requires compute capability 9.0 or higher and CUDA >= 12.9"); the profiles' capability
    fields say which GPUs pass."""
    tr, problems = scenario.training, []
    if tr.dtype is Dtype.FP4 and hw.peak_fp4_flop_per_s is None:
        problems.append(
            f"training.dtype: value fp4: hardware profile {hw.name!r} has no FP4 tensor cores "
            "(gpu.peak_fp4_tflop_per_s; Transformer Engine's NVFP4 needs compute capability 10.0, "
            f"Blackwell); profiles with FP4: {', '.join(fp4_profiles()) or 'none found'}"
        )
    if tr.dtype is Dtype.FP8 and tr.fp8_recipe is Fp8Recipe.BLOCKWISE and not hw.compute.fp8_block_scaling:
        with_blocks = profiles_with(lambda profile: profile.compute.fp8_block_scaling)
        problems.append(
            f"training.fp8_recipe: value blockwise: hardware profile {hw.name!r} has no FP8 "
            "block-scaled GEMM kernels (compute.fp8_block_scaling; Transformer Engine needs compute "
            f"capability 9.0 and CUDA 12.9); profiles with them: {', '.join(with_blocks) or 'none found'}"
        )
    return problems


def require_hardware_fits(scenario: Scenario, hw: HardwareProfile, source: str | Path = "") -> None:
    """Raise ConfigError naming every `hardware_problems` of the pair: where the scenario
    meets its hardware (loading both, and `simulation.build_plan` for scenarios built in code)."""
    problems = hardware_problems(scenario, hw)
    if problems:
        raise ConfigError(source or scenario.name, problems)


def load_scenario_and_hardware(path: str | Path) -> tuple[Scenario, HardwareProfile]:
    path = Path(path)
    scenario = load_scenario(path)
    hw = load_hardware(scenario.hardware, relative_to=path)
    require_hardware_fits(scenario, hw, path)
    return scenario, hw
