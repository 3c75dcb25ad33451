"""FLOP counts per iteration (Korthikanti Appendix A; Narayanan et al. 2021 Eq. 3), for the
model as configured.

Megatron's count, generalised to the layer's widths: a layer's forward does one GEMM per
linear weight (2 FLOPs per weight element per token) and the attention core's two batched
GEMMs, QKᵀ and attention × V (2·B·s²·width each):

    layer forward  = 2Bs · linear_weights + 4Bs² · attention_width
                   = 8Bsh² + 4Bs²h + 4Bsh·ffn            (QKV 3h², projection h², MLP 2h·ffn)
    logits         = 2BshV
    model FLOPs    = 3 · (L · layer forward + logits)     (backward = 2 × forward)

With ffn = 4h this is Eq. 7, 72BsLh²(1 + s/(6h) + v/(12hL)). Hardware FLOPs add what
recomputation re-runs: full recompute one layer forward per layer (Narayanan Eq. 3,
96BsLh²(1 + s/(6h) + v/(16hL)) at ffn = 4h); selective recompute the attention core's
forward, 4Bs²h per layer. Eq. 8 adds 12Bs²h instead (three times what the re-run costs,
see docs/cost_model.md), so its HFU can exceed 1 for long sequences; `paper_hardware_flops`
keeps Eq. 8 for comparison with Table 5's HFU column, which follows it.

The sums are written in the papers' factored form, 72·B·s·L·h²·(a + b + c) with each
ratio an int / int (Python rounds that division correctly), so at ffn = 4h every ratio
is the float of the paper's ratio and the results equal Eq. 7 / Eq. 8 / Narayanan Eq. 3
bit for bit (a test checks): Table 5 does not move.

B is the global batch. The time model prices the op graph's FLOPs instead; these are the
numbers MFU and HFU are reported with.

GQA and gated MLPs follow Megatron-core's `num_floating_point_operations`
(megatron/training/training.py): QKV h·(q + 2k), projection q·h, MLP
glu·h·f with glu = 3 for SwiGLU (fc1 2f wide) and 2 otherwise, attention core width q.
The attention core is NOT halved for the causal mask: 12·B·s²·L·q per iteration, the
convention of Megatron-core core_v0.11 and earlier (and of Eq. 7, so Table 5's MFU does
not move). Megatron-core core_v0.12 onward (commit 8873b55d6a) counts 6·B·s²·L·q; to
convert, subtract 6·B·s²·L·q from `model_flops` (TFLOP/s and MFU scale by the same ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.choices import Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.layer_config import LayerConfig


@dataclass(frozen=True, slots=True)
class LayerWidths:
    """The widths one transformer layer's FLOPs depend on (all of the full model, not a
    tensor-parallel shard): h, f, and Megatron-core's q = a·d_h and k = g·d_h (0 = h, the
    paper's layer) and whether the MLP is gated (SwiGLU)."""

    hidden_size: int
    ffn_hidden_size: int
    query_width: int = 0
    kv_width: int = 0
    gated: bool = False

    @property
    def linear_weights(self) -> int:
        """Weight elements of the layer's linears: QKV h·(q + 2k), projection q·h, MLP
        glu·h·ffn (glu 3 gated, else 2); 4h² + 2h·ffn for the paper's layer."""
        h = self.hidden_size
        q, k = self.query_width or h, self.kv_width or h
        glu = 3 if self.gated else 2
        return h * (q + 2 * k) + q * h + glu * h * self.ffn_hidden_size

    @property
    def attention_width(self) -> int:
        """Width of the attention core's GEMMs (QKᵀ contracts over it, A·V produces it): q."""
        return self.query_width or self.hidden_size


def layer_widths(cfg: LayerConfig) -> LayerWidths:
    """The FLOP widths of a layer as configured (full model, before the t split)."""
    return LayerWidths(
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.ffn_hidden_size,
        query_width=cfg.query_width,
        kv_width=cfg.kv_width,
        gated=cfg.activation.gated,
    )


def layer_forward_flops(B: int, s: int, widths: LayerWidths) -> int:
    """2Bs · linear weights + 4Bs² · attention width (8Bsh² + 4Bs²h + 4Bsh·ffn)."""
    return 2 * B * s * widths.linear_weights + 4 * B * s * s * widths.attention_width


