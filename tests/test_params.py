"""Parameter counts and weight bytes of the reference models against published sizes.

Every expected number below is published by the model's authors (source in the
comment) or read from a recorded checkpoint inventory; none is copied from the
loader's output. Published sizes are rounded, so each check allows 1% (or the
rounding interval of the published figure where that is wider).
"""
from __future__ import annotations

import pytest

from servebook.hf_config import active_matmul_params, load_model_spec, mtp_params, reference_model_ids

B = 1e9
GIB = 2**30


def _close(value: float, published: float, rel: float = 0.01) -> bool:
    return abs(value - published) <= rel * published


# (id, published total, source)
PUBLISHED_TOTALS = [
    # Hugging Face model page (safetensors metadata) of meta-llama/Llama-3.1-8B: "8.03B params"
    ("llama-3.1-8b", 8.03 * B),
    # Hugging Face model page of meta-llama/Llama-3.1-70B: "70.6B params"
    ("llama-3.1-70b", 70.6 * B),
    # Qwen/Qwen3-32B model card: "Number of Parameters: 32.8B"
    ("qwen3-32b", 32.8 * B),
    # Qwen/Qwen3-30B-A3B model card: "Number of Parameters: 30.5B in total and 3.3B activated"
    ("qwen3-30b-a3b", 30.5 * B),
    # Hugging Face model page of mistralai/Mistral-7B-v0.1: "7.24B params"
    ("mistral-7b-v0.1", 7.24 * B),
    # Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters"
    ("mixtral-8x7b", 46.7 * B),
    # DeepSeek-V3 technical report / model card: "671B total parameters" (main model, MTP excluded)
    ("deepseek-v3", 671 * B),
    # Hugging Face model page of deepseek-ai/DeepSeek-V2-Lite: "15.7B params"
    ("deepseek-v2-lite", 15.7 * B),
    # gpt-oss model card (arXiv 2508.10925), Table 1: 20.91B total / 116.83B total
    ("gpt-oss-20b", 20.91 * B),
    ("gpt-oss-120b", 116.83 * B),
    # Gemma 3 technical report, Table 1 (27B): 1,416M embedding + 25,600M non-embedding
    # parameters; the 417M vision encoder is listed separately (we count text only).
    ("gemma-3-27b", (1416 + 25600) * 1e6),
    # Gemma 4 model card: 31B dense "30.7B"; 26B A4B "25.2B total, 3.8B active".
    # These match text-only counts (the ~550M vision encoder is not included).
    ("gemma-4-31b", 30.7 * B),
    # Quantized checkpoints of the same models (issue 40): the same shapes, so the same parameters
    # as the base model's published count (packing changes bytes, not parameters).
    ("llama-3.1-8b-awq-int4", 8.03 * B),
    ("llama-3.1-8b-gptq-int4", 8.03 * B),
    ("llama-3.1-8b-w8a8", 8.03 * B),
    ("llama-3.1-70b-awq-int4", 70.6 * B),
    ("qwen3-32b-fp8", 32.8 * B),
    ("gemma-4-26b-a4b", 25.2 * B),
]


@pytest.mark.parametrize("model_id,published", PUBLISHED_TOTALS, ids=[p[0] for p in PUBLISHED_TOTALS])
def test_total_parameters_match_published(model_id, published):
    total = load_model_spec(model_id).params.total
    assert _close(total, published), f"{model_id}: {total / B:.3f}B vs published {published / B:.3f}B"


def test_every_reference_model_has_a_published_total():
    assert sorted(p[0] for p in PUBLISHED_TOTALS) == reference_model_ids()


# Active parameters. Publishers count them two ways; see active_matmul_params.
def test_active_including_embedding_mixtral_and_qwen():
    # Mistral AI, "Mixtral of experts": "only uses 12.9B parameters per token"
    assert _close(load_model_spec("mixtral-8x7b").params.active, 12.9 * B)
    # Qwen3-30B-A3B model card: "3.3B activated"
    assert _close(load_model_spec("qwen3-30b-a3b").params.active, 3.3 * B, rel=0.02)
    # Gemma 4 model card: 26B A4B "3.8B active" (tied embeddings: the table is the head)
    assert _close(load_model_spec("gemma-4-26b-a4b").params.active, 3.8 * B)


