"""config.json -> ModelSpec: attention layout, KV bytes per token, sources and errors.

Expected values are hand arithmetic written next to each assertion (or the
public config's own numbers), never output copied from the loader.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servebook.errors import ConfigError, ServebookError
from servebook.hf_config import load_model_spec, reference_model_ids, supported_architectures

# A Llama-3.1-8B-shaped config (the fields of the public config.json that matter).
LLAMA_8B_SHAPE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def _with(base: dict, **changes) -> dict:
    cfg = json.loads(json.dumps(base))
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


# --- KV bytes per token, by hand ------------------------------------------


def test_llama_kv_bytes_per_token_by_hand():
    spec = load_model_spec(LLAMA_8B_SHAPE)
    # K and V x 32 layers x 8 KV heads x 128 head_dim x 2 bytes (bf16)
    assert spec.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    # fp8 KV cache: 1 byte per element
    assert spec.kv_bytes_per_token(kv_dtype_bytes=1) == 2 * 32 * 8 * 128
    assert all(layer.kind == "full" and layer.sliding_window is None for layer in spec.layers)


def test_head_dim_falls_back_to_hidden_over_heads():
    spec = load_model_spec(LLAMA_8B_SHAPE)
    assert {layer.head_dim for layer in spec.layers} == {4096 // 32}


def test_explicit_head_dim_wins_over_hidden_over_heads():
    # Qwen3-32B: 64 query heads x 128 = 8192 != hidden 5120, so head_dim must be read.
    cfg = _with(
        LLAMA_8B_SHAPE,
        architectures=["Qwen3ForCausalLM"],
        hidden_size=5120,
        num_attention_heads=64,
        head_dim=128,
        num_hidden_layers=64,
    )
    spec = load_model_spec(cfg)
    assert spec.kv_bytes_per_token() == 2 * 64 * 8 * 128 * 2


def test_mistral_sliding_window_on_every_layer():
    cfg = _with(LLAMA_8B_SHAPE, architectures=["MistralForCausalLM"], sliding_window=4096)
    spec = load_model_spec(cfg)
    assert [layer.sliding_window for layer in spec.layers] == [4096] * 32
    assert {layer.kind for layer in spec.layers} == {"sliding"}


def test_null_sliding_window_means_full_attention():
    cfg = _with(LLAMA_8B_SHAPE, architectures=["MistralForCausalLM"], sliding_window=None)
    assert {layer.kind for layer in load_model_spec(cfg).layers} == {"full"}


def test_qwen_sliding_window_only_when_enabled_and_from_max_window_layers():
    base = _with(LLAMA_8B_SHAPE, architectures=["Qwen3ForCausalLM"], head_dim=128, num_hidden_layers=8,
                 sliding_window=4096, max_window_layers=5)
    off = load_model_spec(_with(base, use_sliding_window=False))
    assert {layer.kind for layer in off.layers} == {"full"}
    on = load_model_spec(_with(base, use_sliding_window=True))
    # layers 0..4 stay full (below max_window_layers), 5..7 slide
    assert [layer.kind for layer in on.layers] == ["full"] * 5 + ["sliding"] * 3


def test_explicit_layer_types_are_honoured():
    types = ["sliding_attention", "full_attention"] * 16
    cfg = _with(LLAMA_8B_SHAPE, layer_types=types, sliding_window=128)
    spec = load_model_spec(cfg)
    assert [layer.kind for layer in spec.layers] == ["sliding", "full"] * 16
    assert spec.layers[0].sliding_window == 128 and spec.layers[1].sliding_window is None


GEMMA3_TEXT = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "num_hidden_layers": 62,
        "sliding_window": 1024,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
    },
}


def test_gemma3_pattern_from_nested_text_config():
    spec = load_model_spec(GEMMA3_TEXT)
    kinds = [layer.kind for layer in spec.layers]
    # default pattern 6: every 6th layer (index 5, 11, ...) is global -> 62 // 6 = 10 full layers
    assert kinds.count("full") == 10 and kinds.count("sliding") == 52
    assert kinds[5] == "full" and kinds[0] == "sliding"
    assert spec.hidden_size == 5376 and spec.tie_word_embeddings
    # naive KV: 62 layers x 2 x 16 heads x 128 x 2 bytes
    assert spec.kv_bytes_per_token() == 62 * 2 * 16 * 128 * 2


def test_gemma3_sliding_window_pattern_field():
    cfg = json.loads(json.dumps(GEMMA3_TEXT))
    cfg["text_config"].update(num_hidden_layers=6, sliding_window_pattern=2)
    kinds = [layer.kind for layer in load_model_spec(cfg).layers]
    assert kinds == ["sliding", "full"] * 3


GEMMA4_31B_SHAPE = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "text_config": {
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": 4,
        "attention_k_eq_v": True,
        "num_hidden_layers": 60,
        "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "vocab_size": 262144,
        "max_position_embeddings": 262144,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "tie_word_embeddings": True,
    },
}


def test_gemma4_global_layers_have_their_own_kv_shape_and_share_k_as_v():
    spec = load_model_spec(GEMMA4_31B_SHAPE)
    sliding = [layer for layer in spec.layers if layer.kind == "sliding"]
    full = [layer for layer in spec.layers if layer.kind == "full"]
    assert len(sliding) == 50 and len(full) == 10
    assert {(l.num_kv_heads, l.head_dim, l.v_head_dim, l.sliding_window) for l in sliding} == {(16, 256, 256, 1024)}
    assert {(l.num_kv_heads, l.head_dim, l.v_head_dim) for l in full} == {(4, 512, 0)}
    # naive bytes: 50 x 2 x 16 x 256 x 2  +  10 x 1 (K only) x 4 x 512 x 2
    assert spec.kv_bytes_per_token() == 50 * 2 * 16 * 256 * 2 + 10 * 4 * 512 * 2


def test_gemma4_without_k_eq_v_keeps_v_and_local_kv_heads():
    cfg = json.loads(json.dumps(GEMMA4_31B_SHAPE))
    cfg["text_config"]["attention_k_eq_v"] = False
    full = [l for l in load_model_spec(cfg).layers if l.kind == "full"]
    # transformers applies num_global_key_value_heads only with attention_k_eq_v
    assert {(l.num_kv_heads, l.head_dim, l.v_head_dim) for l in full} == {(16, 512, 512)}


def test_kv_shared_layers_point_at_last_unshared_layer_of_same_type():
    cfg = json.loads(json.dumps(GEMMA4_31B_SHAPE))
    cfg["text_config"].update(
        num_hidden_layers=12,
        layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
        num_kv_shared_layers=4,
    )
    spec = load_model_spec(cfg)
    # unshared layers 0..7 are sliding 0-4, full 5, sliding 6-7; consumers 8..11
    # (sliding 8-10, full 11) reuse the last unshared layer of their type: 7 and 5.
    assert [l.kv_source_layer for l in spec.layers[:8]] == [None] * 8
    assert [l.kv_source_layer for l in spec.layers[8:]] == [7, 7, 7, 5]
    owned = [l for l in spec.layers if l.owns_cache]
    assert len(owned) == 8
    assert spec.kv_bytes_per_token() == 7 * 2 * 16 * 256 * 2 + 1 * 4 * 512 * 2


DEEPSEEK_V3_SHAPE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
}


def test_mla_caches_one_latent_per_token():
    spec = load_model_spec(DEEPSEEK_V3_SHAPE)
    assert {(l.kind, l.num_kv_heads, l.head_dim, l.v_head_dim) for l in spec.layers} == {("mla", 1, 576, 0)}
    # 61 layers x (512 + 64) x 2 bytes -- num_key_value_heads (128) plays no part
    assert spec.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70272


def test_deepseek_dense_first_layers_and_moe_shape():
    spec = load_model_spec(DEEPSEEK_V3_SHAPE)
    assert spec.moe.moe_layer_indices == tuple(range(3, 61))
    assert spec.moe.num_experts == 256 and spec.moe.experts_per_token == 8
    assert spec.moe.shared_intermediate_size == 2048
    assert spec.moe.params_per_expert == 3 * 7168 * 2048


# --- sources -----------------------------------------------------------------


def test_load_from_file_and_directory(tmp_path):
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(LLAMA_8B_SHAPE))
    from_dir = load_model_spec(model_dir)
    from_file = load_model_spec(model_dir / "config.json")
    assert from_dir.name == from_file.name == "my-llama"
    assert from_dir.params == from_file.params == load_model_spec(LLAMA_8B_SHAPE).params
    assert load_model_spec(model_dir, name="custom").name == "custom"


def test_reference_ids_load_by_id():
    for model_id in reference_model_ids():
        spec = load_model_spec(model_id)
        assert spec.name == model_id
        assert spec.num_layers > 0 and spec.params.total > 0 and spec.weight_bytes > 0


# --- errors ------------------------------------------------------------------


def test_missing_num_hidden_layers_is_named():
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_model_spec(_with(LLAMA_8B_SHAPE, num_hidden_layers=None))


def test_missing_field_inside_text_config_is_named():
    cfg = json.loads(json.dumps(GEMMA3_TEXT))
    del cfg["text_config"]["num_key_value_heads"]
    cfg["text_config"]["num_attention_heads"] = None
    with pytest.raises(ConfigError, match="num_attention_heads"):
        load_model_spec(cfg)


@pytest.mark.parametrize("bad", ["32", 32.5, -1, 0, True])
def test_non_integer_or_non_positive_layer_count(bad):
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_model_spec(_with(LLAMA_8B_SHAPE, num_hidden_layers=bad))


def test_unknown_architecture_lists_supported_ones():
    with pytest.raises(ConfigError) as err:
        load_model_spec(_with(LLAMA_8B_SHAPE, architectures=["MambaForCausalLM"]))
    message = str(err.value)
    assert "MambaForCausalLM" in message
    for arch in ("LlamaForCausalLM", "DeepseekV3ForCausalLM", "Gemma4ForConditionalGeneration"):
        assert arch in message and arch in supported_architectures()


def test_unknown_reference_id_and_missing_path():
    with pytest.raises(ConfigError, match="reference"):
        load_model_spec("no-such-model-xyz")


def test_directory_without_config(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_model_spec(tmp_path)


def test_invalid_json_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_spec(path)


def test_layer_types_length_mismatch():
    with pytest.raises(ConfigError, match="layer_types"):
        load_model_spec(_with(LLAMA_8B_SHAPE, layer_types=["full_attention"] * 3))


def test_unsupported_quantization_is_reported():
    with pytest.raises(ConfigError, match="quant_method 'bitsandbytes' is not modelled"):
        load_model_spec(_with(LLAMA_8B_SHAPE, quantization_config={"quant_method": "bitsandbytes"}))
    # A modelled method with a field missing names the field (AWQ needs its bit width).
    with pytest.raises(ConfigError, match="lacks 'bits'"):
        load_model_spec(_with(LLAMA_8B_SHAPE, quantization_config={"quant_method": "awq"}))


def test_top_k_larger_than_experts():
    cfg = _with(LLAMA_8B_SHAPE, architectures=["MixtralForCausalLM"], num_local_experts=8, num_experts_per_tok=9)
    with pytest.raises(ConfigError, match="exceeds"):
        load_model_spec(cfg)


def test_errors_are_servebook_errors():
    assert issubclass(ConfigError, ServebookError)


# --- properties ----------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    layers=st.integers(min_value=1, max_value=128),
    kv_heads=st.integers(min_value=1, max_value=16),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    dtype_bytes=st.sampled_from([1, 2, 4]),
)
def test_kv_bytes_scale_linearly_with_layers_and_are_positive(layers, kv_heads, head_dim, dtype_bytes):
    cfg = _with(LLAMA_8B_SHAPE, num_hidden_layers=layers, num_key_value_heads=kv_heads, head_dim=head_dim,
                num_attention_heads=kv_heads * 2)
    one = load_model_spec(_with(cfg, num_hidden_layers=1)).kv_bytes_per_token(dtype_bytes)
    many = load_model_spec(cfg).kv_bytes_per_token(dtype_bytes)
    assert one == 2 * kv_heads * head_dim * dtype_bytes > 0
    assert many == layers * one


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(min_value=1, max_value=64), pattern=st.integers(min_value=1, max_value=8))
def test_gemma_window_pattern_counts(layers, pattern):
    cfg = json.loads(json.dumps(GEMMA3_TEXT))
    cfg["text_config"].update(num_hidden_layers=layers, sliding_window_pattern=pattern)
    spec = load_model_spec(cfg)
    full = sum(1 for l in spec.layers if l.kind == "full")
    assert full == layers // pattern
    assert spec.kv_bytes_per_token() >= 0 and spec.params.total > 0


# --- CLI ---------------------------------------------------------------------------


def test_models_command_json(capsys):
    from servebook.cli import main

    assert main(["models", "llama-3.1-8b", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["layers"] == 32 and row["full_layers"] == 32
    assert row["kv_bytes_per_token_naive"] == 2 * 32 * 8 * 128 * 2


def test_models_command_reports_bad_input_without_traceback(capsys, tmp_path):
    from servebook.cli import main

    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(_with(LLAMA_8B_SHAPE, num_hidden_layers=None)))
    assert main(["models", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "num_hidden_layers" in err and "Traceback" not in err
