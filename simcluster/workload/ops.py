"""The op vocabulary of the workload model: GEMMs, memory-bound kernels and collectives.

Each op carries what the cost model needs (FLOPs, bytes moved through HBM, message bytes)
and what the memory model needs (bytes it keeps for backward). Nothing here knows about
hardware or time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from simcluster.config.choices import AttentionKernel, SoftmaxType
from simcluster.config.moe_choices import FlexBackend


class OpKind(enum.Enum):
    GEMM = "gemm"
    ELEMENTWISE = "elementwise"
    COLLECTIVE = "collective"
    ATTENTION = "attention"  # one fused flash-attention kernel (priced from its achieved TFLOP/s)


class Module(enum.Enum):
    """The part of the model an op belongs to, at the grain the simulator tells ops apart:
    pricing (each memory-bound kind has its own curve, `costs.compute.elementwise_kind`),
    reporting (`costs.op_kind`), FP8 (which GEMMs are Transformer Engine linears,
    `workload.fp8`), recompute and the profiler's benchmarks. A collective belongs to the
    linear whose input or output it gathers or reduces (Megatron's column- / row-parallel
    layers own their f / g conjugates). Values are stable words, not the ops' names (those
    stay for traces and calibration records: `Op.name`)."""

    EMBEDDING = "embedding"  # the vocab-parallel lookup, its conjugate and its grad scatter-add
    EMBEDDING_DROPOUT = "embedding_dropout"
    LAYERNORM = "layernorm"  # ln1, ln2 and the final norm (LayerNorm or RMSNorm: one kind of kernel)
    RESIDUAL_GRAD_ADD = "residual_grad_add"  # a block's backward adds its grad to the residual's
    QKV = "qkv"  # the fused QKV projection (a TE linear)
    ROPE = "rope"
    QK_NORM = "qk_norm"  # --qk-layernorm: the query and key heads' norms ...
    KEY_COPY = "key_copy"  # ... and the key's contiguous copy before its norm
    QUERY_COPY = "query_copy"  # the query heads' copy out of the strided QKV split (`layer._query_copy`)
    VALUE_COPY = "value_copy"  # TE `get_qkv_layout`'s contiguous copy of V (`layer._value_copy`)
    QKV_GRAD_CONCAT = "qkv_grad_concat"  # the QKV split's backward `torch.cat` of dq, dk, dv
    KV_REPEAT = "kv_repeat"  # GQA's K/V head repeat in the unfused core
    FLASH = "flash"  # the fused attention core (one kernel each way, or the CP ring)
    QK = "qk"  # the unfused core: QKᵀ (batched GEMM) ...
    SOFTMAX = "softmax"  # ... fused scale-mask-softmax ...
    ATTENTION_DROPOUT = "attention_dropout"  # ... dropout on the probabilities ...
    AV = "av"  # ... probabilities × V ...
    CONTEXT_COPY = "context_copy"  # ... and the context's permute to [s, b, q/t]
    PROJ = "proj"  # the attention's output projection (a TE linear)
    BIAS_DROPOUT_ADD = "bias_dropout_add"
    FC1 = "fc1"  # the MLP's first linear (a TE linear)
    BIAS_GELU = "bias_gelu"
    SWIGLU = "swiglu"
    SQUARED_RELU = "squared_relu"
    FC2 = "fc2"  # the MLP's second linear (a TE linear)
    LOGITS = "logits"  # the output layer's GEMM against the (tied) embedding weight
    CROSS_ENTROPY = "cross_entropy"  # vocab-parallel cross-entropy and its two all-reduces
    FP8_AMAX = "amax"  # FP8 current scaling's amax pass (and its all-reduce)
    FP8_SCALE = "fp8_scale"  # ... and its scale computation
    ROUTER = "router"  # MoE: the router's gating GEMM (weight replicated on every rank)
    ROUTER_TOPK = "router_topk"  # ... and its top-k with the score function (softmax / sigmoid)
    ROUTER_AUX_LOSS = "aux_loss"  # ... its load-balancing loss (and the counts' all-reduce)
    ROUTER_Z_LOSS = "z_loss"  # ... and its z-loss on the logits
    MOE_PERMUTE = "permute"  # the dispatcher's permute of the routed rows (and its all-to-all)
    MOE_SORT_CHUNKS = "sort_chunks"  # received rows sorted by local expert, and back
    EXPERT_FP8_PADDING = "fp8_padding"  # TE Fp8Padding / Fp8Unpadding around quantized experts
    EXPERT_FC1 = "expert_fc1"  # the routed experts' grouped fc1 (TE GroupedLinear); their
    EXPERT_FC2 = "expert_fc2"  # weighted SwiGLU is a SWIGLU kernel; the grouped fc2
    GLU_CLAMP = "glu_clamp"  # gpt-oss: the eager clamps of the experts' GLU input (and their cat)
    EXPERT_BIAS = "expert_bias"  # gpt-oss: the experts' fc2 bias, added per local expert in eager PyTorch
    MOE_UNPERMUTE = "unpermute"  # the combine's all-to-all and the scatter-add back to [T, h]
    MOE_INPUT_GRAD_ADD = "input_grad_add"  # autograd's sum of the block input's gradients
    SHARED_FC1 = "shared_fc1"  # the shared experts' fc1 (tensor-parallel like the dense MLP)
    SHARED_FC2 = "shared_fc2"  # the shared experts' fc2
    MLA_DOWN = "mla_down"  # MLA: the duplicated q / kv down projections (TE linears, not split)
    MLA_UP = "mla_up"  # MLA: the column-parallel q / kv up projections (latent norms fused in)
    MLA_Q_PROJ = "mla_q_proj"  # MLA without a q latent: the column-parallel q projection of ln1's output
    MTP_EH_PROJ = "mtp_eh_proj"  # multi-token prediction: eh_proj 2h -> h (column-parallel)
    STANDIN_ALL_GATHER = "standin_all_gather"  # calibration: the one-GPU stand-in's copies
    STANDIN_REDUCE_SCATTER = "standin_reduce_scatter"  # for collectives (`calibration.shapes`)


class Pass(enum.Enum):
    """Which pass an op runs in: the forward (also when recompute re-runs it in the
    backward), the input-gradient backward (B) or the weight-gradient backward (W)."""

    FORWARD = "forward"
    INPUT_GRAD = "input_grad"
    WEIGHT_GRAD = "weight_grad"


class GradOf(enum.Enum):
    """Which input's gradient an input-gradient GEMM computes, where a module's batched GEMM
    has two inputs (the unfused core: Q and K of QKᵀ, the probabilities and V of ×V)."""

    Q = "q"
    K = "k"
    PROBS = "probs"
    V = "v"


class CollectiveKind(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"  # MoE dispatch / combine: `message_bytes` is the busiest rank's buffer


class CommGroup(enum.Enum):
    """Which communicator a layer's collective runs over (Megatron-core parallel_state.py
    groups): the tensor-parallel group (every dense collective), or under MoE parallel
    folding the expert-parallel group (ep ranks, stride etp), the expert-tensor-parallel
    group (etp consecutive ranks) or both together (etp·ep consecutive). The pricing maps
    each to a `GroupPlacement` (`costs.placement.expert_groups`). The router's
    load-balancing loss all-reduces its token counts over tp·cp (`TP_CP`: aux_loss,
    seq_aux_loss) or tp·cp·dp (`TP_DP_CP`: global_aux_loss), router.py `tp_cp_group` /
    `tp_dp_cp_group`."""

    TP = "tp"
    EP = "ep"
    ETP = "etp"
    ETP_EP = "etp_ep"
    TP_CP = "tp_cp"
    TP_DP_CP = "tp_dp_cp"


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] (+)= A[m, k] · B[k, n], `batch` times. `accumulate_fp32` marks a weight-grad
    GEMM that accumulates into Megatron's fp32 main_grad (reads and writes C in fp32)."""

    m: int
    n: int
    k: int
    batch: int = 1
    accumulate_fp32: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def bytes_moved(self, element_bytes: int) -> float:
        """Fewest HBM bytes: read A and B once, write C once (read+write in fp32 if accumulating)."""
        inputs = element_bytes * (self.m * self.k + self.k * self.n)
        output = (8 if self.accumulate_fp32 else element_bytes) * self.m * self.n
        return float(self.batch * (inputs + output))


