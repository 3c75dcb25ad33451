"""A scenario's whole workload, hardware-free: the ops of every pipeline chunk, the bytes
each chunk keeps per microbatch, parameters and static memory per stage, and the message
sizes of pipeline p2p, data-parallel gradient reduction and the optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from simcluster.config.choices import Normalization, PositionEmbedding, Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.config.pipeline_split import PipelineSplit
from simcluster.config.scenario import Scenario
from simcluster.workload import memory
from simcluster.workload.context_parallel import context_parallel_layer_ops
from simcluster.workload.embedding import embedding_ops, output_ops, padded_vocab_size
from simcluster.workload.fp8 import (
    EXPERT_LINEARS,
    fp8_copies,
    quantized_weight_bytes_per_element,
    te_linear_weight_params,
)
from simcluster.workload.layer import LayerOps, layer_ops, layer_ops_16bit, quantized_layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.mla import is_window_layer
from simcluster.workload.mla_layer import MLALayerSpec, mla_layer_ops, without_recompute
from simcluster.workload.mla_params import mla_param_delta_per_rank, mtp_params_per_rank
from simcluster.workload.moe_config import ExpertLayout, MLAConfig, MoEConfig
from simcluster.workload.moe_layer import MoELayerSpec, moe_layer_config, moe_layer_ops
from simcluster.workload.moe_memory import expert_static_memory
from simcluster.workload.mtp import mtp_extra_ops, mtp_head_ops, mtp_stage_ops, with_mtp

FP32_BYTES = 4
BF16_BYTES = 2
# FP8: Transformer Engine casts each TE linear's bf16 weight to FP8 once per step, on the
# first microbatch (`is_first_microbatch`; later microbatches reuse the cached copies):
# reads 2 bytes and writes each cached FP8 copy (row-wise, and on Hopper the column-wise
# transposed one), 1 byte each.
BF16_WEIGHT_READ_BYTES_PER_PARAM = 2


def optimizer_step_bytes(params: float, grad_bytes: int, optimizer_shards: int) -> float:
    """HBM bytes of one optimizer step on a rank (Megatron mixed precision, apex FusedAdam),
    per parameter with fp32 grads and no sharding: grad-norm read 4; Adam reads grad, master,
    m, v (16) and writes master, m, v (12); master→bf16 copy reads 4, writes 2; zeroing the
    main grads writes 4: 42 bytes. With the distributed optimizer (`optimizer_shards` = d·c) grad norm, Adam
    and the master→bf16 copy run on the rank's 1/(d·c) shard (Megatron-core
    `DistributedOptimizer.step` over its shard of the main params), while zeroing the grad
    buffer (`zero_grad_buffer`) still writes every parameter's main grad; grad reads and the
    zeroing move `grad_bytes` (2 with --grad-reduce-in-bf16)."""
    per_shard = grad_bytes + (grad_bytes + 12) + 12 + (FP32_BYTES + BF16_BYTES)
    return params * (grad_bytes + per_shard / optimizer_shards)


@dataclass(frozen=True, slots=True)
class LayerKind:
    """What a transformer layer is, as a small value: the layer one rank runs and the
    context-parallel size that turns its attention into a ring. `build_workload` builds a
    layer's ops from its kind alone, so equal kinds have equal ops and stage pricing
    (`costs.stage_pricing`) caches a layer's price by its kind. A MoE layer carries its
    experts (`moe`, `workload.moe_layer.MoELayerSpec`); a dense layer None. An MLA layer
    carries its latent attention (`mla`, `workload.mla_layer.MLALayerSpec`)."""

    config: LayerConfig
    cp: int
    moe: MoELayerSpec | None = None
    mla: MLALayerSpec | None = None


def kind_ops(kind: LayerKind) -> LayerOps:
    """The ops of one layer of `kind`: the dense layer (context-parallel ring applied), with
    the MoE MLP in place of its MLP when the kind has experts (`workload.moe_layer`), MLA
    in place of its attention when the kind has it (`workload.mla_layer`)."""
    cfg = kind.config if kind.moe is None else moe_layer_config(kind.config)
    if kind.mla is None:
        dense = context_parallel_layer_ops(layer_ops(cfg), cfg, kind.cp)
    else:
        # MLA replaces the 16-bit attention block; FP8 / FP4 then quantize the whole layer's
        # TE linears, MLA's among them, by one set of rules
        dense = context_parallel_layer_ops(layer_ops_16bit(cfg), cfg, kind.cp)
        dense = quantized_layer_ops(mla_layer_ops(dense, cfg, kind.mla), cfg)
    return dense if kind.moe is None else moe_layer_ops(dense, cfg, kind.moe)


@dataclass(frozen=True, slots=True)
class LayerSegment:
    """`num_layers` consecutive transformer layers of one `kind`, each running `layer`'s ops
    (the ops `kind` gives). A chunk's layers are a tuple of segments in execution order, so
    one stage can hold layers of different kinds (a MoE model's dense first layers, MoE
    layers and MTP layers; Megatron-core builds each layer from its own spec,
    `transformer_block.py::TransformerBlockSubmodules.layer_specs`). Dense models have one."""

    kind: LayerKind
    layer: LayerOps
    num_layers: int


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """What one microbatch costs on one (stage, chunk): its layer segments in order, plus
    the embedding on the first virtual stage and the output layer on the last. `output` holds
    the ops after the chunk's layers: the output layer (with MTP's when they share the last
    virtual stage), or, on a standalone MTP stage a pipeline layout names, the MTP layers'
    embedding, norms and eh_proj (`workload.mtp.mtp_stage_ops`)."""

    stage: int
    chunk: int
    segments: tuple[LayerSegment, ...]
    embedding: LayerOps | None
    output: LayerOps | None

    @property
    def num_layers(self) -> int:
        return sum(segment.num_layers for segment in self.segments)

    @property
    def saved_bytes(self) -> float:
        extras = sum(part.saved_bytes for part in (self.embedding, self.output) if part)
        return self.layer_saved_bytes + extras

    @property
    def layer_saved_bytes(self) -> float:
        return sum(segment.num_layers * segment.layer.saved_bytes for segment in self.segments)


@dataclass(frozen=True, slots=True)
class StageWork:
    stage: int
    num_params: float
    static: memory.StaticMemory
    chunks: tuple[ChunkWork, ...]
    dp_gradient_bytes: float
    optimizer_step_bytes: float
    embedding_grad_bytes: float  # tied word-embedding grads all-reduced, first and last stage (0 if untied)
    param_gather_bytes: float  # distributed optimizer: the updated bf16 parameters all-gathered
    # MoE: the routed experts' gradients reduced over the expert-data-parallel group, and
    # (distributed optimizer) their updated bf16 parameters all-gathered over it; the dense
    # fields above then hold the dense parameters only (over dp·cp)
    expert_gradient_bytes: float = 0.0
    expert_param_gather_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    scenario: Scenario
    layer_config: LayerConfig
    layer: LayerOps  # the representative layer: a MoE layer where the model has experts
    stages: tuple[StageWork, ...]
    p2p_bytes: float
    layer_kind: LayerKind | None = None  # the representative layer's kind

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def message_bytes(self, earlier: int) -> float:
        """Per rank, the pipeline message between virtual stage `earlier` and the next one:
        the activation it sends forward and that activation's gradient coming back.
        `p2p_bytes` on every hop but those after a standalone MTP stage (a layout's `m` not
        on the loss stage): `MultiTokenPredictionBlock.forward` returns
        `torch.cat(hidden_states_list, dim=0)`, the decoder's hidden states and each MTP
        depth's, so each hop from the MTP stage to the loss stage carries
        (1 + mtp_num_layers) · p2p_bytes (Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553,
        megatron/core/transformer/multi_token_prediction.py; the loss stage splits it again,
        `process_mtp_loss`: `torch.chunk(hidden_states, 1 + mtp_num_layers)`)."""
        scenario = self.scenario
        last = scenario.parallel.pp * scenario.parallel.vpp - 1
        if self.mtp_standalone and scenario.mtp_virtual_stage <= earlier < last:
            return (1 + scenario.model.mtp_num_layers) * self.p2p_bytes
        return self.p2p_bytes

    @property
    def mtp_standalone(self) -> bool:
        """MTP layers on a virtual stage before the loss stage (Megatron-core's
        `mtp_standalone`, `PipelineParallelLayerLayout.validate_layer_layout`)."""
        scenario = self.scenario
        last = scenario.parallel.pp * scenario.parallel.vpp - 1
        return bool(scenario.model.mtp_num_layers) and scenario.mtp_virtual_stage != last


def layer_config(scenario: Scenario) -> LayerConfig:
    """The layer one rank runs. With context parallelism every rank holds s/c tokens of the
    sequence and "all non-attention modules run unchanged on s/c tokens" (Megatron-core
    `docs/user-guide/features/context_parallel.md`; the batch is cut by
    `utils.py::get_batch_on_this_cp_rank`), so the layer is described on s/c: its GEMMs,
    element-wise kernels, SP collectives, saved activations, pipeline messages and the
    embedding / loss all scale by 1/c. Only the attention core sees the whole sequence,
    through the KV ring (`workload.context_parallel`)."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    return LayerConfig(
        micro_batch_size=tr.micro_batch_size,
        seq_length=m.seq_length // par.cp,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        ffn_hidden_size=m.ffn_size,
        tp=par.tp,
        sequence_parallel=par.sequence_parallel,
        recompute=tr.recompute,
        dtype=tr.dtype,
        num_query_groups=m.query_groups,
        activation=m.activation,
        normalization=m.normalization,
        position_embedding=m.position_embedding,
        attention_backend=tr.attention_backend,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        fp8_recipe=tr.fp8_recipe,
        attention_kernel=tr.attention_kernel,
        recompute_modules=None if tr.recompute_modules is None else frozenset(tr.recompute_modules),
        kv_channels=m.kv_channels,
        softmax_type=m.softmax_type,
        # MLA replaces the attention block; its latent norms are its own (`workload.mla_layer`)
        qk_layernorm=m.qk_layernorm and m.mla is None,
        add_bias_linear=m.add_bias_linear,
    )


