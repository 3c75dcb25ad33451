"""Megatron-core's `--pipeline-model-parallel-layout`: which layers each virtual pipeline
stage builds, written as a string such as DeepSeek-V3's ``"Et*3|(tt|)*29,m|L"``.

Source: Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553,
`megatron/core/transformer/pipeline_parallel_layer_layout.py` (`PipelineParallelLayerLayout`:
`parse_str_to_list`, `__init__`, `validate_layer_layout`) and
`megatron/core/transformer/transformer_config.py::TransformerConfig.__post_init__` (a layout
refuses `num_layers_in_first/last_pipeline_stage` and
`account_for_embedding/loss_in_pipeline_split`; its stage count fixes the virtual-pipeline size).

Syntax, as Megatron parses it:

* ``E`` the embedding, ``t`` a transformer decoder layer, ``m`` a multi-token-prediction layer,
  ``L`` the loss (output layer); ``|`` ends a virtual stage; commas are cosmetic.
* ``x*N`` repeats one symbol N times, ``(...)*N`` repeats a group (no nesting): Megatron
  expands groups first, then single symbols, with two regular-expression passes.
* The stages are listed in virtual-stage order: stage k is chunk k // pp of pipeline rank
  k % pp (chunk c of rank r is virtual stage c·pp + r), so ``pp · vpp`` stages in all.

What Megatron requires of a layout (`validate_layer_layout`): ``E`` first and ``L`` last in
the flattened order, each exactly once; as many ``t`` as ``num_layers`` and ``m`` as
``mtp_num_layers``; no ``t`` after an ``m``; every ``m`` in one virtual stage, which is the
last chunk of its pipeline rank. Megatron builds the embedding on virtual stage 0 and the
loss on the last one whatever the string says (`is_pipeline_first_stage` /
`is_pipeline_last_stage`), so here ``E`` must open stage 0 and ``L`` close the last stage.
Standard library only.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

EMBEDDING, DECODER, MTP, LOSS = "E", "t", "m", "L"
SYMBOLS = (EMBEDDING, DECODER, MTP, LOSS)
FIELD = "parallel.pipeline_layout"
MAX_EXPANDED_SYMBOLS = 100_000
"""The most symbols a layout may expand to (Megatron has no bound; this keeps a typo such as
``t*999999999`` from exhausting memory; the largest published models have < 200 layers)."""

# Megatron's two expansion passes, in its order: groups, then single symbols.
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_SINGLE = re.compile(r"(.)\*(\d+)")


class LayoutError(ValueError):
    """A layout string Megatron's parser refuses (the message names what is wrong)."""