FLASH_BACKWARD_FLOP_RATIO = 2.5
"""Flash-attention backward FLOPs over forward FLOPs: five GEMMs (QKᵀ recomputed, dV, dP,
dQ, dK) against two (flash-attention `benchmarks/benchmark_flash_attention.py::flops`;
docs/cost_model.md). The profile's backward TFLOP/s are measured under this convention."""


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One fused (flash) attention kernel call on one rank, one direction.

    `batch` sequences × `heads` query heads of `head_dim`, each query head reading one of
    `kv_heads` key/value heads (GQA), `seq_q` queries against `seq_k` keys. Context
    parallelism calls it with seq_q = s/c (or a 1/(2c) chunk) and seq_k = the keys one ring
    step brings; without it seq_q = seq_k = s. A causal mask is bottom-right aligned (query i
    of seq_q sees keys up to seq_k - seq_q + i, flash-attention ≥ 2.1), so a rank-local
    causal chunk with seq_q = seq_k does half the work (flash-attention `hopper/benchmark_attn.py::flops`).
    """

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool
    backward: bool = False
    kernel: AttentionKernel = AttentionKernel.AUTO  # which library's kernels: prices differ, bytes do not
    # P·V's head dim where it differs from Q·Kᵀ's (MLA: 128 against 192). Out of the repr, which
    # the op-graph digests of tests/workload/room_ops_golden.py hash (they predate the field);
    # still compared and hashed.
    v_head_dim: int | None = field(default=None, repr=False)

    # Megatron --window-size (w, 0) on this layer (TE's window_size): a query sees itself and
    # the w keys before it; None = the whole causal prefix. Only for a causal local call. Left
    # out of the repr so that a shape without a window reads (and digests,
    # tests/workload/room_ops_golden.py) as it did before windows existed.
    window_size: int | None = field(default=None, repr=False)
    # Megatron --softmax-type: a non-vanilla softmax (gpt-oss's learned sinks) runs in TE's cuDNN
    # fused attention, priced at the head dim's rates (`costs.compute`); out of the repr as above.
    softmax_type: SoftmaxType = field(default=SoftmaxType.VANILLA, repr=False)

    def __post_init__(self) -> None:
        if self.window_size is not None and (not self.causal or self.seq_q != self.seq_k):
            raise ValueError(
                f"AttentionShape.window_size={self.window_size} needs a causal call with seq_q == seq_k "
                f"(got causal={self.causal}, seq_q={self.seq_q}, seq_k={self.seq_k})"
            )

    @property
    def visible_fraction(self) -> float:
        """Share of the seq_q × seq_k score matrix a causal mask leaves: 1 - seq_q/(2·seq_k)
        (1/2 at seq_q = seq_k: flash-attention `hopper/benchmark_attn.py` counts s/2), 1 if
        not causal. With a window w the band's area over s², counted as the causal triangle
        is (its area): s·(w + 1) − (w + 1)²/2 while w + 1 < s (`workload.mla.window_score_pairs`,
        which a test holds this to)."""
        if not self.causal:
            return 1.0
        if self.window_size is not None and self.window_size + 1 < self.seq_k:
            s, band = float(self.seq_k), self.window_size + 1.0
            return (s * band - band * band / 2.0) / (s * s)
        return 1.0 - self.seq_q / (2.0 * self.seq_k)

    @property
    def keys_walked(self) -> int:
        """Keys one query block walks, the length the kernel's measured rates are read at
        (`costs.compute.flash_attention_flop_per_s`): seq_k, or w + 1 under a window
        narrower than the sequence."""
        if self.window_size is not None:
            return min(self.seq_k, self.window_size + 1)
        return self.seq_k

    @property
    def forward_flops(self) -> float:
        """QKᵀ and P·V over the visible scores: 4·b·heads·s_q·s_k·d·visible (docs/cost_model.md);
        with a separate V head dim (MLA) 2·b·heads·s_q·s_k·(d + d_v)·visible."""
        if self.v_head_dim is not None:
            pair = 2.0 * self.batch * self.heads * self.seq_q * self.seq_k * (self.head_dim + self.v_head_dim)
            return pair * self.visible_fraction
        dense = 4.0 * self.batch * self.heads * self.seq_q * self.seq_k * self.head_dim
        return dense * self.visible_fraction

    @property
    def flops(self) -> float:
        """This direction's FLOPs under the flash-attention convention: forward, or
        2.5 × forward for the backward (`FLASH_BACKWARD_FLOP_RATIO`). With a separate V head
        dim (MLA) the backward counts its five GEMMs by their own head dims,
        2·b·heads·s_q·s_k·(3·d + 2·d_v)·visible (QKᵀ recomputed, dQ, dK over d; dP, dV over
        d_v), as NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py
        `flops` counts it (mode "bwd": 3 × head_dim_qk + 2 × head_dim_vo): the backward rates
        were measured at d = d_v, where this is 2.5 × forward, so they are rates of these
        five GEMMs' FLOPs; 2.5 × forward would count an MLA backward (d 192, d_v 128) 4 % short."""
        if not self.backward:
            return self.forward_flops
        if self.v_head_dim is None:
            return self.forward_flops * FLASH_BACKWARD_FLOP_RATIO
        pairs = self.batch * self.heads * self.seq_q * self.seq_k * self.visible_fraction
        return 2.0 * pairs * (3.0 * self.head_dim + 2.0 * self.v_head_dim)


