"""FLOPs, parameters, routed rows and dispatch messages of one MoE MLP block, per rank.

Everything follows Megatron-core's MoE layer as it runs in training
(megatron/core/transformer/moe/, Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553):

- `MoELayer.forward` (moe_layer.py): shared experts on the layer input; the router
  (router.py `TopKRouter`: one gating GEMM [T, h] x [h, E] on the rank's own tokens,
  weight replicated, marked `sequence_parallel`); the dispatcher's preprocess and
  permutation; dispatch; the experts (experts.py `TEGroupedMLP`: grouped fc1, weighted
  activation, grouped fc2, weights split over the expert-tensor-parallel group); combine;
  unpermute; add the shared expert output.
- T, the tokens entering the layer on a rank, is s·b/(cp·tp): the MoE layer takes
  [s/tp, b, h] because Megatron requires sequence parallelism with tp > 1 (moe_layer.py
  `MoELayer.forward`), and context parallelism splits s.
- Routed rows (`routed_rows`): dropless, a rank sends T·k rows (`num_out_tokens =
  routing_map.size(0) * topk`, token_dispatcher.py `MoEAlltoAllTokenDispatcher.preprocess`);
  with a capacity factor each expert keeps at most C = ceil(T·k/E · cf) rows from each
  source rank (moe_utils.py `get_capacity`, `apply_router_token_dropping`), and with
  padding exactly C. The busiest expert rank receives `load_imbalance` times the mean,
  capped by capacity; the expert-tensor-parallel all-gather then multiplies its rows by etp.

Element bytes `e` are the activations' (bf16 = 2); `probs_bytes` is the routing
probabilities' dtype: the logits' (`moe_router_dtype`, default the input dtype: probs are
`type_as(logits)`), 4 with `--moe-router-dtype fp32`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from simcluster.config.moe_choices import TokenDispatcher
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.ops import GemmShape

INDEX_BYTES = 8  # torch.int64 indices (argsort / topk outputs) in Megatron's unfused permute


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """One expert MLP: h -> fc1 (2f gated, f otherwise; TEGroupedMLP doubles
    `moe_ffn_hidden_size` under `gated_linear_unit`) -> activation -> fc2 f -> h, with
    optional biases (gpt-oss: `--add-bias-linear`)."""

    hidden_size: int
    ffn_hidden_size: int
    gated: bool
    bias: bool = False

    @property
    def fc1_width(self) -> int:
        return 2 * self.ffn_hidden_size if self.gated else self.ffn_hidden_size

    @property
    def weights(self) -> int:
        """h·fc1 + f·h (+ fc1 + h biases)."""
        h, f = self.hidden_size, self.ffn_hidden_size
        biases = self.fc1_width + h if self.bias else 0
        return h * self.fc1_width + f * h + biases

    @property
    def forward_flops_per_token(self) -> int:
        """2·(h·fc1 + f·h): 6hf gated, 4hf otherwise (training.py `moe_layer_flops`)."""
        return 2 * (self.hidden_size * self.fc1_width + self.ffn_hidden_size * self.hidden_size)


def expert_shape(hidden_size: int, moe: MoEConfig, gated: bool, bias: bool = False) -> ExpertShape:
    return ExpertShape(hidden_size, moe.ffn_hidden_size, gated, bias)


def shared_expert_shape(hidden_size: int, moe: MoEConfig, gated: bool) -> ExpertShape:
    """The shared experts: one dense MLP of `shared_expert_ffn_hidden_size` (shared_experts.py
    `SharedExpertMLP` sets `ffn_hidden_size = moe_shared_expert_intermediate_size`; bias not
    supported there)."""
    return ExpertShape(hidden_size, moe.shared_expert_ffn_hidden_size, gated, False)


@dataclass(frozen=True, slots=True)
class MoEParams:
    """Parameters of one MoE MLP block: routed experts (all E, and the k a token uses),
    shared experts, router (E·h weight, + E bias)."""

    routed: int
    routed_active: int
    shared: int
    router: int

    @property
    def total(self) -> int:
        return self.routed + self.shared + self.router

    @property
    def active(self) -> int:
        """What one token's forward multiplies by: k experts, shared experts, router."""
        return self.routed_active + self.shared + self.router


def moe_params(hidden_size: int, moe: MoEConfig, gated: bool, expert_bias: bool = False) -> MoEParams:
    one = expert_shape(hidden_size, moe, gated, expert_bias).weights
    shared = shared_expert_shape(hidden_size, moe, gated).weights if moe.shared_expert_ffn_hidden_size else 0
    router = moe.num_experts * hidden_size + (moe.num_experts if moe.router_bias else 0)
    return MoEParams(moe.num_experts * one, moe.router_topk * one, shared, router)


