"""The grouped expert GEMMs the microbench times (issue 18): the shipped MoE models' expert
shapes over a grid of local experts G and tokens per expert M.

Standard library only (the microbench imports it on a bare GPU machine; the fit and the tests
read it too).

Tokens per local expert on the busiest expert rank, as the op graph sizes the experts'
GEMMs (`workload.moe.routed_rows` and `expert_gemms`, dropless):

    M = load_imbalance · (s·b / (cp·tp)) · topk · ep / E

a rank routes s·b/(cp·tp) tokens (the MoE layer's input is sequence-parallel), topk copies
each; the ep ranks' copies spread over E experts, E/ep = G of them local. The shipped
scenarios (scenarios/moe/, s 4096, b 1, load_imbalance 1): Mixtral 8x7B (tp 1, ep 8) G 1,
M 8192; Qwen3-30B-A3B (tp 1, ep 16) G 8, M 4096; Qwen3-235B-A22B (tp 2, ep 32) G 4, M 4096;
gpt-oss-120B (tp 2, ep 16) G 8, M 1024; DeepSeek-V3 (tp 2, ep 64) G 4, M 4096. Each model's
expert (hidden h, FFN f per expert over etp, gated: fc1 is 2f wide) gives six GEMMs in the op
graph's coordinates (C[m, n] = A[m, k] B[k, n], batch G; `workload.moe_layer`):

    fc1        m M,  n 2f, k h        fc1.dgrad  m M,  n h,  k 2f     fc1.wgrad  m h,  n 2f, k M
    fc2        m M,  n h,  k f        fc2.dgrad  m M,  n f,  k h      fc2.wgrad  m f,  n h,  k M

The grid: every model's six GEMMs at G in `GROUPS` and M in `TOKENS_PER_EXPERT` (octaves
apart by two), with G·M at most `MAX_ROWS` (the rows of one grouped call: the busiest rank's
routed tokens, 32k at the layouts above). That spans M 128 (ep-heavy layouts, short
sequences) to 8192 and G 1 (Mixtral, SequentialMLP's one GEMM per expert) to 16.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.workload.grouped_gemm import GROUPED_KINDS, tokens_per_expert
from simcluster.workload.ops import GemmShape


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """One MoE model's routed expert: hidden size h, FFN width per expert over etp."""

    model: str
    hidden_size: int
    ffn_per_rank: int
    gated: bool = True  # SwiGLU: fc1 is 2·f wide

    @property
    def fc1_width(self) -> int:
        return 2 * self.ffn_per_rank if self.gated else self.ffn_per_rank


EXPERT_SHAPES = (
    ExpertShape("mixtral-8x7b", 4096, 14336),
    ExpertShape("qwen3-30b-a3b", 2048, 768),
    ExpertShape("qwen3-235b-a22b", 4096, 1536),
    ExpertShape("gpt-oss-120b", 2880, 2880),
    ExpertShape("deepseek-v3", 7168, 2048),
)
GROUPS = (1, 4, 8, 16)
TOKENS_PER_EXPERT = (128, 512, 2048, 8192)
MAX_ROWS = 32768

QUICK_SHAPES = (ExpertShape("tiny", 64, 32),)
QUICK_GROUPS = (1, 2)
QUICK_TOKENS = (16, 64)
QUICK_MAX_ROWS = 128


@dataclass(frozen=True, slots=True)
class GroupedShape:
    """One grouped GEMM to time: `kind`, G groups, the op graph's m, n, k per group."""

    kind: str
    groups: int
    m: int
    n: int
    k: int
    model: str = ""

    @property
    def tokens(self) -> int:
        return tokens_per_expert(self.kind, self.m, self.k)

    @property
    def gemm(self) -> GemmShape:
        return GemmShape(self.m, self.n, self.k, self.groups, accumulate_fp32=self.kind.endswith(".wgrad"))

    @property
    def flops(self) -> float:
        return self.gemm.flops


def grouped_shape(kind: str, groups: int, tokens: int, expert: ExpertShape) -> GroupedShape:
    """The op graph's (m, n, k) of `kind` for `expert` at `tokens` per expert (module table)."""
    h, f = expert.hidden_size, expert.ffn_per_rank
    n_in, n_out = (h, expert.fc1_width) if kind.startswith("fc1") else (f, h)  # the weight [out, in]
    if kind.endswith(".wgrad"):
        m, n, k = n_in, n_out, tokens
    elif kind.endswith(".dgrad"):
        m, n, k = tokens, n_in, n_out
    else:
        m, n, k = tokens, n_out, n_in
    return GroupedShape(kind, groups, m, n, k, expert.model)


def grouped_grid(quick: bool = False) -> list[GroupedShape]:
    """Every grouped GEMM to time, model by model, then G, then M, then kind."""
    shapes, groups, tokens, max_rows = (
        (QUICK_SHAPES, QUICK_GROUPS, QUICK_TOKENS, QUICK_MAX_ROWS)
        if quick
        else (EXPERT_SHAPES, GROUPS, TOKENS_PER_EXPERT, MAX_ROWS)
    )
    return [
        grouped_shape(kind, g, m, expert)
        for expert in shapes
        for g in groups
        for m in tokens
        if g * m <= max_rows
        for kind in GROUPED_KINDS
    ]


def busiest_tokens_per_expert(
    seq_length: int,
    micro_batch_size: int,
    router_topk: int,
    num_experts: int,
    ep: int,
    tp: int = 1,
    cp: int = 1,
    load_imbalance: float = 1.0,
) -> float:
    """M = load_imbalance · (s·b / (cp·tp)) · topk · ep / E (module docstring)."""
    return load_imbalance * seq_length * micro_batch_size / (cp * tp) * router_topk * ep / num_experts
