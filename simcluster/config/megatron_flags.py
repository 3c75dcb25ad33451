"""Megatron-LM's launch flags as `import-megatron` sorts them (`megatron/training/arguments.py`).

Every flag ends in exactly one bucket, and none is dropped silently:
  used         read into the scenario (`--num-layers`, `--sequence-parallel`, …);
  ignored      known, with no effect on a simulated iteration (`--lr`, `--train-iters`, …);
  not modelled known, changes the workload, but the simulator has no model of it
               (`--num-experts`, …), or it sets a scenario key the simulator refuses so
               far (`NOT_MODELLED_YET`): the scenario describes the run without it;
  unknown      anything else (a typo, a newer flag): listed for the user to check.
"""

from __future__ import annotations

SOURCE = "megatron arguments"
DEFAULT_HARDWARE = "a100-sxm4-80gb"
# GPT-2 BPE (50,257 tokens) padded as in Korthikanti et al. Table 3 (v = 51,200).
DEFAULT_VOCAB_SIZE = 51200
# Megatron's --make-vocab-size-divisible-by default: the vocabulary is padded to a multiple
# of this times tp (`megatron/training/tokenizer/tokenizer.py::_vocab_size_with_padding`).
DEFAULT_VOCAB_DIVISOR = 128

MODEL_INTS = {
    "num-layers": "num_layers",
    "hidden-size": "hidden_size",
    "num-attention-heads": "num_attention_heads",
    "seq-length": "seq_length",
    "vocab-size": "vocab_size",
    "ffn-hidden-size": "ffn_hidden_size",
}
MODEL_FLOATS = {"hidden-dropout": "hidden_dropout", "attention-dropout": "attention_dropout"}
REQUIRED = ("num-layers", "hidden-size", "num-attention-heads", "seq-length", "micro-batch-size")
# Transformer Engine reads NVTE_FUSED_ATTN before choosing an attention backend: 0 turns its
# cuDNN fused attention off (transformer_engine/pytorch/attention/dot_product_attention/
# utils.py::get_attention_backend), so TE runs Dao's flash-attn kernels (FlashAttention-2
# where flash-attn 2 is installed). Written before the launcher, as NeMo's launch scripts do.
FUSED_ATTENTION_OFF = "NVTE_FUSED_ATTN=0"

# The flags that set each scenario key of issue 11: when the simulator refuses the key
# (`NOT_MODELLED_YET`), these flags are "not modelled" and the key keeps its default.
KEY_FLAGS: dict[str, tuple[str, ...]] = {
    "model.num_query_groups": ("group-query-attention", "num-query-groups"),
    "model.activation": ("swiglu", "squared-relu"),
    "model.normalization": ("normalization",),
    "model.position_embedding": ("position-embedding-type", "use-rotary-position-embeddings"),
    "model.untie_embeddings_and_output_weights": ("untie-embeddings-and-output-weights",),
    "parallel.cp": ("context-parallel-size",),
    "parallel.account_for_embedding_in_pipeline_split": ("account-for-embedding-in-pipeline-split",),
    "parallel.account_for_loss_in_pipeline_split": ("account-for-loss-in-pipeline-split",),
    "parallel.first_pipeline_num_layers": ("decoder-first-pipeline-num-layers",),
    "parallel.last_pipeline_num_layers": ("decoder-last-pipeline-num-layers",),
    "parallel.pipeline_layout": ("pipeline-model-parallel-layout",),
    "training.dtype": ("fp8-format", "fp4-format"),
    "training.attention_backend": ("attention-backend", "use-flash-attn"),
    "training.overlap_param_gather": ("overlap-param-gather",),
    "training.tp_comm_overlap": ("tp-comm-overlap",),
    "training.grad_reduce_in_bf16": ("grad-reduce-in-bf16",),
    "training.fp8_param_gather": ("fp8-param-gather",),
    "training.fp8_recipe": ("fp8-recipe",),
    "training.fp4_recipe": ("fp4-recipe",),
    "training.fp4_param_gather": ("fp4-param-gather",),
    "training.cuda_graph_impl": (
        "cuda-graph-impl",
        "enable-cuda-graph",
        "external-cuda-graph",
        "cuda-graph-modules",
        "cuda-graph-scope",
    ),
    # issue 18 (config/megatron_moe.py)
    "model.moe": (
        "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
        "moe-layer-freq", "moe-expert-capacity-factor", "moe-router-score-function",
        "disable-bias-linear", "activation-func-clamp-value", "moe-router-load-balancing-type",
        "moe-aux-loss-coeff", "moe-z-loss-coeff",
    ),
    "model.kv_channels": ("kv-channels",),
    "model.mla": ("multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim",
                  "qk-pos-emb-head-dim", "v-head-dim"),
    "model.mtp_num_layers": ("mtp-num-layers",),
    "model.window_size": ("window-size",),
    "model.window_attn_skip_freq": ("window-attn-skip-freq",),
    "model.softmax_type": ("softmax-type",),
    "model.qk_layernorm": ("qk-layernorm",),
    "model.add_bias_linear": ("disable-bias-linear",),
    "parallel.ep": ("expert-model-parallel-size",),
    "parallel.etp": ("expert-tensor-parallel-size",),
    "training.moe_token_dispatcher": ("moe-token-dispatcher-type", "moe-enable-deepep"),
    "training.moe_flex_dispatcher_backend": ("moe-flex-dispatcher-backend",),
    "training.moe_grouped_gemm": ("moe-grouped-gemm",),
    "training.moe_router_fusion": ("moe-router-fusion",),
    "training.moe_permute_fusion": ("moe-permute-fusion",),
    "training.overlap_moe_expert_parallel_comm": ("overlap-moe-expert-parallel-comm",),
    "training.delay_wgrad_compute": ("delay-wgrad-compute",),
    "training.recompute_modules": ("recompute-modules", "moe-layer-recompute"),
}  # fmt: skip

