"""The shape of a mixture-of-experts model, its multi-latent attention, and how its experts
are laid out over the GPUs: frozen, validated, torch-free.

Field names follow Megatron-core's flags (megatron/core/transformer/transformer_config.py,
megatron/training/arguments.py); every rule cites the Megatron check it mirrors. All
citations are to Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22).

A bad value raises ValueError naming the class, the field, the value and what is allowed,
so the scenario loader can prefix the file name and show it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.moe_choices import LoadBalancingType, RouterScore


def _positive(owner: str, name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{owner}.{name}={value} is not allowed: it must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class MoEConfig:
    """The routed-expert MLP that replaces the dense MLP of a MoE layer.

    `num_experts` (`--num-experts`), `router_topk` (`--moe-router-topk`), `ffn_hidden_size`
    per expert (`--moe-ffn-hidden-size`), `shared_expert_ffn_hidden_size` (all shared experts
    together, `--moe-shared-expert-intermediate-size`; 0 = none), `first_k_dense_layers`
    (the first k layers keep the dense MLP: `--moe-layer-freq "([0]*k+[1]*(L-k))"`),
    `capacity_factor` (`--moe-expert-capacity-factor`; None = dropless) and
    `pad_to_capacity` (`--moe-pad-expert-input-to-capacity`), `load_imbalance` (the
    busiest expert rank's routed tokens over the mean, >= 1), `router_score`
    (`--moe-router-score-function`), group-limited routing (`--moe-router-num-groups`,
    `--moe-router-group-topk`: DeepSeek-V3 picks 4 of 8 groups, then 8 experts in them)
    `router_bias` (gpt-oss's router has a bias: Megatron `--add-bias-linear` on the
    router, router.py `Router.__init__`) and `router_expert_bias` (DeepSeek-V3's
    auxiliary-loss-free balancing, `--moe-router-enable-expert-bias`: a per-expert bias added
    to sigmoid scores for the choice only, moe_utils.py `topk_routing_with_score_function`;
    the softmax path does not read it). `expert_bias` (gpt-oss: `add_bias_linear` on the
    experts' TE GroupedLinears, experts.py `TEGroupedMLP`) and `activation_func_clamp_value`
    (gpt-oss 7.0: Megatron-core `TransformerConfig.activation_func_clamp_value`, the clamp of
    the GLU's two halves in fused_bias_geglu.py `weighted_bias_quick_geglu_impl`) are priced
    by `workload.gptoss_experts`. `aux_loss_coeff` (`--moe-aux-loss-coeff`, default 0),
    `load_balancing_type` (`--moe-router-load-balancing-type`, default aux_loss) and
    `z_loss_coeff` (`--moe-z-loss-coeff`, default None) add the router's load-balancing
    loss and z-loss, priced by `workload.moe_aux_loss`."""

    num_experts: int
    router_topk: int
    ffn_hidden_size: int
    shared_expert_ffn_hidden_size: int = 0
    first_k_dense_layers: int = 0
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    load_imbalance: float = 1.0
    router_score: RouterScore = RouterScore.SOFTMAX
    router_num_groups: int | None = None
    router_group_topk: int | None = None
    router_bias: bool = False
    router_expert_bias: bool = False
    expert_bias: bool = False
    activation_func_clamp_value: float | None = None
    aux_loss_coeff: float = 0.0
    load_balancing_type: LoadBalancingType = LoadBalancingType.AUX_LOSS
    z_loss_coeff: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "router_score", RouterScore(self.router_score))
        object.__setattr__(self, "load_balancing_type", LoadBalancingType(self.load_balancing_type))
        owner = type(self).__name__
        for name in ("num_experts", "router_topk", "ffn_hidden_size"):
            _positive(owner, name, getattr(self, name))
        for name in ("shared_expert_ffn_hidden_size", "first_k_dense_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{owner}.{name}={getattr(self, name)} is not allowed: it must be >= 0")
        # moe_utils.py: torch.topk(scores, k=topk) over num_experts columns
        if self.router_topk > self.num_experts:
            raise ValueError(
                f"{owner}.router_topk={self.router_topk} is not allowed: a token picks at most "
                f"num_experts={self.num_experts} experts (1 <= router_topk <= num_experts)"
            )
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(
                f"{owner}.capacity_factor={self.capacity_factor} is not allowed: it must be > 0, "
                "or null for dropless routing"
            )
        # transformer_config.py: "moe_pad_expert_input_to_capacity" needs a capacity factor
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError(
                f"{owner}.pad_to_capacity=true is not allowed with capacity_factor=null: padding to "
                "capacity needs a capacity factor"
            )
        if self.activation_func_clamp_value is not None and not self.activation_func_clamp_value > 0:
            raise ValueError(
                f"{owner}.activation_func_clamp_value={self.activation_func_clamp_value} is not "
                "allowed: it must be > 0 (the GLU clamps its gate to <= v and its linear half to "
                "[-v, v]), or null for no clamp"
            )
        if not self.load_imbalance >= 1.0:
            raise ValueError(
                f"{owner}.load_imbalance={self.load_imbalance} is not allowed: it is the busiest "
                "expert rank's tokens over the mean, so >= 1 (1 = perfectly balanced)"
            )
        self._check_losses(owner)
        self._check_groups(owner)

    def _check_losses(self, owner: str) -> None:
        """router.py: the loss runs when its coefficient is > 0 (`get_aux_loss_coeff`); a
        negative coefficient would reward imbalance, so it is refused here."""
        if not self.aux_loss_coeff >= 0:
            raise ValueError(
                f"{owner}.aux_loss_coeff={self.aux_loss_coeff} is not allowed: it must be >= 0 "
                "(0 = no load-balancing loss, Megatron's default)"
            )
        if self.z_loss_coeff is not None and not self.z_loss_coeff >= 0:
            raise ValueError(
                f"{owner}.z_loss_coeff={self.z_loss_coeff} is not allowed: it must be >= 0, or null "
                "for no z-loss (Megatron's default)"
            )

    @property
    def aux_loss_enabled(self) -> bool:
        """router.py `TopKRouter.is_aux_loss_enabled`: a load-balancing type other than none
        with a coefficient > 0."""
        return self.aux_loss_coeff > 0 and self.load_balancing_type is not LoadBalancingType.NONE

    def _check_groups(self, owner: str) -> None:
        """transformer_config.py `__post_init__`: group-limited routing needs both numbers,
        E % num_groups == 0 and group_topk <= num_groups; moe_utils.py::group_limited_topk
        takes topk // group_topk experts per group to score it and then topk experts from
        the group_topk chosen groups, so those groups must hold at least topk experts."""
        groups, group_topk = self.router_num_groups, self.router_group_topk
        if groups is None and group_topk is None:
            return
        if groups is None or group_topk is None:
            raise ValueError(
                f"{owner}.router_num_groups={groups} and router_group_topk={group_topk} are not "
                "allowed: group-limited routing needs both (or neither)"
            )
        _positive(owner, "router_num_groups", groups)
        _positive(owner, "router_group_topk", group_topk)
        if self.num_experts % groups:
            raise ValueError(
                f"{owner}.router_num_groups={groups} is not allowed: it must divide "
                f"num_experts={self.num_experts}"
            )
        if group_topk > groups:
            raise ValueError(
                f"{owner}.router_group_topk={group_topk} is not allowed: it must be <= "
                f"router_num_groups={groups}"
            )
        if group_topk > self.router_topk:  # a group is scored by its top router_topk // group_topk
            raise ValueError(
                f"{owner}.router_group_topk={group_topk} is not allowed: it must be <= "
                f"router_topk={self.router_topk} (each group is scored by its top "
                "router_topk // router_group_topk experts)"
            )
        if group_topk * (self.num_experts // groups) < self.router_topk:
            raise ValueError(
                f"{owner}.router_group_topk={group_topk} is not allowed: {group_topk} groups of "
                f"{self.num_experts // groups} experts hold fewer than router_topk={self.router_topk}"
            )

    def is_moe_layer(self, layer_index: int) -> bool:
        """Layer `layer_index` (0-based) has the MoE MLP: all but the first k
        (Megatron's `--moe-layer-freq` list `[0]*k + [1]*(L-k)`, transformer_config.py)."""
        return layer_index >= self.first_k_dense_layers

    def num_moe_layers(self, num_layers: int) -> int:
        """MoE layers among `num_layers` decoder layers (MTP layers not included)."""
        return max(num_layers - self.first_k_dense_layers, 0)

    def megatron_moe_layer_freq(self, num_layers: int) -> str:
        """The `--moe-layer-freq` value that means `first_k_dense_layers` (1 when 0)."""
        k = self.first_k_dense_layers
        return "1" if k == 0 else f"([0]*{k}+[1]*{num_layers - k})"


@dataclass(frozen=True, slots=True)
class MLAConfig:
    """DeepSeek multi-latent attention (megatron/core/transformer/multi_latent_attention.py
    `MLASelfAttention`): queries through a rank-`q_lora_rank` bottleneck (None: one
    `linear_q_proj`, as DeepSeek-V2-Lite), keys and values through a rank-`kv_lora_rank`
    latent, per head `qk_head_dim` + `qk_pos_emb_head_dim` (the decoupled RoPE part, one
    key head shared by all heads) for Q·K and `v_head_dim` for V."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("kv_lora_rank", "qk_head_dim", "v_head_dim"):
            _positive(owner, name, getattr(self, name))
        if self.q_lora_rank is not None:
            _positive(owner, "q_lora_rank", self.q_lora_rank)
        if self.qk_pos_emb_head_dim < 0:
            raise ValueError(
                f"{owner}.qk_pos_emb_head_dim={self.qk_pos_emb_head_dim} is not allowed: it must be >= 0"
            )

    @property
    def q_head_dim(self) -> int:
        """qk_head_dim + qk_pos_emb_head_dim: the width Q·K contracts over per head."""
        return self.qk_head_dim + self.qk_pos_emb_head_dim


def check_mla_attention(mla: MLAConfig, num_attention_heads: int, num_query_groups: int | None) -> None:
    """MLA has one latent K/V per token, expanded to every head: it has no GQA groups
    (megatron/training/training.py `num_floating_point_operations`: `assert not
    args.group_query_attention` under MLA). `num_query_groups` None, 0 or equal to the head
    count is plain multi-head attention and is allowed."""
    del mla
    if num_query_groups and num_query_groups != num_attention_heads:
        raise ValueError(
            f"model.num_query_groups={num_query_groups} is not allowed with model.mla: multi-latent "
            f"attention has no GQA groups (leave num_query_groups unset or = "
            f"num_attention_heads={num_attention_heads})"
        )


@dataclass(frozen=True, slots=True)
class ExpertLayout:
    """Megatron-core's MoE parallel folding (megatron/core/parallel_state.py
    `initialize_model_parallel`): within one pipeline stage the same tp·cp·dp ranks are
    viewed twice. The attention (dense) grid is tp × cp × dp (order tp-cp-dp); the expert
    grid is etp × ep × edp (order tp-ep-dp, `expert_decoder_rank_generator`) with
    edp = tp·cp·dp / (etp·ep) (`expert_data_parallel_size = world_size //
    (etp·ep·pp)`). So ep·etp must divide tp·cp·dp, and the EP group is ep ranks strided
    etp apart inside a block of etp·ep consecutive ranks. `etp` None means tp
    (`expert_tensor_parallel_size` defaults to tp)."""

    tp: int
    cp: int
    dp: int
    ep: int = 1
    etp: int | None = None

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        owner = type(self).__name__
        for name in ("tp", "cp", "dp", "ep", "etp"):
            _positive(owner, name, getattr(self, name))
        if self.attention_ranks % (self.ep * self.expert_tp):
            raise ValueError(
                f"parallel.ep={self.ep} with etp={self.expert_tp} is not allowed: ep·etp="
                f"{self.ep * self.expert_tp} must divide tp·cp·dp={self.attention_ranks} "
                f"(tp={self.tp}, cp={self.cp}, dp={self.dp}; Megatron-core folds the expert groups "
                "into the same ranks)"
            )

    @property
    def expert_tp(self) -> int:
        """etp, resolved (tp when not given)."""
        return int(self.etp or self.tp)

    @property
    def attention_ranks(self) -> int:
        """tp·cp·dp: the ranks of one pipeline stage."""
        return self.tp * self.cp * self.dp

    @property
    def expert_dp(self) -> int:
        """edp = tp·cp·dp / (ep·etp): the expert-data-parallel group, over which expert
        gradients are reduced and (distributed optimizer) expert optimizer state sharded."""
        return self.attention_ranks // (self.ep * self.expert_tp)

    @property
    def expert_shards(self) -> int:
        """ep·etp: how many ranks share one copy of the routed experts' weights."""
        return self.ep * self.expert_tp


def check_moe_parallel(moe: MoEConfig, layout: ExpertLayout, sequence_parallel: bool) -> None:
    """The rules that join the model to the layout, each one Megatron's:
    experts divisible by ep (moe_layer.py `BaseMoELayer.__init__`: `assert
    num_moe_experts % ep_size == 0`, `num_local_experts = num_moe_experts // ep_size`),
    sequence parallelism with tp > 1 in training (moe_layer.py `MoELayer.forward` raises
    ValueError without it), and a busiest rank that cannot take more than all the routed
    tokens (load_imbalance <= ep)."""
    if moe.num_experts % layout.ep:
        raise ValueError(
            f"model.moe.num_experts={moe.num_experts} is not allowed with parallel.ep={layout.ep}: "
            "each expert-parallel rank holds num_experts/ep whole experts, so ep must divide num_experts"
        )
    if layout.tp > 1 and not sequence_parallel:
        raise ValueError(
            f"parallel.sequence_parallel=false is not allowed for a MoE model with tp={layout.tp}: "
            "Megatron-core's MoE layer requires sequence parallelism with tensor parallelism in training"
        )
    if moe.load_imbalance > layout.ep:
        raise ValueError(
            f"model.moe.load_imbalance={moe.load_imbalance} is not allowed with parallel.ep={layout.ep}: "
            "the busiest of ep ranks takes at most ep times the mean (1 <= load_imbalance <= ep)"
        )
