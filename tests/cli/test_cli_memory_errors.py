"""`memory` errors: a CUDA measurement without a CUDA device is one clean error (as
calibrate's), and a zero shape override is refused like a negative one, not ignored."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from simcluster.cli import app

runner = CliRunner()
SHIPPED = "gpt-22b-sp-selective"


def test_measure_on_cuda_without_a_cuda_device_is_a_clean_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sees no GPU (the CPU wheel): exit 2 with calibrate's words, no traceback, and
    nothing measured."""
    pytest.importorskip("torch")
    monkeypatch.setattr("simcluster.profiler.bench.device_info.cuda_device_count", lambda: 0)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured without a device")

    monkeypatch.setattr("simcluster.profiler.layer.accounting.measure_saved_bytes", forbidden)
    result = runner.invoke(app, ["memory", SHIPPED, "--measure", "--device", "cuda", "--seq-length", "64"])
    assert result.exit_code == 2, result.output
    assert "--device cuda: torch sees no CUDA device (try --device cpu)" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("option", "field"),
    [("--seq-length", "model.seq_length"), ("--micro-batch-size", "training.micro_batch_size")],
)
@pytest.mark.parametrize("value", ["0", "-5"])
def test_zero_or_negative_shape_is_refused(option: str, field: str, value: str) -> None:
    """0 used to be read as 'no override' and the scenario's own shape was reported."""
    result = runner.invoke(app, ["memory", SHIPPED, option, value])
    assert result.exit_code == 2, result.output
    assert f"{field}: value {value}: Input should be greater than 0" in result.output