def norm_params(h: int, normalization: Normalization) -> int:
    """One norm's parameters: LayerNorm's weight and bias (2h), RMSNorm's weight (h)."""
    return 2 * h if normalization is Normalization.LAYERNORM else h


def layer_params_per_rank(
    h: int,
    ffn: int,
    tp: int,
    *,
    query_width: int = 0,
    kv_width: int = 0,
    gated: bool = False,
    normalization: Normalization = Normalization.LAYERNORM,
    bias: bool = True,
) -> float:
    """QKV, projection, fc1, fc2 weights and column biases split by t; row-parallel biases
    and both norms replicated (12h² + 13h per layer when ffn = 4h, t = 1). Megatron-core
    widths (`transformer/attention.py`, `transformer/mlp.py`): linear_qkv h × (q + 2k)
    with q = a·d_h and k = g·d_h (0 = h),
    linear_proj q × h, linear_fc1 h × 2f when gated (SwiGLU) else h × f, linear_fc2 f × h.
    `bias` is Megatron's `add_bias_linear` (`bias=self.config.add_bias_linear` on all four
    linears): False (`--disable-bias-linear`, Llama's recipes) drops (q + 2k + fc1)/t + 2h
    per layer."""
    q, k = query_width or h, kv_width or h
    qkv, fc1 = q + 2 * k, (2 * ffn if gated else ffn)
    sharded = h * qkv + q * h + h * fc1 + ffn * h
    replicated = 2 * norm_params(h, normalization)
    if bias:
        sharded += qkv + fc1
        replicated += h + h
    return sharded / tp + replicated


