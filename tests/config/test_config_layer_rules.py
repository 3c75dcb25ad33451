"""The attention layer's rules live once (`config.layer_rules`): each by hand, the scenario
validator and the layer descriptions refusing the same layouts, and no second copy."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from simcluster.config.choices import AttentionBackend, AttentionKernel, Dtype
from simcluster.config.errors import ConfigError
from simcluster.config.layer_rules import (
    ContextParallelRule,
    attention_kernel_allowed,
    context_parallel_problems,
    flash_precision_allowed,
    query_group_problems,
    query_groups_or_default,
)
from simcluster.config.layer_shape import Indivisible
from simcluster.config.scenario import parse_scenario
from simcluster.workload.layer_config import LayerConfig
from tests.modern_cases import llama3_8b

PACKAGE = Path(__file__).resolve().parents[2] / "simcluster"
FLASH, UNFUSED = AttentionBackend.FLASH, AttentionBackend.UNFUSED


def test_query_groups_default_to_the_heads():
    """Unset (None or 0) means one K/V head per query head."""
    assert query_groups_or_default(32, None) == query_groups_or_default(32, 0) == 32
    assert query_groups_or_default(32, 8) == 8


@pytest.mark.parametrize(
    ("a", "g", "tp", "expected"),
    [
        (32, 8, 8, []),
        (32, 6, 2, [Indivisible("num_attention_heads", 32, "num_query_groups", 6)]),
        (32, 8, 16, [Indivisible("num_query_groups", 8, "tp", 16)]),
        (32, 6, 4, [Indivisible("num_attention_heads", 32, "num_query_groups", 6)]),  # the first only
    ],
)
def test_query_group_problems(a, g, tp, expected):
    assert query_group_problems(a, g, tp) == expected


def test_flash_needs_16_bit_and_a_kernel_choice_needs_flash():
    assert flash_precision_allowed(FLASH, Dtype.BF16) and flash_precision_allowed(FLASH, Dtype.FP8)
    assert not flash_precision_allowed(FLASH, Dtype.FP32) and flash_precision_allowed(UNFUSED, Dtype.FP32)
    assert attention_kernel_allowed(AttentionKernel.FLASH_ATTN_2, FLASH)
    assert not attention_kernel_allowed(AttentionKernel.FLASH_ATTN_2, UNFUSED)
    assert attention_kernel_allowed(AttentionKernel.AUTO, UNFUSED)


@pytest.mark.parametrize(
    ("cp", "s", "tp", "sp", "backend", "expected"),
    [
        (1, 1001, 3, True, UNFUSED, []),
        (2, 8192, 8, True, FLASH, []),
        (4, 8196, 1, False, FLASH, [ContextParallelRule.SEQUENCE_CHUNKS]),  # 8196 / 8 is not whole
        (2, 8200, 8, True, FLASH, [ContextParallelRule.SEQUENCE_PARALLEL]),  # 4100 / 8 is not whole
        (2, 8192, 8, True, UNFUSED, [ContextParallelRule.FLASH_BACKEND]),
        (3, 100, 1, False, UNFUSED, [ContextParallelRule.SEQUENCE_CHUNKS, ContextParallelRule.FLASH_BACKEND]),
    ],
)
def test_context_parallel_problems(cp, s, tp, sp, backend, expected):
    assert context_parallel_problems(cp, s, tp, sp, backend) == expected


def _scenario_refuses(g: int, tp: int, backend: str, dtype: str, kernel: str) -> bool:
    data = llama3_8b(
        model={"num_query_groups": g},
        parallel={"tp": tp},
        training={"attention_backend": backend, "dtype": dtype, "attention_kernel": kernel},
    )
    try:
        parse_scenario(data, "rules.yaml")
    except ConfigError:
        return True
    return False


def _layer_refuses(g: int, tp: int, backend: str, dtype: str, kernel: str) -> bool:
    try:
        LayerConfig(4096, 32, 8192, 1, 14336, tp=tp, num_query_groups=g, attention_backend=backend,
                    dtype=dtype, attention_kernel=kernel)  # fmt: skip
    except ValueError:
        return True
    return False


@pytest.mark.parametrize(
    ("g", "tp", "backend", "dtype", "kernel"),
    list(
        itertools.product(
            [8, 6, 32], [1, 4, 16], ["flash", "unfused"], ["bf16", "fp32"], ["auto", "flash_attn_2"]
        )
    ),
)
def test_the_scenario_and_the_layer_refuse_the_same_layers(g, tp, backend, dtype, kernel):
    """GQA, flash precision and kernel choice: a scenario loads exactly when its layer can be built."""
    assert _scenario_refuses(g, tp, backend, dtype, kernel) == _layer_refuses(g, tp, backend, dtype, kernel)


WRITTEN_ONCE = (
    "config/scenario.py",
    "workload/layer_config.py",
    "profiler/layer/spec.py",
    "workload/memory.py",
)


def _boolops_of_query_groups(tree: ast.AST) -> list[int]:
    """Lines of `x.num_query_groups or ...` / `query_groups or ...` (the default, rewritten)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            first = node.values[0]
            name = (
                first.attr
                if isinstance(first, ast.Attribute)
                else first.id
                if isinstance(first, ast.Name)
                else ""
            )
            if name in {"num_query_groups", "query_groups"}:
                lines.append(node.lineno)
    return lines


def _modulo_by_twice(tree: ast.AST) -> list[int]:
    """Lines of `… % (2 * cp)` or `seq_length % 2` (the 2·cp chunk rule, rewritten)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            right, left = node.right, ast.unparse(node.left)
            twice = (
                isinstance(right, ast.BinOp)
                and isinstance(right.left, ast.Constant)
                and right.left.value == 2
            )
            if twice or (isinstance(right, ast.Constant) and right.value == 2 and "seq" in left):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("module", WRITTEN_ONCE)
def test_no_second_copy_of_the_rules(module):
    """The query-groups default and the 2·cp chunk rule are not written again beside the callers."""
    tree = ast.parse((PACKAGE / module).read_text())
    assert _boolops_of_query_groups(tree) == [] and _modulo_by_twice(tree) == []


def test_the_guard_sees_the_copies_there_were():
    """The forms the rules had in scenario.py and layer_config.py before they moved."""
    source = "g = self.num_query_groups or self.num_attention_heads\nbad = s % (2 * cp)\n"
    tree = ast.parse(source + "odd = self.seq_length % 2\n")
    assert _boolops_of_query_groups(tree) == [1] and _modulo_by_twice(tree) == [2, 3]


def test_the_torch_layer_builds_with_the_standard_library_and_torch_only():
    """`LayerSpec` (and so the rules it asks) imports without pydantic, yaml or the simulator's other deps."""
    blocked = ["pydantic", "yaml", "simpy", "pandas", "matplotlib", "typer", "pyarrow", "numpy"]
    code = (
        f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
        "from simcluster.profiler.layer.spec import LayerSpec\n"
        "try:\n    LayerSpec(64, 4, 32, 2, cp=2)\nexcept ValueError as e:\n    assert 'flash' in str(e)\n"
        "else:\n    raise SystemExit('cp=2 without flash was accepted')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
