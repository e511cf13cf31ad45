"""Send token-id prompts to a running ``vllm serve`` and time each one (TTFT, latency).

``vllm bench serve`` sends text, which the server tokenizes again (adding BOS and merging
tokens across the boundary between a shared prefix and a suffix), so the token ids the
prefix cache sees are not the ones the benchmark generated. A prefix-caching prediction
needs the exact ids: :func:`stream_token_prompts` posts them as ``/v1/completions``
prompts (a list of token ids), streamed, ``ignore_eos`` so every request generates exactly
``max_tokens`` tokens, with up to ``max_concurrency`` requests in flight (threads,
standard library only). TTFT is the time from sending a request to its first streamed
chunk that carries a choice.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from servebook.lab.errors import LabError


def _one(url: str, model: str, prompt: Sequence[int], max_tokens: int, timeout_s: float, t_zero: float) -> dict:
    body = json.dumps({"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    usage: dict = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if first is None and chunk.get("choices"):
                    first = time.perf_counter()
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except urllib.error.HTTPError as exc:
        raise LabError(f"{url} answered {exc.code}: {exc.read()[:400]!r}; check the model name and the prompt "
                       "length against --max-model-len") from None
    except urllib.error.URLError as exc:
        raise LabError(f"cannot reach {url} ({exc.reason}); is the server still running?") from None
    end = time.perf_counter()
    if first is None:
        raise LabError(f"{url} streamed no token for a {len(prompt)}-token prompt")
    return {"prompt_tokens": usage.get("prompt_tokens", len(prompt)),
            "output_tokens": usage.get("completion_tokens", 0),
            "ttft_s": first - start, "latency_s": end - start, "start_s": start - t_zero}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def stream_token_prompts(base_url: str, model: str, prompts: Sequence[Sequence[int]], *, max_tokens: int,
                         max_concurrency: int | None = None, timeout_s: float = 900.0) -> dict:
    """Send every prompt (token ids) at once, at most ``max_concurrency`` in flight; time each.

    Returns ``{"requests": [...], "summary": {...}}``: per request ``prompt_tokens``,
    ``output_tokens`` (the server's usage), ``ttft_s``, ``latency_s``, ``start_s`` (seconds
    after the first send), in the order of ``prompts``; the summary has ``duration_s`` (first
    send to last answer), ``completed``, ``mean_ttft_ms``, ``median_ttft_ms``, ``p99_ttft_ms``,
    ``mean_latency_s``, ``output_throughput`` and ``total_token_throughput`` (tokens/s over
    ``duration_s``), ``request_throughput`` (requests/s). Raises :class:`LabError` when a
    request fails.
    """
    if not prompts:
        raise LabError("no prompts to send")
    url = base_url.rstrip("/") + "/v1/completions"
    workers = min(len(prompts), max_concurrency or len(prompts))
    t_zero = time.perf_counter()
    lock = threading.Lock()
    ends: list[float] = []

    def run(prompt):
        row = _one(url, model, prompt, max_tokens, timeout_s, t_zero)
        with lock:
            ends.append(row["start_s"] + row["latency_s"])
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(run, prompts))
    duration = max(ends)
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
