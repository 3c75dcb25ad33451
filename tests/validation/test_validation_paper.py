"""The shipped calibration is reproducible, and validation covers every table row."""

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.validation import (
    fit_table4,
    fitted_to_table4,
    load_paper_tables,
    table4_comparisons,
    table5_comparisons,
)


def test_shipped_a100_constants_are_the_table4_fit_of_the_public_profile():
    """a100-sxm4-80gb = a100-sxm4-80gb-public + the Table 4 fit, nothing else."""
    public = load_hardware("a100-sxm4-80gb-public")
    shipped = load_hardware("a100-sxm4-80gb")
    fit = fit_table4(public)
    assert shipped.compute.gemm_max_efficiency == fit.gemm_max_efficiency
    assert shipped.network.tp_overlap_fraction == fit.tp_overlap_fraction
    declared = shipped.calibration["public_values"]
    assert declared["compute.gemm_max_efficiency"] == public.compute.gemm_max_efficiency
    assert declared["network.tp_overlap_fraction"] == public.network.tp_overlap_fraction
    assert fitted_to_table4(shipped) and not fitted_to_table4(public)
    untouched = shipped.model_copy(
        update={
            "name": public.name,
            "description": public.description,
            "provenance": public.provenance,
            "calibration": public.calibration,
            "compute": shipped.compute.model_copy(
                update={
                    "gemm_max_efficiency": public.compute.gemm_max_efficiency,
                    "sources": public.compute.sources,
                }
            ),
            "network": shipped.network.model_copy(
                update={
                    "tp_overlap_fraction": public.network.tp_overlap_fraction,
                    "sources": public.network.sources,
                }
            ),
        }
    )
    assert untouched == public


def test_every_row_of_tables_4_and_5_is_compared():
    """10 Table 4 times; 8 Table 5 iteration times plus 4 MFU and 4 HFU."""
    tables = load_paper_tables()
    assert len(table4_comparisons()) == 2 * len(tables["table4"]) == 10
    rows = table5_comparisons()
    assert sum(r.quantity == "iteration s" for r in rows) == 8
    assert sum(r.unit == "%" for r in rows) == 8


def test_table4_calibration_fits_within_two_percent():
    """After calibration every Table 4 time is within 2 % (it is what was fitted)."""
    assert all(abs(row.error) < 0.02 for row in table4_comparisons())


def test_paper_check_of_mfu_formula_through_validation():
    """A measured MFU in Table 5 equals the paper's formula at the measured time (41.5% for
    22B at 1.10 s up to rounding), so predicted MFU errors are time errors, not formula ones."""
    rows = {(r.row, r.quantity): r for r in table5_comparisons()}
    row = rows[("22B SP + selective", "iteration s")]
    mfu = rows[("22B SP + selective", "MFU")]
    assert mfu.predicted * row.predicted == pytest.approx(41.7 * 1.10, rel=0.01)
