"""Scheduler defaults (vLLM 0.32.0 ``config/scheduler.py``, ``engine/arg_utils.py``, ``config/vllm.py``).

Units: ``*_tokens`` tokens, ``*_seqs`` sequences, ``*_BYTES`` bytes.
"""
from __future__ import annotations

from servebook.errors import ServebookError
from servebook.vllm_rules.release import rule_release

#: Total device memory (bytes, 70 GiB) from which vLLM (0.26.0 to 0.32.0) uses the larger batch defaults
#: (unless the GPU is an A100): ``EngineArgs.get_batch_defaults``.
LARGE_GPU_BYTES = 70 * 2**30

#: ``(max_num_batched_tokens, max_num_seqs)`` per usage context before the ``max_model_len`` cap
#: (``EngineArgs.get_batch_defaults``): CUDA GPUs with at least :data:`LARGE_GPU_BYTES` that are
#: not A100s, other GPUs, and the CPU backend. Tokens, sequences.
LARGE_GPU_BATCH_DEFAULTS = {"OPENAI_API_SERVER": (8192, 1024), "LLM_CLASS": (16384, 1024)}
SMALL_GPU_BATCH_DEFAULTS = {"OPENAI_API_SERVER": (2048, 256), "LLM_CLASS": (8192, 256)}
CPU_BATCH_DEFAULTS = {"OPENAI_API_SERVER": (2048, 128), "LLM_CLASS": (4096, 256)}
#: The usage contexts vLLM distinguishes for these defaults: ``vllm serve`` and the offline ``LLM`` class.
USAGE_CONTEXTS = ("OPENAI_API_SERVER", "LLM_CLASS")


