"""Quantized checkpoints and LoRA slots in the memory budget (issue 40), against hand arithmetic.

Every expected number is computed here from the model's shapes and the storage rules read in
vLLM 0.27.1's source (re-read in 0.32.0's and 0.34.0's: the same; vllm_claims.toml quotes them) (packed int4 = half a byte per value, 16-bit scales per group of 128 input
features, int4 zero points, fp32 block scales, ...), never taken from servebook's output.
"""
from __future__ import annotations

import json
import shlex

import pytest

from servebook.errors import ConfigError, ServebookError
from servebook.hf_config import load_model_spec
from servebook.lora import LoraSettings, lora_activation_bytes, lora_weights_bytes
from servebook.plan import make_plan
from servebook.quant_schemes import compute_capability, kernel_on, resolve, schemes
from servebook.shipped import MODELS_DIR

GIB = 2**30
# Llama 3.1 8B shapes (config.json): hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, 32 layers.
H, Q, KV, I, LAYERS, VOCAB = 4096, 4096, 1024, 14336, 32, 128256
# (rows = output features, cols = input features) of one layer's seven projections.
PROJ = [(Q, H), (KV, H), (KV, H), (H, Q), (I, H), (I, H), (H, I)]
SIXTEEN_BIT = (2 * VOCAB * H + (2 * LAYERS + 1) * H) * 2   # embedding, head, norms at 2 bytes


def _cfg(quant: dict, base: str = "llama-3.1-8b") -> dict:
    cfg = json.loads((MODELS_DIR / f"{base}.json").read_text())
    cfg["quantization_config"] = quant
    return cfg


def test_awq_int4_8b_by_hand():
    # qweight: 4 bits per value; scales: one 16-bit value per 128 inputs per output; zeros: 4 bits each.
    per_layer = sum(r * c // 2 + r * (c // 128) * 2 + r * (c // 128) // 2 for r, c in PROJ)
    assert load_model_spec("llama-3.1-8b-awq-int4").weight_bytes == LAYERS * per_layer + SIXTEEN_BIT


def test_gptq_act_order_adds_the_two_int32_index_vectors_and_drops_zero_points():
    base = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}
    plain = load_model_spec(_cfg({**base, "desc_act": False})).weight_bytes
    ordered = load_model_spec(_cfg({**base, "desc_act": True})).weight_bytes
    # Symmetric GPTQ on Marlin keeps no zero points: values + 16-bit group scales only.
    assert plain == LAYERS * sum(r * c // 2 + r * (c // 128) * 2 for r, c in PROJ) + SIXTEEN_BIT
    # desc_act: g_idx and its sort indices, one int32 each per input feature of every *fused* layer
    # vLLM builds: qkv_proj (H), o_proj (Q), gate_up_proj (H), down_proj (I).
    assert ordered - plain == LAYERS * 2 * 4 * (H + Q + H + I)
    # group_size -1 makes act order meaningless (one group): vLLM turns it off.
    assert load_model_spec(_cfg({**base, "group_size": -1, "desc_act": True})).weight_bytes == \
        load_model_spec(_cfg({**base, "group_size": -1, "desc_act": False})).weight_bytes


def test_fp8_block_scales_are_fp32_per_128x128_block():
    spec = load_model_spec("qwen3-32b-fp8")
    h, q, kv, inter, layers, vocab = 5120, 64 * 128, 8 * 128, 25600, 64, 151936
    proj = [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]
    blocks = sum(-(-r // 128) * -(-c // 128) for r, c in proj)
    per_layer = sum(r * c for r, c in proj) + 4 * blocks
    # 16-bit: embedding, head, per layer two norms of h and the q/k norms of 128; the final norm.
    sixteen = (2 * vocab * h + layers * (2 * h + 2 * 128) + h) * 2
    assert spec.weight_bytes == layers * per_layer + sixteen


def test_compressed_tensors_w8a8_keeps_fp32_channel_scales_and_a_16_bit_head():
    per_layer = sum(r * c + 4 * r for r, c in PROJ)
    assert load_model_spec("llama-3.1-8b-w8a8").weight_bytes == LAYERS * per_layer + SIXTEEN_BIT


def test_nvfp4_is_half_a_byte_plus_an_fp8_scale_per_16_values():
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    per_layer = sum(r * c // 2 + r * c // 16 + 8 for r, c in PROJ)
    assert load_model_spec(_cfg(quant)).weight_bytes == LAYERS * per_layer + SIXTEEN_BIT


def test_excluded_modules_stay_16_bit():
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    whole = load_model_spec(_cfg(awq)).weight_bytes
    r, c = H, I  # down_proj
    awq_down = r * c // 2 + r * (c // 128) * 2 + r * (c // 128) // 2
    # AWQ matches modules_to_not_convert as substrings of the module name.
    skipped = load_model_spec(_cfg({**awq, "modules_to_not_convert": ["down_proj"]})).weight_bytes
    assert skipped - whole == LAYERS * (r * c * 2 - awq_down)
    # compressed-tensors: exact names or re: regexes; one layer's attention left 16-bit.
    ct = json.loads((MODELS_DIR / "llama-3.1-8b-w8a8.json").read_text())["quantization_config"]
    base = load_model_spec(_cfg(ct)).weight_bytes
    one = load_model_spec(_cfg({**ct, "ignore": ["lm_head", "re:model[.]layers[.]0[.]self_attn[.].*"]})).weight_bytes
    attn = PROJ[:4]
    assert one - base == sum(r * c * 2 - (r * c + 4 * r) for r, c in attn)


def test_mxfp4_and_deepseek_fp8_keep_their_sizes():
    # gpt-oss-20b: the arXiv 2508.10925 checkpoint is 12.8 GiB (MXFP4 experts, the rest bf16).
    assert round(load_model_spec("gpt-oss-20b").weight_bytes / GIB, 1) == 12.8


@pytest.mark.parametrize("quant, message", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False}, "sym: true"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128, "sym": True}, "4- or 8-bit"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128, "zero_point": True}, "4 bits only"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "two positive integers"),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, "config_groups"),
    ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "not modelled"),
    ({"quant_method": "bitsandbytes"}, "not modelled"),
])
def test_schemes_vllm_does_not_load_are_refused_with_what_to_use(quant, message):
    with pytest.raises(ConfigError, match=message):
        load_model_spec(_cfg(quant))


