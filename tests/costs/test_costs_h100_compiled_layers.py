"""The shipped H100 profile prices the three torch.compile'd layers measured on an H100 SXM
(docs/calibration/h100-2026-11-26/layers_eager_vs_compiled.json, t 1, no collectives)
within 5 % each; the burst-ceiling, single-bandwidth model it replaced was 10.6-13.6 % fast."""

import pytest

from simcluster.config.hardware import load_hardware
from tests.h100_measured import h100_measured

H100 = load_hardware("h100-sxm5-80gb")


@pytest.mark.parametrize("row", h100_measured.layer_checks(H100), ids=lambda row: row["layer"])
def test_each_compiled_layer_within_five_percent(row):
    assert abs(row["error"]) <= 0.05, row


def test_the_burst_ceilings_and_one_bandwidth_price_every_layer_fast():
    """The same check fails without the measured compute model: the MAMF ceilings (0.803,
    0.709), no measured GEMMs, every memory-bound kernel at 2.90 TB/s."""
    burst = H100.model_copy(
        update={
            "compute": H100.compute.model_copy(
                update={
                    "gemm_max_efficiency": 0.803,
                    "gemm_points": [],
                    "memory_bound_efficiency": 0.866,
                    "memory_bound_efficiency_by_kind": {},
                }
            )
        }
    )
    assert all(row["error"] < -0.08 for row in h100_measured.layer_checks(burst))
