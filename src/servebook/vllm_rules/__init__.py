"""vLLM's rules and defaults that servebook mirrors: one home for each, per release where they differ.

The chapter describes vLLM 0.32.0 (``PINNED_VLLM``); the GPU results come from 0.26.0 (``GPU_LAB_VLLM``).
A rule that differs between the two takes ``vllm_version`` and is kept once per release
(``RULE_RELEASES``; today: the sliding-window block size, ``sliding_block_size``, the long-prefill cap
on a lone request, ``effective_long_prefill_threshold``, the largest CUDA-graph step on Blackwell,
``default_cudagraph_cap``, whether page unification pads a page that does not divide the largest,
``pads_undivided_pages``, and whether a quantized checkpoint with group activation ordering loads,
``act_order_loads``).

Grouped like vLLM's own ``vllm/config/*`` (each name documents its unit and the
vLLM source it mirrors; paths are relative to the ``vllm`` package):

    cache        gpu_memory_utilization, block sizes, KV dtype bytes, the sliding-window holds
                 (booked at admission, held while running)
    scheduler    batch defaults per GPU class, async scheduling, tokens in flight (engine and per request),
                 the step budget's lower bound (max_num_seqs) and the long-prefill cap's upper bound
    parallel     tensor-parallel validity, KV heads per GPU
    compilation  the largest CUDA-graph capture size
    quantization which quantized-checkpoint settings a release loads (GPTQ desc_act / actorder)
    release      the vLLM releases the chapter describes (PINNED_VLLM) and the GPU labs ran (GPU_LAB_VLLM),
                 the releases rules are keyed by (RULE_RELEASES) and which one a release follows

``kv_cache``, ``memory``, ``perf`` and ``simulator`` read these; the drift test
(tests/engine/test_cpu_capacity.py, ``test_defaults_servebook_uses_are_the_pinned_release_defaults``)
checks them against the installed vLLM; tests/test_vllm_rules.py fails when another module
keeps its own copy.
"""
from servebook.vllm_rules.cache import (
    BLOCK_SIZE_MULTIPLE,
    CPU_DEFAULT_BLOCK_SIZE,
    CUDA_DEFAULT_BLOCK_SIZE,
    DEFAULT_ENABLE_PREFIX_CACHING,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KERNEL_BLOCK_MULTIPLE,
    KV_DTYPE_BYTES,
    MAX_BLOCK_SIZE,
    SLIDING_KERNEL_BLOCK_SIZE,
    check_block_size,
    check_utilization,
    default_block_size,
    kv_dtype_bytes,
    pads_undivided_pages,
    sliding_window_hold_tokens,
    sliding_block_size,
    sliding_window_running_blocks,
)
from servebook.vllm_rules.compilation import (BLACKWELL_CUDAGRAPH_MAX_TOKENS, DEFAULT_CUDAGRAPH_MAX_TOKENS,
                                              cudagraph_max_tokens, default_cudagraph_cap)
from servebook.vllm_rules.parallel import check_tp, check_tp_size, kv_heads_per_gpu, tp_splits_heads
from servebook.vllm_rules.quantization import act_order_loads
from servebook.vllm_rules.release import GPU_LAB_VLLM, PINNED_VLLM, RULE_RELEASES, rule_release
from servebook.vllm_rules.scheduler import (
    ASYNC_SPECULATIVE_METHODS,
    CPU_BATCH_DEFAULTS,
    LARGE_GPU_BATCH_DEFAULTS,
    LARGE_GPU_BYTES,
    SMALL_GPU_BATCH_DEFAULTS,
    USAGE_CONTEXTS,
    async_scheduling_with_speculation,
    check_batch_budget,
    check_long_prefill_threshold,
    decode_unsettled_tokens,
    effective_long_prefill_threshold,
    default_async_scheduling,
    in_flight_tokens,
    max_concurrent_batches,
    vllm_batch_defaults,
)

__all__ = [
    "BLACKWELL_CUDAGRAPH_MAX_TOKENS", "act_order_loads", "pads_undivided_pages", "BLOCK_SIZE_MULTIPLE", "CPU_BATCH_DEFAULTS", "CPU_DEFAULT_BLOCK_SIZE", "CUDA_DEFAULT_BLOCK_SIZE",
    "DEFAULT_CUDAGRAPH_MAX_TOKENS", "DEFAULT_ENABLE_PREFIX_CACHING", "DEFAULT_GPU_MEMORY_UTILIZATION", "GPU_LAB_VLLM", "KERNEL_BLOCK_MULTIPLE",
    "KV_DTYPE_BYTES", "RULE_RELEASES", "default_cudagraph_cap", "effective_long_prefill_threshold", "rule_release", "sliding_block_size",
    "LARGE_GPU_BATCH_DEFAULTS", "LARGE_GPU_BYTES", "MAX_BLOCK_SIZE", "PINNED_VLLM", "SMALL_GPU_BATCH_DEFAULTS",
    "USAGE_CONTEXTS", "ASYNC_SPECULATIVE_METHODS", "async_scheduling_with_speculation", "check_batch_budget", "check_long_prefill_threshold",
    "SLIDING_KERNEL_BLOCK_SIZE", "check_block_size", "check_tp", "check_tp_size", "check_utilization", "cudagraph_max_tokens",
    "decode_unsettled_tokens", "default_async_scheduling", "default_block_size", "in_flight_tokens",
    "kv_dtype_bytes", "kv_heads_per_gpu", "max_concurrent_batches", "sliding_window_hold_tokens",
    "sliding_window_running_blocks", "tp_splits_heads", "vllm_batch_defaults",
]