def moe_forward_flops(num_tokens: float, hidden_size: int, moe: MoEConfig, gated: bool) -> float:
    """Forward FLOPs of the block over `num_tokens` tokens (whole model, no parallel split):
    router 2·T·h·E + routed k·T·2h·(fc1 + f) + shared T·2h·(fc1_s + f_s). Megatron's MFU count
    (training.py `num_floating_point_operations`) has the last two and not the router."""
    router = 2.0 * num_tokens * hidden_size * moe.num_experts
    routed = num_tokens * moe.router_topk * expert_shape(hidden_size, moe, gated).forward_flops_per_token
    shared = num_tokens * shared_expert_shape(hidden_size, moe, gated).forward_flops_per_token
    return router + routed + shared


def local_tokens(seq_length: int, micro_batch_size: int, layout: ExpertLayout) -> float:
    """T = s·b/(cp·tp): the tokens a rank routes (the MoE layer's input is sequence-parallel)."""
    return seq_length * micro_batch_size / (layout.cp * layout.tp)


def expert_capacity(tokens: float, moe: MoEConfig) -> int | None:
    """C = ceil(T·k/E · cf) rows per expert from one source rank (moe_utils.py `get_capacity`
    with num_tokens = T·k, as `apply_router_token_dropping` and the alltoall preprocess call
    it); None when dropless."""
    if moe.capacity_factor is None:
        return None
    return math.ceil(tokens * moe.router_topk / moe.num_experts * moe.capacity_factor)


@dataclass(frozen=True, slots=True)
class RoutedRows:
    """Rows of hidden size on one rank, per microbatch and MoE layer.

    `tokens` T enter the layer; `sent` rows leave the permutation into the dispatch (mean
    rank); `received` rows arrive over the EP group at the mean / `busiest_received` at the
    busiest expert rank; `expert`/`busiest_expert` rows enter that rank's grouped GEMMs
    after the expert-tensor-parallel all-gather (x etp). `capacity` per expert and source."""

    tokens: float
    sent: float
    received: float
    busiest_received: float
    expert: float
    busiest_expert: float
    capacity: int | None


def routed_rows(seq_length: int, micro_batch_size: int, moe: MoEConfig, layout: ExpertLayout) -> RoutedRows:
    """Dropless: sent = received = T·k, busiest = load_imbalance·T·k. Capacity (not padded):
    each expert keeps min(load, C) rows from each source, so sent = min(T·k, C·E) and the
    busiest rank receives min(li·T·k, C·E). Padded to capacity: exactly C·E everywhere
    (token_dispatcher.py `preprocess` under `drop_and_pad`: `num_out_tokens = capacity *
    num_experts`, every local expert `capacity * tp_size * ep_size`)."""
    t = local_tokens(seq_length, micro_batch_size, layout)
    k, li, etp = moe.router_topk, moe.load_imbalance, layout.expert_tp
    cap = expert_capacity(t, moe)
    if cap is None:
        sent, busiest = t * k, li * t * k
    elif moe.pad_to_capacity:
        sent = busiest = float(cap * moe.num_experts)
    else:
        sent, busiest = min(t * k, cap * moe.num_experts), min(li * t * k, cap * moe.num_experts)
    return RoutedRows(t, sent, sent, busiest, sent * etp, busiest * etp, cap)


@dataclass(frozen=True, slots=True)
class MoERankFlops:
    """Forward FLOPs of the block on one rank (busiest expert rank for the experts)."""

    router: float
    experts: float
    shared: float

    @property
    def total(self) -> float:
        return self.router + self.experts + self.shared


def rank_forward_flops(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    gated: bool,
    busiest: bool = True,
) -> MoERankFlops:
    """Router 2·T·h·E on the rank's T tokens (replicated weight); experts 2·rows·h·(fc1 + f)/etp
    (fc1 and fc2 split over etp); shared experts tensor-parallel over tp on the s·b/cp tokens
    gathered by sequence parallelism: 2·(T·tp)·h·(fc1_s + f_s)/tp. Backward is twice each."""
    h = hidden_size
    expert_rows = rows.busiest_expert if busiest else rows.expert
    per_row = expert_shape(h, moe, gated).forward_flops_per_token / layout.expert_tp
    shared = rows.tokens * shared_expert_shape(h, moe, gated).forward_flops_per_token
    return MoERankFlops(2.0 * rows.tokens * h * moe.num_experts, expert_rows * per_row, shared)


