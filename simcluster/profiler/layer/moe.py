"""The MoE MLP block in torch, one rank, as Megatron-core runs it on its unfused path.

Router (gating GEMM, top-k with softmax or sigmoid scores, optional capacity dropping),
permutation of the routed rows by expert, the experts as grouped matmuls (fc1, weighted
SwiGLU or activation x probs, fc2), unpermutation, and the shared experts, each step written
after the Megatron-core function it mirrors (Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/transformer/moe/): router.py
`TopKRouter.routing`, moe_utils.py `topk_routing_with_score_function`,
`apply_router_token_dropping`, `permute`, `unpermute`, `sort_chunks_by_idxs`,
token_dispatcher.py `MoEAlltoAllTokenDispatcher` (with ep = etp = 1 the all-to-alls are the
identity), experts.py `TEGroupedMLP.forward`, fusions/fused_bias_swiglu.py
`WeightedSwiGLUFunction` / `SwiGLUFunction`, shared_experts.py `SharedExpertMLP`.

Its purpose is the memory check: what autograd keeps here is what
`workload.moe_memory.moe_saved_bytes` predicts (tests/profiler/test_profiler_moe.py). It
imports torch and the standard library only (and the torch-free workload config).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from simcluster.config.moe_choices import RouterScore, TokenDispatcher
from simcluster.workload.moe_config import MoEConfig


def _swiglu(y: Tensor) -> Tensor:
    y1, y2 = torch.chunk(y, 2, -1)
    return F.silu(y1) * y2


def _swiglu_back(g: Tensor, y: Tensor) -> Tensor:
    """d/dy of silu(y1)·y2 (fused_bias_swiglu.py `swiglu_back`)."""
    y1, y2 = torch.chunk(y, 2, -1)
    sig = torch.sigmoid(y1)
    silu = y1 * sig
    return torch.cat((g * sig * (1 + y1 * (1 - sig)) * y2, g * silu), -1)


class SwiGLUFunction(torch.autograd.Function):
    """Keeps only its input (`SwiGLUFunction`: the shared experts' fused activation)."""

    @staticmethod
    def forward(ctx, y: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(y)
        return _swiglu(y)

    @staticmethod
    def backward(ctx, g: Tensor) -> Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return _swiglu_back(g, y)


class WeightedSwiGLUFunction(torch.autograd.Function):
    """silu(y1)·y2·w, keeping y and w (`WeightedSwiGLUFunction`, the routed experts' fused
    activation with the routing probability applied)."""

    @staticmethod
    def forward(ctx, y: Tensor, w: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(y, w)
        return (_swiglu(y) * w).to(y.dtype)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        y, w = ctx.saved_tensors
        grad_y = _swiglu_back(g * w, y).to(y.dtype)
        grad_w = (_swiglu(y) * g).sum(-1, keepdim=True).to(w.dtype)
        return grad_y, grad_w


class AllToAll(torch.autograd.Function):
    """Megatron's `all_to_all` (tensor_parallel/mappings.py `_AllToAll`): rows to every rank
    of the group by `input_splits`, received by `output_splits`; the backward sends the
    gradients back with the splits swapped. Keeps no tensor."""

    @staticmethod
    def forward(ctx, x: Tensor, output_splits: list[int], input_splits: list[int]) -> Tensor:  # type: ignore[override]
        ctx.splits = (output_splits, input_splits)
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits)
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        output_splits, input_splits = ctx.splits
        return AllToAll.apply(g, input_splits, output_splits), None, None


class AuxLossAutoScaler(torch.autograd.Function):
    """moe_utils.py `MoEAuxLossAutoScaler`: passes the probs through, keeps the aux loss and
    gives it gradient 1 in backward."""

    @staticmethod
    def forward(ctx, probs: Tensor, aux_loss: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(aux_loss)
        return probs

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        (aux_loss,) = ctx.saved_tensors
        return g, torch.ones_like(aux_loss)


def attach_aux_loss(logits: Tensor, probs: Tensor, moe: MoEConfig, coeff: float) -> Tensor:
    """router.py `_apply_aux_loss` with tp = cp = 1: `compute_routing_scores_for_aux_loss`
    (fp32 softmax, or sigmoid normalised to sum 1, over all experts; their top-k for the
    token counts) and `switch_load_balancing_loss_func`, attached to the probs."""
    k, num_tokens, num_experts = moe.router_topk, logits.shape[0], moe.num_experts
    if moe.router_score is RouterScore.SOFTMAX:
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        sig = torch.sigmoid(logits.float())
        scores = sig / (sig.sum(dim=-1, keepdim=True) + 1e-20)
    # Megatron takes this top-k of the scores themselves; the node dies with its unused
    # values at once, keeping nothing: detached here to match
    _, top = torch.topk(scores.detach(), k=k, dim=1)
    tokens_per_expert = torch.zeros_like(logits).int().scatter(1, top, 1).bool().sum(dim=0)
    loss = torch.sum(scores.sum(dim=0) * tokens_per_expert) * (
        num_experts * coeff / (k * num_tokens * num_tokens)
    )
    return AuxLossAutoScaler.apply(probs, loss)


def _topk(scores: Tensor, moe: MoEConfig) -> tuple[Tensor, Tensor]:
    """torch.topk, or moe_utils.py `group_limited_topk`: score each of G groups by the sum of
    its top k/group_topk scores, keep the best group_topk groups, top-k among their experts."""
    k, groups, group_topk = moe.router_topk, moe.router_num_groups, moe.router_group_topk
    if not groups or not group_topk:
        return torch.topk(scores, k=k, dim=1)
    num_tokens, num_experts = scores.shape
    group_scores = scores.view(num_tokens, groups, -1).topk(k // group_topk, dim=-1)[0].sum(dim=-1)
    # Megatron's top-k here drops its values at once, so its node keeps nothing: detached
    group_idx = torch.topk(group_scores.detach(), k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores.detach()).scatter_(1, group_idx, 1)
    score_mask = (
        group_mask.unsqueeze(-1).expand(num_tokens, groups, num_experts // groups).reshape(num_tokens, -1)
    )
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(masked, k=k, dim=-1)


def route(
    logits: Tensor, moe: MoEConfig, aux_loss_coeff: float = 0.0, expert_bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """`topk_routing_with_score_function` (no pre-softmax; the expert bias under sigmoid),
    `apply_router_token_dropping` and, with a coefficient, the aux loss: (probs [T, E] zero
    off the chosen experts, bool map)."""
    k = moe.router_topk
    if moe.router_score is RouterScore.SOFTMAX:
        scores, top = _topk(logits, moe)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        sig = torch.sigmoid(logits.float())
        if expert_bias is not None:
            # Megatron's top-k of scores + bias only yields indices (its graph dies with the
            # unused values at once): detached here to match
            _, top = _topk((sig + expert_bias.float()).detach(), moe)
            scores = torch.gather(sig, dim=1, index=top)
        else:
            scores, top = _topk(sig, moe)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else scores
    probs = probs.type_as(logits)
    routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
    routing_map = torch.zeros_like(logits).int().scatter(1, top, 1).bool()
    if moe.capacity_factor is None:
        return _with_aux_loss(logits, routing_probs, moe, aux_loss_coeff), routing_map
    num_tokens, num_experts = logits.shape
    capacity = math.ceil(num_tokens * k / num_experts * moe.capacity_factor)
    if capacity > num_tokens:
        keep = torch.ones_like(routing_map)
    else:
        # Megatron takes this top-k of the probs themselves; the graph node it makes dies
        # with its unused values at once, so it keeps nothing: detached here to match
        _, kept = torch.topk(routing_probs.detach(), k=capacity, dim=0, sorted=False)
        keep = torch.zeros_like(routing_probs).scatter(0, kept, 1).bool()
    # padded: every expert takes its `capacity` best tokens, routed to it or not (their
    # probs are 0); otherwise the routed tokens within capacity
    final_map = keep if moe.pad_to_capacity else torch.logical_and(routing_map, keep)
    return _with_aux_loss(logits, routing_probs * final_map, moe, aux_loss_coeff), final_map


def _with_aux_loss(logits: Tensor, probs: Tensor, moe: MoEConfig, coeff: float) -> Tensor:
    return attach_aux_loss(logits, probs, moe, coeff) if coeff > 0 else probs


def permute(
    tokens: Tensor, routing_map: Tensor, probs: Tensor, num_out: int
) -> tuple[Tensor, Tensor, Tensor]:
    """moe_utils.py `permute`, the argsort path: rows grouped by expert, and their probs."""
    num_tokens = tokens.shape[0]
    flat_sorted = routing_map.bool().T.contiguous().reshape(-1).argsort(descending=True, stable=True)
    flat_sorted = flat_sorted[:num_out]
    sorted_indices = flat_sorted % num_tokens
    permuted_probs = probs.T.contiguous().reshape(-1)[flat_sorted]
    return tokens.index_select(0, sorted_indices), permuted_probs, sorted_indices


def permute_padded(
    tokens: Tensor, routing_map: Tensor, probs: Tensor, capacity: int
) -> tuple[Tensor, Tensor, Tensor]:
    """moe_utils.py `permute` with drop_and_pad: exactly `capacity` rows per expert."""
    num_tokens, num_experts = routing_map.shape
    by_expert = routing_map.to(dtype=torch.int8).T.contiguous()
    sorted_indices = (
        by_expert.argsort(dim=-1, descending=True, stable=True)[:, :capacity].contiguous().view(-1)
    )
    rows_1d = torch.arange(num_experts, device=probs.device).unsqueeze(-1) * num_tokens
    indices_1d = (rows_1d + sorted_indices.view(num_experts, capacity)).view(-1)
    permuted_probs = probs.T.contiguous().view(-1).index_select(0, indices_1d)
    return tokens.index_select(0, sorted_indices), permuted_probs, sorted_indices


def unpermute(rows: Tensor, sorted_indices: Tensor, num_tokens: int) -> Tensor:
    """moe_utils.py `unpermute` without probs: scatter-add each row back to its token."""
    hidden = rows.shape[1]
    out = torch.zeros((num_tokens, hidden), dtype=rows.dtype, device=rows.device)
    out.scatter_add_(0, sorted_indices.unsqueeze(1).expand(-1, hidden), rows)
    return out


def sort_chunks(rows: Tensor, split_sizes: list[int], order: list[int]) -> Tensor:
    """moe_utils.py `sort_chunks_by_idxs`, unfused: split and concatenate in `order`."""
    chunks = torch.split(rows, split_sizes, dim=0)
    return torch.cat([chunks[i] for i in order], dim=0)


class MoEBlock(nn.Module):
    """Router, routed experts (gated by SwiGLU) and shared experts on one rank of an
    expert-parallel group of `ep_size` (tp = etp = 1; the default torch.distributed group
    when ep_size > 1); x is the rank's [T, h] tokens."""

    def __init__(
        self,
        hidden_size: int,
        moe: MoEConfig,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        ep_rank: int = 0,
        ep_size: int = 1,
        aux_loss_coeff: float = 0.0,
        recompute_moe_act: bool = False,
        dispatcher: TokenDispatcher = TokenDispatcher.ALLTOALL,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        E, h, f, fs = moe.num_experts, hidden_size, moe.ffn_hidden_size, moe.shared_expert_ffn_hidden_size
        if E % ep_size:
            raise ValueError(f"num_experts={E} is not divisible by ep={ep_size}")

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter((torch.randn(*shape, generator=gen) * 0.1).to(dtype))

        self.moe, self.ep_rank, self.ep_size = moe, ep_rank, ep_size
        self.aux_loss_coeff, self.recompute_moe_act = aux_loss_coeff, recompute_moe_act
        if dispatcher is TokenDispatcher.ALLGATHER and ep_size > 1:
            raise ValueError("the allgather dispatcher runs here with ep = 1 only")
        if dispatcher is TokenDispatcher.FLEX:
            raise ValueError("the flex (DeepEP) dispatcher is not in the torch block")
        self.dispatcher = dispatcher
        self.num_local_experts = E // ep_size
        local = slice(ep_rank * self.num_local_experts, (ep_rank + 1) * self.num_local_experts)
        self.router = param(E, h)
        # every rank draws all experts (the serial block's weights) and keeps its own;
        # fc1 is 2f wide: TEGroupedMLP doubles the ffn under gated_linear_unit
        self.fc1 = nn.Parameter(param(E, 2 * f, h).detach()[local].clone())
        self.fc2 = nn.Parameter(param(E, h, f).detach()[local].clone())
        self.shared_fc1 = param(2 * fs, h) if fs else None
        self.shared_fc2 = param(h, fs) if fs else None
        self.last_rows: tuple[int, int] = (0, 0)  # (rows sent, rows its experts computed)
        # router.py: an fp32 buffer, updated outside autograd (None: no expert bias)
        bias = (torch.randn(E, generator=gen) * 0.1).float() if moe.router_expert_bias else None
        self.expert_bias: Tensor | None
        self.register_buffer("expert_bias", bias)

    def experts(self, rows: Tensor, tokens_per_expert: list[int], probs: Tensor) -> Tensor:
        """TEGroupedMLP: grouped fc1, weighted SwiGLU, grouped fc2 (one GEMM per expert).
        With `recompute_moe_act` (`--recompute-modules moe_act`) the activation's output is
        not kept: only the fc1 output and probs stay, as under Megatron's
        `CheckpointWithoutOutput` (torch's checkpoint re-runs fc2 too; the bytes are the same)."""
        fc1 = torch.cat([F.linear(x, w) for x, w in zip(torch.split(rows, tokens_per_expert), self.fc1)])
        if self.recompute_moe_act:
            out: Tensor = checkpoint(self._act_fc2, fc1, probs, tokens_per_expert, use_reentrant=True)
            return out
        return self._act_fc2(fc1, probs, tokens_per_expert)

    def _act_fc2(self, fc1: Tensor, probs: Tensor, tokens_per_expert: list[int]) -> Tensor:
        act = WeightedSwiGLUFunction.apply(fc1, probs.unsqueeze(-1))
        return torch.cat([F.linear(x, w) for x, w in zip(torch.split(act, tokens_per_expert), self.fc2)])

    def forward(self, x: Tensor) -> Tensor:
        num_tokens, num_local = x.shape[0], self.num_local_experts
        shared = None
        if self.shared_fc1 is not None and self.shared_fc2 is not None:
            shared = F.linear(SwiGLUFunction.apply(F.linear(x, self.shared_fc1)), self.shared_fc2)
        logits = F.linear(x, self.router)  # router_gating_linear: keeps x
        probs, routing_map = route(logits, self.moe, self.aux_loss_coeff, self.expert_bias)
        if self.dispatcher is TokenDispatcher.ALLGATHER:
            out = self._allgather_experts(x, probs, routing_map)
            return out + shared if shared is not None else out
        local_counts = routing_map.sum(dim=0)
        if self.moe.pad_to_capacity:  # the alltoall dispatcher's drop_and_pad preprocess
            capacity = int(routing_map.sum(dim=0).max())  # route() kept exactly capacity each
            local_counts = torch.full_like(local_counts, capacity)
            rows, row_probs, sorted_indices = permute_padded(x, routing_map, probs, capacity)
        else:
            num_out = num_tokens * self.moe.router_topk
            if self.moe.capacity_factor is not None:
                num_out = int(local_counts.sum())
            rows, row_probs, sorted_indices = permute(x, routing_map, probs, num_out)
        counts, send, recv = self._exchange_counts(local_counts)  # counts[source][local expert]
        if send is not None and recv is not None:  # token_dispatch: tokens and probs over EP
            rows, row_probs = AllToAll.apply(rows, recv, send), AllToAll.apply(row_probs, recv, send)
        sources = range(len(counts))
        tokens_per_expert = [sum(counts[s][j] for s in sources) for j in range(num_local)]
        if num_local > 1:  # dispatch_postprocess: sort the [source, expert] chunks by expert
            split = [counts[s][j] for s in sources for j in range(num_local)]
            order = [s * num_local + j for j in range(num_local) for s in sources]
            rows, row_probs = sort_chunks(rows, split, order), sort_chunks(row_probs, split, order)
        out_rows = self.experts(rows, tokens_per_expert, row_probs)
        if num_local > 1:  # combine_preprocess: back to [source, expert]
            split = [counts[s][j] for j in range(num_local) for s in sources]
            order = [j * len(counts) + s for s in sources for j in range(num_local)]
            out_rows = sort_chunks(out_rows, split, order)
        if send is not None and recv is not None:  # token_combine
            out_rows = AllToAll.apply(out_rows, send, recv)
        self.last_rows = (int(local_counts.sum()), sum(tokens_per_expert))
        out = unpermute(out_rows, sorted_indices, num_tokens)
        return out + shared if shared is not None else out

    def _allgather_experts(self, x: Tensor, probs: Tensor, routing_map: Tensor) -> Tensor:
        """`MoEAllGatherTokenDispatcher` with tp = ep = 1 (nothing to gather): the rows of the
        local experts permuted by the local map without probs, the probs by `masked_select`,
        no chunk sort, unpermute. It has no padded permute: padded to capacity, the router's
        map already holds exactly C tokens per expert."""
        num_tokens, local = x.shape[0], self.num_local_experts
        local_map = routing_map[:, :local]
        local_probs = probs[:, :local].contiguous()
        tokens_per_expert = local_map.sum(dim=0).tolist()
        flat_sorted = local_map.bool().T.contiguous().reshape(-1).argsort(descending=True, stable=True)
        sorted_indices = flat_sorted[: sum(tokens_per_expert)] % num_tokens
        rows = x.index_select(0, sorted_indices)
        row_probs = local_probs.T.contiguous().masked_select(local_map.T.contiguous())
        out_rows = self.experts(rows, tokens_per_expert, row_probs)
        self.last_rows = (sum(tokens_per_expert), sum(tokens_per_expert))
        return unpermute(out_rows, sorted_indices, num_tokens)

    def _exchange_counts(
        self, local_counts: Tensor
    ) -> tuple[list[list[int]], list[int] | None, list[int] | None]:
        """`MoEAlltoAllTokenDispatcher.preprocess`: every source rank's tokens per local
        expert (all-gathered over EP), the rows this rank sends to and receives from each."""
        if self.ep_size == 1:
            return [local_counts.tolist()], None, None
        gathered = [torch.zeros_like(local_counts) for _ in range(self.ep_size)]
        dist.all_gather(gathered, local_counts)
        lo = self.ep_rank * self.num_local_experts
        counts = [g[lo : lo + self.num_local_experts].tolist() for g in gathered]
        send = local_counts.reshape(self.ep_size, self.num_local_experts).sum(dim=1).tolist()
        return counts, send, [sum(c) for c in counts]

    def reference(self, x: Tensor) -> Tensor:
        """The same function written token by token, for the correctness test (ep = 1)."""
        probs, routing_map = route(F.linear(x, self.router), self.moe, expert_bias=self.expert_bias)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for e in torch.nonzero(routing_map[t]).flatten().tolist():
                hidden = _swiglu(F.linear(x[t], self.fc1[e])) * probs[t, e]
                out[t] = out[t] + F.linear(hidden, self.fc2[e])
        if self.shared_fc1 is not None and self.shared_fc2 is not None:
            out = out + F.linear(_swiglu(F.linear(x, self.shared_fc1)), self.shared_fc2)
        return out


def ep_check(comm: object, cases: list[tuple[int, MoEConfig, int]]) -> list[dict[str, float]]:
    """One rank of an expert-parallel group (the default torch.distributed group, e.g.
    `profiler.bench.launch.run_distributed(ep_check, ep, cases)`): for each (hidden size,
    dropless MoE, tokens per rank), the EP block against the serial block on all ranks'
    tokens. Returns the largest differences of output, input gradient, this rank's expert
    gradients and the summed router / shared-expert gradients, the bytes the EP block kept
    for backward, and its rows (sent, computed by its experts)."""
    del comm
    from simcluster.profiler.layer.accounting import SavedTensorCounter

    rank, ep = dist.get_rank(), dist.get_world_size()
    results = []
    for hidden, moe, tokens in cases:
        gen = torch.Generator().manual_seed(7)
        inputs = torch.randn(ep * tokens, hidden, generator=gen)
        weights = torch.randn(ep * tokens, hidden, generator=gen)
        serial = MoEBlock(hidden, moe, seed=3)
        x_all = inputs.clone().requires_grad_()
        y_all = serial(x_all)
        (y_all * weights).sum().backward()
        block = MoEBlock(hidden, moe, seed=3, ep_rank=rank, ep_size=ep)
        mine = slice(rank * tokens, (rank + 1) * tokens)
        x = inputs[mine].clone().requires_grad_()
        with SavedTensorCounter(block) as counter:
            y = block(x)
        (y * weights[mine]).sum().backward()
        local = slice(rank * block.num_local_experts, (rank + 1) * block.num_local_experts)
        errors = {
            "output": (y - y_all[mine]).abs().max().item(),
            "input_grad": (_grad(x) - _grad(x_all)[mine]).abs().max().item(),
            "fc1_grad": (_grad(block.fc1) - _grad(serial.fc1)[local]).abs().max().item(),
            "fc2_grad": (_grad(block.fc2) - _grad(serial.fc2)[local]).abs().max().item(),
        }
        for name in ("router", "shared_fc1", "shared_fc2"):
            mine_p, all_p = getattr(block, name), getattr(serial, name)
            if mine_p is not None and all_p is not None:
                summed = _grad(mine_p).clone()
                dist.all_reduce(summed)  # the data-parallel gradient reduction of a dense parameter
                errors[f"{name}_grad"] = (summed - _grad(all_p)).abs().max().item()
        sent, computed = block.last_rows
        results.append(
            errors | {"saved_bytes": counter.result().total_bytes, "sent": sent, "computed": computed}
        )
    return results


def _grad(t: Tensor) -> Tensor:
    if t.grad is None:
        raise RuntimeError("no gradient reached this tensor")
    return t.grad
