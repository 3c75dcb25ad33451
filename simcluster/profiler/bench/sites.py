"""The layer's memory-bound sites: the torch code between two GEMMs, forward or backward.

Each mirrors `ParallelTransformerLayer` (profiler/layer/transformer.py); backward sites time
autograd.grad through the same forward code, built once per input set:
- `layer_norm` F.layer_norm; backward includes its weight and bias gradients.
- `residual_add` the autograd accumulation of the two residual-stream gradients.
- `bias_dropout_add` mask draw (bernoulli) + x + bias, × keep × 1/(1-p), + residual;
  backward includes the bias gradient (the row-parallel linears' bias).
- `softmax` scale_mask_softmax (scale, causal mask, softmax; fp32 backward).
- `attention_dropout` mask draw + dropout of the attention probabilities.
- `context_layout` the [b·a/t, s, d] → [s, b, h/t] context copy; backward: the context
  gradient's view plus the concatenation of the Q, K, V gradients into the QKV layout and
  the QKV bias gradient (glue kernels Megatron's op graph has no op of its own for).
- `gelu` tanh-GeLU (the bias is fused in addmm); backward includes fc1's bias gradient.
So an element-wise "op" here may be several eager kernels; its fitted bandwidth is the op
graph's bytes over their time, which is how the profile carries the eager layer's cost.
With `ctx.mode` fused, softmax, dropout and bias-dropout-add run the layer's compiled
regions (`layer.regions`), one kernel per direction, as in the fused layer; layer norm and
GeLU are one torch kernel per direction in both modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from simcluster.profiler.bench.timing import Call
from simcluster.profiler.layer.ops import LocalMasks, bias_dropout_add, dropout, scale_mask_softmax
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, Op, Pass

if TYPE_CHECKING:
    from simcluster.profiler.bench.kernels import BuildContext

LAYERNORM_EPS = 1e-5


def site_benchmark(op: Op, cfg: LayerConfig) -> tuple[str, tuple[int, ...], Callable[[BuildContext], Call]]:
    """(benchmark name, dims, builder) of the site that runs element-wise `op`."""
    site, backward = _site_of(op)
    region = int(cfg.region_tokens)
    t = cfg.tp
    dims = {
        "layer_norm": (region, cfg.hidden_size),
        "residual_add": (region, cfg.hidden_size),
        "bias_dropout_add": (region, cfg.hidden_size),
        "softmax": (cfg.micro_batch_size, cfg.heads_per_rank, cfg.seq_length, cfg.head_dim),
        "attention_dropout": (cfg.micro_batch_size, cfg.heads_per_rank, cfg.seq_length),
        "context_layout": (cfg.seq_length, cfg.micro_batch_size, cfg.heads_per_rank, cfg.head_dim),
        "gelu": (cfg.tokens, cfg.ffn_hidden_size // t),
    }[site]
    name = f"{site}.{'backward' if backward else 'forward'}"
    return name, dims, _SITES[site](backward, *dims)


SITES = {
    Module.LAYERNORM: "layer_norm",
    Module.SOFTMAX: "softmax",
    Module.ATTENTION_DROPOUT: "attention_dropout",
    Module.CONTEXT_COPY: "context_layout",
    Module.BIAS_GELU: "gelu",
    Module.BIAS_DROPOUT_ADD: "bias_dropout_add",
    Module.RESIDUAL_GRAD_ADD: "residual_add",
}
"""The eager site that runs each module's element-wise op (the paper's layer's modules)."""


def _site_of(op: Op) -> tuple[str, bool]:
    """(site, is_backward) for an element-wise op of the op graph; the residual add is the
    same kernel either way (timed as its forward)."""
    if op.module not in SITES:
        raise KeyError(f"no benchmark for element-wise op {op.name!r}: add one to profiler/bench/sites.py")
    backward = op.pass_ is Pass.INPUT_GRAD and op.module is not Module.RESIDUAL_GRAD_ADD
    return SITES[op.module], backward


def _timed_backward(
    build_graph: Callable[[BuildContext], tuple[Tensor, tuple[Tensor, ...]]],
    after: Callable[[tuple[Tensor, ...]], object] | None = None,
) -> Callable[[BuildContext], Call]:
    """Run the forward once per input set (untimed); time autograd.grad through it."""

    def build(ctx: BuildContext) -> Call:
        out, leaves = build_graph(ctx)
        grad = ctx.randn(*out.shape)

        def call() -> object:
            grads = torch.autograd.grad(out, leaves, grad, retain_graph=True)
            return after(grads) if after is not None else grads

        return call

    return build


def _leaf(x: Tensor) -> Tensor:
    return x.requires_grad_()


def _layer_norm(backward: bool, rows: int, h: int) -> Callable[[BuildContext], Call]:
    def graph(ctx: BuildContext) -> tuple[Tensor, tuple[Tensor, ...]]:
        x, w, b = (
            _leaf(ctx.randn(rows, h)),
            _leaf(1 + ctx.randn(h, scale=0.02)),
            _leaf(ctx.randn(h, scale=0.02)),
        )
        return F.layer_norm(x, (h,), w, b, LAYERNORM_EPS), (x, w, b)

    if backward:
        return _timed_backward(graph)

    def build(ctx: BuildContext) -> Call:
        x, w, b = ctx.randn(rows, h), 1 + ctx.randn(h, scale=0.02), ctx.randn(h, scale=0.02)
        return lambda: F.layer_norm(x, (h,), w, b, LAYERNORM_EPS)

    return build