def expert_gemms(
    rows: RoutedRows, hidden_size: int, moe: MoEConfig, layout: ExpertLayout, gated: bool
) -> tuple[GemmShape, GemmShape]:
    """The busiest rank's forward grouped GEMMs as `batch` = E/ep equal GEMMs (fc1, fc2),
    each of busiest_expert·ep/E rows: the small per-expert shapes the cost model prices."""
    local = moe.num_experts // layout.ep
    m = max(round(rows.busiest_expert / local), 1)
    shape = expert_shape(hidden_size, moe, gated)
    fc1 = GemmShape(m=m, n=shape.fc1_width // layout.expert_tp, k=hidden_size, batch=local)
    fc2 = GemmShape(m=m, n=hidden_size, k=moe.ffn_hidden_size // layout.expert_tp, batch=local)
    return fc1, fc2


class MessageKind(enum.Enum):
    ALL_TO_ALL = "all_to_all"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"


class ExpertGroup(enum.Enum):
    """Megatron's process groups the dispatch runs on (parallel_state.py)."""

    EP = "ep"  # expert model parallel: ep ranks, stride etp
    ETP = "etp"  # expert tensor parallel: etp consecutive ranks
    ETP_EP = "etp_ep"  # expert tensor x model parallel: etp·ep consecutive ranks


@dataclass(frozen=True, slots=True)
class DispatchMessage:
    """One collective of the forward dispatch / combine on one rank. `send_bytes` is what the
    mean rank puts in (all-to-all: its whole send buffer, 1/size of it to itself;
    all-gather: the output buffer; reduce-scatter: the input buffer, the repository's
    convention in workload/ops.py); `busiest_bytes` the same at the busiest expert rank
    (all-to-all: what it receives). Each backward runs the mirror collective with the same
    bytes (all-to-all <-> all-to-all, all-gather <-> reduce-scatter)."""

    name: str
    kind: MessageKind
    group: ExpertGroup
    group_size: int
    send_bytes: float
    busiest_bytes: float


def dispatch_messages(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    dispatcher: TokenDispatcher,
    element_bytes: int = 2,
    probs_bytes: int = 2,
) -> tuple[DispatchMessage, ...]:
    """The forward collectives of one MoE layer (`dispatcher` alltoall or allgather)."""
    if dispatcher is TokenDispatcher.ALLTOALL:
        return _alltoall_messages(rows, hidden_size, moe, layout, element_bytes, probs_bytes)
    if dispatcher is TokenDispatcher.ALLGATHER:
        return _allgather_messages(rows, hidden_size, moe, layout, element_bytes, probs_bytes)
    raise ValueError(
        f"training.moe_token_dispatcher={dispatcher.value}: this function models alltoall and "
        "allgather; flex (DeepEP) is workload.moe_flex.flex_messages"
    )


def _alltoall_messages(
    rows: RoutedRows, h: int, moe: MoEConfig, layout: ExpertLayout, e: int, pb: int
) -> tuple[DispatchMessage, ...]:
    """token_dispatcher.py `MoEAlltoAllTokenDispatcher`: preprocess all-gathers each rank's
    tokens-per-expert counts (E int64) over etp·ep; token_dispatch sends the permuted
    tokens and their probs over EP (`all_to_all(self.ep_group, ...)`); dispatch_postprocess
    all-gathers them over etp; combine_preprocess reduce-scatters the expert output over etp
    in the probs' dtype (`hidden_states.to(self.probs.dtype)`); token_combine sends it back
    over EP. With ep = etp = 1 nothing is sent (`if self.ep_size > 1 or self.tp_size > 1`)."""
    ep, etp = layout.ep, layout.expert_tp
    if ep == 1 and etp == 1:
        return ()
    A2A, AG, RS = MessageKind.ALL_TO_ALL, MessageKind.ALL_GATHER, MessageKind.REDUCE_SCATTER
    counts = float(moe.num_experts * INDEX_BYTES * ep * etp)
    out = [DispatchMessage("moe.tokens_per_expert", AG, ExpertGroup.ETP_EP, ep * etp, counts, counts)]
    if ep > 1:
        out += [
            DispatchMessage(
                "moe.dispatch", A2A, ExpertGroup.EP, ep, rows.sent * h * e, rows.busiest_received * h * e
            ),
            DispatchMessage(
                "moe.dispatch_probs", A2A, ExpertGroup.EP, ep, rows.sent * pb, rows.busiest_received * pb
            ),
        ]
    if etp > 1:
        out += [
            DispatchMessage(
                "moe.dispatch_etp", AG, ExpertGroup.ETP, etp, rows.expert * h * e, rows.busiest_expert * h * e
            ),
            DispatchMessage(
                "moe.dispatch_probs_etp", AG, ExpertGroup.ETP, etp, rows.expert * pb, rows.busiest_expert * pb
            ),
            DispatchMessage(
                "moe.combine_etp",
                RS,
                ExpertGroup.ETP,
                etp,
                rows.expert * h * pb,
                rows.busiest_expert * h * pb,
            ),
        ]
    if ep > 1:
        out.append(
            DispatchMessage(
                "moe.combine", A2A, ExpertGroup.EP, ep, rows.received * h * e, rows.busiest_received * h * e
            )
        )
    return tuple(out)


def _allgather_messages(
    rows: RoutedRows, h: int, moe: MoEConfig, layout: ExpertLayout, e: int, pb: int
) -> tuple[DispatchMessage, ...]:
    """token_dispatcher.py `MoEAllGatherTokenDispatcher`: every rank all-gathers the routing
    map (bool), the probs [T, E] and the tokens [T, h] of the whole etp·ep group
    (`gather_from_sequence_parallel_region(..., group=self.tp_ep_group)`), keeps the rows of
    its own experts, and reduce-scatters the [T·etp·ep, h] result in the probs' dtype.
    Every rank moves the same bytes: load imbalance changes the GEMM rows, not these."""
    n = layout.ep * layout.expert_tp
    if n == 1:
        return ()
    AG, RS = MessageKind.ALL_GATHER, MessageKind.REDUCE_SCATTER
    gathered = rows.tokens * n
    E = moe.num_experts
    parts = (
        ("moe.routing_map_allgather", AG, gathered * E * 1),
        ("moe.probs_allgather", AG, gathered * E * pb),
        ("moe.dispatch_allgather", AG, gathered * h * e),
        ("moe.combine_reduce_scatter", RS, gathered * h * pb),
    )
    return tuple(DispatchMessage(name, kind, ExpertGroup.ETP_EP, n, b, b) for name, kind, b in parts)


@dataclass(frozen=True, slots=True)
class PermuteBytes:
    """HBM bytes of the memory-bound kernels around the dispatch, forward, fewest bytes
    (read each input once, write each output once): permute (index_select of the sent
    rows and their probs), sort_chunks by local expert (only when a rank holds several
    experts and tokens come from several ranks), unpermute (read the returned rows, write
    the [T, h] output; scatter_add into zeros)."""

    permute: float
    sort_chunks: float
    unpermute: float

    @property
    def total(self) -> float:
        return self.permute + 2 * self.sort_chunks + self.unpermute


def permute_bytes(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    element_bytes: int = 2,
    probs_bytes: int = 2,
    busiest: bool = True,
    dispatcher: TokenDispatcher = TokenDispatcher.ALLTOALL,
) -> PermuteBytes:
    """alltoall: permute 2·R·(h·e + pb); sort_chunks 2·Re·(h·e) once each way of the experts
    (dispatch postprocess and combine preprocess, `sort_chunks_by_idxs`); unpermute
    (R + T)·h·e. R = sent rows, Re = expert rows at the (busiest) rank. allgather (after
    the gather of n = etp·ep ranks' tokens): permute the local experts' Re rows 2·Re·h·e
    and `masked_select` their probs from [E/ep, T·n] (read probs and mask, write Re·pb);
    no chunk sort; unpermute back to the gathered [T·n, h], (Re + T·n)·h·e."""
    h, e = hidden_size, element_bytes
    sent, expert = rows.sent, rows.busiest_expert if busiest else rows.expert
    local_experts = moe.num_experts // layout.ep
    if dispatcher is TokenDispatcher.ALLGATHER:
        gathered = rows.tokens * layout.ep * layout.expert_tp
        select = local_experts * gathered * (probs_bytes + 1) + expert * probs_bytes
        return PermuteBytes(2.0 * expert * h * e + select, 0.0, (expert + gathered) * h * e)
    sorts = local_experts > 1
    return PermuteBytes(
        permute=2.0 * sent * (h * e + probs_bytes),
        sort_chunks=2.0 * expert * h * e if sorts else 0.0,
        unpermute=(sent + rows.tokens) * h * e,
    )
