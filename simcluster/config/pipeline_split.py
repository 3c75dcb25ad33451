"""How many transformer layers each pipeline stage and each of its virtual chunks builds.

Megatron-core's rules (`transformer_block.py::get_num_layers_to_build`,
`transformer_layer.py::get_transformer_layer_offset`), written once: the scenario loader reports what they
refuse and the workload builds its chunks from what they give.

* Default: every stage gets L/p layers, every chunk L/(p·v).
* `account_for_embedding_in_pipeline_split` / `account_for_loss_in_pipeline_split`: the
  split is computed as if there were L+1 / L+2 layers, so (L + e + l) must be divisible by
  p, and the per-stage share by v; the first virtual chunk of pipeline rank 0 then builds one
  layer fewer (the embedding takes its slot), the last virtual chunk of the last rank one
  fewer (the loss takes its slot).
* `first_pipeline_num_layers` F / `last_pipeline_num_layers` Lₗ: the first (last) stage gets
  exactly F (Lₗ) layers and the other stages split the rest evenly; with VPP every stage's
  count is divided by v (each must divide).
* `pipeline_layout` (`--pipeline-model-parallel-layout`): each virtual stage builds the
  transformer layers the layout string names (`config.pipeline_layout`); Megatron-core
  refuses it beside the four keys above.

Sources: `megatron/core/transformer/transformer_block.py::get_num_layers_to_build` (the
counts), `transformer_layer.py::get_transformer_layer_offset` (where each chunk starts:
chunks are laid out in virtual-stage order, chunk c of rank r at virtual index c·p + r),
and `transformer_config.py::TransformerConfig.__post_init__` (the divisibility checks, whose
order and "middle stages must exist for middle layers" rule are followed here).
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.pipeline_layout import LayoutRequest, layout_chunk_layers, layout_problems


@dataclass(frozen=True, slots=True)
class SplitRequest:
    """The scenario fields that decide the split (Megatron's names)."""

    num_layers: int
    pp: int
    vpp: int = 1
    account_for_embedding: bool = False
    account_for_loss: bool = False
    first_pipeline_num_layers: int | None = None
    last_pipeline_num_layers: int | None = None
    pipeline_layout: str | None = None
    mtp_num_layers: int = 0  # checked against the layout's m symbols

    @property
    def accounted_layers(self) -> int:
        """L + e + l: the layer count the split is computed for with the account-for flags."""
        return self.num_layers + int(self.account_for_embedding) + int(self.account_for_loss)

    @property
    def explicit(self) -> bool:
        return self.first_pipeline_num_layers is not None or self.last_pipeline_num_layers is not None


@dataclass(frozen=True, slots=True)
class PipelineSplit:
    """`chunk_layers[stage][chunk]`: transformer layers built by virtual chunk `chunk` of
    pipeline rank `stage`."""

    chunk_layers: tuple[tuple[int, ...], ...]

    @property
    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers per pipeline rank (the sum over its chunks)."""
        return tuple(sum(chunks) for chunks in self.chunk_layers)

    @property
    def num_layers(self) -> int:
        return sum(self.stage_layers)

    def layer_offset(self, stage: int, chunk: int) -> int:
        """The global index of the first layer of (stage, chunk): the layers of every
        virtual stage before it (`get_transformer_layer_offset`)."""
        pp = len(self.chunk_layers)
        virtual = chunk * pp + stage
        return sum(self.chunk_layers[k % pp][k // pp] for k in range(virtual))


def split_problems(request: SplitRequest) -> list[str]:
    """What Megatron-core refuses in this split, phrased on the scenario fields; empty when
    the split is valid. `parallel.vpp` > 1 with pp = 1 and the mutual exclusion of the two
    kinds of flags are reported by the scenario loader."""
    return _split(request)[1]


def pipeline_split(request: SplitRequest) -> PipelineSplit:
    """The layers each (stage, chunk) builds; ValueError naming the rule for a split
    Megatron-core refuses (the loader reports the same problems first)."""
    split, problems = _split(request)
    if problems:
        raise ValueError("; ".join(problems))
    assert split is not None
    return split


def _split(request: SplitRequest) -> tuple[PipelineSplit | None, list[str]]:
    if request.pipeline_layout is not None:
        return _layout_split(request)
    if request.explicit:
        return _explicit_split(request)
    return _accounted_split(request)


def _layout_split(request: SplitRequest) -> tuple[PipelineSplit | None, list[str]]:
    """The layout's transformer layers per (stage, chunk). Megatron-core
    (`TransformerConfig.__post_init__`) raises 'pipeline_model_parallel_layout cannot be set
    with other pipeline layout arguments' beside first/last stage sizes or account-for flags."""
    assert request.pipeline_layout is not None
    others = [
        name
        for name, on in (
            ("first_pipeline_num_layers", request.first_pipeline_num_layers is not None),
            ("last_pipeline_num_layers", request.last_pipeline_num_layers is not None),
            ("account_for_embedding_in_pipeline_split", request.account_for_embedding),
            ("account_for_loss_in_pipeline_split", request.account_for_loss),
        )
        if on
    ]
    if others:
        return None, [
            f"parallel.pipeline_layout: cannot be combined with parallel.{', parallel.'.join(others)}; "
            "Megatron-core: 'pipeline_model_parallel_layout cannot be set with other pipeline layout "
            "arguments' (the layout already places every layer)"
        ]
    layout = LayoutRequest(
        request.pipeline_layout, request.num_layers, request.pp, request.vpp, request.mtp_num_layers
    )
    problems = layout_problems(layout)
    if problems:
        return None, problems
    return PipelineSplit(layout_chunk_layers(layout)), []


def _accounted_split(request: SplitRequest) -> tuple[PipelineSplit | None, list[str]]:
    """Default split, or the account-for split: L + e + l over p·v, then one layer fewer in
    the first (embedding) and last (loss) virtual chunk."""
    p, v, L = request.pp, request.vpp, request.num_layers
    total = request.accounted_layers
    if total % (p * v):
        if request.account_for_embedding or request.account_for_loss:
            flags = " + ".join(
                name
                for name, on in (
                    ("1 for account_for_embedding_in_pipeline_split", request.account_for_embedding),
                    ("1 for account_for_loss_in_pipeline_split", request.account_for_loss),
                )
                if on
            )
            return None, [
                f"model.num_layers: value {L}: the split counts {L} + {flags} = {total} layers, which "
                f"must be divisible by pp * vpp ({p} * {v} = {p * v}) (Megatron-core "
                "get_num_layers_to_build)"
            ]
        return None, [f"model.num_layers: value {L}: must be divisible by pp * vpp ({p} * {v} = {p * v})"]
    per_chunk = total // (p * v)
    layers = [[per_chunk] * v for _ in range(p)]
    problems = []
    if request.account_for_embedding:
        layers[0][0] -= 1
    if request.account_for_loss:
        layers[p - 1][v - 1] -= 1
    if min(layers[0][0], layers[p - 1][v - 1]) < 0:
        problems.append(
            f"model.num_layers: value {L}: leaves {per_chunk} layer per chunk, too few for both the "
            "embedding and the loss in one chunk (Megatron-core asserts 'Not enough layers')"
        )
    return PipelineSplit(tuple(tuple(chunks) for chunks in layers)), problems


def _explicit_split(request: SplitRequest) -> tuple[PipelineSplit | None, list[str]]:
    """First / last stage sizes given, the middle stages split the rest evenly."""
    p, v, L = request.pp, request.vpp, request.num_layers
    first, last = request.first_pipeline_num_layers, request.last_pipeline_num_layers
    problems: list[str] = []
    if p == 1:
        key = "first_pipeline_num_layers" if first is not None else "last_pipeline_num_layers"
        value = first if first is not None else last
        return None, [f"parallel.{key}: value {value}: needs pp > 1"]
    middle_layers, middle_stages = L, p
    for key, value in (("first_pipeline_num_layers", first), ("last_pipeline_num_layers", last)):
        if value is None:
            continue
        if value % v:
            problems.append(
                f"parallel.{key}: value {value}: must be divisible by vpp ({v}); each of the stage's "
                "chunks builds the same number of layers"
            )
        middle_layers -= value
        middle_stages -= 1
    if middle_layers < 0:
        problems.append(
            f"model.num_layers: value {L}: fewer than first_pipeline_num_layers + "
            f"last_pipeline_num_layers ({(first or 0) + (last or 0)})"
        )
    elif bool(middle_layers) != bool(middle_stages):
        problems.append(
            f"model.num_layers: value {L}: leaves {middle_layers} layers for {middle_stages} middle "
            "stages; with first_pipeline_num_layers / last_pipeline_num_layers set the stages must hold "
            "every layer (Megatron-core: 'Mismatch')"
        )
    elif middle_stages and middle_layers % middle_stages:
        problems.append(
            f"model.num_layers: value {L}: leaves {middle_layers} layers for the {middle_stages} middle "
            f"stages, which must divide them evenly (Megatron-core)"
        )
    elif middle_stages and (middle_layers // middle_stages) % v:
        problems.append(
            f"parallel.vpp: value {v}: must divide the {middle_layers // middle_stages} layers of each "
            "middle stage"
        )
    if problems:
        return None, problems
    per_middle = middle_layers // middle_stages if middle_stages else 0
    stage_layers = [per_middle] * p
    if first is not None:
        stage_layers[0] = first
    if last is not None:
        stage_layers[p - 1] = last
    return PipelineSplit(tuple((count // v,) * v for count in stage_layers)), []
