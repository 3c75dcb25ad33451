"""Megatron flags of issue 18 -> the scenario: mixture of experts (`model.moe`,
`parallel.ep` / `etp`, the MoE `training` keys), multi-latent attention, multi-token
prediction, sliding windows, `--kv-channels` and `--recompute-modules`.

Spellings and defaults are Megatron-LM's @d98e8a64ddf34856e74b24714e3bedb2f5a39553: the MoE
and MTP flags are generated from megatron/core/transformer/transformer_config.py's fields
(megatron/training/argument_utils.py::ArgumentGroupFactory: `--moe-router-topk` default 2,
`--moe-token-dispatcher-type` default allgather, `--moe-grouped-gemm` off), the MLA sizes
from megatron/training/arguments.py::_add_mla_args (`--kv-lora-rank` 32, `--qk-head-dim` 128,
`--qk-pos-emb-head-dim` 64, `--v-head-dim` 128, `--q-lora-rank` None), and validate_args
fills `--moe-ffn-hidden-size` from `--ffn-hidden-size` and `--expert-tensor-parallel-size`
from tp. A flag left out therefore imports as Megatron's default, which may differ from the
scenario's (a note says so).
"""

from __future__ import annotations

from typing import Any

from simcluster.config.choices import SoftmaxType
from simcluster.config.megatron_cmdline import FlagReader
from simcluster.config.megatron_pattern import (
    PatternError,
    leading_zeros,
    parse_layer_pattern,
    parse_window,
    skip_frequency,
)
from simcluster.config.moe_choices import RecomputeModule

MOE_MODEL_FLAGS = (
    "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size", "moe-layer-freq",
    "moe-expert-capacity-factor", "moe-router-score-function", "moe-router-load-balancing-type",
    "moe-aux-loss-coeff", "moe-z-loss-coeff",
)  # fmt: skip
MLA_SIZE_FLAGS = ("q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim")
# _add_mla_args's defaults, for `--multi-latent-attention` without a size flag
MLA_DEFAULTS: dict[str, int | None] = {
    "q_lora_rank": None, "kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128,
}  # fmt: skip
DEFAULT_ROUTER_TOPK = 2  # transformer_config.py moe_router_topk
_ROUTER_SCORES = {"softmax": "softmax", "sigmoid": "sigmoid"}
_DISPATCHERS = {name: name for name in ("alltoall", "allgather", "flex")}
_FLEX_BACKENDS = {name: name for name in ("deepep", "hybridep")}
# transformer_config.py `__post_init__` allowed_modules that simcluster has no layer for
# (gated delta net, gated delta product, hyper-connections): read, then not modelled
UNMODELLED_RECOMPUTE_MODULES = ("gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")


def _first_k_dense(read: FlagReader, num_layers: int) -> int:
    """`--moe-layer-freq` as the number of dense first layers. Megatron-core
    (gpt_layer_specs.py::get_gpt_decoder_block_spec): an integer N makes layers 0, N, 2N, …
    MoE; a list has one 0 (dense) / 1 (MoE) per layer and must be num_layers long. The
    scenario holds dense layers first, then MoE layers: N = 1, or a list [0]*k + [1]*(L-k)."""
    text = read.text("moe-layer-freq")
    if text is None:
        return 0
    allowed = (
        f'1, or "([0]*k+[1]*({num_layers}-k))": k dense first layers, then MoE layers '
        "(model.moe.first_k_dense_layers)"
    )
    try:
        pattern = parse_layer_pattern(text)
    except PatternError as error:
        read.problems.append(f"--moe-layer-freq: value {text!r}: {error}; allowed: {allowed}")
        return 0
    if isinstance(pattern, int):
        if pattern != 1:
            read.problems.append(
                f"--moe-layer-freq: value {text!r}: one MoE layer every {pattern} layers (layers 0, "
                f"{pattern}, {2 * pattern}, … MoE) cannot be expressed; allowed: {allowed}"
            )
        return 0
    if len(pattern) != num_layers:  # gpt_layer_specs.py asserts the length
        read.problems.append(
            f"--moe-layer-freq: value {text!r}: {len(pattern)} entries for num_layers {num_layers} "
            "(Megatron asserts one per layer)"
        )
        return 0
    k = leading_zeros(pattern)
    if k is None:
        read.problems.append(
            f"--moe-layer-freq: value {text!r}: dense layers after MoE layers cannot be expressed "
            f"(entries 0 or 1, every 0 first); allowed: {allowed}"
        )
        return 0
    return k


