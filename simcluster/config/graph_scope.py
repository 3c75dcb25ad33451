"""`training.cuda_graph_scope`: which parts of each transformer layer a per-layer CUDA graph
captures (Megatron-LM `--cuda-graph-modules`, formerly `--cuda-graph-scope`;
megatron/core/transformer/transformer_config.py `cuda_graph_modules` and its
`__post_init__` checks, @d98e8a64ddf34856e74b24714e3bedb2f5a39553). An empty list (Megatron's
default, the deprecated "full") captures whole layers."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from simcluster.config.choices import CudaGraphImpl
from simcluster.config.moe_choices import TokenDispatcher

if TYPE_CHECKING:
    from simcluster.config.scenario import Scenario


class CudaGraphScope(str, enum.Enum):
    """One entry of `--cuda-graph-modules`: attn (input norm, attention, its residual add),
    mlp (a dense layer's pre-MLP norm and MLP), moe (a MoE layer's whole MoE block: only with
    drop-and-pad routing), moe_router (the pre-MLP norm, the router and the shared experts),
    moe_preprocess (with moe_router: the token dispatcher's `preprocess` and permute)."""

    ATTN = "attn"
    MLP = "mlp"
    MOE = "moe"
    MOE_ROUTER = "moe_router"
    MOE_PREPROCESS = "moe_preprocess"


MOE_SCOPES = frozenset({CudaGraphScope.MOE, CudaGraphScope.MOE_ROUTER, CudaGraphScope.MOE_PREPROCESS})


def cuda_graph_scope_problems(scenario: Scenario) -> list[str]:
    """Megatron-core's asserts on `cuda_graph_modules`, phrased on the YAML keys."""
    tr, moe = scenario.training, scenario.model.moe
    scope = set(tr.cuda_graph_scope)
    if not scope:
        return []
    names = ", ".join(s.value for s in tr.cuda_graph_scope)
    key = f"training.cuda_graph_scope: value [{names}]"
    if tr.cuda_graph_impl is CudaGraphImpl.FULL_ITERATION:
        return [f"{key}: must be empty with training.cuda_graph_impl full_iteration (Megatron-core asserts)"]
    problems = []
    if moe is None and scope & MOE_SCOPES:
        problems.append(f"{key}: moe, moe_router and moe_preprocess need model.moe (Megatron-core asserts)")
    if {CudaGraphScope.MOE, CudaGraphScope.MOE_ROUTER} <= scope:
        problems.append(f"{key}: give moe or moe_router, not both (Megatron-core asserts)")
    if CudaGraphScope.MOE_PREPROCESS in scope and CudaGraphScope.MOE_ROUTER not in scope:
        problems.append(f"{key}: moe_preprocess needs moe_router (Megatron-core asserts)")
    if moe is not None:
        if CudaGraphScope.MOE in scope:
            problems.append(
                f"{key}: moe captures the whole MoE block, which Megatron-core allows only with "
                "drop-and-pad routing (--moe-pad-expert-input-to-capacity, not a scenario key); "
                "allowed for dropless MoE: moe_router, moe_preprocess"
            )
        if CudaGraphScope.MLP in scope and moe.first_k_dense_layers == 0:
            problems.append(f"{key}: mlp needs dense layers (model.moe.first_k_dense_layers > 0)")
        alltoall = tr.moe_token_dispatcher is TokenDispatcher.ALLTOALL
        if CudaGraphScope.MOE_PREPROCESS in scope and moe.capacity_factor is not None and alltoall:
            problems.append(
                f"{key}: moe_preprocess is not allowed with model.moe.capacity_factor and the alltoall "
                "dispatcher (its preprocess copies counts to the host; Megatron-core asserts)"
            )
    return problems
