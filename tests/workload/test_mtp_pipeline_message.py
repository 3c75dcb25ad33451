"""The pipeline message of a standalone MTP stage (`Workload.message_bytes`, priced by
`costs.stage_pricing`): Megatron-core's MTP block returns the decoder's hidden states and
each MTP depth's concatenated on the sequence dimension (multi_token_prediction.py
`MultiTokenPredictionBlock.forward`: `torch.cat(hidden_states_list, dim=0)`), so every hop
from the MTP stage to the loss stage carries (1 + mtp_num_layers) messages' bytes, forward
and backward; with `mtp_standalone` every p2p sends its shape first
(p2p_communication.py `_communicate_shapes`). MTP on the loss stage changes nothing."""

from __future__ import annotations

import pytest

from simcluster.config import load_hardware
from simcluster.costs.network import p2p_time_s
from simcluster.costs.stage_pricing import StagePricing
from simcluster.costs.stage_transfers import SHAPE_MESSAGE_BYTES
from simcluster.workload.model import build_workload
from tests.workload.test_mla_layer import _small

HW = load_hardware("h100-sxm5-80gb")
# the small DeepSeek-V3-shaped model (6 layers, tp 2 with SP, seq 256, mbs 1, hidden 512)
P2P_BYTES = 2 * 256 * 512 / 2  # bf16 · s · h / tp per rank
STANDALONE = {"parallel.pp": 4, "parallel.pipeline_layout": "Ett|ttt|tm|L"}
COLOCATED = {"parallel.pp": 4, "parallel.pipeline_layout": "Ett|ttt|t|mL"}
# pp 2 × vpp 2: virtual stage k is chunk k // 2 of rank k % 2; MTP on rank 0's chunk 1
INTERLEAVED = {"parallel.pp": 2, "parallel.vpp": 2, "parallel.pipeline_layout": "Ett|ttt|tm|L"}


def _message_bytes(changes: dict) -> list[float]:
    scenario = _small(**changes)
    workload = build_workload(scenario)
    assert workload.p2p_bytes == P2P_BYTES
    return [workload.message_bytes(vs) for vs in range(scenario.parallel.pp * scenario.parallel.vpp)]


def test_hops_after_a_standalone_mtp_stage_carry_every_depths_hidden_states() -> None:
    p = P2P_BYTES
    assert _message_bytes(STANDALONE) == [p, p, 2 * p, p]  # stage 2 (tm) -> 3 (L): 1 + 1 depth
    two_depths = STANDALONE | {"model.mtp_num_layers": 2, "parallel.pipeline_layout": "Ett|ttt|tmm|L"}
    assert _message_bytes(two_depths) == [p, p, 3 * p, p]
    assert _message_bytes(INTERLEAVED) == [p, p, 2 * p, p]
    assert build_workload(_small(**STANDALONE)).mtp_standalone


def test_mtp_on_the_loss_stage_sends_one_message_size() -> None:
    assert _message_bytes({}) == [P2P_BYTES] * 2  # no layout: MTP with the loss on the last stage
    assert _message_bytes(COLOCATED) == [P2P_BYTES] * 4
    assert not build_workload(_small()).mtp_standalone
    assert not build_workload(_small(**COLOCATED)).mtp_standalone


def _sends(changes: dict) -> list[tuple]:
    scenario = _small(**changes)
    stages = StagePricing(HW).stages(scenario, build_workload(scenario))
    return [(stage.send_forward, stage.send_backward) for stage in stages]


def _hop_s(transfer, message_bytes: float, shapes: bool) -> float:
    """A p2p of `message_bytes` on the transfer's link (SP: no gather), its shape first."""
    same = not transfer.crosses_nodes
    shape_s = p2p_time_s(SHAPE_MESSAGE_BYTES, same, HW) if shapes else 0.0
    return p2p_time_s(message_bytes, same, HW) + shape_s


def test_standalone_mtp_prices_each_hop_by_its_message() -> None:
    """pp 4: rank 2 sends 2 messages' bytes forward, rank 3 back; every hop sends its shape first."""
    p = P2P_BYTES
    sends = _sends(STANDALONE)
    forward_bytes, backward_bytes = [p, p, 2 * p, p], [p, p, p, 2 * p]
    for (forward, backward), f_bytes, b_bytes in zip(sends, forward_bytes, backward_bytes, strict=True):
        assert forward.chunk_seconds is None and backward.chunk_seconds is None  # one chunk a rank
        assert forward.seconds == pytest.approx(_hop_s(forward, f_bytes, True), rel=1e-12)
        assert backward.seconds == pytest.approx(_hop_s(backward, b_bytes, True), rel=1e-12)
    assert sends[2][0].seconds > sends[1][0].seconds


def test_interleaved_standalone_mtp_prices_each_chunks_hop() -> None:
    """pp 2 × vpp 2: rank 0's chunk 1 (the MTP stage) sends 2 messages' bytes forward, rank 1's
    chunk 1 (the loss stage) 2 back; their chunk 0 sends one. `seconds` is the least."""
    p = P2P_BYTES
    (forward0, backward0), (forward1, backward1) = _sends(INTERLEAVED)
    assert forward0.chunk_seconds == pytest.approx(
        (_hop_s(forward0, p, True), _hop_s(forward0, 2 * p, True)), rel=1e-12
    )
    assert backward1.chunk_seconds == pytest.approx(
        (_hop_s(backward1, p, True), _hop_s(backward1, 2 * p, True)), rel=1e-12
    )
    assert forward0.seconds == min(forward0.chunk_seconds) and backward1.seconds == min(
        backward1.chunk_seconds
    )
    assert backward0.chunk_seconds is None and forward1.chunk_seconds is None
    assert backward0.seconds == pytest.approx(_hop_s(backward0, p, True), rel=1e-12)


def test_colocated_mtp_sends_no_shapes() -> None:
    for forward, backward in _sends(COLOCATED):
        assert forward.seconds == pytest.approx(_hop_s(forward, P2P_BYTES, False), rel=1e-12)
        assert backward.seconds == pytest.approx(_hop_s(backward, P2P_BYTES, False), rel=1e-12)