def stage_params_per_rank(
    scenario: Scenario, stage: int, cfg: LayerConfig | None = None, split: PipelineSplit | None = None
) -> float:
    """Layers (this stage's own count under `Scenario.pipeline_split`), plus the word (and
    learned position) embedding on the first stage, the final norm and the output weight on
    the last: Megatron keeps a copy of the tied embedding there when p > 1, and its own
    output weight with `untie_embeddings_and_output_weights`. `cfg` and `split` are the
    scenario's `layer_config` and `pipeline_split` where the caller has them."""
    m, par = scenario.model, scenario.parallel
    cfg = cfg or layer_config(scenario)
    layers = (split or scenario.pipeline_split).stage_layers[stage]
    params = layers * layer_params_per_rank(
        m.hidden_size,
        m.ffn_size,
        par.tp,
        query_width=cfg.query_width,
        kv_width=cfg.kv_width,
        gated=cfg.activation.gated,
        normalization=cfg.normalization,
        bias=cfg.add_bias_linear,
    )
    if cfg.qk_layernorm:  # the query and key norms' weights (h/a each; replicated over tp)
        params += layers * 2 * norm_params(cfg.head_dim, cfg.normalization)
    word_embedding = padded_vocab_size(m.vocab_size, par.tp) * m.hidden_size / par.tp
    if stage == 0:
        params += word_embedding
        if m.position_embedding is PositionEmbedding.LEARNED:
            params += m.seq_length * m.hidden_size
    if stage == par.pp - 1:
        output_weight = par.pp > 1 or m.untie_embeddings_and_output_weights
        params += norm_params(m.hidden_size, m.normalization) + (word_embedding if output_weight else 0.0)
    return params


