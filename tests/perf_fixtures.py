"""Shared, hand-written inputs for the perf tests (public config.json shapes; GPU datasheet peaks)."""
from servebook.perf.gpu import GPUNumbers
from servebook.perf.model import Coefficients

# meta-llama/Llama-3.1-8B config.json (shapes only)
LLAMA_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256,
                max_position_embeddings=131072, tie_word_embeddings=False, torch_dtype="bfloat16",
                rms_norm_eps=1e-5, head_dim=128)
# Qwen/Qwen3-30B-A3B config.json (shapes only)
QWEN3_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048,
                 intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                 num_attention_heads=32, num_key_value_heads=4, num_hidden_layers=48, vocab_size=151936,
                 max_position_embeddings=40960, tie_word_embeddings=False, torch_dtype="bfloat16", head_dim=128,
                 decoder_sparse_step=1, mlp_only_layers=[])

# NVIDIA H200 SXM datasheet: 141 GB, 4.8 TB/s, 989 TFLOP/s dense bf16, NVLink 900 GB/s (both directions; 450 each way)
H200 = GPUNumbers("h200", 141 * 10**9, 4.8e12, 989e12, 1979e12, 900e9)

# Known coefficients for synthetic-data tests (not calibrated values: test inputs)
KNOWN = Coefficients(expert_matmul_peak_eff=0.4, per_moe_layer_overhead_s=3e-5, eager_moe_layer_s=1.5e-3,
                     step_overhead_s=2e-3, per_sequence_overhead_s=5e-6, request_overhead_s=8e-3,
                     weight_bandwidth_eff=0.8, expert_bandwidth_eff=0.55, kv_bandwidth_eff=0.65,
                     matmul_peak_eff=0.7, matmul_half_tokens=100.0, attention_eff=0.45, smoothmax_p=4.0,
                     gpu="h200", source="test")


def spec(cfg, name):
    from servebook.hf_config import load_model_spec

    return load_model_spec(dict(cfg), name=name)
