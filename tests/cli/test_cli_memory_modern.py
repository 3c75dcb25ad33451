"""`simcluster memory --measure` for the modern layer options: predicted == measured, the QKV
output a selective checkpoint keeps through V's view counted and named."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app

runner = CliRunner()

OPTIONS = {
    "gqa": ({"num_query_groups": 4}, {}),
    "swiglu": ({"activation": "swiglu"}, {}),
    "squared_relu": ({"activation": "squared_relu"}, {}),
    "rmsnorm": ({"normalization": "rmsnorm"}, {}),
    "rope": ({"position_embedding": "rope"}, {}),
    "flash": ({}, {"attention_backend": "flash"}),
    "llama": (
        {
            "num_query_groups": 4,
            "activation": "swiglu",
            "normalization": "rmsnorm",
            "position_embedding": "rope",
        },
        {"attention_backend": "flash"},
    ),
}


def _scenario(tmp_path: Path, model: dict, training: dict, cp: int = 1) -> Path:
    data = {
        "name": "modern-tiny",
        "hardware": "h100-sxm5-80gb",
        "model": {
            "num_layers": 4,
            "hidden_size": 256,
            "num_attention_heads": 8,
            "ffn_hidden_size": 512,
            "seq_length": 64,
            "vocab_size": 1024,
            **model,
        },
        "parallel": {"tp": 2, "cp": cp, "pp": 1, "dp": 1, "sequence_parallel": True},
        "training": {"micro_batch_size": 2, "global_batch_size": 4, **training},
    }
    path = tmp_path / "modern.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", list(OPTIONS))
def test_memory_measure_modern_option(tmp_path: Path, name: str) -> None:
    model, training = OPTIONS[name]
    result = runner.invoke(app, ["memory", str(_scenario(tmp_path, model, training)), "--measure", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    measured, predicted = payload["measured_bytes_per_layer"], payload["predicted_bytes_per_layer"]
    assert measured == predicted
    assert payload["measured"]["view_held_bytes"] == 0  # no checkpoint: TE copies, nothing held


@pytest.mark.parametrize("name", ["rope", "llama", "gqa"])
def test_memory_measure_selective_counts_the_held_qkv_output(tmp_path: Path, name: str) -> None:
    """Selective recompute: the checkpoint keeps V's view, so the QKV output stays; the
    prediction counts it and equals the measurement."""
    model, training = OPTIONS[name]
    result = runner.invoke(
        app,
        [
            "memory",
            str(_scenario(tmp_path, model, {**training, "recompute": "selective"})),
            "--measure",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["measured_bytes_per_layer"] == payload["predicted_bytes_per_layer"]
    # e·S·(q + k)/t with S = 128 tokens, t = 2: RoPE q = k = 256; llama k = 256·4/8 = 128;
    # GQA without RoPE: a rank holds 2 groups of 2 heads, Q is copied (e·S·q/t)
    held = {"rope": 2 * 128 * 512 // 2, "llama": 2 * 128 * 384 // 2, "gqa": 2 * 128 * 256 // 2}
    assert payload["measured"]["view_held_bytes"] == held[name]


def test_memory_measure_names_the_held_qkv_output(tmp_path: Path) -> None:
    """The text output states the counted term and its cause."""
    model, training = OPTIONS["llama"]
    result = runner.invoke(
        app, ["memory", str(_scenario(tmp_path, model, {**training, "recompute": "selective"})), "--measure"]
    )
    assert result.exit_code == 0, result.output
    # e·S·(q + k)/t = 2 · 128 · (256 + 128) / 2
    assert "of these, 49,152 bytes are the QKV output kept alive by V's view" in result.output


def _measure_json(path: Path) -> dict:
    result = runner.invoke(app, ["memory", str(path), "--measure", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_memory_measure_context_parallel(tmp_path: Path) -> None:
    """cp = 2: the real layer runs as rank 0 of the K/V ring on s/cp = 32 tokens. Llama mix:
    the ring saves a K/V buffer and RoPE'd Q, nothing holds the QKV output. MHA without RoPE:
    TE keeps the views, so Q's view keeps the QKV output's K/V part beside the ring's buffer,
    e·S·2k/t = 2 · 64 · 512 / 2 bytes, counted (`ring_held_bytes`) and named. Both equal."""
    llama = _measure_json(_scenario(tmp_path, *OPTIONS["llama"], cp=2))
    assert llama["measured_bytes_per_layer"] == llama["predicted_bytes_per_layer"]
    assert llama["measured"]["view_held_bytes"] == 0
    flash = _measure_json(_scenario(tmp_path, *OPTIONS["flash"], cp=2))
    assert flash["measured"]["view_held_bytes"] == 32_768
    assert flash["measured_bytes_per_layer"] == flash["predicted_bytes_per_layer"]
    result = runner.invoke(app, ["memory", str(_scenario(tmp_path, *OPTIONS["flash"], cp=2)), "--measure"])
    assert "rank 0 of the cp = 2 K/V ring on s/cp = 32 tokens" in result.output
    assert "of these, 32,768 bytes are the QKV output kept alive by Q's view" in result.output
