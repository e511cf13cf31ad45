"""Roofline: arithmetic intensity by hand (dense and MoE), ridge point from datasheet peaks."""
import pytest

from perf_fixtures import H200, LLAMA_8B, QWEN3_MOE, spec
from servebook.perf.roofline import attainable_flops, decode_intensity, ridge_batch

LLAMA = spec(LLAMA_8B, "llama-3.1-8b")
MOE = spec(QWEN3_MOE, "qwen3-30b-a3b")


def test_dense_decode_intensity_is_about_the_batch():
    # 2 FLOPs per parameter per sequence over 2 bytes per parameter: ~B FLOP/byte with no KV to read
    i = decode_intensity(LLAMA, [1, 64], 0)["intensity_flops_per_byte"]
    assert i == pytest.approx([1.0, 64.0], rel=0.02)


def test_kv_reads_pull_intensity_down():
    short = decode_intensity(LLAMA, [64], 0)["intensity_flops_per_byte"][0]
    long = decode_intensity(LLAMA, [64], 8192)["intensity_flops_per_byte"][0]
    # at 8k context 64 sequences read 64 x 8192 x 128 KiB = 64 GiB of KV on top of ~15 GB of weights
    assert long < short / 4


def test_moe_intensity_grows_slower_than_dense():
    moe = decode_intensity(MOE, [1, 64], 0)["intensity_flops_per_byte"]
    assert moe[0] == pytest.approx(1.0, rel=0.1)       # one token reads just what it uses
    assert moe[1] < 64 * 3.35 / 30.5 * 1.5            # 64 tokens touch ~all experts: bytes x9, FLOPs x64


def test_ridge_and_attainable():
    assert H200.ridge_flops_per_byte == pytest.approx(989e12 / 4.8e12)
    assert attainable_flops(H200, [1.0, 1e4]) == pytest.approx([4.8e12, 989e12])
    b = ridge_batch(LLAMA, H200, 0)
    assert b == pytest.approx(H200.ridge_flops_per_byte, rel=0.05)
    assert ridge_batch(LLAMA, H200, 8192, max_batch=4096) is None   # KV reads keep long-context decode memory-bound