def test_active_excluding_input_embedding_gpt_oss_and_deepseek():
    # gpt-oss model card, Table 1: active 3.61B (20b), 5.13B (120b); their active count
    # includes the unembedding but not the embedding lookup.
    assert _close(active_matmul_params(load_model_spec("gpt-oss-20b")), 3.61 * B)
    assert _close(active_matmul_params(load_model_spec("gpt-oss-120b")), 5.13 * B)
    # DeepSeek-V3 report: "37B activated for each token" -- two significant digits, so the
    # published figure stands for [36.5B, 37.5B).
    assert 36.5 * B <= active_matmul_params(load_model_spec("deepseek-v3")) < 37.5 * B
    # DeepSeek-V2 paper / V2-Lite card: "2.4B activated" -- two significant digits; allow 3%.
    assert _close(active_matmul_params(load_model_spec("deepseek-v2-lite")), 2.4 * B, rel=0.03)


def test_dense_models_are_fully_active():
    for model_id in ("llama-3.1-8b", "qwen3-32b", "mistral-7b-v0.1", "gemma-4-31b"):
        params = load_model_spec(model_id).params
        assert params.active == params.total and params.experts == 0


def test_non_embedding_counts_from_qwen_model_cards():
    # Qwen3 model cards: "Number of Paramaters (Non-Embedding): 31.2B" (32B), "29.9B" (30B-A3B)
    for model_id, published in (("qwen3-32b", 31.2 * B), ("qwen3-30b-a3b", 29.9 * B)):
        p = load_model_spec(model_id).params
        assert _close(p.total - p.embedding - p.lm_head, published)


def test_deepseek_v3_mtp_module_explains_685b_repo_size():
    # The Hugging Face repo states 685B = 671B main model + 14B multi-token-prediction
    # module. vLLM loads the MTP weights only for MTP speculative decoding, so the spec
    # (and weight_bytes) leave them out; mtp_params sizes them.
    spec = load_model_spec("deepseek-v3")
    assert _close(mtp_params("deepseek-v3"), 14 * B, rel=0.05)
    assert _close(spec.params.total + mtp_params("deepseek-v3"), 685 * B)
    assert mtp_params("llama-3.1-8b") == 0


# --- recorded checkpoint inventories (exact) -----------------------------------


def test_deepseek_v2_lite_matches_checkpoint_tensor_count():
    # A public model report listing every tensor of DeepSeek-V2-Lite-Chat's safetensors
    # (see data/models/SOURCES.md) sums to 15,706,484,224 parameters, all bf16 (29.26 GiB).
    spec = load_model_spec("deepseek-v2-lite")
    assert spec.params.total == 15_706_484_224
    assert spec.weight_bytes == 15_706_484_224 * 2


def test_gemma_4_31b_text_matches_checkpoint_minus_vision_tower():
    # The same kind of report for google/gemma-4-31B-it sums to 31,273,088,876 parameters,
    # including the vision tower.
    # Vision tensors as listed there (shapes), summed by hand:
    vision_layer = 4 * 1152 * 1152 + 3 * 1152 * 4304 + 4 * 1152 + 2 * 72  # attn, mlp, norms, q/k norms
    vision = (
        27 * vision_layer
        + 1152 * 768  # patch_embedder.input_proj
        + 2 * 10240 * 1152  # position_embedding_table
        + 2 * 1152  # std_bias, std_scale
        + 5376 * 1152  # embed_vision.embedding_projection
    )
    # the 60 stored `layer_scalar` values (one per decoder layer) are text weights and counted
    assert load_model_spec("gemma-4-31b").params.total == 31_273_088_876 - vision


