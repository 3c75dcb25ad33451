"""Which of a layer's ops a per-layer CUDA graph captures (`training.cuda_graph_impl` local /
transformer_engine with `training.cuda_graph_scope`, Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553 transformer_layer.py `_te_cuda_graph_capture`,
`_get_submodules_under_cudagraphs`, moe/moe_utils.py `maybe_skip_or_early_return_by_cudagraph`).

A captured op issues nothing; the layer's captured ops are one graph, one launch per pass.
Regions, located by the layer's pre-MLP norm (forward: the last norm before the MLP or the
router; backward: the first norm and its residual-gradient add):

* attn: the ops before the pre-MLP norm (forward), after its backward (backward);
* mlp (dense layer): the pre-MLP norm and the MLP;
* moe_router (MoE layer): the pre-MLP norm, the router GEMM and its top-k, and the shared
  experts (captured with the router when not overlapped with the dispatch, Megatron's default);
* moe_preprocess (with moe_router, the alltoall dispatcher): `preprocess` and the permute
  (the counts' all-gather and the permute op); allgather and flex have no priced op there.

The whole-layer scope ([]) captures a dense layer whole (one launch per pass). A dropless MoE
layer cannot be captured whole (its dispatcher syncs the host, which a capture cannot hold;
Megatron-core allows the `moe` scope only with drop-and-pad routing): under [] it is priced
as attn + moe_router, the partial capture Megatron-core does support (an assumption, see
docs/moe_host.md). Recompute ops are captured with the attention (selective recompute of the
attention core runs in its backward graph) and stay eager in the MoE block.
"""

from __future__ import annotations

from simcluster.config.graph_scope import CudaGraphScope
from simcluster.config.moe_choices import TokenDispatcher
from simcluster.workload.moe_layer import DENSE_MLP_MODULES, MoELayerSpec
from simcluster.workload.ops import Module, Op, OpKind, Pass

_SHARED = frozenset({Module.SHARED_FC1, Module.SHARED_FC2})
_MOE_BLOCK = frozenset(
    {
        Module.ROUTER, Module.ROUTER_TOPK, Module.ROUTER_AUX_LOSS, Module.ROUTER_Z_LOSS,
        Module.MOE_PERMUTE, Module.MOE_SORT_CHUNKS, Module.EXPERT_FC1,
        Module.EXPERT_FC2, Module.MOE_UNPERMUTE, Module.MOE_INPUT_GRAD_ADD, *_SHARED,
    }
)  # fmt: skip
WHOLE_LAYER = frozenset({CudaGraphScope.ATTN, CudaGraphScope.MLP})
DROPLESS_WHOLE_LAYER = (CudaGraphScope.ATTN, CudaGraphScope.MOE_ROUTER)


def effective_scope(scope: tuple[CudaGraphScope, ...], moe: MoELayerSpec | None) -> frozenset[CudaGraphScope]:
    """The regions captured in a layer (module docstring): [] is the whole layer for a dense
    layer, attn + moe_router for a dropless MoE layer."""
    if not scope:
        if moe is None or moe.moe.pad_to_capacity:
            return WHOLE_LAYER | {CudaGraphScope.MOE}
        return frozenset(DROPLESS_WHOLE_LAYER)
    return frozenset(scope)


def captures_whole_layer(scope: frozenset[CudaGraphScope], moe: MoELayerSpec | None) -> bool:
    if moe is None:
        return WHOLE_LAYER <= scope
    return {CudaGraphScope.ATTN, CudaGraphScope.MOE} <= scope


def _forward_norm(ops: tuple[Op, ...]) -> int | None:
    mlp = DENSE_MLP_MODULES | {Module.ROUTER}
    first = next((i for i, op in enumerate(ops) if op.module in mlp), None)
    if first is None:
        return None
    return next((i for i in range(first - 1, -1, -1) if ops[i].module is Module.LAYERNORM), None)


def _backward_norm_end(ops: tuple[Op, ...]) -> int | None:
    norm = next((i for i, op in enumerate(ops) if op.module is Module.LAYERNORM), None)
    if norm is None:
        return None
    end = norm + 1
    while end < len(ops) and ops[end].module is Module.RESIDUAL_GRAD_ADD:
        end += 1
    return end


_ROUTING = frozenset({Module.ROUTER_TOPK, Module.ROUTER_AUX_LOSS, Module.ROUTER_Z_LOSS})
"""The router's `routing` (top-k, its z-loss and load-balancing loss): inside the router's graph."""


def _router_region(ops: tuple[Op, ...], backward: bool, norm: int, norm_end: int) -> set[int]:
    if backward:
        start = next((i for i, op in enumerate(ops) if op.module in _ROUTING), norm_end)
        return set(range(start, norm_end))
    last = max((i for i, op in enumerate(ops) if op.module in _ROUTING), default=norm)
    return set(range(norm, last + 1))


def _preprocess_region(ops: tuple[Op, ...], backward: bool, after: int) -> set[int]:
    """alltoall: the counts' all-gather and the permute (forward), the permute's backward."""
    permute = [i for i, op in enumerate(ops) if op.module is Module.MOE_PERMUTE and (backward or i > after)]
    if backward:
        return {i for i in permute if ops[i].kind is OpKind.ELEMENTWISE}
    first_permute = next((i for i in permute if ops[i].kind is OpKind.ELEMENTWISE), None)
    return set() if first_permute is None else {i for i in permute if i <= first_permute}


def captured_ops(
    ops: tuple[Op, ...], scope: frozenset[CudaGraphScope], moe: MoELayerSpec | None, recompute: bool = False
) -> tuple[bool, ...]:
    """Whether each op of one pass of a layer is captured (module docstring)."""
    if recompute:
        attn = CudaGraphScope.ATTN in scope
        return tuple(attn and op.module not in _MOE_BLOCK | DENSE_MLP_MODULES for op in ops)
    backward = any(op.pass_ is not Pass.FORWARD for op in ops)
    norm = _backward_norm_end(ops) if backward else _forward_norm(ops)
    if norm is None:
        return tuple(False for _ in ops)
    attention = set(range(norm, len(ops))) if backward else set(range(norm))
    mlp = set(range(len(ops))) - attention
    captured: set[int] = set()
    if CudaGraphScope.ATTN in scope:
        captured |= attention
    if moe is None:
        if CudaGraphScope.MLP in scope:
            captured |= mlp
    elif CudaGraphScope.MOE in scope:
        captured |= mlp
    elif CudaGraphScope.MOE_ROUTER in scope:
        captured |= _router_region(ops, backward, norm, norm)
        captured |= {i for i, op in enumerate(ops) if op.module in _SHARED}
        captured |= {i for i in mlp if ops[i].module is Module.SWIGLU and i and ops[i - 1].module in _SHARED}
        if CudaGraphScope.MOE_PREPROCESS in scope and moe.dispatcher is TokenDispatcher.ALLTOALL:
            captured |= _preprocess_region(ops, backward, norm)
    return tuple(i in captured for i in range(len(ops)))
