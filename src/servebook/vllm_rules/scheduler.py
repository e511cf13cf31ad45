"""Scheduler defaults (vLLM 0.27.1 ``config/scheduler.py``, ``engine/arg_utils.py``, ``config/vllm.py``).

Units: ``*_tokens`` tokens, ``*_seqs`` sequences, ``*_BYTES`` bytes.
"""
from __future__ import annotations

from servebook.errors import ServebookError

#: Total device memory (bytes, 70 GiB) from which vLLM 0.27.1 uses the larger batch defaults
#: (unless the GPU is an A100): ``EngineArgs.get_batch_defaults``.
LARGE_GPU_BYTES = 70 * 2**30


def vllm_batch_defaults(
    gpu_memory_bytes: int | None,
    gpu_name: str | None = None,
    *,
    usage_context: str = "OPENAI_API_SERVER",
    max_model_len: int | None = None,
    device: str = "cuda",
) -> tuple[int, int]:
    """vLLM 0.27.1's default ``(max_num_batched_tokens, max_num_seqs)``.

    ``EngineArgs.get_batch_defaults`` (``engine/arg_utils.py``): on CUDA GPUs
    with at least 70 GiB whose name lacks "a100", 16384/1024 for the ``LLM``
    class and 8192/1024 for ``vllm serve``; on other GPUs 8192/256 and
    2048/256; on CPU 4096/256 and 2048/128 (times the world size, here 1).
    ``_set_default_max_num_seqs_and_batched_tokens_args`` then caps the token
    budget at ``max_num_seqs x max_model_len`` (with chunked prefill on).

    Args:
        gpu_memory_bytes: total device memory as the platform reports it.
        gpu_name: device name (only "a100" matters).
        usage_context: ``"OPENAI_API_SERVER"`` (``vllm serve``) or ``"LLM_CLASS"``.
        max_model_len: context length for the cap; None for no cap.
        device: ``"cuda"`` or ``"cpu"``.
    """
    if usage_context not in ("OPENAI_API_SERVER", "LLM_CLASS"):
        raise ServebookError(f"usage_context {usage_context!r} is not known; use OPENAI_API_SERVER or LLM_CLASS")
    server = usage_context == "OPENAI_API_SERVER"
    if device == "cpu":
        tokens, seqs = (2048, 128) if server else (4096, 256)
    elif gpu_memory_bytes is not None and gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in (gpu_name or "").lower():
        tokens, seqs = (8192, 1024) if server else (16384, 1024)
    else:
        tokens, seqs = (2048, 256) if server else (8192, 256)
    if max_model_len is not None:
        tokens = min(tokens, seqs * max_model_len)
    return tokens, seqs


def default_async_scheduling(device: str = "cuda") -> bool:
    """Whether 0.27.1 turns async scheduling on by default.

    On for CUDA (``VllmConfig.__post_init__`` sets it when nothing is
    incompatible), forced off on CPU (``CpuPlatform.check_and_update_config``).
    """
    return device == "cuda"


def in_flight_tokens(max_num_batched_tokens: int, async_scheduling: bool) -> int:
    """Tokens the engine may have in flight: ``max_concurrent_batches x max_num_batched_tokens``.

    ``VllmConfig.max_in_flight_tokens`` (``config/vllm.py``): two batches with async
    scheduling, one without.
    """
    return (2 if async_scheduling else 1) * max_num_batched_tokens
