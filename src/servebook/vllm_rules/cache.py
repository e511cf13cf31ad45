"""Cache rules (vLLM 0.32.0 ``config/cache.py`` and the attention backends; 0.26.0/0.27.1 where they differ).

Units: ``*_BLOCK_SIZE`` and ``*_tokens`` are tokens; ``KV_DTYPE_BYTES`` bytes per
cached element; utilisation a fraction of total GPU memory.
"""
from __future__ import annotations

import math
from typing import Literal

from servebook.errors import ServebookError
from servebook.vllm_rules.release import rule_release

Device = Literal["cuda", "cpu"]

#: ``CacheConfig.gpu_memory_utilization`` default (fraction of total GPU memory) in 0.26.0 and
#: 0.27.1 and 0.32.0 (``config/cache.py``: ``Field(default=0.92, gt=0, le=1)``; older releases used 0.9).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

#: Whether ``vllm serve`` caches prefixes when ``--enable-prefix-caching`` is not given (0.32.0:
#: ``CacheConfig.enable_prefix_caching`` defaults to True, and ``ModelConfig`` keeps it on for every
#: generative decoder, attention/state-space hybrids included; vllm_claims.toml checks both).
DEFAULT_ENABLE_PREFIX_CACHING = True

#: ``CacheConfig.DEFAULT_BLOCK_SIZE`` (tokens, ``config/cache.py``); CUDA attention
#: backends (FLASH_ATTN, FLASH_ATTN_MLA on Hopper, TRITON_ATTN) accept it.
CUDA_DEFAULT_BLOCK_SIZE = 16
#: Tokens per block on CPU: ``CpuPlatform.check_and_update_config`` (``platforms/cpu.py``)
#: sets 128 unless ``--block-size`` is given.
CPU_DEFAULT_BLOCK_SIZE = 128
#: Smallest kernel block size (tokens) of FLASH_ATTN / TRITON_ATTN (``get_supported_kernel_block_sizes``
#: returns ``MultipleOf(16)``; CPU_ATTN did too up to 0.27.1). In 0.26.0 and 0.27.1 sliding-window
#: layers take it as their own block size: :func:`sliding_block_size`.
SLIDING_KERNEL_BLOCK_SIZE = 16
#: The kernel's block multiple (tokens) per release and device: ``get_supported_kernel_block_sizes``
#: of FLASH_ATTN (``cuda``) and CPU_ATTN (``cpu``, ``v1/attention/backends/cpu_attn.py``:
#: ``MultipleOf(16)`` in 0.26.0/0.27.1, ``MultipleOf(32)`` in 0.32.0).
KERNEL_BLOCK_MULTIPLE: dict[str, dict[str, int]] = {
    "0.26.0": {"cuda": 16, "cpu": 16},
    "0.32.0": {"cuda": 16, "cpu": 32},
}
#: Every attention backend the book targets needs block sizes (tokens) that are
#: multiples of 16 (``MultipleOf(16)``); FlashMLA needs exactly 64.
BLOCK_SIZE_MULTIPLE = 16
#: ``--block-size`` is bounded by the CLI choices of older releases and by
#: the kernels; we accept multiples of 16 up to this many tokens.
MAX_BLOCK_SIZE = 1024

#: Bytes per KV element for each ``--kv-cache-dtype`` the book discusses.
#: ``"auto"`` means the model dtype; vLLM serves float32 checkpoints in
#: bfloat16 (``_get_and_verify_dtype`` in ``config/model.py``), so it is 2.
#: fp8 variants are stored as ``torch.uint8`` (``STR_DTYPE_TO_TORCH_DTYPE``,
#: ``utils/torch_utils.py``).
KV_DTYPE_BYTES: dict[str, int] = {
    "auto": 2,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def kv_dtype_bytes(kv_cache_dtype: str) -> int:
    """Bytes per cached element for ``--kv-cache-dtype`` (``"auto"`` = 2 bytes)."""
    try:
        return KV_DTYPE_BYTES[kv_cache_dtype]
    except (KeyError, TypeError):
        allowed = ", ".join(KV_DTYPE_BYTES)
        raise ServebookError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not supported; use one of: {allowed}"
        ) from None


def check_utilization(gpu_memory_utilization: float) -> None:
    """Raise unless ``0 < u <= 1`` (the range ``CacheConfig`` accepts)."""
    u = gpu_memory_utilization
    if not isinstance(u, (int, float)) or isinstance(u, bool) or not (0 < u <= 1) or math.isnan(u):
        raise ServebookError(
            f"gpu_memory_utilization {u!r} is out of range; use a fraction in (0, 1], e.g. 0.92"
        )


def default_block_size(device: Device = "cuda") -> int:
    """Tokens per block vLLM picks when ``--block-size`` is not given (0.26.0 to 0.32.0 alike).

    16 on CUDA (``CacheConfig.DEFAULT_BLOCK_SIZE``; FLASH_ATTN keeps it via
    ``AttentionBackend.get_preferred_block_size``), 128 on CPU
    (``CpuPlatform.check_and_update_config``). Backends that need another size
    (FlashMLA: 64, CUTLASS MLA on Blackwell: 128) log
    ``Setting kv cache block size to N for X backend``; pass that ``N`` here.
    """
    if device == "cpu":
        return CPU_DEFAULT_BLOCK_SIZE
    if device == "cuda":
        return CUDA_DEFAULT_BLOCK_SIZE
    raise ServebookError(f"device {device!r} is not supported; use 'cuda' or 'cpu'")


