"""Layouts Megatron-core accepts (`get_num_layers_to_build`), written from the flags' side by the
importer's author: even, embedding / loss counted as layers, explicit first / last sizes."""

from __future__ import annotations

import pytest

from simcluster.config.pipeline_split import split_problems
from simcluster.config.scenario import Scenario

BOTH = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def _ends(first: int | None, last: int | None = None) -> dict[str, int]:
    ends = {"first_pipeline_num_layers": first, "last_pipeline_num_layers": last}
    return {key: n for key, n in ends.items() if n is not None}


def _scenario(num_layers: int, pp: int, vpp: int = 1, **parallel) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "split",
            "hardware": "h100-sxm5-80gb",
            "model": {"num_layers": num_layers, "hidden_size": 256, "num_attention_heads": 8,
                      "seq_length": 128, "vocab_size": 1024},
            "parallel": {"tp": 1, "pp": pp, "vpp": vpp, **parallel},
            "training": {"micro_batch_size": 1, "global_batch_size": 16},
        }
    )  # fmt: skip


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "parallel"),
    [
        (32, 4, 2, {}),
        (126, 16, 8, BOTH),
        (127, 16, 8, {"account_for_embedding_in_pipeline_split": True}),
        (14, 4, 1, _ends(3, 3)),
        (20, 4, 2, _ends(2, 6)),
        (10, 3, 1, _ends(4)),
        (8, 2, 1, _ends(3, 5)),
    ],
)
def test_layouts_megatron_core_accepts(layers, pp, vpp, parallel):
    assert split_problems(_scenario(layers, pp, vpp, **parallel).split_request) == []
