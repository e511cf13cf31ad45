"""Step-time model: work counts and seconds checked against hand arithmetic."""
import math

import pytest

from perf_fixtures import H200, KNOWN, LLAMA_8B, QWEN3_MOE, spec
from servebook.errors import ServebookError
from servebook.perf import work as W
from servebook.perf.model import Coefficients, decode_step, prefill_request_s, prefill_step, smoothmax

LLAMA = spec(LLAMA_8B, "llama-3.1-8b")
MOE = spec(QWEN3_MOE, "qwen3-30b-a3b")


def test_causal_keys_by_hand():
    assert W.causal_keys(0, 4, None) == 1 + 2 + 3 + 4
    assert W.causal_keys(0, 4, 2) == 1 + 2 + 2 + 2
    assert W.causal_keys(1, 3, None) == 2 + 3 + 4
    assert W.causal_keys(3, 2, 4) == 4 + 4
    assert W.causal_keys(10, 3, 4) == 12


def test_expected_distinct_experts_by_hand():
    # one token touches exactly top-k experts; two tokens 128 * (1 - (120/128)^2)
    assert W.expected_distinct_experts(MOE, 1) == pytest.approx(8.0)
    assert W.expected_distinct_experts(MOE, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert W.expected_distinct_experts(MOE, 4096) == pytest.approx(128.0)
    assert W.expected_distinct_experts(LLAMA, 10) == 0


def test_dense_weight_read_excludes_untied_embedding():
    # Llama-3.1-8B bf16: 8,030,261,248 params x 2 B, minus the 128256 x 4096 embedding gather
    assert W.dense_weight_bytes_read(LLAMA) == (8_030_261_248 - 128256 * 4096) * 2
    assert W.dense_weight_bytes_read(LLAMA, tp=2) == (8_030_261_248 - 128256 * 4096) * 2 / 2


def test_decode_work_llama_by_hand():
    w = W.decode_work(LLAMA, 2, 1000)
    # KV: 32 layers x 8 heads x (128 K + 128 V) x 2 B = 131072 B per token
    assert w.kv_read_bytes == 2 * 1000 * 131072
    per_token_matmul = 8_030_261_248 - 2 * 128256 * 4096
    assert w.linear_flops == 2 * 2 * (per_token_matmul + 128256 * 4096)
    # attention: 32 q-heads x (128+128) x 2 FLOPs x 1001 keys x 32 layers x 2 sequences
    assert w.attention_flops == pytest.approx(2 * 32 * 256 * 1001 * 32 * 2)


def test_fp8_kv_halves_kv_reads():
    a = W.decode_work(LLAMA, 8, 4096, kv_cache_dtype="auto").kv_read_bytes
    b = W.decode_work(LLAMA, 8, 4096, kv_cache_dtype="fp8").kv_read_bytes
    assert b == a / 2


def test_sliding_window_caps_reads():
    from servebook.hf_config import load_model_spec

    gemma = load_model_spec("gemma-4-31b")
    short = W.decode_work(gemma, 1, 1000).kv_read_bytes
    long = W.decode_work(gemma, 1, 11000).kv_read_bytes
    # only the 10 global layers (4 KV heads x 512, K=V shared but vLLM keeps and reads both slots)
    # grow beyond the 1024 window: 10 x 4 x (512 + 512) x 2 B per extra token; sliding layers
    # grow by 24 tokens (1000 -> 1024)
    sliding = sum(1 for l in gemma.layers if l.kind == "sliding")
    assert sliding == 50
    expected = 10_000 * 10 * 4 * (512 + 512) * 2 + 24 * 50 * 16 * 512 * 2
    assert long - short == pytest.approx(expected)


def test_tp_replicates_kv_heads_beyond_their_count():
    moe_layer = MOE.layers[0]  # 4 KV heads
    assert W.kv_heads_per_gpu(moe_layer, 2) == 2
    assert W.kv_heads_per_gpu(moe_layer, 8) == 1  # replicated, not 0.5


def test_tp_that_does_not_divide_heads_is_refused_with_reason():
    with pytest.raises(ServebookError, match="does not divide .* 32 attention heads"):
        W.check_tp(LLAMA, 3)
    with pytest.raises(ServebookError, match="KV heads"):
        W.check_tp(spec(dict(LLAMA_8B, num_key_value_heads=6, num_attention_heads=24), "odd"), 4)


def test_smoothmax_limits():
    assert smoothmax(3.0, 4.0, 1.0) == pytest.approx(7.0)
    assert smoothmax(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert smoothmax(3.0, 4.0, 60.0) == pytest.approx(4.0, rel=1e-6)


def test_decode_step_seconds_by_hand():
    c = Coefficients(step_overhead_s=1e-3, per_sequence_overhead_s=0.0, request_overhead_s=0.0,
                     weight_bandwidth_eff=0.5, expert_bandwidth_eff=0.5, kv_bandwidth_eff=0.5, matmul_peak_eff=1.0,
                     matmul_half_tokens=1.0, attention_eff=0.5, smoothmax_p=20.0)
    s = decode_step(LLAMA, H200, c, batch=1, context_tokens=1000)
    weights_s = (8_030_261_248 - 128256 * 4096) * 2 / (4.8e12 * 0.5)
    kv_s = 1000 * 131072 / (4.8e12 * 0.5)
    assert s.step_s == pytest.approx(1e-3 + weights_s + kv_s, rel=1e-3)
    assert s.bound == "memory"


def test_moe_decode_reads_more_experts_as_batch_grows():
    one = decode_step(MOE, H200, KNOWN, batch=1, context_tokens=512)
    many = decode_step(MOE, H200, KNOWN, batch=64, context_tokens=512)
    bytes_per_expert = MOE.moe.params_per_expert * 2 * 48
    assert one.expert_bytes == pytest.approx(8 * bytes_per_expert, rel=1e-6)
    assert many.expert_bytes == pytest.approx(128 * (1 - (120 / 128) ** 64) * bytes_per_expert, rel=1e-6)


def test_prefill_chunks_add_step_overheads():
    one = prefill_request_s(LLAMA, H200, KNOWN, prompt_tokens=8192, max_num_batched_tokens=8192)
    four = prefill_request_s(LLAMA, H200, KNOWN, prompt_tokens=8192, max_num_batched_tokens=2048)
    # four steps read the weights four times and pay the step overhead four times
    assert four > one + 3 * KNOWN.step_overhead_s


def test_tp_allreduce_uses_link_bandwidth():
    c = Coefficients(**{**KNOWN.to_dict(), "allreduce_latency_s": 1e-5, "link_eff": 0.5})
    one = decode_step(LLAMA, H200, c, batch=8, context_tokens=1000, tp=2)
    # 2 all-reduces x 32 layers x (10 us + 2*(1/2) x 8 x 4096 x 2 B / (450e9 x 0.5))
    assert one.allreduce_s == pytest.approx(64 * (1e-5 + 8 * 4096 * 2 / 225e9))


def test_eager_steps_above_the_graph_size_pay_the_host_floor():
    c = Coefficients(**{**KNOWN.to_dict(), "eager_moe_layer_s": 1e-3, "smoothmax_p": 50.0})
    graphed = prefill_step(MOE, H200, c, tokens=512)
    eager = prefill_step(MOE, H200, c, tokens=513)
    # 48 MoE layers x 1 ms of host launches floor the eager step; the graphed one is far below it
    assert graphed.step_s < 0.048 < eager.step_s
    assert prefill_step(MOE, H200, c, tokens=513, cudagraph_max_tokens=1024).step_s < 0.048
    assert prefill_step(LLAMA, H200, c, tokens=513).step_s < 0.048   # no MoE layers, no floor


def test_cudagraph_size_follows_vllm_default():
    from servebook.perf.model import cudagraph_max_tokens

    # min(max_num_seqs x (1 + drafts) x 2, 512, max_num_batched_tokens) - vllm/config/vllm.py (0.27.1)
    assert cudagraph_max_tokens(256, 16384) == 512
    assert cudagraph_max_tokens(64, 16384) == 128
    assert cudagraph_max_tokens(64, 16384, num_speculative_tokens=3) == 512
    assert cudagraph_max_tokens(256, 256) == 256
    assert cudagraph_max_tokens(256, 16384, enforce_eager=True) == 0


def test_kv_read_counts_the_v_slot_vllm_keeps_for_k_equals_v_layers():
    """Gemma 4 global layers share K and V, but vLLM stores (and reads) both slots.

    Hand arithmetic for gemma-4-31b at one token of context, TP 1, bf16: 50 sliding layers x
    16 heads x (256 + 256) + 10 global layers x 4 heads x (512 + 512) = 450,560 elements,
    x 2 bytes = 901,120 bytes per token, the same as servebook.kv_cache's per-token page bytes.
    """
    from servebook.hf_config import load_model_spec
    from servebook.kv_cache import kv_cache_layout
    from servebook.perf.work import kv_elements_per_token_per_gpu

    spec = load_model_spec("gemma-4-31b")
    elements = sum(kv_elements_per_token_per_gpu(l, 1) for l in spec.layers if l.owns_cache)
    assert elements * 2 == 901_120
    assert kv_cache_layout(spec).kv_bytes_per_token == 901_120


def test_mxfp4_experts_are_read_at_their_own_width_and_count_rows_by_intensity():
    """gpt-oss's routed experts are MXFP4: 4-bit values + one 8-bit scale per 32 (17/32 byte), their biases
    16-bit; the rest of the model is 16-bit. The step model reads the experts at that width (not the
    model's average) and counts an expert GEMM's rows as 16-bit rows of the same arithmetic intensity."""
    from servebook.hf_config import MXFP4_BYTES_PER_PARAM, load_model_spec

    oss, qwen = load_model_spec("gpt-oss-20b"), load_model_spec("qwen3-30b-a3b")
    assert oss.moe.bytes_per_param == pytest.approx(MXFP4_BYTES_PER_PARAM, rel=0.01)
    assert oss.moe.bytes_per_param > MXFP4_BYTES_PER_PARAM, "the biases are 16-bit"
    assert qwen.moe.bytes_per_param == 2.0
    average = oss.weight_bytes / oss.params.total
    assert average > 1.2 * oss.moe.bytes_per_param, "a mixed checkpoint's average overstates its experts"
    per_layer = oss.moe.params_per_expert * oss.moe.bytes_per_param
    for t in (1.0, 32.0):
        touched = W.expected_distinct_experts(oss, t)
        assert W.expert_weight_bytes_read(oss, t) == pytest.approx(touched * per_layer * len(oss.moe.moe_layer_indices))
        assert W.expert_gemm_rows(oss, t) == pytest.approx(W.tokens_per_touched_expert(oss, t) * 2 / oss.moe.bytes_per_param)
        assert W.expert_gemm_rows(qwen, t) == W.tokens_per_touched_expert(qwen, t)
    # the bytes not in experts are the 16-bit rest, embedding table included (untied in gpt-oss)
    dense = W.dense_weight_bytes_read(oss) + oss.params.embedding * 2
    assert dense + oss.params.experts * oss.moe.bytes_per_param == pytest.approx(oss.weight_bytes, rel=1e-9)


def test_a_quantized_experts_decode_step_is_no_longer_priced_as_16_bit_work():
    """At a few rows per expert the 16-bit expert GEMM is bound by its weights; an MXFP4 one reads a
    quarter of the bytes and must not be priced at the 16-bit GEMM's cost (gpt-oss-20b on the H200 ran
    decode steps of 32 requests in ~4.6 ms: labs/e2e_results.md)."""
    import dataclasses

    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    oss = load_model_spec("gpt-oss-20b")
    as_bf16 = dataclasses.replace(oss, moe=dataclasses.replace(oss.moe, bytes_per_param=2.0))
    g = gpu_numbers("h200")
    c, _ = calibrated_coefficients(g.name)
    quantized = decode_step(oss, g, c, batch=32, context_tokens=600).step_s
    sixteen = decode_step(as_bf16, g, c, batch=32, context_tokens=600).step_s
    assert quantized < 2 / 3 * sixteen  # a quarter of the bytes; the attention and dense layers are shared
