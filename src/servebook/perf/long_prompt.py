"""A long prompt arriving among running decodes: its prefill steps, its TTFT, the decodes' ITL spike.

vLLM 0.27.1's scheduler (``vllm/v1/core/sched/scheduler.py``) serves the running requests
first: each of ``decode_batch`` decoding sequences takes one token of the step's budget
(``--max-num-batched-tokens``), and a waiting prompt gets what is left.

* Chunked prefill on (the default): the prompt is prefilled ``budget - decode_batch`` tokens
  per step, so it takes ``ceil(prompt / (budget - decode_batch))`` steps, every one of them a
  decode step for the running sequences too.
* Chunked prefill off (``--no-enable-chunked-prefill``): the whole prompt must fit in what is
  left of one step's budget. If ``prompt + decode_batch > budget`` the scheduler stops at
  that prompt and it waits until enough decodes finish — :func:`long_prompt_chunks` refuses
  that case instead of predicting a TTFT that depends on when they finish.

:func:`predict_long_prompt` times those steps with the calibrated step-time model
(:func:`servebook.perf.chunk_budget.mixed_step_s`); :func:`knee` finds where shrinking the budget
stops paying on measured or predicted (TTFT, worst ITL) points.
"""
from __future__ import annotations

import math

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec
from servebook.perf.chunk_budget import mixed_step_s
from servebook.perf.model import DEFAULT_CUDAGRAPH_MAX_TOKENS, Coefficients
from servebook.perf.work import prompt_chunks


def long_prompt_chunks(prompt_tokens: int, *, max_num_batched_tokens: int, decode_batch: int,
                       chunked: bool = True) -> list[tuple[int, int]]:
    """``(tokens, prior_tokens)`` of each step that prefills the prompt, in order.

    Args:
        prompt_tokens: the long prompt's length (tokens).
        max_num_batched_tokens: the step's token budget (tokens).
        decode_batch: sequences decoding while the prompt is prefilled (one budget token each).
        chunked: chunked prefill on (vLLM's default) or off.
    """
    if prompt_tokens < 1 or decode_batch < 0 or max_num_batched_tokens < 1:
        raise ServebookError(f"need prompt_tokens >= 1, decode_batch >= 0 and a budget >= 1 token; got "
                             f"{prompt_tokens}, {decode_batch}, {max_num_batched_tokens}")
    left = max_num_batched_tokens - decode_batch
    if left < 1:
        raise ServebookError(f"{decode_batch} decoding sequences use the whole {max_num_batched_tokens}-token budget: "
                             "no prompt token fits; raise --max-num-batched-tokens above the running batch")
    if chunked:
        return prompt_chunks(prompt_tokens, left)
    if prompt_tokens > left:
        raise ServebookError(
            f"with chunked prefill off a {prompt_tokens}-token prompt needs {prompt_tokens + decode_batch} tokens of "
            f"budget beside {decode_batch} decodes but --max-num-batched-tokens is {max_num_batched_tokens}: vLLM "
            "holds the prompt until enough decodes finish; raise the budget or turn chunked prefill on")
    return [(prompt_tokens, 0)]


def predict_long_prompt(spec: ModelSpec, gpu, coeffs: Coefficients, *, prompt_tokens: int, decode_batch: int,
                        decode_context_tokens: float, max_num_batched_tokens: int, chunked: bool = True,
                        tp: int = 1, kv_cache_dtype: str = "auto",
                        cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> dict:
    """Predicted steps, TTFT and ITL spike when one long prompt arrives among ``decode_batch`` decodes.

    Returns a dict:

    * ``chunks`` — ``[(tokens, prior_tokens), ...]`` per prefill step (:func:`long_prompt_chunks`);
    * ``step_s`` — seconds of each of those steps (decodes + chunk; context grows one token a step);
    * ``ttft_s`` — their sum plus the calibrated per-request overhead (seconds); the step already
      running when the prompt arrives (up to one ``decode_step_s``) is not included;
    * ``worst_step_s`` — the longest of those steps: the worst ITL a decoding user sees (seconds);
    * ``decode_step_s`` — a plain decode step of the same batch: the ITL without the prompt (seconds).
    """
    chunks = long_prompt_chunks(prompt_tokens, max_num_batched_tokens=max_num_batched_tokens,
                                decode_batch=decode_batch, chunked=chunked)
    common = dict(tp=tp, kv_cache_dtype=kv_cache_dtype, cudagraph_max_tokens=cudagraph_max_tokens)
    steps = [mixed_step_s(spec, gpu, coeffs, prefill_tokens=n, prior_tokens=prior, decode_batch=decode_batch,
                          decode_context_tokens=decode_context_tokens + i, **common)
             for i, (n, prior) in enumerate(chunks)]
    decode = (mixed_step_s(spec, gpu, coeffs, prefill_tokens=0, decode_batch=decode_batch,
                           decode_context_tokens=decode_context_tokens, **common) if decode_batch else 0.0)
    return {"chunks": chunks, "step_s": steps, "ttft_s": sum(steps) + coeffs.request_overhead_s,
            "worst_step_s": max(steps), "decode_step_s": decode,
            "max_num_batched_tokens": max_num_batched_tokens, "chunked": chunked}


def knee(points: list[dict], *, budget_key: str = "max_num_batched_tokens", ttft_key: str = "ttft_s",
         itl_key: str = "worst_itl_s") -> int | None:
    """The budget below which a smaller ``--max-num-batched-tokens`` costs more TTFT than it saves ITL.

    ``points`` are chunked-prefill configurations (measured or predicted). Walking from the largest
    budget down, each step to the next smaller budget cuts the worst ITL by a fraction and raises
    the TTFT by a fraction; the knee is the last budget reached while the cut was at least as large
    as the rise. Returns None for fewer than two points; the largest budget when the first step down
    already costs more than it saves.
    """
    ordered = sorted(points, key=lambda p: p[budget_key], reverse=True)
    if len(ordered) < 2:
        return None
    for p in ordered:
        if p[ttft_key] <= 0 or p[itl_key] <= 0:
            raise ServebookError(f"TTFT and ITL must be > 0 s; got {p[ttft_key]}, {p[itl_key]} at {p[budget_key]}")
    best = ordered[0][budget_key]
    for big, small in zip(ordered, ordered[1:]):
        itl_cut = (big[itl_key] - small[itl_key]) / big[itl_key]
        ttft_rise = (small[ttft_key] - big[ttft_key]) / big[ttft_key]
        if itl_cut < ttft_rise:
            break
        best = small[budget_key]
    return best


def prefill_steps(prompt_tokens: int, *, max_num_batched_tokens: int, decode_batch: int) -> int:
    """Steps a chunked prefill of ``prompt_tokens`` takes beside ``decode_batch`` decodes:
    ``ceil(prompt / (budget - decodes))``."""
    left = max_num_batched_tokens - decode_batch
    if left < 1:
        raise ServebookError(f"{decode_batch} decodes fill the {max_num_batched_tokens}-token budget")
    return math.ceil(prompt_tokens / left)
