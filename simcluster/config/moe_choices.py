"""The closed sets of choices of a mixture-of-experts model (Megatron-core's MoE flags).

Kept beside `choices.py` so a scenario model can name them without importing the workload.
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553.
"""

from __future__ import annotations

import enum


class RouterScore(str, enum.Enum):
    """`--moe-router-score-function`: the router's score of a token for an expert
    (megatron/core/transformer/moe/moe_utils.py::topk_routing_with_score_function).
    softmax (Megatron's default: top-k of the logits, then a softmax over the k chosen)
    or sigmoid (DeepSeek-V3: a sigmoid of every logit, top-k, then the k scores
    normalised to sum 1)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class TokenDispatcher(str, enum.Enum):
    """`--moe-token-dispatcher-type` (megatron/core/transformer/moe/token_dispatcher.py):
    alltoall (`MoEAlltoAllTokenDispatcher`: tokens sent to the ranks of their experts over
    the expert-parallel group), allgather (`MoEAllGatherTokenDispatcher`: every token
    gathered over the expert-tensor x expert-parallel group, results reduce-scattered
    back) or flex (`MoEFlexTokenDispatcher`, DeepEP / HybridEP kernels)."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX = "flex"
