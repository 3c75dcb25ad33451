"""What gpt-oss's routed experts run beyond the weighted SwiGLU experts of `workload.moe_layer`:
the clamp of the GLU's input and the fc2 bias, as Megatron-core runs them.

Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c (the Megatron-LM of
NVIDIA-NeMo/Megatron-Bridge v0.4.0, 0fbfe7d3, whose GPT-OSS bridge sets `add_bias_linear`,
`bias_activation_fusion`, `activation_func = quick_gelu`, `glu_linear_offset = 1.0`,
`activation_func_clamp_value = 7.0`), per busiest expert rank of `re` routed rows, `local`
local experts, `f` = moe_ffn_hidden_size / etp, element bytes `e`:

GLU clamp, fused_bias_geglu.py `weighted_bias_quick_geglu_impl`: before the fused (jit)
weighted quick-GEGLU, in eager PyTorch,

    x_glu, x_linear = input.chunk(2, -1)                                  # views
    input = torch.cat((x_glu.clamp(max=v), x_linear.clamp(-v, v)), -1)  # 3 kernels

forward: two clamps (each reads and writes [re, f]) and the cat (reads and writes
[re, 2f]): 8·e·re·f bytes. The fused GLU saves the cat's output, [re, 2f], for its backward
(`WeightedQuickGeGLUFunction.save_for_backward`) on top of the fc1 output the clamps keep.
Backward, autograd (PyTorch FunctionsManual.cpp `clamp_backward`): the gate's
`where(self <= v, grad, 0)` (a compare writing a bool mask, then the where), the linear
half's `where((self >= -v).logical_and_(self <= v), grad, 0)` (two compares, the and, the
where), and `chunk`'s backward, a cat of the two halves' gradients: 7 kernels,
(11·e + 8)·re·f bytes (`glu_clamp_backward_bytes`). The cat's backward is views (no kernel).

fc2 bias, experts.py `TEGroupedMLP._apply_bias`: fc2 is built with `skip_bias_add=True`, so
its bias is added after the grouped GEMM by a Python loop over the local experts,

    torch.cat([t + b * p for t, b, p in zip(split(out, tokens_per_expert), biases,
                                              split(probs, tokens_per_expert))])

forward: per expert a mul (writes [r, h]) and an add (reads two, writes one), then one cat of
[re, h]: 2·local + 1 kernels, 6·e·re·h bytes (probs in the activation dtype: Transformer
Engine's fused router returns them in the logits' dtype, router.cpp
`fused_topk_with_score_function_fwd`; `.to(dtype)` is then a no-op). Backward: per expert the
mul's two gradients, each a mul and a broadcast-reduction (`sum_to`: db over rows, dp over
h), 4 kernels and 6·e·r·h bytes; then `split`'s backward, a cat of the per-expert output
gradients, e·2·re·h, and of the probs' gradients, 2·e·re: 4·local + 2 kernels. Nothing new is
saved (the mul keeps the bias and a view of the probs, both held already).

fc1's bias is added inside TE's grouped GEMM (cuBLAS bias epilogue, `skip_bias_add=False`)
and its gradient comes from the weight-gradient GEMMs' epilogue (TE grouped_linear.py
`grouped_gemm_wgrad`): not priced apart, as the dense layer's fused biases are not.
"""

from __future__ import annotations

from simcluster.workload.ops import Module, Op, Pass, elementwise

# Op names end in their kernel kind (`calibration.records.recorded_op_kind`), ".bwd" in the
# backward: "moe.experts.clamp_gate.glu_clamp", "moe.experts.fc2_bias_add_3.expert_bias".

BOOL_BYTES = 1  # torch.bool masks of the clamp's backward


def glu_clamp_forward_ops(e: int, rows: float, f: float) -> tuple[Op, ...]:
    """The clamp of the gate half, of the linear half, and the cat (module docstring); the
    cat's output [rows, 2f] is saved for the fused GLU's backward."""
    half = e * rows * f
    return (
        elementwise(
            "moe.experts.clamp_gate.glu_clamp", 2 * half, module=Module.GLU_CLAMP, pass_=Pass.FORWARD
        ),
        elementwise(
            "moe.experts.clamp_linear.glu_clamp", 2 * half, module=Module.GLU_CLAMP, pass_=Pass.FORWARD
        ),
        elementwise(
            "moe.experts.clamp_cat.glu_clamp", 4 * half, 2 * half, module=Module.GLU_CLAMP, pass_=Pass.FORWARD
        ),
    )