# Flags read into the scenario (beyond MODEL_INTS); everything else is sorted below.
USED = {
    "encoder-seq-length", "micro-batch-size", "global-batch-size", "tensor-model-parallel-size",
    "pipeline-model-parallel-size", "virtual-pipeline-model-parallel-size",
    "num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
    "sequence-parallel", "recompute-granularity", "recompute-activations", "checkpoint-activations",
    "recompute-method", "recompute-num-layers", "bf16", "fp16", "use-distributed-optimizer",
    "overlap-grad-reduce", "world-size", "data-parallel-size", "nproc-per-node", "nnodes",
    "make-vocab-size-divisible-by", "recompute-modules", *MODEL_FLOATS,
    *(flag for flags in KEY_FLAGS.values() for flag in flags),
}  # fmt: skip

IGNORED = {
    "lr", "min-lr", "train-iters", "train-samples", "weight-decay", "start-weight-decay",
    "end-weight-decay", "weight-decay-incr-style", "clip-grad", "sgd-momentum", "init-method-std",
    "init-method-xavier-uniform", "seed", "split", "vocab-file", "merge-file", "tokenizer-type",
    "tokenizer-model", "vocab-extra-ids", "save", "load", "pretrained-checkpoint", "finetune",
    "distributed-backend", "distributed-timeout-minutes", "num-workers", "dataloader-type",
    "no-masked-softmax-fusion", "no-bias-gelu-fusion",
    "no-bias-dropout-fusion", "no-gradient-accumulation-fusion", "masked-softmax-fusion",
    "use-cpu-initialization", "no-async-tensor-model-parallel-allreduce", "ddp-impl", "local-rank",
    "apply-query-key-layer-scaling", "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32",
    "loss-scale", "initial-loss-scale", "min-loss-scale", "loss-scale-window", "hysteresis",
    "fp16-lm-cross-entropy", "use-mcore-models", "use-legacy-models", "transformer-impl",
    "eod-mask-loss", "reset-position-ids", "reset-attention-mask", "mock-data", "use-env",
    "no-persist-layer-norm", "empty-unused-memory-level", "barrier-with-l1-time", "use-checkpoint-args",
    "max-position-embeddings", "rampup-batch-size", "optimizer", "rotary-base", "rotary-percent",
    "rope-scaling-factor", "use-rope-scaling", "norm-epsilon", "no-rope-fusion", "bias-swiglu-fusion",
    "node-rank", "master-addr", "master-port", "standalone", "max-restarts", "rdzv-backend",
    "rdzv-endpoint", "rdzv-id", "rdzv-conf", "monitor-interval", "no-python", "module",
    "cuda-graph-warmup-steps",
    # MoE / MLA / MTP values with no cost in a step: a learning rate, logging, checkpoint
    # conversion, a scalar on the routing weights, RoPE scaling, which tokens a capacity drops
    "moe-router-bias-update-rate", "moe-per-layer-logging", "moe-use-upcycling",
    "moe-upcycling-granularity", "moe-router-topk-scaling-factor", "moe-token-drop-policy",
    "mtp-loss-scaling-factor", "rotary-scaling-factor", "mscale",
    "mscale-all-dim", "cache-mla-latents",
}  # fmt: skip
IGNORED_PREFIXES = (
    "log-", "tensorboard-", "wandb-", "save-", "load-", "no-load-", "no-save-", "eval-", "exit-",
    "ckpt-", "lr-", "adam-", "data-", "train-data", "valid-data", "test-data", "profile", "timing-",
)  # fmt: skip