def check_block_size(block_size: int) -> None:
    """Raise unless ``block_size`` (tokens) is a multiple of 16 in [16, 1024]."""
    if (
        not isinstance(block_size, int)
        or block_size <= 0
        or block_size % BLOCK_SIZE_MULTIPLE
        or block_size > MAX_BLOCK_SIZE
    ):
        raise ServebookError(
            f"block_size {block_size!r} is not allowed; use a multiple of "
            f"{BLOCK_SIZE_MULTIPLE} between {BLOCK_SIZE_MULTIPLE} and {MAX_BLOCK_SIZE} tokens"
        )


def sliding_window_hold_tokens(sliding_window: int, in_flight_tokens: int) -> int:
    """Tokens (before capping at the context) vLLM *books* for one request in a sliding-window layer.

    The admission bound, ``SlidingWindowSpec.max_admission_blocks_per_request``
    (``v1/kv_cache_interface.py``): the last ``window - 1`` tokens plus everything the engine
    may have in flight (:func:`servebook.vllm_rules.scheduler.in_flight_tokens`). It sizes
    the start-up log's ``Maximum concurrency`` (``get_max_concurrency_for_kv_cache_config``)
    and caps what admitting a prompt may ask for; callers cap it at the request's context and
    add vLLM's one extra block where they count blocks. What a running request actually holds
    is smaller: :func:`sliding_window_running_blocks`.
    """
    return sliding_window - 1 + in_flight_tokens


def sliding_window_running_blocks(sliding_window: int, block_size: int, unsettled_tokens: int) -> int:
    """Most blocks a sliding-window group holds for one *running* request, once its window has slid.

    The run-time rule (vLLM 0.27.1 and 0.32.0, ``v1/core/single_type_kv_cache_manager.py``), not the
    admission bound of :func:`sliding_window_hold_tokens`:

    * ``KVCacheManager.allocate_slots`` first calls ``SlidingWindowManager.remove_skipped_blocks``
      with the processed prefix ``p`` (computed tokens minus those still in flight): every whole
      block below ``p - window + 1`` (``get_num_skipped_tokens``) goes back to the free pool;
    * then ``allocate_new_blocks`` gives the request ``cdiv(p + unsettled_tokens, block_size)``
      block slots (``unsettled_tokens``: tokens past ``p`` that need a slot this step; for a
      decode step :func:`servebook.vllm_rules.scheduler.decode_unsettled_tokens`, for a prefill
      chunk the chunk plus any chunk still in flight).

    Live blocks: ``cdiv(p + u, b) - floor((p - window + 1) / b)``. Over all positions of ``p``
    (the window straddles a block boundary) the most is ``cdiv(window + u - 2, b) + 1``
    blocks: about ``window / block_size`` plus one, whatever the context. A request shorter
    than that holds ``cdiv(its tokens, b)``; callers take the smaller. Units: tokens in, blocks out.
    """
    for name, value in (("sliding_window", sliding_window), ("block_size", block_size),
                        ("unsettled_tokens", unsettled_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ServebookError(f"{name} {value!r} is not allowed; use a positive number of tokens")
    return -(-(sliding_window + unsettled_tokens - 2) // block_size) + 1


def sliding_block_size(block_size: int, device: Device = "cuda", vllm_version: str | None = None) -> int:
    """Tokens per block vLLM gives a sliding-window layer (before page unification), per release.

    ``Attention.get_kv_cache_spec`` (``model_executor/layers/attention/attention.py``) with
    ``_largest_kernel_block_within``, for a layer whose page is not padded:

    * 0.26.0 and 0.27.1: the kernel's smallest block, whatever ``block_size`` is (16 on CUDA and CPU);
      page unification then scales it up to the full layers' page.
    * 0.32.0: the primary ``block_size`` itself when the kernel runs it (a multiple of the kernel's
      multiple, :data:`KERNEL_BLOCK_MULTIPLE`: 16 on CUDA, 32 on CPU), else the largest multiple within
      it, at least one multiple: ``max(m, block_size // m * m)``. On CUDA with the default 16-token
      block both give 16; on CPU (default 128) 0.32.0 gives 128 where 0.27.1 gave 16.

    ``vllm_version``: the release (None: :data:`~servebook.vllm_rules.release.PINNED_VLLM`).
    """
    release = rule_release(vllm_version)
    if device not in ("cuda", "cpu"):
        raise ServebookError(f"device {device!r} is not supported; use 'cuda' or 'cpu'")
    multiple = KERNEL_BLOCK_MULTIPLE[release][device]
    if release == "0.26.0":
        return multiple
    return max(multiple, block_size // multiple * multiple)


def pads_undivided_pages(vllm_version: str | None = None) -> bool:
    """Whether page unification pads an attention layer whose page does not divide the largest page.

    ``unify_kv_cache_spec_page_size`` (``v1/core/kv_cache_utils.py``; ``v1/core/kv_cache_planning.py``
    in 0.34.0) first scales a smaller page up by a whole ratio of blocks. When the largest page is not
    a whole multiple of it:

    * 0.26.0 and 0.27.1: the page is padded only on a backend whose KV layout is num-blocks-first
      (``AttentionSpec.indexes_kv_by_block_stride``); FLASH_ATTN, the CUDA backend servebook models,
      is not, and the engine cannot start (``NotImplementedError``).
    * 0.32.0 (0.34.0 alike): every non-MLA attention layer's page is padded to the largest
      (``page_size_padded``): its block keeps its tokens and costs the largest page. MLA is never
      padded (``NotImplementedError`` in every release).

    ``vllm_version``: the release (None: :data:`~servebook.vllm_rules.release.PINNED_VLLM`).
    """
    return rule_release(vllm_version) != "0.26.0"
