"""The FLOPs simcluster divides by a public benchmark's rate are the FLOPs that benchmark divided
its time by (docs/hardware_profiles.md, "Counting conventions checked (2026-11-27)").

Each reference formula below is the benchmark's own, re-typed from its source (file@commit in
the comment) so that a change to `AttentionShape` or `GemmShape` counting that would price a
published rate against other FLOPs than it was measured on fails here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.workload.ops import FLASH_BACKWARD_FLOP_RATIO, AttentionShape, GemmShape


def flash_attention_hopper_flops(batch, nheads, seqlen_q, seqlen_k, headdim, headdim_v, causal):
    """Dao-AILab/flash-attention hopper/benchmark_attn.py::flops @0251105a (the FlashAttention-3
    paper's benchmark: the cuDNN and FA2 bars of its Figs. 5-6 behind the H100/H200 tables and
    the head-dim ratios): causal keys per query averaged, (max(0, s_k - s_q) + s_k) / 2; the
    backward printed as 2.5 × this."""
    avg_seqlen = (max(0, seqlen_k - seqlen_q) + seqlen_k) / 2 if causal else seqlen_k
    return batch * nheads * 2 * seqlen_q * avg_seqlen * (headdim + headdim_v)


def cudnn_training_benchmark_flops(batch, seqlen, head_dim_qk, head_dim_vo, heads, mode, window=None):
    """NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/benchmark_single_sdpa.py::flops
    @3929da2 (top_left causal mask, q_seqlen = kv_seqlen): the causal triangle with its
    diagonal; a sliding window of W keys (self included) W(W+1)/2 + (S - W)·W; forward two
    BMMs, backward five (3 × head_dim_qk + 2 × head_dim_vo)."""
    if window is None:
        pairs = seqlen * (seqlen + 1) // 2
    else:
        pairs = window * (window + 1) // 2 + (seqlen - window) * window
    base = batch * heads * pairs * 2
    return base * (head_dim_qk + head_dim_vo if mode == "fwd" else 3 * head_dim_qk + 2 * head_dim_vo)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [512, 8192])
def test_attention_flops_are_flash_attention_benchmark_flops(causal, seq):
    """The H100 microbench, FA3 paper and FA2 tables are all rates of these FLOPs: causal half,
    backward 2.5 × forward (benchmarks/h100_measured.py::_sdpa_rates counts them the same way)."""
    fwd = AttentionShape(batch=2, heads=16, kv_heads=16, seq_q=seq, seq_k=seq, head_dim=128, causal=causal)
    bwd = AttentionShape(
        batch=2, heads=16, kv_heads=16, seq_q=seq, seq_k=seq, head_dim=128, causal=causal, backward=True
    )
    reference = flash_attention_hopper_flops(2, 16, seq, seq, 128, 128, causal)
    assert fwd.flops == pytest.approx(reference, rel=1e-12)
    assert bwd.flops == pytest.approx(2.5 * reference, rel=1e-12)


def test_attention_flops_match_cudnn_training_benchmark_at_equal_head_dims():
    """cuDNN's benchmark counts the causal diagonal (s(s+1)/2 pairs, not s²/2) and five
    backward BMMs: at head dim 128 both agree with simcluster's count within 1/s."""
    s = 8192
    fwd = AttentionShape(batch=1, heads=64, kv_heads=8, seq_q=s, seq_k=s, head_dim=128, causal=True)
    bwd = AttentionShape(
        batch=1, heads=64, kv_heads=8, seq_q=s, seq_k=s, head_dim=128, causal=True, backward=True
    )
    assert fwd.flops == pytest.approx(cudnn_training_benchmark_flops(1, s, 128, 128, 64, "fwd"), rel=1.0 / s)
    assert bwd.flops == pytest.approx(cudnn_training_benchmark_flops(1, s, 128, 128, 64, "bwd"), rel=1.0 / s)


def test_window_pairs_match_cudnn_benchmark_band():
    """gpt-oss's window: Megatron --window-size (127, 0) is cuDNN's sliding window of 128 keys
    (self included), the band the cudnn-frontend gpt-oss rows behind the 128-key head-dim
    ratio were timed on; simcluster's s·(w+1) - (w+1)²/2 pairs are within 0.1 % of cuDNN's."""
    s, w = 8192, 127
    shape = AttentionShape(
        batch=1, heads=64, kv_heads=8, seq_q=s, seq_k=s, head_dim=64, causal=True, window_size=w
    )
    assert shape.keys_walked == 128
    reference = cudnn_training_benchmark_flops(1, s, 64, 64, 64, "fwd", window=w + 1)
    assert shape.flops == pytest.approx(reference, rel=1e-3)


def test_mla_backward_counts_five_gemms_by_their_head_dims():
    """At MLA's unequal head dims (Q·K 192, V 128) the backward counts cuDNN's five BMMs
    (3 × 192 + 2 × 128 = 832 per score pair and FLOP pair), not 2.5 × forward (800): the
    backward rates were measured at equal head dims, where the two agree, so they are rates of
    the five GEMMs' FLOPs. Causal, as the MLA layer's core is."""
    s = 4096
    fwd = AttentionShape(
        batch=1, heads=128, kv_heads=128, seq_q=s, seq_k=s, head_dim=192, causal=True, v_head_dim=128
    )
    bwd = replace(fwd, backward=True)
    assert fwd.flops == pytest.approx(cudnn_training_benchmark_flops(1, s, 192, 128, 128, "fwd"), rel=1.0 / s)
    assert bwd.flops == pytest.approx(cudnn_training_benchmark_flops(1, s, 192, 128, 128, "bwd"), rel=1.0 / s)
    assert bwd.flops / fwd.flops == pytest.approx(832 / 320, rel=1e-12)
    # equal head dims given as a separate V head dim price as the plain shape does
    same = AttentionShape(
        batch=1, heads=8, kv_heads=8, seq_q=s, seq_k=s, head_dim=128, causal=True, backward=True
    )
    split = replace(same, v_head_dim=128)
    assert split.flops == pytest.approx(same.flops, rel=1e-12)
    assert FLASH_BACKWARD_FLOP_RATIO == 2.5


@pytest.mark.parametrize(("m", "n", "k"), [(8192, 8192, 8192), (802816, 192, 768), (15872, 12288, 4096)])
def test_gemm_flops_are_the_benchmarks_2mnk(m, n, k):
    """Every GEMM table the profiles read counts 2·M·N·K: mamf-finder.py (`flos = 2 * m * n * k`),
    pytorch/ao benchmarks/float8/bench_matmul.py (`tops = 2 * M * N * K`), TE
    benchmarks/gemm/benchmark_gemm.py::compute_gemm_flops; superbench cublaslt_gemm.cu (Azure's
    cuBLASLt sweeps) counts m·n·(2k - 1), within 1/(2k)."""
    shape = GemmShape(m=m, n=n, k=k)
    assert shape.flops == 2 * m * n * k
    assert shape.flops == pytest.approx(m * n * (2 * k - 1), rel=1.0 / (2 * k - 1))
