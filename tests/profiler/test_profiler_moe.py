"""The torch MoE block computes the MoE MLP (token-by-token reference) and keeps for backward
exactly the bytes `workload.moe_memory.moe_saved_bytes` predicts, plus the block input;
the torch MLA block keeps what `workload.mla.mla_saved_bytes` predicts."""

import pytest

torch = pytest.importorskip("torch")

from simcluster.config.moe_choices import RecomputeModule, TokenDispatcher  # noqa: E402
from simcluster.profiler.bench.launch import run_distributed  # noqa: E402
from simcluster.profiler.layer.accounting import SavedTensorCounter  # noqa: E402
from simcluster.profiler.layer.mla import MLABlock  # noqa: E402
from simcluster.profiler.layer.moe import MoEBlock, ep_check, route  # noqa: E402
from simcluster.workload.mla import MLAShape, mla_saved_bytes  # noqa: E402
from simcluster.workload.moe import routed_rows  # noqa: E402
from simcluster.workload.moe_config import ExpertLayout, MLAConfig, MoEConfig  # noqa: E402
from simcluster.workload.moe_memory import moe_saved_bytes  # noqa: E402

H = 16
CASES = {
    "softmax top-2, shared": MoEConfig(
        num_experts=4, router_topk=2, ffn_hidden_size=8, shared_expert_ffn_hidden_size=12
    ),
    "sigmoid top-3": MoEConfig(num_experts=8, router_topk=3, ffn_hidden_size=8, router_score="sigmoid"),
    "sigmoid top-1": MoEConfig(num_experts=4, router_topk=1, ffn_hidden_size=8, router_score="sigmoid"),
    "one expert": MoEConfig(num_experts=1, router_topk=1, ffn_hidden_size=8),
    "sigmoid grouped 2 of 4": MoEConfig(
        num_experts=8,
        router_topk=4,
        ffn_hidden_size=8,
        router_score="sigmoid",
        router_num_groups=4,
        router_group_topk=2,
    ),
    "sigmoid grouped, expert bias": MoEConfig(
        num_experts=8,
        router_topk=4,
        ffn_hidden_size=8,
        router_score="sigmoid",
        router_num_groups=4,
        router_group_topk=2,
        router_expert_bias=True,
        shared_expert_ffn_hidden_size=8,
    ),
    "softmax grouped 2 of 4": MoEConfig(
        num_experts=8, router_topk=2, ffn_hidden_size=8, router_num_groups=4, router_group_topk=2
    ),
    "capacity 1.0": MoEConfig(num_experts=4, router_topk=2, ffn_hidden_size=8, capacity_factor=1.0),
    "capacity 4.0": MoEConfig(num_experts=4, router_topk=2, ffn_hidden_size=8, capacity_factor=4.0),
    "padded to capacity 1.25": MoEConfig(
        num_experts=4, router_topk=2, ffn_hidden_size=8, capacity_factor=1.25, pad_to_capacity=True
    ),
}


def measure(
    moe: MoEConfig, tokens: int, dtype: torch.dtype, **options: object
) -> tuple[int, torch.Tensor, MoEBlock, torch.Tensor]:
    """Bytes autograd keeps for one forward of the block (parameters excluded), its output,
    the block and its input."""
    block = MoEBlock(H, moe, dtype=dtype, seed=1, **options)  # type: ignore[arg-type]
    x = (torch.randn(tokens, H, generator=torch.Generator().manual_seed(2)) * 0.5).to(dtype).requires_grad_()
    with SavedTensorCounter(block) as counter:
        out = block(x)
    return counter.result().total_bytes, out, block, x


