"""servebook.rotary_cache: the rotary caches vLLM allocates while loading, against vLLM's rules and the logs."""
from __future__ import annotations

import pytest

from servebook.hf_config import load_model_spec
from servebook.memory import weights_bytes_per_gpu
from servebook.rotary_cache import rotary_cache_bytes

MIB = 2**20


def test_one_cache_per_kind_of_layer_with_vllms_positions_per_scaling_type():
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    # 32 identical layers share one cache: 131,072 positions x 128 rotary dims x 2 bytes
    assert rotary_cache_bytes(llama3, [("full_attention", 128)] * 32, dtype_bytes=2) == 32 * MIB
    linear = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
              "model_type": "gemma3_text"}
    # Gemma 3: the global layers' linear scaling stretches the cache 8x; its sliding layers use plain rope
    gemma3 = rotary_cache_bytes(linear, [("sliding_attention", 128)] * 5 + [("full_attention", 128)], dtype_bytes=2)
    assert gemma3 == (8 * 131072 + 131072) * 128 * 2
    yarn = {"max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}}
    assert rotary_cache_bytes(yarn, [("full_attention", 64)], dtype_bytes=2) == 4096 * 32 * 64 * 2
    partial = {"max_position_embeddings": 1000, "partial_rotary_factor": 0.5}
    assert rotary_cache_bytes(partial, [("full_attention", 128)], dtype_bytes=2) == 1000 * 64 * 2
    # Gemma 4's proportional rope caches the whole head whatever its partial factor
    prop = {"max_position_embeddings": 1000,
            "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
                                "sliding_attention": {"rope_type": "default"}}}
    assert rotary_cache_bytes(prop, [("sliding_attention", 256), ("full_attention", 512)], dtype_bytes=2) \
        == 1000 * (256 + 512) * 2


@pytest.mark.parametrize("model, logged_gib", [("gemma-3-27b", 50.74), ("gemma-4-31b", 57.91)])
def test_gemma_weights_come_within_a_fifth_of_a_gib_of_the_logged_load(model, logged_gib):
    """The H200 start-ups (labs/results/startup_logs/, vLLM 0.26.0) logged 'Model loading took 50.74 GiB'
    and '57.91 GiB'; without the rotary caches (and, for Gemma 4, the V slot of its K=V layers) the
    weights were 0.43 and 0.73 GiB short."""
    spec = load_model_spec(model)
    loaded = weights_bytes_per_gpu(spec) / 2**30
    assert spec.buffer_bytes > 0.25 * 2**30
    assert 0 <= logged_gib - loaded <= 0.2


def test_every_tp_rank_holds_the_whole_cache():
    spec = load_model_spec("llama-3.1-8b")
    assert weights_bytes_per_gpu(spec, 2) == -(-spec.weight_bytes // 2) + spec.buffer_bytes
