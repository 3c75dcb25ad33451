"""`import-megatron` without `--hardware` says which profile it chose and refuses a line that
profile cannot price (issue 17 §5); `--cross-entropy-loss-fusion` is a known flag."""

from __future__ import annotations

from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.megatron_args import DEFAULT_HARDWARE, parse_megatron_args

MINIMAL = "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 2"
FLASH = f"{MINIMAL} --bf16 --attention-backend flash"


def _invoke(*args):
    return CliRunner().invoke(app, ["import-megatron", *args])


def test_default_hardware_is_named_on_stderr_and_in_the_file():
    result = _invoke(MINIMAL)
    assert result.exit_code == 0, result.output
    note = f"note: hardware: {DEFAULT_HARDWARE}, import-megatron's default"
    assert note in result.stderr and f"# {note}" in result.stdout
    assert f"hardware: {DEFAULT_HARDWARE}" in result.stdout


def test_chosen_hardware_gets_no_default_note():
    result = _invoke(MINIMAL, "--hardware", "h100-sxm5-80gb")
    assert result.exit_code == 0, result.output
    assert "import-megatron's default" not in result.output


def test_flash_line_without_hardware_is_refused_naming_the_default():
    """Flash attention on the default A100 profile (no flash rates): exit 2, the rule, and
    that the default was used and how to choose; nothing written."""
    result = _invoke(FLASH)
    assert result.exit_code == 2 and result.stdout == ""
    assert "training.attention_backend: value flash: hardware profile 'a100-sxm4-80gb'" in result.stderr
    assert f"no --hardware was given, so the default {DEFAULT_HARDWARE} was used" in result.stderr
    assert "h100-sxm5-80gb" in result.stderr.splitlines()[-1]


def test_flash_line_with_a_newer_gpu_imports(tmp_path):
    out = tmp_path / "flash.yaml"
    result = _invoke(FLASH, "--hardware", "h100-sxm5-80gb", "--out", str(out))
    assert result.exit_code == 0, result.output
    run = CliRunner().invoke(app, ["run", str(out), "--json"])
    assert run.exit_code == 0, run.output


def test_fp8_line_on_a_chosen_a100_is_refused_too():
    """An explicit --hardware that cannot price the line is refused as `run` would refuse it
    (without the "default" line)."""
    result = _invoke(f"{MINIMAL} --bf16 --fp8-format hybrid", "--hardware", "a100-sxm4-80gb")
    assert result.exit_code == 2
    assert "training.dtype: value fp8: hardware profile 'a100-sxm4-80gb' has no FP8" in result.stderr
    assert "no --hardware was given" not in result.stderr


def test_cross_entropy_loss_fusion_is_known_and_says_why_it_is_not_priced():
    imported = parse_megatron_args(f"{MINIMAL} --cross-entropy-loss-fusion --cross-entropy-fusion-impl te")
    assert not imported.unknown
    (fusion,) = [line for line in imported.not_modelled if line.startswith("--cross-entropy-loss-fusion")]
    assert "memory unchanged" in fusion and "fp32 softmax" in fusion
    (impl,) = [line for line in imported.not_modelled if line.startswith("--cross-entropy-fusion-impl te")]
    assert "priced as native" in impl