def test_every_catalogue_gpu_has_a_compute_capability_and_kernels_follow_it():
    from servebook.hardware import gpu_names

    for name in gpu_names():
        assert compute_capability(name) >= 8.0
    fp8 = resolve({"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert kernel_on(fp8, "H200-SXM-141GB").native
    a100 = kernel_on(fp8, "A100-SXM-80GB")   # Ampere (8.0) has no FP8 tensor cores
    assert not a100.native and "Marlin" in a100.kernel and "8.9" in a100.note
    nvfp4 = resolve({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    assert kernel_on(nvfp4, "B200-180GB").native and not kernel_on(nvfp4, "H100-SXM-80GB").native
    # A GPU below the scheme's minimum (Volta, 7.0, for AWQ's 7.5) cannot load the checkpoint at all.
    with pytest.raises(ServebookError, match="cannot run AWQ.*>= 7.5"):
        kernel_on(resolve({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}),
                  "V100", capability=7.0)
    assert set(schemes()) >= {"awq", "gptq", "fp8_block", "fp8_tensor", "int8_channel", "wna16", "nvfp4", "mxfp4"}
    # FP8 weights: Fp8Config.get_min_capability() is 75, ModelOptFp8Config's 80 (modelopt.py, 0.27.1 to 0.34.0)
    assert not kernel_on(resolve({"quant_method": "fp8"}), "T4", capability=7.5).native
    with pytest.raises(ServebookError, match=">= 8.0"):
        kernel_on(resolve({"quant_method": "modelopt", "quant_algo": "FP8"}), "T4", capability=7.5)


def test_lora_slots_of_llama_8b_by_hand():
    loras, rank = 4, 64
    s = LoraSettings(max_loras=loras, max_lora_rank=rank)
    spec = load_model_spec("llama-3.1-8b")
    # A: slices x slots x rank x in; B: slots x rank x sum(out). qkv (3 slices), o, gate_up (2), down.
    layer = (3 * loras * rank * H + loras * rank * (Q + 2 * KV)
             + loras * rank * Q + loras * rank * H
             + 2 * loras * rank * H + loras * rank * 2 * I
             + loras * rank * I + loras * rank * H)
    edges = 2 * loras * rank * (VOCAB + H)   # embedding and logits processor
    assert lora_weights_bytes(spec, s) == (LAYERS * layer + edges) * 2
    # TP=2 halves B of column-parallel layers and A of row-parallel ones.
    layer_tp2 = (3 * loras * rank * H + loras * rank * (Q + 2 * KV) // 2
                 + loras * rank * Q // 2 + loras * rank * H
                 + 2 * loras * rank * H + loras * rank * I
                 + loras * rank * I // 2 + loras * rank * H)
    assert lora_weights_bytes(spec, s, tp=2) == (LAYERS * layer_tp2 + edges) * 2
    # The profiling run's widest shrink buffer: tokens x 3 slices x rank, float32.
    assert lora_activation_bytes(spec, s, 8192) == 8192 * 3 * rank * 4


def test_plan_with_lora_pays_exactly_the_slots_and_their_buffer():
    s = LoraSettings(max_loras=8, max_lora_rank=64)
    plain = make_plan("llama-3.1-8b-awq-int4", gpu="H100", max_model_len=32768)
    with_lora = make_plan("llama-3.1-8b-awq-int4", gpu="H100", max_model_len=32768, lora=s)
    spec = plain.spec
    expected = lora_weights_bytes(spec, s) + lora_activation_bytes(spec, s, plain.max_num_batched_tokens)
    assert plain.available_kv_bytes - with_lora.available_kv_bytes == expected
    assert with_lora.budget.model_loading_bytes == plain.budget.weights_bytes + lora_weights_bytes(spec, s)
    argv = shlex.split(with_lora.serve_command())
    assert argv[argv.index("--max-loras") + 1] == "8" and argv[argv.index("--max-lora-rank") + 1] == "64"
    assert "--enable-lora" in argv and "--max-cpu-loras" not in argv


def test_quantized_70b_fits_one_h100_where_16_bit_needs_two():
    # 16-bit Llama 3.1 70B is 131 GiB of weights: no single 80 GiB card; the AWQ checkpoint is 37 GiB.
    with pytest.raises(ServebookError, match="--tp 2"):
        make_plan("llama-3.1-70b", gpu="H100", max_model_len=8192)
    plan = make_plan("llama-3.1-70b-awq-int4", gpu="H100", max_model_len=8192)
    assert plan.capacity.kv_cache_tokens > 8192 and plan.kernel.native


@pytest.mark.parametrize("flags, message", [
    (["--max-loras", "4"], "add --enable-lora"),
    (["--enable-lora", "--max-lora-rank", "24"], "one of 1, 8, 16"),
    (["--enable-lora", "--max-loras", "0"], "positive integer"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "--max-cpu-loras 4 or more"),
])
def test_plan_cli_refuses_bad_lora_flags(flags, message, capsys):
    from servebook.cli import main

    assert main(["plan", "--config", "llama-3.1-8b", "--max-model-len", "8192", *flags]) == 2
    assert message in capsys.readouterr().err


def test_lora_on_moe_is_refused_not_guessed():
    with pytest.raises(ServebookError, match="mixture of experts"):
        make_plan("qwen3-30b-a3b", gpu="H200", max_model_len=8192, lora=LoraSettings())


def test_step_times_of_unmeasured_kernels_are_refused_not_guessed():
    from servebook.perf.model import check_step_time_modelled

    with pytest.raises(ServebookError, match="run by Marlin.*not modelled"):
        check_step_time_modelled(load_model_spec("llama-3.1-8b-awq-int4"), "H200-SXM-141GB")
    # MXFP4 experts are priced on the H200 (recorded there), not on an A100's weight-only fallback.
    check_step_time_modelled(load_model_spec("gpt-oss-20b"), "H200-SXM-141GB")
    with pytest.raises(ServebookError, match="weight-only"):
        check_step_time_modelled(load_model_spec("gpt-oss-20b"), "A100-SXM-80GB")
    check_step_time_modelled(load_model_spec("qwen3-32b-fp8"), "H200-SXM-141GB")   # native FP8
    check_step_time_modelled(load_model_spec("llama-3.1-8b"), "A100-SXM-80GB")      # 16-bit


def test_gptq_modules_in_block_to_quantize_limits_what_is_quantized():
    base = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    every = [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"], ["self_attn.o_proj"],
             ["mlp.up_proj", "mlp.gate_proj"], ["mlp.down_proj"]]
    assert load_model_spec(_cfg({**base, "modules_in_block_to_quantize": every})).weight_bytes == \
        load_model_spec(_cfg(base)).weight_bytes
    attention_only = load_model_spec(_cfg({**base, "modules_in_block_to_quantize": every[:2]})).weight_bytes
    mlp = PROJ[4:]
    gptq = lambda r, c: r * c // 2 + r * (c // 128) * 2
    assert attention_only - load_model_spec(_cfg(base)).weight_bytes == LAYERS * sum(r * c * 2 - gptq(r, c)
                                                                                    for r, c in mlp)
