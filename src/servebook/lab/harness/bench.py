"""Drive a running server with ``vllm bench serve`` and keep every request's timings.

The load generator is vLLM's own (``vllm/benchmarks/serve.py`` of the installed release),
run as a subprocess of the engine's Python with ``--save-result --save-detailed``; its JSON
holds per-request ``input_lens``, ``output_lens``, ``ttfts`` (s), ``itls`` (s, one list per
request) and ``start_times``. :func:`run_bench` returns that JSON (less the generated
texts) with each request's end-to-end latency added, and the prefix cache's work during the
load (``/metrics`` scraped before and after). The random dataset means distinct prompts, so the
hit rate should be near zero (two prompts repeat only when their random start ids coincide);
a larger rate means the prompts repeated and the cache, not the engine, served them.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from servebook.engine_env import vllm_python
from servebook.lab.errors import LabError
from servebook.lab.harness.metrics import delta
from servebook.lab.harness.server import VllmServer, engine_error_line

#: Summary fields kept from vLLM's result (milliseconds where the name says ``_ms``).
SUMMARY_KEYS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
)


#: The prefix cache's counters (vLLM 0.27.1, ``vllm/v1/metrics/loggers.py``): prompt tokens looked
#: up, and those found, as requests are admitted.
PREFIX_CACHE_COUNTERS = {"queries": "vllm:prefix_cache_queries", "hits": "vllm:prefix_cache_hits"}


def prefix_cache_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """The prefix cache's work between two ``/metrics`` scrapes of one server.

    ``query_tokens`` and ``hit_tokens``: the growth of :data:`PREFIX_CACHE_COUNTERS`;
    ``hit_rate`` = hits / queries, None when nothing was looked up (caching off, or no request).
    """
    queries = delta(before, after, PREFIX_CACHE_COUNTERS["queries"])
    hits = delta(before, after, PREFIX_CACHE_COUNTERS["hits"])
    return {"query_tokens": queries, "hit_tokens": hits, "hit_rate": hits / queries if queries > 0 else None}


def bench_command(server: VllmServer, *, num_prompts: int, input_len: int, output_len: int,
                  range_ratio: float = 0.0, request_rate: float | None = None,
                  max_concurrency: int | None = None, seed: int = 0, result_dir: str,
                  extra: list[str] | None = None) -> list[str]:
    """The ``vllm bench serve`` command line (random dataset, ``--ignore-eos`` so lengths are exact)."""
    cmd = [str(vllm_python()), "-m", "servebook.lab.harness.vllm_cli", "bench", "serve",
           "--backend", "vllm", "--base-url", server.base_url, "--model", server.model,
           "--dataset-name", "random", "--random-input-len", str(input_len),
           "--random-output-len", str(output_len), "--random-range-ratio", str(range_ratio),
           "--num-prompts", str(num_prompts), "--seed", str(seed), "--ignore-eos",
           "--temperature", "0", "--save-result", "--save-detailed",
           "--result-dir", result_dir, "--result-filename", "bench.json"]
    if request_rate is not None:
        cmd += ["--request-rate", str(request_rate)]
    if max_concurrency is not None:
        cmd += ["--max-concurrency", str(max_concurrency)]
    return cmd + list(extra or [])


def run_bench(server: VllmServer, *, num_prompts: int, input_len: int, output_len: int,
              range_ratio: float = 0.0, request_rate: float | None = None,
              max_concurrency: int | None = None, seed: int = 0, timeout_s: float = 900.0,
              extra: list[str] | None = None) -> dict:
    """Run one benchmark against ``server``; return vLLM's result with per-request timings.

    Returns a dict with ``summary`` (:data:`SUMMARY_KEYS`), ``requests`` (one dict per request:
    ``input_len``, ``output_len``, ``ttft_s``, ``latency_s`` = TTFT + sum of inter-token gaps,
    ``start_s`` relative to the first request), ``first_start_s`` (that first request's send
    time, seconds on the host's monotonic clock), ``command``, ``wall_s`` and ``prefix_cache``
    (:func:`prefix_cache_delta` over the load: ``/metrics`` is scraped just before and after it, so
    it also counts other clients' requests to the same server in that time).
    Raises :class:`LabError` with the benchmark's own error line when it fails.
    """
    with tempfile.TemporaryDirectory(prefix="servebook-bench-") as tmp:
        cmd = bench_command(server, num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                            range_ratio=range_ratio, request_rate=request_rate,
                            max_concurrency=max_concurrency, seed=seed, result_dir=tmp, extra=extra)
        before = server.metrics()
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=server.env)
        wall = time.monotonic() - t0
        path = Path(tmp) / "bench.json"
        if proc.returncode != 0 or not path.exists():
            out = proc.stdout + proc.stderr
            raise LabError(f"vllm bench serve failed (status {proc.returncode}): "
                           f"{engine_error_line(out) or out[-1500:]}")
        raw = json.loads(path.read_text())
    out = summarise_bench(raw, command=cmd, wall_s=wall)
    out["prefix_cache"] = prefix_cache_delta(before, server.metrics())
    return out


def summarise_bench(raw: dict, *, command: list[str] | None = None, wall_s: float | None = None) -> dict:
    """Per-request rows and the summary from a ``--save-detailed`` result dict."""
    if raw.get("completed", 0) == 0:
        errors = [e for e in raw.get("errors", []) if e]
        raise LabError(f"no request completed; first error: {errors[0] if errors else 'none recorded'}; "
                       "is the server up and the model name right?")
    starts = raw.get("start_times") or [0.0] * len(raw["ttfts"])
    t_first = min(starts) if starts else 0.0
    requests = []
    for i, ttft in enumerate(raw["ttfts"]):
        itls = raw["itls"][i] if i < len(raw.get("itls", [])) else []
        requests.append({
            "input_len": raw["input_lens"][i], "output_len": raw["output_lens"][i],
            "ttft_s": ttft, "latency_s": ttft + sum(itls), "start_s": starts[i] - t_first,
        })
    return {"summary": {k: raw.get(k) for k in SUMMARY_KEYS}, "requests": requests,
            "command": command, "wall_s": wall_s,
            # the first request's send time on the machine's monotonic clock (vLLM's perf_counter),
            # so runs of several benchmark processes on one host can be put on one time line
            "first_start_s": t_first if raw.get("start_times") else None}
