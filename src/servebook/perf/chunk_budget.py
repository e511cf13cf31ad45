"""How many prefill tokens fit in a target step time (chunked prefill, max-num-batched-tokens).

With chunked prefill every step carries the running sequences' decode tokens
plus a prefill chunk; the step's time is what every decoding user waits between
two tokens. :func:`prefill_tokens_within` finds the largest chunk that keeps the
step under a target, and :func:`recommend_max_num_batched_tokens` adds the
decode tokens and rounds down to a power of two (so the target still holds).
"""
from __future__ import annotations

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec
from servebook.perf.model import DEFAULT_CUDAGRAPH_MAX_TOKENS, Coefficients, step_time
from servebook.perf.work import Work, check_tp, decode_work, prefill_work


def mixed_step_s(spec: ModelSpec, gpu, coeffs: Coefficients, *, prefill_tokens: int, decode_batch: int = 0,
                 decode_context_tokens: float = 0.0, prior_tokens: int = 0, tp: int = 1,
                 kv_cache_dtype: str = "auto", cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> float:
    """Seconds of a step with ``decode_batch`` decoding sequences plus one prefill chunk.

    Steps above ``cudagraph_max_tokens`` run eagerly (vLLM's default largest graph is 512 tokens).
    """
    work = Work()
    if decode_batch:
        work = work + decode_work(spec, decode_batch, decode_context_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype)
    if prefill_tokens:
        work = work + prefill_work(spec, prefill_tokens, prior_tokens=prior_tokens, tp=tp,
                                   kv_cache_dtype=kv_cache_dtype, last_chunk=False)
    if work.tokens == 0:
        raise ServebookError("a step needs at least one decode sequence or one prefill token")
    return step_time(spec, gpu, work, coeffs, tp=tp, cudagraph_max_tokens=cudagraph_max_tokens).step_s


def prefill_tokens_within(spec: ModelSpec, gpu, coeffs: Coefficients, *, target_step_s: float,
                          decode_batch: int = 0, decode_context_tokens: float = 0.0, prior_tokens: int = 0,
                          tp: int = 1, kv_cache_dtype: str = "auto", limit_tokens: int = 1 << 20,
                          cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> int:
    """Largest prefill chunk (tokens) whose step, with the given decode batch, takes <= ``target_step_s``.

    Steps above ``cudagraph_max_tokens`` (vLLM's default largest CUDA graph, 512 tokens) run eagerly;
    where that eager step alone exceeds the target, the answer stops at the graph size whatever the TP.
    Returns 0 when the decode batch alone already exceeds the target.
    """
    check_tp(spec, tp)
    if target_step_s <= 0:
        raise ServebookError(f"target step time must be > 0 s, got {target_step_s}")

    def fits(n: int) -> bool:
        if n == 0 and decode_batch == 0:
            return True
        return mixed_step_s(spec, gpu, coeffs, prefill_tokens=n, decode_batch=decode_batch,
                            decode_context_tokens=decode_context_tokens, prior_tokens=prior_tokens, tp=tp,
                            kv_cache_dtype=kv_cache_dtype, cudagraph_max_tokens=cudagraph_max_tokens) <= target_step_s

    if not fits(1 if decode_batch == 0 else 0):
        return 0
    lo, hi = 0, 1
    while hi <= limit_tokens and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit_tokens + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def recommend_max_num_batched_tokens(spec: ModelSpec, gpu, coeffs: Coefficients, *, target_step_s: float,
                                     max_num_seqs: int, decode_context_tokens: float, prior_tokens: int = 0,
                                     tp: int = 1, kv_cache_dtype: str = "auto") -> dict:
    """A ``--max-num-batched-tokens`` that keeps a full step (all seqs decoding + a chunk) under the target.

    Returns a dict with ``chunk_tokens`` (prefill that fits beside ``max_num_seqs``
    decodes), ``budget_tokens`` (chunk + decode tokens), ``recommended`` (largest
    power of two <= budget, at least ``max_num_seqs``) and ``recommended_step_s``.
    """
    chunk = prefill_tokens_within(spec, gpu, coeffs, target_step_s=target_step_s, decode_batch=max_num_seqs,
                                  decode_context_tokens=decode_context_tokens, prior_tokens=prior_tokens, tp=tp,
                                  kv_cache_dtype=kv_cache_dtype)
    if chunk == 0:
        raise ServebookError(
            f"{max_num_seqs} sequences decoding at {decode_context_tokens:.0f} tokens of context already take "
            f"longer than {target_step_s * 1e3:.1f} ms per step; raise the target, lower --max-num-seqs or add GPUs")
    budget = chunk + max_num_seqs
    rec = 1
    while rec * 2 <= budget:
        rec *= 2
    rec = max(rec, max_num_seqs)
    step = mixed_step_s(spec, gpu, coeffs, prefill_tokens=max(rec - max_num_seqs, 0), decode_batch=max_num_seqs,
                        decode_context_tokens=decode_context_tokens, prior_tokens=prior_tokens, tp=tp,
                        kv_cache_dtype=kv_cache_dtype)
    return {"chunk_tokens": chunk, "budget_tokens": budget, "recommended": rec, "recommended_step_s": step,
            "target_step_s": target_step_s, "max_num_seqs": max_num_seqs}