def test_gemma_4_v_slot_is_loaded_but_not_a_checkpoint_parameter():
    # vLLM's Gemma 4 gives its K=V (global) layers a V projection filled with the K weights:
    # in the weight bytes, not in the checkpoint's count.
    spec = load_model_spec("gemma-4-31b")
    cfg = spec.raw["text_config"]
    globals_ = sum(layer.kind == "full" for layer in spec.layers)
    v_slot = globals_ * cfg["hidden_size"] * cfg["num_global_key_value_heads"] * cfg["global_head_dim"]
    assert cfg["attention_k_eq_v"] and spec.params.engine_only == v_slot
    assert spec.weight_bytes == 2 * (spec.params.total + v_slot)
    assert load_model_spec("gemma-3-27b").params.engine_only == 0


# --- weight bytes as loaded -----------------------------------------------------


def test_bf16_weights_are_two_bytes_per_parameter():
    for model_id in ("llama-3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gemma-3-27b"):
        spec = load_model_spec(model_id)
        assert spec.weight_bytes == 2 * spec.params.total


def test_gpt_oss_mxfp4_checkpoint_sizes():
    # gpt-oss model card, Table 1: checkpoint size 12.8 GiB (20b), 60.8 GiB (120b):
    # MoE weights in MXFP4 (4.25 bits/param), everything else bf16.
    assert _close(load_model_spec("gpt-oss-20b").weight_bytes / GIB, 12.8, rel=0.005)
    assert _close(load_model_spec("gpt-oss-120b").weight_bytes / GIB, 60.8, rel=0.005)


def test_gpt_oss_mxfp4_arithmetic_on_a_tiny_config():
    cfg = {
        "architectures": ["GptOssForCausalLM"],
        "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 1, "num_local_experts": 2, "num_experts_per_tok": 1,
        "vocab_size": 100, "sliding_window": 8, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "mxfp4"},
    }
    spec = load_model_spec(cfg)
    # expert matrices: 2 experts x (gate_up 128x64 + down 64x64) = 2 x 12288 values
    expert_values = 2 * (128 * 64 + 64 * 64)
    mxfp4_bytes = expert_values // 2 + expert_values // 32  # 4-bit values + one 1-byte scale per 32
    assert spec.weight_bytes == mxfp4_bytes + 2 * (spec.params.total - expert_values)


def test_deepseek_v3_fp8_bytes_between_one_and_two_per_parameter():
    spec = load_model_spec("deepseek-v3")
    # fp8 linear weights (1 B) + 128x128 block scales (4 B each) + bf16 embeddings/norms/router
    assert spec.params.total < spec.weight_bytes < 1.01 * spec.params.total + 2 * (
        spec.params.embedding + spec.params.lm_head
    )


def test_fp8_block_scales_on_a_tiny_config():
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 2, "num_key_value_heads": 1,
        "num_hidden_layers": 1, "vocab_size": 10, "tie_word_embeddings": False,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    spec = load_model_spec(cfg)
    # linear layers (out x in): q 256x256, k 128x256, v 128x256, o 256x256, gate/up 512x256, down 256x512
    shapes = [(256, 256), (128, 256), (128, 256), (256, 256), (512, 256), (512, 256), (256, 512)]
    fp8 = sum(r * c for r, c in shapes)
    scales = sum(-(-r // 128) * -(-c // 128) for r, c in shapes)
    bf16 = 2 * (10 * 256 * 2 + 256 * 3)  # embedding + lm_head, 2 layer norms + final norm
    assert spec.weight_bytes == fp8 + 4 * scales + bf16


# --- hand-computed KV bytes per token for the reference configs -----------------------


@pytest.mark.parametrize(
    "model_id,expected",
    [
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),  # 131072 = 128 KiB
        ("llama-3.1-70b", 2 * 80 * 8 * 128 * 2),  # 327680 = 320 KiB
        ("qwen3-32b", 2 * 64 * 8 * 128 * 2),
        ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),  # 98304 = 96 KiB
        ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),
        ("deepseek-v3", 61 * (512 + 64) * 2),  # 70272
        ("deepseek-v2-lite", 27 * (512 + 64) * 2),
        ("gpt-oss-20b", 2 * 24 * 8 * 64 * 2),
        ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),
        ("gemma-3-27b", 2 * 62 * 16 * 128 * 2),
        # 50 sliding layers K+V 16x256, 10 global layers K only (K=V) 4x512
        ("gemma-4-31b", 50 * 2 * 16 * 256 * 2 + 10 * 4 * 512 * 2),
        # 25 sliding layers K+V 8x256, 5 global K only 2x512
        ("gemma-4-26b-a4b", 25 * 2 * 8 * 256 * 2 + 5 * 2 * 512 * 2),
    ],
)
def test_naive_kv_bytes_per_token(model_id, expected):
    assert load_model_spec(model_id).kv_bytes_per_token() == expected