def moe_spec(scenario: Scenario) -> MoELayerSpec | None:
    """The scenario's experts and their layout (None for a dense model)."""
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    if m.moe is None:
        return None
    layout = ExpertLayout(tp=par.tp, cp=par.cp, dp=par.dp, ep=par.ep, etp=par.etp)
    return MoELayerSpec(
        MoEConfig(**m.moe.model_dump()),
        layout,
        tr.moe_token_dispatcher,
        tr.moe_grouped_gemm,
        tr.moe_flex_dispatcher_backend,
        router_fusion=tr.moe_router_fusion,
        permute_fusion=tr.moe_permute_fusion,
    )


def mla_spec(scenario: Scenario, cfg: LayerConfig | None = None) -> MLALayerSpec | None:
    """The scenario's multi-latent attention and the recompute modules acting on it (None
    without MLA): `core_attn` and `mla_up_proj` as the layer config checkpoints them
    (`LayerConfig.recomputes`: Megatron's default [core_attn] under selective recompute).
    `cfg` is `layer_config(scenario)` where the caller has it already."""
    if scenario.model.mla is None:
        return None
    cfg = cfg or layer_config(scenario)
    return MLALayerSpec(
        MLAConfig(**scenario.model.mla.model_dump()),
        recompute_core_attn=cfg.recomputes(RecomputeModule.CORE_ATTN),
        recompute_up_proj=cfg.recomputes(RecomputeModule.MLA_UP_PROJ),
    )


def _attention_variant_params(
    scenario: Scenario, stage: int, cfg: LayerConfig, split: PipelineSplit
) -> float:
    """Per-rank parameters a stage holds beyond `stage_params_per_rank`'s standard layers:
    each layer's MLA attention in place of the standard one (`mla_params`), and on the MTP
    layers' stage (the last, or the one `parallel.pipeline_layout` names) the MTP layers (norms,
    eh_proj, a standard layer whose MLP the MoE count swaps like the others') and the
    word-embedding copy the MTP embedding reads where the stage holds none (Megatron builds
    the embedding where `mtp_process`, gpt_model.py): with pp > 1, on the last stage when its
    output layer is untied, on any middle stage always."""
    m, par = scenario.model, scenario.parallel
    mtp = m.mtp_num_layers if stage == scenario.mtp_virtual_stage % par.pp else 0
    layers = split.stage_layers[stage] + mtp
    extra = 0.0
    if m.mla is not None:
        mla = MLAConfig(**m.mla.model_dump())
        extra += layers * mla_param_delta_per_rank(
            m.hidden_size, m.num_attention_heads, mla, par.tp, cfg.query_width, cfg.kv_width,
            cfg.add_bias_linear,
        )  # fmt: skip
    if mtp:
        layer = layer_params_per_rank(
            m.hidden_size, m.ffn_size, par.tp, query_width=cfg.query_width, kv_width=cfg.kv_width,
            gated=cfg.activation.gated, normalization=cfg.normalization, bias=cfg.add_bias_linear,
        )  # fmt: skip
        extra += mtp * mtp_params_per_rank(
            m.hidden_size, par.tp, norm_params(m.hidden_size, m.normalization), layer
        )
        untied = m.untie_embeddings_and_output_weights
        holds_word_embedding = stage == 0 or (stage == par.pp - 1 and not untied)
        if par.pp > 1 and not holds_word_embedding:
            extra += padded_vocab_size(m.vocab_size, par.tp) * m.hidden_size / par.tp
    return extra


def _segments(
    layer_segment: Callable[[int], LayerSegment], first_layer: int, num_layers: int, empty: LayerSegment
) -> tuple[LayerSegment, ...]:
    """A chunk's layers `first_layer` .. + `num_layers` (0-based model layers), each the
    segment `layer_segment` gives it, consecutive layers of one kind merged: the dense first
    layers (`--moe-layer-freq`), then MoE layers, each run split where sliding-window and
    full-attention layers alternate (gpt-oss: window, full, window, ...). One dense segment
    for a dense model without windows; an empty chunk holds `empty` zero times."""
    runs: list[LayerSegment] = []
    for index in range(first_layer, first_layer + num_layers):
        segment = layer_segment(index)
        if runs and runs[-1].kind is segment.kind:
            runs[-1] = replace(runs[-1], num_layers=runs[-1].num_layers + 1)
        else:
            runs.append(replace(segment, num_layers=1))
    return tuple(runs) or (replace(empty, num_layers=0),)


