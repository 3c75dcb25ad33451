"""The quantized experts' row padding: Transformer Engine's `Fp8Padding` / `Fp8Unpadding`
around the grouped expert GEMMs, where the dispatcher has not already aligned the rows.

A quantized grouped GEMM needs each local expert's rows in a multiple of the recipe's
alignment (TE pytorch/quantization.py `get_align_size_for_quantization`, TransformerEngine
@d0067d0da: 32 for MXFP8, 128 for NVFP4, 16 otherwise). Megatron-core's `TEGroupedMLP.forward`
(megatron/core/transformer/moe/experts.py, Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c,
the Megatron-Bridge v0.4.0 pin; in the file since "Enable FP8 for TEGroupedMLP", 2024-10-29)
does, with FP8 or FP4:

    permuted_local_hidden_states, m_splits = self.quantization_padding(hidden, m_splits)
    permuted_probs, _ = self.quantization_padding(probs.unsqueeze(-1), actual_m_splits)
    ... fc1, weighted GLU, fc2 ...
    output = self.quantization_unpadding(output, actual_m_splits)

Each call is one `tex.fused_multi_row_padding` / `fused_multi_row_unpadding` kernel that reads
the rows and writes them at their padded offsets (pytorch/module/fp8_padding.py,
fp8_unpadding.py), unless every split is already aligned (`m_splits == padded_m_splits`: it
returns its input). In backward each is the other: the unpadding's backward pads the output's
gradient, the padding's backward unpads the gradients of the hidden states and of the probs.

When it runs: Hybrid-EP pads in its own dispatch (`_HybridEPManager.dispatch` passes
`pad_multiple`, token_dispatcher.py at the same commit), so its tokens-per-expert arrive
aligned; the alltoall and allgather dispatchers and DeepEP (without
`--moe-router-padding-for-quantization`, which simcluster does not take) hand over the routed
counts as they are, which dropless routing leaves unaligned. With capacity padding
(`pad_to_capacity`) every local expert holds exactly its capacity's rows: padded only if that is
not a multiple of the alignment.

Priced: each op moves its rows once each way (read, write), 2 · rows · width · bytes, the
pad's extra rows (fewer than the alignment per expert) left out; the probs as one column
of activation-sized elements. The kernel is a plain row copy with no profile kind of its own, so
the profile's generic element-wise curve prices it (`costs.compute`); nothing is saved for
backward (its backward needs only the splits). One launch each (`costs.moe_host`).
"""

from __future__ import annotations

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.moe_choices import FlexBackend, TokenDispatcher
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, Op, Pass, elementwise

ALIGN_ROWS = {Fp8Recipe.MXFP8: 32}
"""Rows a quantized grouped GEMM's split is padded to, by FP8 recipe (16 for any other)."""
FP4_ALIGN_ROWS = 128  # NVFP4
DEFAULT_ALIGN_ROWS = 16


def align_rows(cfg: LayerConfig) -> int:
    """TE's `get_align_size_for_quantization` for the layer's recipe (module docstring)."""
    if cfg.dtype is Dtype.FP4:
        return FP4_ALIGN_ROWS
    return ALIGN_ROWS.get(cfg.fp8_recipe, DEFAULT_ALIGN_ROWS)


def experts_padded(
    cfg: LayerConfig, dispatcher: TokenDispatcher, backend: FlexBackend, rows_per_expert: int | None
) -> bool:
    """Whether `TEGroupedMLP` pads the local experts' rows (module docstring): quantized
    experts, a dispatcher that does not align them, and (with capacity padding,
    `rows_per_expert` given) a capacity that is not a multiple of the alignment."""
    if not cfg.dtype.quantized:
        return False
    if dispatcher is TokenDispatcher.FLEX and backend is FlexBackend.HYBRIDEP:
        return False
    if rows_per_expert is not None:
        return rows_per_expert % align_rows(cfg) != 0
    return True


def padding_forward_ops(
    element_bytes: int, rows: float, hidden: int
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(before fc1: the hidden states' and the probs' padding; after fc2: the output's unpadding)."""
    e, F = element_bytes, Pass.FORWARD
    before = (
        _pad("moe.experts.fp8_pad", 2 * e * rows * hidden, F),
        _pad("moe.experts.fp8_pad_probs", 2 * e * rows, F),
    )
    after = (_pad("moe.experts.fp8_unpad", 2 * e * rows * hidden, F),)
    return before, after


def padding_backward_ops(
    element_bytes: int, rows: float, hidden: int
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """(before fc2's backward: the output gradient padded; after fc1's: the hidden states'
    and the probs' gradients unpadded)."""
    e, B = element_bytes, Pass.INPUT_GRAD
    before = (_pad("moe.experts.fp8_unpad.bwd", 2 * e * rows * hidden, B),)
    after = (
        _pad("moe.experts.fp8_pad.bwd", 2 * e * rows * hidden, B),
        _pad("moe.experts.fp8_pad_probs.bwd", 2 * e * rows, B),
    )
    return before, after


def _pad(name: str, bytes_moved: float, pass_: Pass) -> Op:
    return elementwise(name, bytes_moved, module=Module.EXPERT_FP8_PADDING, pass_=pass_)