@dataclass(frozen=True, slots=True)
class RingAttention:
    """Context-parallel attention, Megatron-core's default `--cp-comm-type p2p` (TE
    `AttnFuncWithCPAndKVP2P`), one direction on one rank of a ring of
    `cp_size`. The local K/V chunk circulates in `cp_size` steps; the transfer bringing step
    i + 1's K/V runs beside step i's attention. With the 2·c-chunk causal load balance
    every step does ½(s/c)² of attention: step 0 is the causal `diagonal` (local Q × local
    K/V); on later steps some ranks compute the `lower` tile (all local Q × the first half of
    the received K/V) and the others the `upper` tile (the second half of Q × all of it), so
    the ring waits for the slower of the two. `message_bytes` is what each step sends: K and
    V forward; K, V and the partial dK, dV backward (the first backward step has no dK/dV
    yet: `first_message_bytes`). `final_message_bytes` is the dK/dV sent home after the last
    backward step (0 forward). `first_merge_bytes` and `merge_bytes` are the HBM bytes of the
    element-wise kernels that fold step 0's and each later step's partial result into the
    rank's output (forward: the softmax-LSE output correction; backward: the dQ and dK/dV
    accumulation), 0 where not counted."""

    cp_size: int
    diagonal: AttentionShape
    lower: AttentionShape
    upper: AttentionShape
    message_bytes: float
    first_message_bytes: float
    final_message_bytes: float = 0.0
    first_merge_bytes: float = 0.0
    merge_bytes: float = 0.0

    @property
    def flops(self) -> float:
        """1/c of the causal attention of the whole sequence, per direction."""
        return self.diagonal.flops + (self.cp_size - 1) * self.lower.flops