def _layer_segments(
    scenario: Scenario, cfg: LayerConfig, spec: MoELayerSpec | None, mla: MLALayerSpec | None
) -> Callable[[int], LayerSegment]:
    """The segment (with zero layers) of each 0-based model layer: dense or MoE
    (`first_k_dense_layers`), full or sliding-window attention (Megatron-core
    `is_layer_window_attention` on the 1-based layer number, `workload.mla.is_window_layer`).
    One segment per kind, built once, so equal kinds share their ops and their price."""
    m, cp = scenario.model, scenario.parallel.cp
    first_k = spec.moe.first_k_dense_layers if spec is not None else 0
    built: dict[tuple[bool, bool], LayerSegment] = {}

    def layer_segment(index: int) -> LayerSegment:
        moe = spec is not None and index >= first_k
        window = is_window_layer(index + 1, m.window_size, m.window_attn_skip_freq)
        if (moe, window) not in built:
            config = replace(cfg, window_size=m.window_size) if window else cfg
            kind = LayerKind(config, cp, spec if moe else None, mla)
            built[moe, window] = LayerSegment(kind, kind_ops(kind), 0)
        return built[moe, window]

    return layer_segment


@dataclass(frozen=True, slots=True)
class _StageParams:
    """Per-rank parameters of a stage: the dense ones (optimizer over dp·cp) and the routed
    experts' (sharded over ep·etp, optimizer over the expert-data-parallel group)."""

    dense: float
    experts: float
    static: memory.StaticMemory


def _stage_params(
    scenario: Scenario, stage: int, cfg: LayerConfig, split: PipelineSplit, spec: MoELayerSpec | None,
    moe_layers: int, grad_bytes: int,
) -> _StageParams:  # fmt: skip
    """`stage_params_per_rank`, and for each MoE layer its dense MLP swapped for the router
    and shared experts (dense) and its routed experts (`moe_memory.expert_static_memory`)."""
    par, m = scenario.parallel, scenario.model
    distributed = scenario.training.use_distributed_optimizer
    params = stage_params_per_rank(scenario, stage, cfg, split)
    if m.mla is not None or m.mtp_num_layers:
        params += _attention_variant_params(scenario, stage, cfg, split)
    if spec is None or moe_layers == 0:
        return _StageParams(
            params, 0.0, memory.static_memory(params, par.dp * par.cp, distributed, grad_bytes)
        )
    h, q, kv, norm = m.hidden_size, cfg.query_width, cfg.kv_width, cfg.normalization
    gated, bias = cfg.activation.gated, cfg.add_bias_linear
    full = layer_params_per_rank(
        h, m.ffn_size, par.tp, query_width=q, kv_width=kv, gated=gated, normalization=norm, bias=bias
    )
    # without an MLP: fc1 and its bias vanish, fc2's replicated bias (h) too
    attention_only = layer_params_per_rank(
        h, 0, par.tp, query_width=q, kv_width=kv, normalization=norm, bias=bias
    ) - (h if bias else 0)
    experts = expert_static_memory(
        m.hidden_size, spec.moe, spec.layout, True, distributed, spec.moe.expert_bias, grad_bytes
    )
    dense = params - moe_layers * (full - attention_only - experts.dense_params_per_rank)
    routed = moe_layers * experts.expert_params_per_rank
    a = memory.static_memory(dense, par.dp * par.cp, distributed, grad_bytes)
    b = memory.static_memory(routed, spec.layout.expert_dp, distributed, grad_bytes)
    static = memory.StaticMemory(
        a.weight_bytes + b.weight_bytes,
        a.gradient_bytes + b.gradient_bytes,
        a.optimizer_bytes + b.optimizer_bytes,
    )
    return _StageParams(dense, routed, static)


def _expert_te_params(chunks: tuple[ChunkWork, ...]) -> float:
    """The routed experts' TE linear weights of a stage's chunks (FP8 / NVFP4 copies of them
    are gathered over the expert-data-parallel group, not dp·cp)."""
    return sum(
        seg.num_layers * te_linear_weight_params(seg.layer.forward, EXPERT_LINEARS)
        for chunk in chunks
        for seg in chunk.segments
    )


