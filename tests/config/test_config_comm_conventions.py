"""Counting conventions of the profiles' communication figures (docs/moe.md, "Counting
conventions checked (2026-11-27)"): each figure must count what simcluster divides by it."""

import pytest

from simcluster.config.hardware import load_hardware

RING_P2P_PROFILES = ["h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb"]


@pytest.mark.parametrize("stem", RING_P2P_PROFILES)
def test_p2p_efficiency_is_the_ring_send_rate_over_the_line(stem):
    """`nvlink_p2p_efficiency` prices one NCCL send while the link also carries the reverse
    traffic (a 1F1B send_forward_recv_backward pair, the CP ring): an SM copy at duplex. On the
    8-GPU NVSwitch nodes it is the profile's own ring busbw (nccl-tests: the bytes each rank
    sends per second, (n-1)/n of the all-gathered buffer over the time) over the line rate
    each way. H200 had taken a copy-engine copy in one direction alone (396.4 GB/s, 0.88)."""
    hw = load_hardware(stem)
    ring_gb_per_s = hw.network.nvlink_allgather_busbw[-1][1]
    assert hw.network.nvlink_p2p_efficiency == pytest.approx(
        ring_gb_per_s / hw.network.nvlink_bandwidth_gb_per_s, abs=0.005
    )


def test_h200_p2p_is_not_the_copy_engine_figure():
    """The one-direction CE copy (396.4 / 450 = 0.88) sits above every SM rate measured on
    H200: ring busbw 361.4, Azure's bidirectional SM read 671 / 2 = 335.5 GB/s a direction."""
    hw = load_hardware("h200-sxm-141gb")
    assert hw.network.nvlink_p2p_efficiency < 396.4 / 450 - 0.05
    assert hw.network.nvlink_p2p_efficiency * 450 >= 671 / 2