def glu_clamp_backward_ops(e: int, rows: float, f: float) -> tuple[Op, ...]:
    """`clamp_backward` of both halves and `chunk`'s cat of their gradients (7 kernels)."""
    n, b = rows * f, BOOL_BYTES
    kernels = (
        ("gate_mask", e * n + b * n),  # self <= v
        ("gate_where", b * n + 2 * e * n),  # where(mask, grad, 0)
        ("linear_mask_low", e * n + b * n),  # self >= -v
        ("linear_mask_high", e * n + b * n),  # self <= v
        ("linear_and", 3 * b * n),  # logical_and_ in place: reads two masks, writes one
        ("linear_where", b * n + 2 * e * n),
        ("cat", 4 * e * n),  # the two [rows, f] gradients into [rows, 2f]
    )
    return tuple(
        elementwise(
            f"moe.experts.clamp_{name}.glu_clamp.bwd", bytes_, module=Module.GLU_CLAMP, pass_=Pass.INPUT_GRAD
        )
        for name, bytes_ in kernels
    )


def glu_clamp_backward_bytes(e: int, rows: float, f: float) -> float:
    """(11·e + 8)·rows·f: the sum of `glu_clamp_backward_ops`."""
    return (11 * e + 8 * BOOL_BYTES) * rows * f


def expert_bias_forward_ops(e: int, rows: float, h: int, local: int) -> tuple[Op, ...]:
    """Per local expert `b * p` and `t + b·p` on its rows (rows / local), then the cat."""
    r = rows / local
    ops: list[Op] = []
    for i in range(local):
        ops.append(
            elementwise(
                f"moe.experts.fc2_bias_mul_{i}.expert_bias",
                e * (r * h + h + r),
                module=Module.EXPERT_BIAS,
                pass_=Pass.FORWARD,
            )
        )
        ops.append(
            elementwise(
                f"moe.experts.fc2_bias_add_{i}.expert_bias",
                3 * e * r * h,
                module=Module.EXPERT_BIAS,
                pass_=Pass.FORWARD,
            )
        )
    ops.append(
        elementwise(
            "moe.experts.fc2_bias_cat.expert_bias",
            2 * e * rows * h,
            module=Module.EXPERT_BIAS,
            pass_=Pass.FORWARD,
        )
    )
    return tuple(ops)


def expert_bias_backward_ops(e: int, rows: float, h: int, local: int) -> tuple[Op, ...]:
    """Per local expert the mul's gradients (grad·p summed over rows -> db, grad·b summed
    over h -> dp), then `split`'s cats of the output and probs gradients."""
    r = rows / local
    ops: list[Op] = []
    for i in range(local):
        for grad, out in (("bias", h), ("probs", r)):
            ops.append(
                elementwise(
                    f"moe.experts.fc2_bias_{grad}_mul_{i}.expert_bias.bwd",
                    2 * e * r * h + e * r,
                    module=Module.EXPERT_BIAS,
                    pass_=Pass.INPUT_GRAD,
                )
            )
            ops.append(
                elementwise(
                    f"moe.experts.fc2_bias_{grad}_sum_{i}.expert_bias.bwd",
                    e * r * h + e * out,
                    module=Module.EXPERT_BIAS,
                    pass_=Pass.INPUT_GRAD,
                )
            )
    ops.append(
        elementwise(
            "moe.experts.fc2_bias_cat.expert_bias.bwd",
            2 * e * rows * h,
            module=Module.EXPERT_BIAS,
            pass_=Pass.INPUT_GRAD,
        )
    )
    ops.append(
        elementwise(
            "moe.experts.fc2_bias_probs_cat.expert_bias.bwd",
            2 * e * rows,
            module=Module.EXPERT_BIAS,
            pass_=Pass.INPUT_GRAD,
        )
    )
    return tuple(ops)