def _factored(
    prefactor: float,
    B: int,
    s: int,
    L: int,
    v: int,
    widths: LayerWidths,
    attention: tuple[int, int],
    logits: int,
) -> float:
    """prefactor·B·s·L·h²·(linear/(12h²) + n·s·width/(d·h²) + v/(logits·h·L)), (n, d) = attention.

    Each ratio is an int / int, so with linear = 12h² and width = h they are the floats of
    the papers' 1, s/(6h) (or s/(3h)) and v/(12hL) (or v/(16hL)).
    """
    h = widths.hidden_size
    n, d = attention
    linear_part = widths.linear_weights / (12 * h * h)
    attention_part = n * s * widths.attention_width / (d * h * h)
    return prefactor * B * s * L * h * h * (linear_part + attention_part + v / (logits * h * L))


def model_flops(B: int, s: int, L: int, v: int, widths: LayerWidths) -> float:
    """3 · (L · layer forward + 2BshV); Eq. 7, 72BsLh²(1 + s/(6h) + v/(12hL)), at ffn = 4h."""
    return _factored(72.0, B, s, L, v, widths, (1, 6), 12)


def custom_modules(recompute: Recompute, modules: frozenset[RecomputeModule] | None) -> bool:
    """Selective recompute with `--recompute-modules` other than Megatron's default [core_attn]
    (None is the default)."""
    return recompute is Recompute.SELECTIVE and modules is not None and modules != {RecomputeModule.CORE_ATTN}


def selective_rerun_flops(B: int, s: int, widths: LayerWidths, modules: frozenset[RecomputeModule]) -> float:
    """GEMM FLOPs one dense layer re-runs under selective recompute of `modules`: the
    attention core's forward 4Bs²·width with `core_attn`, the MLP's 2Bs·glu·h·ffn with `mlp`
    (`layernorm` re-runs no GEMM; the MoE modules act on MoE layers, `workload.moe_mfu`)."""
    glu = 3 if widths.gated else 2
    core = 4 * B * s * s * widths.attention_width if RecomputeModule.CORE_ATTN in modules else 0
    mlp = (
        2 * B * s * glu * widths.hidden_size * widths.ffn_hidden_size if RecomputeModule.MLP in modules else 0
    )
    return float(core + mlp)


def hardware_flops(
    B: int, s: int, L: int, v: int, widths: LayerWidths, recompute: Recompute,
    recompute_modules: frozenset[RecomputeModule] | None = None,
) -> float:  # fmt: skip
    """Model FLOPs plus what recomputation re-runs: full, one layer forward per layer
    (Narayanan Eq. 3: 96BsLh²(1 + s/(6h) + v/(16hL)) at ffn = 4h); selective, the attention
    core's forward 4Bs²·width per layer (72BsLh²(… + 2s/(9h) …)), or with other
    `recompute_modules` what they re-run (`selective_rerun_flops`); none, nothing."""
    if recompute_modules is not None and custom_modules(recompute, recompute_modules):
        return model_flops(B, s, L, v, widths) + L * selective_rerun_flops(B, s, widths, recompute_modules)
    if recompute is Recompute.SELECTIVE:
        return _factored(72.0, B, s, L, v, widths, (2, 9), 12)
    if recompute is Recompute.FULL:
        return _factored(96.0, B, s, L, v, widths, (1, 6), 16)
    return model_flops(B, s, L, v, widths)


def paper_hardware_flops(
    B: int, s: int, L: int, v: int, widths: LayerWidths, recompute: Recompute,
    recompute_modules: frozenset[RecomputeModule] | None = None,
) -> float:  # fmt: skip
    """The paper's hardware FLOPs, which Table 5's HFU column follows: Eq. 8 for selective
    (72BsLh²(1 + s/(3h) + v/(12hL)), counting 12Bs²h per layer for a re-run that costs
    4Bs²h), otherwise (and for `recompute_modules` the paper does not have) `hardware_flops`."""
    if custom_modules(recompute, recompute_modules):
        return hardware_flops(B, s, L, v, widths, recompute, recompute_modules)
    if recompute is Recompute.SELECTIVE:
        return _factored(72.0, B, s, L, v, widths, (1, 3), 12)
    return hardware_flops(B, s, L, v, widths, recompute)


def utilization(flops: float, iteration_time_s: float, num_gpus: int, peak_flop_per_s: float) -> float:
    """MFU / HFU: FLOPs over (time × GPUs × peak)."""
    return flops / (iteration_time_s * num_gpus * peak_flop_per_s)
