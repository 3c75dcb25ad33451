"""Multi-token prediction (DeepSeek-V3 §2.2, Megatron `--mtp-num-layers`): the ops an MTP
layer adds beyond its transformer layer, on the last pipeline stage or on the virtual stage a
`parallel.pipeline_layout` names.

Megatron-core builds the MTP block after the decoder on the last pipeline stage
(megatron/core/models/gpt/gpt_model.py: `mtp_process` on the last stage;
megatron/core/transformer/multi_token_prediction.py `MultiTokenPredictionLayer.forward`,
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553). Per MTP layer and microbatch:

    embedding of the input shifted by one (the shared word embedding: the last stage
        holds a copy, its gradient all-reduced with the first stage's like a tied one)
    enorm (on the embedding), hnorm (on the previous hidden states)
    eh_proj   [T, 2h] x [2h, h/tp]     column-parallel (SP: all-gather of the 2h input),
              then all-gathered on the last dim and scattered back to the sequence shard
    one transformer layer (the model's layer: MoE with MLA for DeepSeek-V3; priced as a
        layer segment of the last chunk, `workload.model`)
    final norm, the shared output layer's logits and its cross-entropy loss

This module gives the ops around the layer (`mtp_extra_ops`); the output layer and loss are
`embedding.output_ops` again (the same GEMM against the same weight). A pipeline layout may
put the MTP layers on a virtual stage of their own before the loss stage ("standalone MTP",
`PipelineParallelLayerLayout.validate_layer_layout`): that stage runs the embedding, norms,
eh_proj and transformer layer (`mtp_stage_ops`), and the loss stage computes every MTP depth's
logits and loss (`mtp_head_ops`; gpt_model.py `_postprocess` runs `process_mtp_loss` only
where `post_process`, language_module.py: "MTP loss is computed at post_process stage"). Saved bytes follow
the dense layer's conventions: each norm keeps its input, eh_proj its (local) 2h input.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from simcluster.workload.embedding import embedding_ops, output_ops
from simcluster.workload.layer import LayerOps, norm_kernel
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, GemmShape, Module, Op, Pass, collective, elementwise, gemm

F, B, W = Pass.FORWARD, Pass.INPUT_GRAD, Pass.WEIGHT_GRAD


def _prefixed(ops: tuple[Op, ...], prefix: str) -> tuple[Op, ...]:
    return tuple(replace(op, name=f"{prefix}.{op.name}") for op in ops)


def _eh_proj(cfg: LayerConfig) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """enorm, hnorm, eh_proj and its gathers (forward, backward). enorm and hnorm are built
    with the model's `--normalization` (`MultiTokenPredictionLayer.__init__`: TENorm), so they
    run the model's norm kernel (`layer.norm_kernel`)."""
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    region = cfg.region_tokens * h
    norm, proj, kernel = Module.LAYERNORM, Module.MTP_EH_PROJ, norm_kernel(cfg)
    forward: list[Op] = [
        elementwise("mtp.enorm.ln", 2 * e * region, e * region, module=norm, pass_=F, kernel=kernel),
        elementwise("mtp.hnorm.ln", 2 * e * region, e * region, module=norm, pass_=F, kernel=kernel),
    ]
    if cfg.sequence_parallel:
        forward.append(
            collective(
                "mtp.eh_proj.allgather", CollectiveKind.ALL_GATHER, 2 * e * tokens * h, module=proj, pass_=F
            )
        )
    # eh_proj keeps its 2h input (the local shard with SP, as every TE linear)
    forward.append(
        gemm("mtp.eh_proj", GemmShape(m=tokens, n=h // t, k=2 * h), 2 * e * region, module=proj, pass_=F)
    )
    if t > 1:
        forward.append(
            collective(
                "mtp.eh_proj.gather_last_dim", CollectiveKind.ALL_GATHER, e * tokens * h, module=proj, pass_=F
            )
        )
    backward: list[Op] = []
    # (the last-dim gather's backward keeps the rank's h/t slice: a split, no message)
    if cfg.sequence_parallel:
        backward.append(
            collective(
                "mtp.eh_proj.input_allgather.bwd",
                CollectiveKind.ALL_GATHER,
                2 * e * tokens * h,
                True,
                module=proj,
                pass_=W,
            )
        )
    backward.append(gemm("mtp.eh_proj.dgrad", GemmShape(m=tokens, n=2 * h, k=h // t), module=proj, pass_=B))
    if t > 1:
        kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
        backward.append(
            collective(
                f"mtp.eh_proj.{kind.value.replace('_', '')}.bwd",
                kind,
                2 * e * tokens * h,
                True,
                module=proj,
                pass_=B,
            )
        )
    backward += [
        gemm(
            "mtp.eh_proj.wgrad",
            GemmShape(m=2 * h, n=h // t, k=tokens, accumulate_fp32=True),
            module=proj,
            pass_=W,
        ),
        elementwise("mtp.enorm.ln.bwd", 3 * e * region, module=norm, pass_=B, kernel=kernel),
        elementwise("mtp.hnorm.ln.bwd", 3 * e * region, module=norm, pass_=B, kernel=kernel),
    ]
    return tuple(forward), tuple(backward)


@functools.lru_cache(maxsize=256)
def mtp_extra_ops(cfg: LayerConfig, vocab_size: int, num_layers: int) -> LayerOps:
    """What `num_layers` MTP layers add on the last stage beyond their transformer layers:
    per layer the shifted embedding, enorm, hnorm, eh_proj, then its final norm, logits and
    loss (`embedding.output_ops`, the shared output weight)."""
    embed = embedding_ops(cfg, vocab_size)
    head = output_ops(cfg, vocab_size)
    eh_forward, eh_backward = _eh_proj(cfg)
    forward: tuple[Op, ...] = ()
    backward: tuple[Op, ...] = ()
    for i in range(num_layers):
        prefix = f"mtp{i}"
        forward += _prefixed(embed.forward + eh_forward + head.forward, prefix)
        backward += _prefixed(head.backward + eh_backward + embed.backward, prefix)
    return LayerOps(forward, backward, recompute=())


@functools.lru_cache(maxsize=256)
def mtp_stage_ops(cfg: LayerConfig, vocab_size: int, num_layers: int) -> LayerOps:
    """A standalone MTP stage's ops beyond its transformer layers: per layer the shifted
    embedding, enorm, hnorm and eh_proj (`mtp_extra_ops` without the logits and loss)."""
    embed = embedding_ops(cfg, vocab_size)
    eh_forward, eh_backward = _eh_proj(cfg)
    forward: tuple[Op, ...] = ()
    backward: tuple[Op, ...] = ()
    for i in range(num_layers):
        forward += _prefixed(embed.forward + eh_forward, f"mtp{i}")
        backward += _prefixed(eh_backward + embed.backward, f"mtp{i}")
    return LayerOps(forward, backward, recompute=())


@functools.lru_cache(maxsize=256)
def mtp_head_ops(cfg: LayerConfig, vocab_size: int, num_layers: int) -> LayerOps:
    """The loss stage's share of standalone MTP layers: each depth's final norm, logits and
    loss (`embedding.output_ops`)."""
    head = output_ops(cfg, vocab_size)
    forward: tuple[Op, ...] = ()
    backward: tuple[Op, ...] = ()
    for i in range(num_layers):
        forward += _prefixed(head.forward, f"mtp{i}")
        backward += _prefixed(head.backward, f"mtp{i}")
    return LayerOps(forward, backward, recompute=())


def with_mtp(output: LayerOps, mtp: LayerOps) -> LayerOps:
    """The last chunk's output ops followed by the MTP layers' extra ops."""
    return LayerOps(
        output.forward + mtp.forward,
        mtp.backward + output.backward,
        output.recompute + mtp.recompute,
        output.fp8_recipe,
    )