def _mixture_of_experts(
    read: FlagReader, model: dict[str, Any], notes: list[str], demoted: dict[str, str]
) -> None:
    """`model.moe` from `--num-experts` (Megatron's `num_moe_experts`; absent: dense) and the
    router / expert sizes beside it."""
    experts = read.integer("num-experts")
    if experts is None:
        if given := [f"--{flag}" for flag in MOE_MODEL_FLAGS if read.has(flag)]:
            notes.append(f"{' '.join(given)} without --num-experts: no effect (a dense model)")
        if read.has("activation-func-clamp-value"):  # priced on the routed experts' GLU only
            demoted["activation-func-clamp-value"] = "the dense MLP's GLU clamp"
        return
    topk = read.integer("moe-router-topk")
    if topk is None:
        topk = DEFAULT_ROUTER_TOPK
        notes.append(f"model.moe.router_topk = {topk}: no --moe-router-topk (Megatron's default)")
    ffn = read.integer("moe-ffn-hidden-size")
    if ffn is None:  # arguments.py validate_args: moe_ffn_hidden_size = ffn_hidden_size
        ffn = model.get("ffn_hidden_size") or 4 * (model.get("hidden_size") or 1)
        notes.append(
            f"model.moe.ffn_hidden_size = {ffn}: no --moe-ffn-hidden-size (Megatron: --ffn-hidden-size)"
        )
    moe: dict[str, Any] = {"num_experts": experts, "router_topk": topk, "ffn_hidden_size": ffn}
    if shared := read.integer("moe-shared-expert-intermediate-size"):
        moe["shared_expert_ffn_hidden_size"] = shared
    if first_k := _first_k_dense(read, model.get("num_layers") or 1):
        moe["first_k_dense_layers"] = first_k
    if (capacity := read.number("moe-expert-capacity-factor")) is not None:
        moe["capacity_factor"] = capacity
    score = read.text("moe-router-score-function")
    if score == "sqrtsoftplus":  # transformer_config.py allows it; the scenario has two scores
        demoted["moe-router-score-function"] = "the sqrtsoftplus router score (simulated as softmax)"
    elif (router := read.choice("moe-router-score-function", _ROUTER_SCORES)) not in (None, "softmax"):
        moe["router_score"] = router
    _gpt_oss_experts(read, moe, notes)
    _load_balancing_loss(read, moe, demoted)
    model["moe"] = moe


_LOAD_BALANCING = {name: name for name in ("aux_loss", "seq_aux_loss", "global_aux_loss", "none", "sinkhorn")}


def _load_balancing_loss(read: FlagReader, moe: dict[str, Any], demoted: dict[str, str]) -> None:
    """`--moe-router-load-balancing-type` (default aux_loss), `--moe-aux-loss-coeff` (default
    0) and `--moe-z-loss-coeff` (default None), transformer_config.py / router.py `TopKRouter`
    @d7288711ba278d160d2a5a22c099915c9fe1395c. Megatron also takes lists of types with one
    coefficient each and sinkhorn routing: one type is modelled; sinkhorn is not."""
    if len(read.values("moe-router-load-balancing-type") or ()) > 1:
        demoted["moe-router-load-balancing-type"] = "several load-balancing losses at once (one is modelled)"
        read.values("moe-aux-loss-coeff")  # read with it: one coefficient per type
        return
    kind = read.choice("moe-router-load-balancing-type", _LOAD_BALANCING)
    coeff = read.number("moe-aux-loss-coeff")
    if kind == "sinkhorn":
        demoted["moe-router-load-balancing-type"] = "sinkhorn routing (simulated as top-k without a loss)"
        kind, coeff = None, None
    if kind is not None and kind != "aux_loss":
        moe["load_balancing_type"] = kind
    if coeff:
        moe["aux_loss_coeff"] = coeff
    if (z_loss := read.number("moe-z-loss-coeff")) is not None:
        moe["z_loss_coeff"] = z_loss


def _gpt_oss_experts(read: FlagReader, moe: dict[str, Any], notes: list[str]) -> None:
    """Megatron builds the router's and the experts' biases unless `--disable-bias-linear`
    (`add_bias_linear`, default True: router.py `Router.__init__`, experts.py
    `TEGroupedMLP`), and clamps the experts' GLU with `--activation-func-clamp-value`
    (TransformerConfig `activation_func_clamp_value`, a flag of Megatron-LM's
    `ArgumentGroupFactory(TransformerConfig)` @d98e8a64)."""
    if not read.switch("disable-bias-linear"):
        moe["router_bias"] = moe["expert_bias"] = True
        notes.append(
            "model.moe.router_bias, expert_bias = true: no --disable-bias-linear (Megatron's default "
            "add_bias_linear builds the router's and the experts' biases)"
        )
    if (clamp := read.number("activation-func-clamp-value")) is not None:
        moe["activation_func_clamp_value"] = clamp