OPTIONS = {
    "plain": {},
    "allgather dispatcher": {"dispatcher": TokenDispatcher.ALLGATHER},
    "aux loss": {"aux_loss_coeff": 0.01},
    "moe_act recompute": {"recompute_moe_act": True},
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_saved_bytes_equal_the_formula(name, dtype, option):
    """Measured saved bytes == formula (T = 24 tokens, h = 16) + the input T·h·e, with and
    without the aux loss and moe_act recompute. Under a capacity factor the formula takes
    the rows the router actually kept."""
    moe = CASES[name]
    tokens, e = 24, torch.tensor([], dtype=dtype).element_size()
    measured, out, block, x = measure(moe, tokens, dtype, **OPTIONS[option])
    layout = ExpertLayout(tp=1, cp=1, dp=1)
    rows = routed_rows(tokens, 1, moe, layout)
    if moe.capacity_factor is not None and not moe.pad_to_capacity:  # drops depend on the routing
        _, kept = route(torch.nn.functional.linear(x.detach(), block.router), moe)
        n = float(kept.sum())
        rows = type(rows)(rows.tokens, n, n, n, n, n, rows.capacity)
    recompute = (RecomputeModule.MOE_ACT,) if block.recompute_moe_act else ()
    formula = moe_saved_bytes(
        rows,
        H,
        moe,
        layout,
        gated=True,
        element_bytes=e,
        probs_bytes=e,
        aux_loss=block.aux_loss_coeff > 0,
        recompute=recompute,
        busiest=False,
        dispatcher=block.dispatcher,
    )
    assert measured == formula.total + tokens * H * e


@pytest.mark.parametrize(
    "name", ["softmax top-2, shared", "sigmoid top-3", "capacity 1.0", "sigmoid grouped 2 of 4"]
)
@pytest.mark.parametrize("recompute_moe_act", [False, True])
@pytest.mark.parametrize("dispatcher", [TokenDispatcher.ALLTOALL, TokenDispatcher.ALLGATHER], ids=str)
def test_output_and_gradients_match_the_token_by_token_layer(name, recompute_moe_act, dispatcher):
    """Output and every gradient equal the token-by-token MoE, moe_act recomputed or not,
    either dispatcher."""
    moe = CASES[name]
    block = MoEBlock(H, moe, seed=3, recompute_moe_act=recompute_moe_act, dispatcher=dispatcher)
    x = torch.randn(24, H, generator=torch.Generator().manual_seed(4), requires_grad=True)
    out = block(x)
    ref = block.reference(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    tensors = [x, *block.parameters()]
    grads = []
    for result in (out, ref):  # .backward(): torch's reentrant checkpoint refuses autograd.grad
        for t in tensors:
            t.grad = None
        (result * weights).sum().backward()
        grads.append([t.grad for t in tensors])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_capacity_one_drops_tokens_here():
    """The capacity case must really drop (else it would test nothing new): C = 12 per expert."""
    moe = CASES["capacity 1.0"]
    block = MoEBlock(H, moe, seed=1)
    x = (torch.randn(24, H, generator=torch.Generator().manual_seed(2)) * 0.5).requires_grad_()
    _, kept = route(torch.nn.functional.linear(x.detach(), block.router), moe)
    assert int(kept.sum()) < 24 * 2


EP_CASES = [
    (H, MoEConfig(num_experts=4, router_topk=2, ffn_hidden_size=8, shared_expert_ffn_hidden_size=12), 20),
    (H, MoEConfig(num_experts=2, router_topk=1, ffn_hidden_size=8, router_score="sigmoid"), 20),
]


@pytest.fixture(scope="module")
def ep2():
    """Two gloo ranks, each running every EP case (one spawn: it costs seconds)."""
    return run_distributed(ep_check, 2, EP_CASES)


def test_expert_parallel_equals_serial(ep2):
    """ep = 2 over gloo all-to-all (2 local experts, then 1): output, input gradient, expert
    gradients and the summed dense gradients equal the serial block's on all tokens."""
    for per_rank in ep2:
        for result in per_rank:
            for name, value in result.items():
                if name.endswith("grad") or name == "output":
                    assert value < 1e-5, (name, value)


def test_expert_parallel_saved_bytes_equal_the_formula(ep2):
    """Each rank keeps the formula's bytes for its T tokens, R sent and Re computed rows."""
    layout = ExpertLayout(tp=1, cp=1, dp=2, ep=2)
    for per_rank in ep2:
        for (hidden, moe, tokens), result in zip(EP_CASES, per_rank):
            rows = routed_rows(tokens, 1, moe, layout)
            sent, computed = result["sent"], result["computed"]
            rows = type(rows)(tokens, sent, computed, computed, computed, computed, None)
            formula = moe_saved_bytes(rows, hidden, moe, layout, gated=True, element_bytes=4, probs_bytes=4)
            assert result["saved_bytes"] == formula.total + tokens * hidden * 4
    # the ranks' experts computed all routed rows between them
    computed = [result["computed"] for result in (per_rank[0] for per_rank in ep2)]
    assert sum(computed) == 2 * 20 * 2


def test_aux_loss_reaches_the_router():
    """The aux loss is attached to the probs: with it the router's gradient changes."""
    moe = CASES["softmax top-2, shared"]
    x = torch.randn(24, H, generator=torch.Generator().manual_seed(4))
    grads = []
    for coeff in (0.0, 1.0):
        block = MoEBlock(H, moe, seed=3, aux_loss_coeff=coeff)
        block(x).sum().backward()
        grads.append(block.router.grad)
    assert not torch.allclose(grads[0], grads[1])


def test_grouped_routing_keeps_to_the_chosen_groups():
    """Group-limited routing: every token's experts lie in at most group_topk groups."""
    moe = CASES["sigmoid grouped 2 of 4"]
    block = MoEBlock(H, moe, seed=1)
    x = torch.randn(64, H, generator=torch.Generator().manual_seed(6))
    _, routing_map = route(torch.nn.functional.linear(x, block.router), moe)
    groups_used = routing_map.view(64, 4, 2).any(dim=-1).sum(dim=-1)
    assert int(groups_used.max()) <= 2 and int(routing_map.sum()) == 64 * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mla_saved_bytes_equal_the_formula(dtype):
    """MLA (q_lora 24, kv_lora 20, qk 8 + rope 4 = v 12, 4 heads, h 32, s 16, b 2): measured
    == mla_saved_bytes + the two latent norms' fp32 rsigma (one per token each)."""
    mla = MLAConfig(q_lora_rank=24, kv_lora_rank=20, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12)
    s, b, h, n = 16, 2, 32, 4
    block = MLABlock(h, n, mla, s, dtype, seed=1)
    x = torch.randn(s, b, h, generator=torch.Generator().manual_seed(2)).to(dtype).requires_grad_()
    with SavedTensorCounter(block) as counter:
        out = block(x)
    assert out.grad_fn is not None
    e = torch.tensor([], dtype=dtype).element_size()
    formula = mla_saved_bytes(
        MLAShape(h, n, mla), tokens=s * b, tp=1, sequence_parallel=False, element_bytes=e
    )
    assert counter.result().total_bytes == formula + 2 * s * b * 4