@dataclass(frozen=True, slots=True)
class PipelineLayout:
    """A parsed layout: `stages[k]` is virtual stage k's symbols in order."""

    text: str
    stages: tuple[str, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def count(self, symbol: str) -> int:
        return sum(stage.count(symbol) for stage in self.stages)

    def stages_with(self, symbol: str) -> tuple[int, ...]:
        """The virtual stages that hold `symbol`."""
        return tuple(k for k, stage in enumerate(self.stages) if symbol in stage)

    @property
    def mtp_stage(self) -> int | None:
        """The virtual stage of the MTP layers (None without them)."""
        holders = self.stages_with(MTP)
        return holders[0] if holders else None

    def chunk_layers(self, pp: int) -> tuple[tuple[int, ...], ...]:
        """`[rank][chunk]`: the transformer layers of chunk c of rank r, virtual stage c·pp + r
        (`PipelineParallelLayerLayout.__init__`'s 1-D to 2-D conversion)."""
        vpp = self.num_stages // pp
        return tuple(tuple(self.stages[c * pp + r].count(DECODER) for c in range(vpp)) for r in range(pp))


@functools.lru_cache(maxsize=64)
def parse_layout(text: str) -> PipelineLayout:
    """Expand and split `text` as `PipelineParallelLayerLayout.parse_str_to_list` does;
    LayoutError for a symbol it does not know or an expansion past MAX_EXPANDED_SYMBOLS."""
    expanded = text.replace(",", "")
    for pattern in (_GROUP, _SINGLE):
        expanded = pattern.sub(_repeat, expanded)
    stages = tuple(expanded.split("|"))
    for stage in stages:
        for symbol in stage:
            if symbol not in SYMBOLS:
                raise LayoutError(
                    f"unknown symbol {symbol!r} in stage {stage!r}; allowed: E (embedding), t "
                    "(transformer layer), m (MTP layer), L (loss), | (next virtual stage), x*N and "
                    "(...)*N (repeat), commas"
                )
    return PipelineLayout(text, stages)


def _repeat(match: re.Match[str]) -> str:
    body, times = match.group(1), int(match.group(2))
    if len(body) * times > MAX_EXPANDED_SYMBOLS:
        raise LayoutError(
            f"{match.group(0)!r} expands to {len(body) * times:,} symbols, over the "
            f"{MAX_EXPANDED_SYMBOLS:,} a layout may hold"
        )
    return body * times


@dataclass(frozen=True, slots=True)
class LayoutRequest:
    """The scenario fields a layout is checked against (Megatron's names)."""

    layout: str
    num_layers: int
    pp: int
    vpp: int = 1
    mtp_num_layers: int = 0


def layout_problems(request: LayoutRequest) -> list[str]:
    """What Megatron-core refuses in this layout, phrased on `parallel.pipeline_layout`;
    empty when it is valid."""
    try:
        layout = parse_layout(request.layout)
    except LayoutError as error:
        return [_problem(request, str(error))]
    p, v = request.pp, request.vpp
    if layout.num_stages != p * v:
        return [
            _problem(
                request,
                f"has {layout.num_stages} virtual stages ('|'-separated parts); must be pp * vpp "
                f"({p} * {v} = {p * v}): stage k is chunk k // pp of pipeline rank k % pp",
            )
        ]
    return [_problem(request, rule) for rule in _symbol_rules(layout, request)]


def _symbol_rules(layout: PipelineLayout, request: LayoutRequest) -> list[str]:
    """`validate_layer_layout`'s rules on the symbols' counts and places."""
    rules: list[str] = []
    first, last = layout.stages[0], layout.stages[-1]
    if layout.count(EMBEDDING) != 1 or not first.startswith(EMBEDDING):
        rules.append("needs exactly one E, the first symbol of the first virtual stage (the embedding)")
    if layout.count(LOSS) != 1 or not last.endswith(LOSS):
        rules.append("needs exactly one L, the last symbol of the last virtual stage (the loss)")
    decoders = layout.count(DECODER)
    if decoders != request.num_layers:
        rules.append(f"holds {decoders} transformer layers (t); model.num_layers is {request.num_layers}")
    mtps = layout.count(MTP)
    if mtps != request.mtp_num_layers:
        rules.append(f"holds {mtps} MTP layers (m); model.mtp_num_layers is {request.mtp_num_layers}")
    flat = "".join(layout.stages)
    if MTP in flat and DECODER in flat[flat.index(MTP) :]:
        rules.append("places a transformer layer (t) after an MTP layer (m); decoder layers come first")
    holders = layout.stages_with(MTP)
    if len(holders) > 1:
        rules.append(f"spreads the MTP layers over virtual stages {list(holders)}; all must be in one")
    elif holders and holders[0] // request.pp != request.vpp - 1:
        k = holders[0]
        rules.append(
            f"places the MTP layers in virtual stage {k} (chunk {k // request.pp} of pipeline rank "
            f"{k % request.pp}); Megatron-core requires the last chunk of a rank (chunk {request.vpp - 1})"
        )
    return rules


def _problem(request: LayoutRequest, rule: str) -> str:
    return f"{FIELD}: value {request.layout!r}: {rule} (Megatron-core PipelineParallelLayerLayout)"


def layout_chunk_layers(request: LayoutRequest) -> tuple[tuple[int, ...], ...]:
    """`[rank][chunk]` transformer layers of a valid layout; ValueError naming the rules
    otherwise (the loader reports the same problems first)."""
    problems = layout_problems(request)
    if problems:
        raise ValueError("; ".join(problems))
    return parse_layout(request.layout).chunk_layers(request.pp)
