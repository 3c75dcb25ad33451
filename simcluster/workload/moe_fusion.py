"""Bytes of the MoE layer's fused router and fused permutation (`training.moe_router_fusion`,
`training.moe_permute_fusion`): what each Transformer Engine kernel reads and writes in HBM,
and what it keeps for backward, on one rank per microbatch.

Read from the code, not measured (the kernels need CUDA): Megatron-LM
@d7288711ba278d160d2a5a22c099915c9fe1395c `megatron/core/transformer/moe/moe_utils.py`
(`topk_routing_with_score_function(fused=True)`, `permute` / `unpermute` /
`sort_chunks_by_idxs(fused=True)`) and `token_dispatcher.py` (`MoEAlltoAllTokenDispatcher`),
calling TransformerEngine @71bbefbf153418f943640df0f7373625dc93fa46:

* router: `pytorch/router.py` `FusedTopkScoreFunction` ->
  `common/fused_router/fused_topk_with_score_function.cu`. The forward kernel reads the
  logits [T, E] and writes the dense probs [T, E] (the logits' dtype), the bool routing map
  [T, E] and an fp32 "intermediate output" [T, E] (the scores: softmax / sigmoid); the score
  function, the group-limited top-k, the expert bias and the scaling run inside it. It saves
  the routing map and the intermediate for backward (`ctx.save_for_backward`), 5·T·E bytes.
  The backward kernel reads the probs' gradient, the intermediate and the map and writes
  the logits' gradient [T, E].
* permutation: `pytorch/permutation.py` `_moe_permute_mask_map` / `_moe_unpermute_mask_map`
  / `_moe_chunk_sort`, kernels in `common/triton/permutation.py`. `make_row_id_map` builds
  an int32 row_id_map [T, 2E + 1] in three passes (block cumsums of the bool map into the
  first E columns, their global prefix, then the dense map); `_permute_kernel` loads each
  token once and writes it to each of its rows (and gathers the k probs); `_unpermute_kernel`
  reads a token's rows and writes the token; its backward form (probs gradient included)
  writes the probs' gradient as a dense [T, E]. A chunk sort builds an int32 map of its Re
  rows (`make_chunk_sort_map`) and moves the rows (and probs) by it (`sort_chunks_by_map`).

T: the rank's tokens, E experts, k top-k, R the rows it sends, Re the rows its experts
compute, h hidden, e activation bytes, p probs bytes. The row-id map's small reads by the
permute kernels (n_routed and 2 entries per row: (2R + T)·4) are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.workload.moe import RoutedRows
from simcluster.workload.moe_config import ExpertLayout, MoEConfig

INT32_BYTES = 4
FP32_BYTES = 4
BOOL_BYTES = 1


def fused_topk_bytes(tokens: float, num_experts: int, element_bytes: int) -> tuple[float, float]:
    """HBM bytes of `fused_topk_with_score_function_fwd` and `_bwd` (module docstring):
    forward T·E·(e + e + 1 + 4) (logits in; probs, map, fp32 intermediate out), backward
    T·E·(e + 4 + 1 + e) (probs' gradient, intermediate, map in; logits' gradient out)."""
    cells, e = tokens * num_experts, element_bytes
    forward = cells * (e + e + BOOL_BYTES + FP32_BYTES)
    backward = cells * (e + FP32_BYTES + BOOL_BYTES + e)
    return forward, backward


def fused_router_saved_bytes(tokens: float, moe: MoEConfig) -> float:
    """What the fused router keeps for backward: the bool routing map and the fp32
    intermediate, T·E·(1 + 4) (`FusedTopkScoreFunction.forward`), whatever the score function
    or group-limited routing (they run inside the kernel). The capacity factor's token
    dropping (`apply_router_token_dropping`) runs after the fused kernel, unfused either way,
    and keeps its bool mask [T, E] as on the unfused path (`moe_memory.router_saved_bytes`)."""
    cells = tokens * moe.num_experts
    mask = cells * BOOL_BYTES if moe.capacity_factor is not None else 0.0
    return cells * (BOOL_BYTES + FP32_BYTES) + mask


def row_id_map_bytes(tokens: float, num_experts: int) -> float:
    """`make_row_id_map`'s three passes: pass 1 reads the bool map and writes the block
    cumsums T·E·(1 + 4); pass 2 reads and rewrites them T·E·8; pass 3 reads them and writes
    the dense [T, 2E + 1] map, T·E·4 + T·(2E + 1)·4."""
    cells = tokens * num_experts
    return cells * (BOOL_BYTES + 4 * INT32_BYTES) + tokens * (2 * num_experts + 1) * INT32_BYTES


@dataclass(frozen=True, slots=True)
class FusedPermuteBytes:
    """HBM bytes of the alltoall dispatcher's fused permutation kernels, per op of
    `workload.moe_layer` (forward and backward where they differ)."""

    permute: float  # make_row_id_map + _permute_kernel (tokens and probs)
    permute_backward: float  # _unpermute_kernel with the probs' gradient
    unpermute: float  # _unpermute_kernel (no merging probs), its backward the same bytes
    sort_chunks: float  # make_chunk_sort_map + sort_chunks_by_map, each sort, each way


def fused_permute_bytes(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    element_bytes: int = 2,
    probs_bytes: int = 2,
) -> FusedPermuteBytes:
    """The module docstring's kernels for `MoEAlltoAllTokenDispatcher` (`dispatch_preprocess`,
    `dispatch_postprocess`, `combine_preprocess`, `combine_postprocess` with
    `moe_permute_fusion`). Permute: the map, each token read once T·h·e, R rows and their probs
    written R·(h·e + p), the R probs gathered R·p. Its backward: R rows and probs read, T·h·e
    and the dense probs' gradient T·E·p written. Unpermute: (R + T)·h·e, as the unfused
    scatter-add's. Chunk sort (several local experts): Re·h·e read and written, and when not
    padded to capacity (padded chunks move by view and transpose, fused or not) the Re·4 map
    written and read."""
    h, e, p = hidden_size, element_bytes, probs_bytes
    t, r, E = rows.tokens, rows.sent, moe.num_experts
    map_reads = (2 * r + t) * INT32_BYTES
    permute = row_id_map_bytes(t, E) + t * h * e + r * (h * e + p) + r * p + map_reads
    permute_backward = r * (h * e + p) + t * h * e + t * E * p + map_reads
    unpermute = (r + t) * h * e + map_reads
    re = rows.busiest_expert
    sort_chunks = 0.0
    if moe.num_experts // layout.ep > 1:  # as `moe.permute_bytes`'s, plus the fused sort's map
        sort_chunks = 2.0 * re * h * e + (0.0 if moe.pad_to_capacity else 2 * re * INT32_BYTES)
    return FusedPermuteBytes(permute, permute_backward, unpermute, sort_chunks)