def build_workload(scenario: Scenario, fp8_weight_copies: int = 1) -> Workload:
    """The scenario's work per stage. `fp8_weight_copies` (the profile's
    `HardwareProfile.fp8_weight_copies`: 2 on Hopper, 1 on Blackwell) counts the FP8 weight
    copies TE caches under `dtype: fp8`; the one hardware fact the workload needs. A chunk's
    segments follow its layers in order (`_segments`): a MoE model's dense first layers,
    then MoE layers; sliding-window and full-attention layers where the model has windows."""
    cfg = layer_config(scenario)
    spec = moe_spec(scenario)
    mla = mla_spec(scenario, cfg)
    layer_segment = _layer_segments(scenario, cfg, spec, mla)
    # the last layer's kind: a MoE layer where the model has experts; with windows, full or
    # windowed as that layer is (gpt-oss's layer 36, a multiple of its skip frequency: full)
    representative = layer_segment(scenario.model.num_layers - 1)
    layer = representative.layer
    embedding = embedding_ops(cfg, scenario.model.vocab_size)
    output = output_ops(cfg, scenario.model.vocab_size)
    mtp = scenario.model.mtp_num_layers
    par = scenario.parallel
    last_virtual = par.pp * par.vpp - 1
    # the MTP layers run after the decoder on the last virtual stage, or on the one a pipeline
    # layout names: their transformer layers (the model's last layer's kind) as a segment, the
    # rest with the output layer; a standalone MTP stage keeps the embedding and eh_proj and
    # the loss stage computes every depth's logits (`workload.mtp`)
    mtp_virtual = scenario.mtp_virtual_stage
    mtp_extras: LayerOps | None = None
    if mtp and mtp_virtual == last_virtual:
        output = with_mtp(output, mtp_extra_ops(cfg, scenario.model.vocab_size, mtp))
    elif mtp:
        output = with_mtp(output, mtp_head_ops(cfg, scenario.model.vocab_size, mtp))
        mtp_extras = mtp_stage_ops(cfg, scenario.model.vocab_size, mtp)
    split = scenario.pipeline_split
    stages = []
    for stage in range(par.pp):
        chunks = tuple(
            ChunkWork(
                stage=stage,
                chunk=chunk,
                segments=_segments(
                    layer_segment, split.layer_offset(stage, chunk), split.chunk_layers[stage][chunk],
                    representative,
                )
                + (
                    (replace(representative, num_layers=mtp),)
                    if mtp and chunk * par.pp + stage == mtp_virtual
                    else ()
                ),  # fmt: skip
                embedding=embedding if chunk * par.pp + stage == 0 else None,
                output=(
                    output if chunk * par.pp + stage == last_virtual
                    else mtp_extras if chunk * par.pp + stage == mtp_virtual
                    else None
                ),  # fmt: skip
            )
            for chunk in range(par.vpp)
        )
        untied = scenario.model.untie_embeddings_and_output_weights
        # MTP reads the word embedding on its stage: that copy's gradient is all-reduced with
        # the first stage's as a tied embedding's is (`_allreduce_word_embedding_grads`) over
        # the embedding group: rank 0, the last rank when tied, the MTP ranks
        # (pretrain_gpt.py `get_embedding_ranks`, Megatron-LM @d98e8a64)
        holders = set() if untied else {0, par.pp - 1}
        if mtp:
            holders |= {0, mtp_virtual % par.pp}
        tied = par.pp > 1 and stage in holders and len(holders) > 1
        # the distributed optimizer shards over DP × CP (CP ranks hold identical weights)
        grad_bytes = BF16_BYTES if scenario.training.grad_reduce_in_bf16 else FP32_BYTES
        moe_layers = sum(seg.num_layers for chunk in chunks for seg in chunk.segments if seg.kind.moe)
        stage_params = _stage_params(scenario, stage, cfg, split, spec, moe_layers, grad_bytes)
        params, static = stage_params.dense, stage_params.static
        distributed = scenario.training.use_distributed_optimizer
        shards = par.dp * par.cp if distributed else 1
        step_bytes = optimizer_step_bytes(params, grad_bytes, shards)
        if stage_params.experts:
            expert_shards = spec.layout.expert_dp if spec is not None and distributed else 1
            step_bytes += optimizer_step_bytes(stage_params.experts, grad_bytes, expert_shards)
        gather_bytes = BF16_BYTES * params
        expert_gather_bytes = BF16_BYTES * stage_params.experts
        if cfg.dtype.quantized:
            # integer-valued: a sum of products of shapes, exact in any order
            te_params = sum(
                seg.num_layers * te_linear_weight_params(seg.layer.forward)
                for chunk in chunks
                for seg in chunk.segments
            )
            copies = fp8_copies(cfg.fp8_recipe, fp8_weight_copies, cfg.dtype)
            per_copy = quantized_weight_bytes_per_element(cfg.dtype, cfg.fp8_recipe)
            fp8_copy = per_copy * te_params
            if scenario.training.fp8_param_gather or scenario.training.fp4_param_gather:
                # the FP8 (NVFP4) parameter replaces the bf16 one; parameters are all-gathered in
                # FP8 (NVFP4), and the second copy (Hopper's transposed FP8 one, NVFP4's
                # column-wise one) is re-made after each gather (read one copy, write one)
                weights = static.weight_bytes - BF16_BYTES * te_params + copies * fp8_copy
                static = replace(static, weight_bytes=weights)
                expert_te = _expert_te_params(chunks)  # gathered over the expert-data-parallel group
                gather_bytes -= (BF16_BYTES - per_copy) * (te_params - expert_te)
                expert_gather_bytes -= (BF16_BYTES - per_copy) * expert_te
                step_bytes += 2 * (copies - 1) * fp8_copy
            else:
                static = replace(static, weight_bytes=static.weight_bytes + copies * fp8_copy)
                # the once-per-step weight casts, priced with the step's other HBM-bound work
                step_bytes += BF16_WEIGHT_READ_BYTES_PER_PARAM * te_params + copies * fp8_copy
        stages.append(
            StageWork(
                stage=stage,
                num_params=params + stage_params.experts,
                static=static,
                chunks=chunks,
                dp_gradient_bytes=grad_bytes * params,
                param_gather_bytes=gather_bytes,
                optimizer_step_bytes=step_bytes,
                embedding_grad_bytes=(
                    grad_bytes
                    * padded_vocab_size(scenario.model.vocab_size, par.tp)
                    * scenario.model.hidden_size
                    / par.tp
                    if tied
                    else 0.0
                ),
                expert_gradient_bytes=grad_bytes * stage_params.experts,
                expert_param_gather_bytes=expert_gather_bytes,
            )
        )
    # Per rank, each pipeline message is 1/t of [s/c, b, h]: the sequence shard with SP, or
    # Megatron's scatter/gather split without it (Megatron-core `p2p_communication.py`: the p2p
    # tensor shape is [s/cp, b, h]); cfg.tokens already holds s/c.
    p2p_bytes = cfg.element_bytes * cfg.tokens * cfg.hidden_size / par.tp
    return Workload(scenario, cfg, layer, tuple(stages), p2p_bytes, representative.kind)