@dataclass(frozen=True, slots=True)
class DeepEPMessage:
    """One DeepEP dispatch or combine (the flex token dispatcher) on the busiest rank:
    `send_bytes` leave it for the ep ranks of its group (its own included), and for each
    number of NVLink domains the group could span, the part that crosses domains (RDMA:
    once per destination domain). Which applies depends on the hardware, so the costs pick
    it (`costs.deepep`); `workload.moe_flex.deepep_messages` fills it.

    With the hybridep backend (`backend`) the costs price it as Hybrid-EP's kernel
    (`costs.hybridep`), with the HBM traffic of its own work beside the transfer:
    `preprocess_bytes` (the metadata scan of the gathered routing map, each time a dispatch
    has no cached handle) and `staging_bytes` (the copy of the rank's tokens into the RDMA
    buffer, when the group spans NVLink domains); `workload.moe_flex.hybridep_messages`."""

    ep: int
    send_bytes: float
    internode_bytes: tuple[tuple[int, float], ...]  # (domains spanned, bytes sent to other domains)
    backend: FlexBackend = FlexBackend.DEEPEP
    preprocess_bytes: float = 0.0
    staging_bytes: float = 0.0

    def bytes_across(self, num_domains: int) -> float:
        """The bytes sent to other domains when the group spans `num_domains`; where the
        routing split was not computed for that count (it does not divide the experts),
        every copy to a rank outside the sender's domain: send·(1 − 1/num_domains)."""
        for domains, sent in self.internode_bytes:
            if domains == num_domains:
                return sent
        return self.send_bytes * (1.0 - 1.0 / num_domains) if num_domains > 1 else 0.0


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel (or collective) on one tensor-parallel rank.

    `saved_bytes` is what the op keeps for backward (forward ops only; Korthikanti Table 2
    bookkeeping). `overlaps_next` marks an asynchronous collective that runs while the next
    op computes (Megatron overlaps the input-grad all-reduce / reduce-scatter of a
    column-parallel linear with its weight-grad GEMM). `module` and `pass_` say what the op
    is (`Module`, `Pass`; `grad_of` where a module's input-gradient GEMMs are two): code asks
    them, never the name, which is for people, traces and calibration records.
    """

    name: str
    kind: OpKind
    gemm: GemmShape | None = None
    bytes_moved: float = 0.0
    collective: CollectiveKind | None = None
    message_bytes: float = 0.0
    saved_bytes: float = 0.0
    overlaps_next: bool = False
    attention: AttentionShape | None = None
    ring: RingAttention | None = None
    module: Module = field(kw_only=True)
    pass_: Pass = field(kw_only=True)
    grad_of: GradOf | None = field(default=None, kw_only=True)
    group: CommGroup = field(default=CommGroup.TP, kw_only=True)
    deepep: DeepEPMessage | None = field(default=None, kw_only=True)  # a DeepEP kernel (flex dispatcher)
    # the memory-bound kernel where it is not the module's own: an RMSNorm is Module.LAYERNORM
    # (recompute, memory, reporting) run by the "rmsnorm" kernel (`costs.compute.elementwise_kind`)
    kernel: str | None = field(default=None, kw_only=True)

    @property
    def flops(self) -> float:
        if self.ring is not None:
            return self.ring.flops
        if self.attention is not None:
            return self.attention.flops
        return self.gemm.flops if self.gemm is not None else 0.0


def gemm(
    name: str, shape: GemmShape, saved_bytes: float = 0.0, *, module: Module, pass_: Pass,
    grad_of: GradOf | None = None,
) -> Op:  # fmt: skip
    return Op(
        name=name, kind=OpKind.GEMM, gemm=shape, saved_bytes=saved_bytes, module=module, pass_=pass_,
        grad_of=grad_of,
    )  # fmt: skip


def elementwise(
    name: str,
    bytes_moved: float,
    saved_bytes: float = 0.0,
    *,
    module: Module,
    pass_: Pass,
    kernel: str | None = None,
) -> Op:
    return Op(
        name=name, kind=OpKind.ELEMENTWISE, bytes_moved=bytes_moved, saved_bytes=saved_bytes, module=module,
        pass_=pass_, kernel=kernel,
    )  # fmt: skip


def flash_attention(name: str, shape: AttentionShape, saved_bytes: float = 0.0, *, pass_: Pass) -> Op:
    return Op(
        name=name, kind=OpKind.ATTENTION, attention=shape, saved_bytes=saved_bytes, module=Module.FLASH,
        pass_=pass_,
    )  # fmt: skip


def collective(
    name: str, kind: CollectiveKind, message_bytes: float, overlaps_next: bool = False, *, module: Module,
    pass_: Pass, group: CommGroup = CommGroup.TP,
) -> Op:  # fmt: skip
    """`message_bytes` is the full buffer: all-reduce buffer, all-gather output, reduce-scatter
    input, all-to-all send (or, at the busiest rank, receive) buffer; `group` the communicator."""
    return Op(
        name=name,
        kind=OpKind.COLLECTIVE,
        collective=kind,
        message_bytes=message_bytes,
        overlaps_next=overlaps_next,
        module=module,
        pass_=pass_,
        group=group,
    )
