"""The keys of issue 18 -> Megatron-LM flags (`export-megatron`, `plan`): the reverse of
`megatron_moe`, written so that `import-megatron` reads them back to the same keys.

Where Megatron's default differs from the scenario's the flag is always written: the
dispatcher (Megatron's default allgather, the scenario's alltoall) and, for a MoE model,
`--moe-grouped-gemm` (off in Megatron) when grouped GEMM is on. `model.moe.load_imbalance`
has no flag (the router decides it in a real run): it is not exported and imports as 1.0.
"""

from __future__ import annotations

from simcluster.config.choices import SoftmaxType
from simcluster.config.errors import ConfigError
from simcluster.config.megatron_flags import SOURCE
from simcluster.config.moe_choices import FlexBackend, LoadBalancingType, TokenDispatcher
from simcluster.config.moe_config import MoEConfig
from simcluster.config.scenario import ModelSpec, ParallelSpec, Scenario


def _moe_flags(model: ModelSpec) -> list[str]:
    moe = model.moe
    if moe is None:
        return []
    flags = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.router_topk)]
    flags += ["--moe-ffn-hidden-size", str(moe.ffn_hidden_size)]
    if moe.shared_expert_ffn_hidden_size:
        flags += ["--moe-shared-expert-intermediate-size", str(moe.shared_expert_ffn_hidden_size)]
    if moe.first_k_dense_layers:
        config = MoEConfig(**moe.model_dump())
        flags += ["--moe-layer-freq", config.megatron_moe_layer_freq(model.num_layers)]
    if moe.capacity_factor is not None:
        flags += ["--moe-expert-capacity-factor", repr(moe.capacity_factor)]
    flags += ["--moe-router-score-function", moe.router_score.value]
    # Megatron's add_bias_linear (default True) gives both the router and the experts biases
    if moe.router_bias != moe.expert_bias:
        raise ConfigError(
            SOURCE,
            [
                f"model.moe.router_bias: value {str(moe.router_bias).lower()} with expert_bias "
                f"{str(moe.expert_bias).lower()} has no Megatron flags: --disable-bias-linear drops "
                "both (add_bias_linear); allowed: both true or both false"
            ],
        )
    # a MoE model without expert biases: the line is Megatron's bias-free one (its dense
    # flags write the flag when model.add_bias_linear is false); a scenario with dense biases
    # beside bias-free experts has no line of its own and reads back with add_bias_linear false
    if not moe.expert_bias and model.add_bias_linear:
        flags.append("--disable-bias-linear")
    if moe.activation_func_clamp_value is not None:
        flags += ["--activation-func-clamp-value", repr(moe.activation_func_clamp_value)]
    if moe.load_balancing_type is not LoadBalancingType.AUX_LOSS:  # Megatron's default: aux_loss
        flags += ["--moe-router-load-balancing-type", moe.load_balancing_type.value]
    if moe.aux_loss_coeff:
        flags += ["--moe-aux-loss-coeff", repr(moe.aux_loss_coeff)]
    if moe.z_loss_coeff is not None:
        flags += ["--moe-z-loss-coeff", repr(moe.z_loss_coeff)]
    return flags


def moe_and_attention_flags(model: ModelSpec) -> list[str]:
    """`--num-experts` and the MoE sizes, `--kv-channels`, `--multi-latent-attention` with
    every MLA size (`--q-lora-rank` left out when null: Megatron's default is no query
    bottleneck), `--mtp-num-layers`, `--window-size w,0`, `--window-attn-skip-freq N` and
    `--qk-layernorm`."""
    flags = _moe_flags(model)
    if model.kv_channels is not None:
        flags += ["--kv-channels", str(model.kv_channels)]
    if (mla := model.mla) is not None:
        flags.append("--multi-latent-attention")
        if mla.q_lora_rank is not None:
            flags += ["--q-lora-rank", str(mla.q_lora_rank)]
        flags += ["--kv-lora-rank", str(mla.kv_lora_rank), "--qk-head-dim", str(mla.qk_head_dim)]
        flags += ["--qk-pos-emb-head-dim", str(mla.qk_pos_emb_head_dim), "--v-head-dim", str(mla.v_head_dim)]
    if model.mtp_num_layers:
        flags += ["--mtp-num-layers", str(model.mtp_num_layers)]
    if model.window_size is not None:
        flags += ["--window-size", f"{model.window_size},0"]  # TE's (left, right): causal
    if model.window_attn_skip_freq is not None:
        flags += ["--window-attn-skip-freq", str(model.window_attn_skip_freq)]
    if model.softmax_type is not SoftmaxType.VANILLA:
        flags += ["--softmax-type", model.softmax_type.value]
    if model.qk_layernorm:
        flags.append("--qk-layernorm")
    return flags


def moe_parallel_flags(parallel: ParallelSpec) -> list[str]:
    """`--expert-model-parallel-size` (ep > 1), `--expert-tensor-parallel-size` (when set;
    null is Megatron's default, tp)."""
    flags = ["--expert-model-parallel-size", str(parallel.ep)] if parallel.ep > 1 else []
    if parallel.etp is not None:
        flags += ["--expert-tensor-parallel-size", str(parallel.etp)]
    return flags


def moe_training_flags(scenario: Scenario) -> list[str]:
    """A MoE model's `--moe-token-dispatcher-type` (always: Megatron's default is allgather)
    and `--moe-grouped-gemm`, `--moe-router-fusion` / `--moe-permute-fusion` when set;
    `--recompute-modules` when the list is set."""
    tr = scenario.training
    flags: list[str] = []
    if scenario.model.moe is not None:
        dispatcher = tr.moe_token_dispatcher
        flags += ["--moe-token-dispatcher-type", TokenDispatcher(dispatcher).value]
        if tr.moe_flex_dispatcher_backend is not FlexBackend.DEEPEP:  # Megatron's default: deepep
            flags += ["--moe-flex-dispatcher-backend", tr.moe_flex_dispatcher_backend.value]
        if tr.moe_grouped_gemm:
            flags.append("--moe-grouped-gemm")
        if tr.moe_router_fusion:
            flags.append("--moe-router-fusion")
        if tr.moe_permute_fusion:
            flags.append("--moe-permute-fusion")
        if tr.overlap_moe_expert_parallel_comm:
            flags.append("--overlap-moe-expert-parallel-comm")
        if tr.delay_wgrad_compute:
            flags.append("--delay-wgrad-compute")
    if tr.recompute_modules == []:
        # arguments.py: nargs="+"; an empty list has no command line
        problem = "training.recompute_modules: value []: Megatron's --recompute-modules takes one or more"
        raise ConfigError(SOURCE, [problem])
    if tr.recompute_modules is not None:
        flags += ["--recompute-modules", *(module.value for module in tr.recompute_modules)]
    return flags