def recompute_workspace_bytes(workload: Workload) -> float:
    """Recomputation re-materialises one layer at a time during a backward: the bytes that
    layer would have kept without recompute, minus what it did keep."""
    cfg = workload.layer_config
    if cfg.recompute is Recompute.NONE:
        return 0.0
    kind = workload.layer_kind
    if kind is not None and (kind.moe is not None or kind.mla is not None):
        mla = without_recompute(kind.mla) if kind.mla is not None else None
        unrecomputed = kind_ops(replace(kind, config=replace(cfg, recompute=Recompute.NONE), mla=mla))
        return unrecomputed.saved_bytes - workload.layer.saved_bytes
    return layer_ops(replace(cfg, recompute=Recompute.NONE)).saved_bytes - workload.layer.saved_bytes


def ring_buffer_bytes(workload: Workload) -> float:
    """The context-parallel ring's transient receive buffers: two K/V chunks (the one being
    used and the one arriving; TE AttnFuncWithCPAndKVP2P's `p2p_comm_buffers`; docs/memory.md
    "Context parallelism"); 0 without cp."""
    rings = [op.ring for op in workload.layer.forward if op.ring is not None]
    return 2 * rings[0].first_message_bytes if rings else 0.0


def transient_bytes(workload: Workload) -> float:
    """Bytes a backward holds beyond the stored activations: the recompute workspace of one
    layer plus, with cp, the ring's K/V buffers."""
    return recompute_workspace_bytes(workload) + ring_buffer_bytes(workload)