def vllm_batch_defaults(
    gpu_memory_bytes: int | None,
    gpu_name: str | None = None,
    *,
    usage_context: str = "OPENAI_API_SERVER",
    max_model_len: int | None = None,
    device: str = "cuda",
) -> tuple[int, int]:
    """vLLM's default ``(max_num_batched_tokens, max_num_seqs)`` (0.26.0 to 0.32.0 alike).

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
    if usage_context not in USAGE_CONTEXTS:
        raise ServebookError(f"usage_context {usage_context!r} is not known; use OPENAI_API_SERVER or LLM_CLASS")
    if device == "cpu":
        table = CPU_BATCH_DEFAULTS
    elif gpu_memory_bytes is not None and gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in (gpu_name or "").lower():
        table = LARGE_GPU_BATCH_DEFAULTS
    else:
        table = SMALL_GPU_BATCH_DEFAULTS
    tokens, seqs = table[usage_context]
    if max_model_len is not None:
        tokens = min(tokens, seqs * max_model_len)
    return tokens, seqs


def default_async_scheduling(device: str = "cuda") -> bool:
    """Whether vLLM (0.26.0 to 0.32.0) turns async scheduling on by default.

    On for CUDA (``VllmConfig.__post_init__`` sets it when nothing is
    incompatible), forced off on CPU (``CpuPlatform.check_and_update_config``).
    """
    return device == "cuda"


#: Speculative methods with which vLLM 0.32.0 leaves async scheduling on when it is left unset
#: (``VllmConfig.__post_init__`` in ``config/vllm.py``): the EAGLE family (``eagle``, ``eagle3``,
#: ``extract_hidden_states``, the MTP model types, ``dflash``), ``ngram_gpu``, ``draft_model`` and
#: ``dspark``. Every other method (``ngram``, ``suffix``, ``medusa``, ...) turns it off with a warning.
ASYNC_SPECULATIVE_METHODS = frozenset({"eagle", "eagle3", "extract_hidden_states", "mtp", "dflash", "ngram_gpu",
                                       "draft_model", "dspark"})


def async_scheduling_with_speculation(method: str, device: str = "cuda") -> bool:
    """Whether async scheduling stays on (left unset) when speculative decoding uses ``method``
    (vLLM 0.32.0; ``mtp`` stands for its MTP model types). Off on CPU regardless."""
    return default_async_scheduling(device) and method in ASYNC_SPECULATIVE_METHODS


def max_concurrent_batches(async_scheduling: bool) -> int:
    """Engine steps that may be scheduled but not yet processed: 2 with async scheduling, else 1.

    ``VllmConfig.max_concurrent_batches`` (``config/vllm.py``) with pipeline parallelism 1.
    """
    return 2 if async_scheduling else 1


def in_flight_tokens(max_num_batched_tokens: int, async_scheduling: bool) -> int:
    """Tokens the engine may have in flight: ``max_concurrent_batches x max_num_batched_tokens``.

    ``VllmConfig.max_in_flight_tokens`` (``config/vllm.py``): two batches with async
    scheduling, one without.
    """
    return max_concurrent_batches(async_scheduling) * max_num_batched_tokens


def decode_unsettled_tokens(async_scheduling: bool, query_tokens: int = 1) -> int:
    """Tokens of one decoding request that hold KV slots but are not yet processed, at allocation.

    When the scheduler allocates a decode step (``KVCacheManager.allocate_slots``,
    ``v1/core/kv_cache_manager.py``) the request needs slots up to ``num_computed_tokens +
    query_tokens``, while ``remove_skipped_blocks`` frees on the processed prefix
    ``num_computed_tokens - num_in_flight_tokens``. Without async scheduling nothing is in
    flight: ``query_tokens`` (1 without speculation). With async scheduling the previous step's
    tokens are still in flight (``AsyncScheduler`` advances ``num_computed_tokens`` and
    ``num_in_flight_tokens`` at scheduling, ``v1/core/sched/scheduler.py``): twice that.
    Tokens; ``query_tokens`` is 1 + speculative tokens per step.
    """
    return max_concurrent_batches(async_scheduling) * query_tokens


def check_batch_budget(max_num_batched_tokens: int, max_num_seqs: int) -> None:
    """Raise unless ``max_num_batched_tokens >= max_num_seqs`` (tokens per step vs sequences).

    vLLM 0.32.0 (as 0.27.1) refuses to start otherwise: ``SchedulerConfig.verify_max_model_len``
    (``config/scheduler.py``) raises ``max_num_batched_tokens (...) must be greater than or
    equal to max_num_seqs (...)``; every running sequence needs at least one token of the
    step's budget.
    """
    if max_num_batched_tokens < max_num_seqs:
        raise ServebookError(
            f"--max-num-batched-tokens {max_num_batched_tokens} is smaller than --max-num-seqs {max_num_seqs}: "
            "vLLM refuses to start (every running sequence needs a token of the step's budget); "
            f"raise --max-num-batched-tokens to at least {max_num_seqs} or lower --max-num-seqs"
        )


def check_long_prefill_threshold(long_prefill_token_threshold: int, max_model_len: int) -> None:
    """Raise when ``long_prefill_token_threshold > max_model_len`` (both tokens).

    vLLM 0.32.0 (as 0.27.1), ``SchedulerConfig.verify_max_model_len`` (``config/scheduler.py``):
    ``long_prefill_token_threshold (...) cannot be greater than the max_model_len (...)``.
    """
    if long_prefill_token_threshold > max_model_len:
        raise ServebookError(
            f"--long-prefill-token-threshold {long_prefill_token_threshold} is larger than --max-model-len "
            f"{max_model_len}: vLLM refuses to start; use at most {max_model_len} tokens (0 turns the cap off)"
        )


def effective_long_prefill_threshold(long_prefill_token_threshold: int, eligible_requests: int,
                                     vllm_version: str | None = None) -> int:
    """The per-request prefill cap (tokens) the scheduler applies this step; 0 means no cap.

    ``Scheduler.schedule`` (``v1/core/sched/scheduler.py``):

    * 0.26.0 and 0.27.1: ``--long-prefill-token-threshold`` itself, every step.
    * 0.32.0: 0 (no cap) when only one request is running or waiting (``eligible_requests``,
      ``get_request_counts``: running plus waiting): there is nobody for a long prefill to starve.
      (0.32.0's opt-in ``long_prefill_token_threshold_adaptive``, default off, is not modelled.)

    ``vllm_version``: the release (None: :data:`~servebook.vllm_rules.release.PINNED_VLLM`).
    """
    if rule_release(vllm_version) == "0.26.0":
        return long_prefill_token_threshold
    return long_prefill_token_threshold if eligible_requests > 1 else 0