def _residual_add(backward: bool, rows: int, h: int) -> Callable[[BuildContext], Call]:
    def build(ctx: BuildContext) -> Call:
        a, b = ctx.randn(rows, h), ctx.randn(rows, h)
        return lambda: a + b

    return build


def _keep(ctx: BuildContext, shape: tuple[int, ...]) -> Tensor | None:
    """The layer's mask draw (`LocalMasks`), local shape."""
    return LocalMasks().keep_mask("site", shape, 0, 0, shape[0], ctx.dropout_prob, ctx.device)


def _bias_dropout_add(backward: bool, rows: int, h: int) -> Callable[[BuildContext], Call]:
    def forward(ctx: BuildContext, x: Tensor, bias: Tensor, residual: Tensor) -> Tensor:
        return bias_dropout_add(x, bias, residual, _keep(ctx, (rows, h)), ctx.dropout_prob, ctx.regions)

    def graph(ctx: BuildContext) -> tuple[Tensor, tuple[Tensor, ...]]:
        x, bias, res = _leaf(ctx.randn(rows, h)), _leaf(ctx.randn(h)), _leaf(ctx.randn(rows, h))
        return forward(ctx, x, bias, res), (x, bias, res)

    if backward:
        return _timed_backward(graph)

    def build(ctx: BuildContext) -> Call:
        x, bias, res = ctx.randn(rows, h), ctx.randn(h), ctx.randn(rows, h)
        return lambda: forward(ctx, x, bias, res)

    return build


def _softmax(backward: bool, b: int, heads: int, s: int, d: int) -> Callable[[BuildContext], Call]:
    scale = 1.0 / math.sqrt(d)

    def graph(ctx: BuildContext) -> tuple[Tensor, tuple[Tensor, ...]]:
        scores = _leaf(ctx.randn(b, heads, s, s))
        return scale_mask_softmax(scores, scale, ctx.regions), (scores,)

    if backward:
        return _timed_backward(graph)

    def build(ctx: BuildContext) -> Call:
        scores = ctx.randn(b, heads, s, s)
        return lambda: scale_mask_softmax(scores, scale, ctx.regions)

    return build


def _attention_dropout(backward: bool, b: int, heads: int, s: int) -> Callable[[BuildContext], Call]:
    shape = (b, heads, s, s)

    def graph(ctx: BuildContext) -> tuple[Tensor, tuple[Tensor, ...]]:
        probs = _leaf(ctx.randn(*shape, scale=1.0 / s))
        return dropout(probs, _keep(ctx, shape), ctx.dropout_prob, ctx.regions), (probs,)

    if backward:
        return _timed_backward(graph)

    def build(ctx: BuildContext) -> Call:
        probs = ctx.randn(*shape, scale=1.0 / s)
        return lambda: dropout(probs, _keep(ctx, shape), ctx.dropout_prob, ctx.regions)

    return build


def _context_layout(backward: bool, s: int, b: int, heads: int, d: int) -> Callable[[BuildContext], Call]:
    batch = b * heads

    def layout(context: Tensor) -> Tensor:  # ParallelTransformerLayer._attention_core
        return context.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)

    if not backward:

        def build(ctx: BuildContext) -> Call:
            context = ctx.randn(batch, s, d)
            return lambda: layout(context)

        return build

    def build_backward(ctx: BuildContext) -> Call:
        context = _leaf(ctx.randn(batch, s, d))
        out, grad_out = layout(context), ctx.randn(s, b, heads * d)
        qkv = _leaf(ctx.randn(s, b, 3 * heads * d))  # ParallelTransformerLayer._attention
        q, k, v = qkv.view(s, b, heads, 3 * d).split(d, dim=-1)
        views = (
            q.reshape(s, batch, d).transpose(0, 1),
            k.reshape(s, batch, d).permute(1, 2, 0),
            v.reshape(s, batch, d).transpose(0, 1),
        )
        grads = (ctx.randn(batch, s, d), ctx.randn(batch, d, s), ctx.randn(batch, s, d))

        def call() -> object:
            torch.autograd.grad(out, context, grad_out, retain_graph=True)
            (grad_qkv,) = torch.autograd.grad(views, qkv, grads, retain_graph=True)
            return grad_qkv.reshape(-1, grad_qkv.shape[-1]).sum(dim=0)  # QKV bias gradient

        return call

    return build_backward


def _gelu(backward: bool, tokens: int, width: int) -> Callable[[BuildContext], Call]:
    def graph(ctx: BuildContext) -> tuple[Tensor, tuple[Tensor, ...]]:
        x = _leaf(ctx.randn(tokens, width))
        return F.gelu(x, approximate="tanh"), (x,)

    if backward:  # + fc1's bias gradient, grad2d.sum(dim=0) in _Linear.backward
        return _timed_backward(graph, after=lambda grads: grads[0].sum(dim=0))

    def build(ctx: BuildContext) -> Call:
        x = ctx.randn(tokens, width)
        return lambda: F.gelu(x, approximate="tanh")

    return build


_SITES: dict[str, Callable[..., Callable[[BuildContext], Call]]] = {
    "layer_norm": _layer_norm,
    "residual_add": _residual_add,
    "bias_dropout_add": _bias_dropout_add,
    "softmax": _softmax,
    "attention_dropout": _attention_dropout,
    "context_layout": _context_layout,
    "gelu": _gelu,
}