def _multi_latent_attention(read: FlagReader, model: dict[str, Any], notes: list[str]) -> None:
    """`model.mla` from `--multi-latent-attention` (arguments.py core_transformer_config_from_args
    then builds an MLATransformerConfig) and the five sizes of _add_mla_args."""
    if not read.switch("multi-latent-attention"):
        if given := [f"--{flag}" for flag in MLA_SIZE_FLAGS if read.has(flag)]:
            notes.append(f"{' '.join(given)} without --multi-latent-attention: no effect (Megatron)")
        return
    mla = dict(MLA_DEFAULTS)
    for flag in MLA_SIZE_FLAGS:
        if (value := read.integer(flag)) is not None:
            mla[flag.replace("-", "_")] = value
    defaulted = [
        f"{flag.replace('-', '_')} {mla[flag.replace('-', '_')]}"
        for flag in MLA_SIZE_FLAGS[1:]
        if not read.has(flag)
    ]
    if defaulted:
        notes.append(f"model.mla: {', '.join(defaulted)}: Megatron's defaults (flags not given)")
    model["mla"] = mla


def _window(read: FlagReader, model: dict[str, Any], notes: list[str]) -> None:
    """`--window-size (w, 0)`: TE's (left, right) window, a causal window of w keys before
    the query; `--window-attn-skip-freq`: an integer N (1-based layer n keeps full attention
    when n % N == 0), or a per-layer list (1 = window) that such an N describes."""
    text = read.text("window-size")
    if text is not None:
        try:
            window = parse_window(text)
        except PatternError as error:
            window = ()
            read.problems.append(f"--window-size: value {text!r}: {error}")
        if window and (len(window) != 2 or window[1] != 0 or window[0] < 1):
            read.problems.append(
                f"--window-size: value {text!r}: allowed: w,0 with w >= 1 (a causal sliding window of w "
                "keys; a right-hand width, or -1 for an unbounded side, cannot be expressed)"
            )
        elif window:
            model["window_size"] = window[0]
    skip = read.text("window-attn-skip-freq")
    if skip is None:
        return
    if "window_size" not in model:
        notes.append("--window-attn-skip-freq without --window-size: no effect (every layer full attention)")
        return
    try:
        pattern = parse_layer_pattern(skip)
    except PatternError as error:
        read.problems.append(f"--window-attn-skip-freq: value {skip!r}: {error}")
        return
    if isinstance(pattern, list):
        num_layers = model.get("num_layers") or 0
        every = skip_frequency(pattern) if len(pattern) == num_layers else None
        if every is None:
            read.problems.append(
                f"--window-attn-skip-freq: value {skip!r}: allowed: an integer N, or a list of {num_layers} "
                "entries (1 = window, 0 = full attention) that repeats [1]*(N-1)+[0]"
            )
            return
        pattern = every
    if pattern:  # 0: every layer a window layer, as without the flag
        model["window_attn_skip_freq"] = pattern


def read_moe_and_attention(
    read: FlagReader, model: dict[str, Any], notes: list[str], demoted: dict[str, str]
) -> None:
    """Add `moe`, `kv_channels`, `mla`, `mtp_num_layers`, `window_size`,
    `window_attn_skip_freq` and `qk_layernorm` to `model` where the line sets them."""
    _mixture_of_experts(read, model, notes, demoted)
    if (kv_channels := read.integer("kv-channels")) is not None:
        model["kv_channels"] = kv_channels
    _multi_latent_attention(read, model, notes)
    if mtp := read.integer("mtp-num-layers"):
        model["mtp_num_layers"] = mtp
    _window(read, model, notes)
    # TransformerConfig.softmax_type (Megatron-LM @d98e8a64 ArgumentGroupFactory: --softmax-type)
    softmax = read.choice("softmax-type", {choice.value: choice.value for choice in SoftmaxType})
    if softmax not in (None, SoftmaxType.VANILLA.value):
        model["softmax_type"] = softmax
    if read.switch("qk-layernorm"):
        model["qk_layernorm"] = True


def read_moe_parallel(read: FlagReader, parallel: dict[str, Any]) -> None:
    """`parallel.ep` / `etp` (Megatron's default etp is tp, the scenario's null)."""
    if (ep := read.integer("expert-model-parallel-size")) is not None and ep != 1:
        parallel["ep"] = ep
    if (etp := read.integer("expert-tensor-parallel-size")) is not None:
        parallel["etp"] = etp


