"""Send many token-id prompts to a running ``vllm serve`` at once and time each (TTFT, latency).

``vllm bench serve`` sends text, which the server tokenizes again (adding BOS and merging
tokens across the boundary between a shared prefix and a suffix), so the token ids the
prefix cache sees are not the ones the benchmark generated. A prefix-caching prediction
needs the exact ids: :func:`stream_token_prompts` sends them with Lab 5's streaming client
(:func:`servebook.lab.harness.itl.stream_completion`: ``/v1/completions`` with a token-id prompt,
``stream``, ``ignore_eos``, greedy), up to ``max_concurrency`` requests in flight (one
thread each), and summarises the per-request times. TTFT is the time from sending a
request to its first chunk that carries a token.
"""
from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from servebook.lab.errors import LabError
from servebook.lab.harness.itl import StreamRecord, stream_completion


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def stream_token_prompts(base_url: str, model: str, prompts: Sequence[Sequence[int]], *, max_tokens: int,
                         max_concurrency: int | None = None, timeout_s: float = 900.0) -> dict:
    """Send every prompt (token ids) at once, at most ``max_concurrency`` in flight; time each.

    Returns ``{"requests": [...], "summary": {...}}``: per request ``prompt_tokens``,
    ``output_tokens`` (token ids streamed), ``ttft_s``, ``latency_s``, ``start_s`` (seconds
    after the first send), in the order of ``prompts``; the summary has ``duration_s`` (first
    send to last answer), ``completed``, ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``,
    ``mean_latency_s``, ``output_throughput`` and ``total_token_throughput`` (tokens/s over
    ``duration_s``), ``request_throughput`` (requests/s). Raises :class:`LabError` when a
    request fails.
    """
    if not prompts:
        raise LabError("no prompts to send")
    workers = min(len(prompts), max_concurrency or len(prompts))
    records = [StreamRecord(name=f"r{i}", prompt_tokens=len(p), max_tokens=max_tokens) for i, p in enumerate(prompts)]

    def run(i: int) -> StreamRecord:
        return stream_completion(base_url, model, list(prompts[i]), records[i], timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(run, range(len(prompts))))
    failed = [r for r in records if r.error or not r.arrivals_s]
    if failed:
        raise LabError(f"{len(failed)} of {len(records)} requests failed; first: {failed[0].error or 'no token streamed'}; "
                       "check the model name and the prompt length against --max-model-len")
    t_zero = min(r.send_s for r in records)
    rows = [{"prompt_tokens": r.prompt_tokens, "output_tokens": r.tokens, "ttft_s": r.ttft_s,
             "latency_s": r.arrivals_s[-1] - r.send_s, "start_s": r.send_s - t_zero} for r in records]
    duration = max(r.arrivals_s[-1] for r in records) - t_zero
    ttfts = [r["ttft_s"] for r in rows]
    out_tokens = sum(r["output_tokens"] for r in rows)
    in_tokens = sum(r["prompt_tokens"] for r in rows)
    summary = {
        "duration_s": duration, "completed": len(rows), "max_concurrency": workers,
        "mean_ttft_ms": 1000 * statistics.fmean(ttfts), "median_ttft_ms": 1000 * statistics.median(ttfts),
        "p99_ttft_ms": 1000 * _percentile(ttfts, 0.99),
        "mean_latency_s": statistics.fmean(r["latency_s"] for r in rows),
        "output_throughput": out_tokens / duration, "total_token_throughput": (in_tokens + out_tokens) / duration,
        "request_throughput": len(rows) / duration,
    }
    return {"requests": rows, "summary": summary}