# Known flags with no model in the simulator (always), and why.
NOT_MODELLED = {
    "overlap-p2p-comm": "overlapped pipeline p2p",
    "distribute-saved-activations": "distributed saved activations",
    "num-microbatches-with-partial-activation-checkpoints": "partial recompute (paper Appendix C)",
    "pipeline-model-parallel-split-rank": "encoder-decoder pipelines",
    "cp-comm-type": "the context-parallel communication kind",
    # megatron/core/fp4_utils.py::get_fp4_context and fp8_utils.py: layers kept in BF16 under
    # --fp4-format / --fp8-format; the scenario quantizes every layer's TE linears
    "first-last-layers-bf16": "the first and last layers kept in BF16 under FP8 / FP4",
    "num-layers-at-start-in-bf16": "the first and last layers kept in BF16 under FP8 / FP4",
    "num-layers-at-end-in-bf16": "the first and last layers kept in BF16 under FP8 / FP4",
    # megatron/core/fusions/fused_cross_entropy.py (the `native` impl): the same fp32 softmax
    # is saved as the unfused _VocabParallelCrossEntropy's, so memory is unchanged; its fused
    # kernels and one merged all-reduce are priced as the unfused loss's
    "cross-entropy-loss-fusion": (
        "the fused vocab-parallel loss (memory unchanged: it saves the same fp32 softmax; "
        "time priced as the unfused loss's kernels)"
    ),
    # TE cross_entropy.py::CrossEntropyFunction writes the gradient into the logits in place
    # MoE options without a scenario key (transformer_config.py fields, Megatron-LM @d98e8a64)
    "moe-input-jitter-eps": "the router's input jitter",
    "moe-router-dtype": "the router's fp32 / fp64 logits (simulated in the training dtype)",
    "moe-router-num-groups": "group-limited routing (no scenario key yet)",
    "moe-router-group-topk": "group-limited routing (no scenario key yet)",
    "moe-router-enable-expert-bias": "the per-expert routing bias (auxiliary-loss-free balancing)",
    "moe-router-pre-softmax": "softmax before top-k (the top-k then softmax order is priced)",
    "moe-pad-expert-input-to-capacity": "expert inputs padded to capacity (no scenario key yet)",
    "moe-shared-expert-overlap": "the shared expert overlapped with the dispatch",
    "moe-router-padding-for-fp8": "the routing map padded for FP8 GEMMs",
    "moe-apply-probs-on-input": "the routing probabilities applied before the experts",
    "moe-use-legacy-grouped-gemm": "the legacy grouped-GEMM kernels (priced as TE's)",
    "moe-router-force-load-balancing": "forced balanced routing (model.moe.load_imbalance 1.0 is the same)",
    "mla-down-proj-fusion": "the fused MLA down-projection",
    "cross-entropy-fusion-impl": (
        "the loss kernel (te saves the 16-bit logits, 2·s·b·V/t, instead of the fp32 softmax, "
        "4·s·b·V/t; priced as native)"
    ),
}

# Why a flag whose scenario key is not priced yet is simulated without it.
KEY_REASONS = {
    "model.num_query_groups": "grouped-query attention",
    "model.activation": "the MLP activation (GeLU is priced)",
    "model.normalization": "the norm kind (LayerNorm is priced)",
    "model.position_embedding": "the position embedding kind (learned absolute is priced)",
    "model.untie_embeddings_and_output_weights": "an untied output layer (tied embeddings are priced)",
    "parallel.cp": "context parallelism",
    "parallel.account_for_embedding_in_pipeline_split": "uneven pipeline stages",
    "parallel.account_for_loss_in_pipeline_split": "uneven pipeline stages",
    "parallel.first_pipeline_num_layers": "uneven pipeline stages",
    "parallel.last_pipeline_num_layers": "uneven pipeline stages",
    "training.dtype": "FP8 training (simulated in bf16)",
    "training.attention_backend": "the attention kernel (the paper's unfused attention is priced)",
    "training.overlap_param_gather": "overlapped parameter all-gather",
    "training.tp_comm_overlap": "overlapped tensor-parallel communication",
    "model.kv_channels": "a per-head width other than hidden_size / num_attention_heads",
    "model.mla": "multi-latent attention (standard attention is priced)",
    "model.mtp_num_layers": "multi-token prediction layers",
    "model.window_size": "sliding-window attention (full causal attention is priced)",
    "model.window_attn_skip_freq": "sliding-window attention (full causal attention is priced)",
    "model.qk_layernorm": "the query / key norms",
    "model.add_bias_linear": "bias-free linears",
    "training.recompute_modules": "recompute of modules other than core_attn (simulated as core_attn)",
    "training.moe_token_dispatcher": "the token dispatcher (simulated as alltoall)",
    "training.moe_flex_dispatcher_backend": "the flex dispatcher's backend",
    "training.moe_permute_fusion": "the fused permute / unpermute kernels",
}


def bucket(name: str) -> str:
    """used / not_modelled / ignored / unknown, before knowing which keys are priced."""
    if name in MODEL_INTS or name in USED:
        return "used"
    if name in NOT_MODELLED:
        return "not_modelled"
    if name in IGNORED:  # before the prefixes: a few moe- flags have no cost
        return "ignored"
    if name.startswith(("moe-", "fp8")):
        return "not_modelled"
    if name.startswith(IGNORED_PREFIXES):
        return "ignored"
    return "unknown"