# `--moe-router-fusion`, `--moe-permute-fusion` (store_true; transformer_config.py, Megatron-LM
# @d7288711ba278d160d2a5a22c099915c9fe1395c)
_FUSION_FLAGS = {"moe_router_fusion": "moe-router-fusion", "moe_permute_fusion": "moe-permute-fusion"}


def read_moe_training(read: FlagReader, training: dict[str, Any], is_moe: bool, notes: list[str]) -> None:
    """The dispatcher and grouped GEMM of a MoE line, Megatron's defaults when absent:
    `--moe-enable-deepep` (deprecated) needs `--moe-token-dispatcher-type flex`
    (transformer_config.py `__post_init__` raises otherwise)."""
    dispatcher = read.choice("moe-token-dispatcher-type", _DISPATCHERS)
    deepep = read.switch("moe-enable-deepep")
    grouped = read.switch("moe-grouped-gemm")
    ep_overlap = read.switch("overlap-moe-expert-parallel-comm")
    delay_wgrad = read.switch("delay-wgrad-compute")
    fusions = {key: read.switch(flag) for key, flag in _FUSION_FLAGS.items()}
    if deepep and dispatcher not in (None, "flex"):
        read.problems.append(
            f"--moe-enable-deepep with --moe-token-dispatcher-type {dispatcher}: DeepEP runs under the flex "
            "dispatcher only (Megatron raises); allowed: --moe-token-dispatcher-type flex"
        )
    if not is_moe:
        if dispatcher or deepep or grouped or ep_overlap or delay_wgrad or any(fusions.values()):
            notes.append(
                "MoE dispatcher / grouped-GEMM / fusion flags without --num-experts: no effect "
                "(a dense model)"
            )
        return
    training.update({key: True for key, fused in fusions.items() if fused})  # Megatron's default: off
    if dispatcher is None and deepep:
        dispatcher = "flex"
    elif dispatcher is None:
        dispatcher = "allgather"
        notes.append(
            "training.moe_token_dispatcher = allgather: no --moe-token-dispatcher-type (Megatron's default)"
        )
    training["moe_token_dispatcher"] = dispatcher
    training["moe_grouped_gemm"] = grouped  # Megatron's default: off (SequentialMLP)
    _read_flex_backend(read, training, dispatcher, deepep)
    if ep_overlap:
        training["overlap_moe_expert_parallel_comm"] = True
    if delay_wgrad:
        training["delay_wgrad_compute"] = True


def _read_flex_backend(read: FlagReader, training: dict[str, Any], dispatcher: str, deepep: bool) -> None:
    """`--moe-flex-dispatcher-backend` (Megatron's default deepep). Megatron-core raises on
    `--moe-enable-deepep` with hybridep ("Only one backend is supported for flex token
    dispatcher", transformer_config.py `__post_init__`); ncclep has no model here."""
    backend = read.choice("moe-flex-dispatcher-backend", _FLEX_BACKENDS)
    if backend is None or backend == "deepep":
        return
    if deepep:
        read.problems.append(
            "--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep: Megatron-core allows one flex "
            "backend (it raises); allowed: drop --moe-enable-deepep"
        )
    if dispatcher == "flex":
        training["moe_flex_dispatcher_backend"] = backend


def read_recompute_modules(read: FlagReader, recompute: str, demoted: dict[str, str]) -> list[str] | None:
    """`--recompute-modules` under selective recompute (else None, as Megatron ignores it),
    with `moe` added by the deprecated `--moe-layer-recompute` (transformer_config.py
    `__post_init__`). Modules Megatron allows but simcluster has no layer for are dropped
    and the flag is not modelled; any other name is an error listing the allowed ones."""
    modules = read.values("recompute-modules")
    layer = read.has("moe-layer-recompute")
    if recompute != "selective" or (modules is None and not layer):
        return None
    names = list(modules if modules is not None else [RecomputeModule.CORE_ATTN.value])
    if layer and RecomputeModule.MOE.value not in names:
        names.append(RecomputeModule.MOE.value)
    known = {module.value for module in RecomputeModule}
    allowed = (*known, *UNMODELLED_RECOMPUTE_MODULES)
    if wrong := [name for name in names if name not in allowed]:
        read.problems.append(
            f"--recompute-modules: value {' '.join(wrong)}: allowed: {', '.join(sorted(allowed))}"
        )
        return None
    if dropped := [name for name in names if name not in known]:
        demoted["recompute-modules"] = f"recompute of {', '.join(dropped)} (no such layer in simcluster)"
    return [name for name in names if name in known]