def test_reference_layer_layouts():
    mistral = load_model_spec("mistral-7b-v0.1")
    assert {(l.kind, l.sliding_window) for l in mistral.layers} == {("sliding", 4096)}
    assert {l.kind for l in load_model_spec("mixtral-8x7b").layers} == {"full"}
    assert {l.kind for l in load_model_spec("qwen3-32b").layers} == {"full"}  # use_sliding_window false
    oss = load_model_spec("gpt-oss-120b")
    assert [l.kind for l in oss.layers] == ["sliding", "full"] * 18
    assert {l.sliding_window for l in oss.layers if l.kind == "sliding"} == {128}
    gemma3 = load_model_spec("gemma-3-27b")
    assert [l.kind for l in gemma3.layers].count("full") == 10  # 62 layers, pattern 6
    assert {l.sliding_window for l in gemma3.layers if l.kind == "sliding"} == {1024}
    g4 = load_model_spec("gemma-4-26b-a4b")
    assert g4.moe.num_experts == 128 and g4.moe.experts_per_token == 8
    assert g4.moe.expert_intermediate_size == 704
    # the dense MLP (intermediate_size 2112) runs beside the experts on every token
    assert g4.moe.num_shared_experts == 1 and g4.moe.shared_intermediate_size == 2112


# --- cross-check against transformers (independent implementation) ---------------------

_META_COUNT = r'''
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch, transformers as T
from transformers.utils import logging
logging.set_verbosity_error()
out = {}
for path in sys.argv[1:]:
    cfg = json.load(open(path))
    cfg.pop("quantization_config", None)  # count parameters in their unquantized form
    arch = cfg["architectures"][0]
    conf = T.AutoConfig.for_model(**cfg)
    text = getattr(conf, "text_config", None) or conf  # text-only, as servebook counts
    cls = {"Gemma3ForConditionalGeneration": T.Gemma3ForCausalLM,
           "Gemma4ForConditionalGeneration": T.Gemma4ForCausalLM}.get(arch) or getattr(T, arch)
    with torch.device("meta"):
        model = cls(text)
    # parameters (tied ones once) + persistent buffers, i.e. what the checkpoint stores
    # (DeepSeek-V3's e_score_correction_bias and Gemma 4's layer_scalar are buffers there)
    persistent = set(model.state_dict())
    buffers = sum(b.numel() for n, b in model.named_buffers() if n in persistent)
    out[path] = sum(p.numel() for p in model.parameters()) + buffers
print(json.dumps(out))
'''


@pytest.mark.engine
def test_counts_equal_transformers_models_built_on_the_meta_device():
    """transformers (in .venv-vllm) builds each reference model without memory; its parameter
    count must equal ours exactly (DeepSeek-V3's MTP layer is not built by transformers either)."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    python = root / ".venv-vllm" / "bin" / "python"
    if not python.exists():
        pytest.skip("needs .venv-vllm (transformers + torch)")
    models_dir = root / "src" / "servebook" / "data" / "models"
    paths = [str(models_dir / f"{m}.json") for m in reference_model_ids()]
    result = subprocess.run([str(python), "-c", _META_COUNT, *paths], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    theirs = json.loads(result.stdout.strip().splitlines()[-1])
    for model_id, path in zip(reference_model_ids(), paths):
        assert load_model_spec(model_id).params.total == theirs[path], model_id
