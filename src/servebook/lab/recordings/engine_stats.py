"""What a lab's recording says about vLLM's prefix cache and its running requests.

Two sources: vLLM's periodic stats line in the engine logs a lab kept (``Running: N reqs``,
``Prefix cache hit rate: X%``, every 10 s) and, in newer recordings, the ``prefix_cache`` counters
the harness kept per ``vllm bench serve`` load (:func:`servebook.lab.harness.bench.prefix_cache_delta`).
Rates are percent where the name says ``_pct``.
"""
from __future__ import annotations

import re

_HIT_RATE = re.compile(r"Prefix cache hit rate: ([0-9.]+)%")
_RUNNING = re.compile(r"Running: (\d+) reqs")


def logged_prefix_hit_pct(logs, *, min_running: int = 2) -> float | None:
    """The highest prefix-cache hit rate (%) in engine logs, over lines with ``min_running`` or more requests running.

    vLLM's periodic stats line (every 10 s) carries ``Running: N reqs`` and ``Prefix cache hit
    rate: X%`` (over recent requests). Lines with fewer requests running (idle, or a single-stream
    load) are left out. None when no line qualifies.
    """
    rates = []
    for log in logs:
        for line in log.splitlines():
            hit, running = _HIT_RATE.search(line), _RUNNING.search(line)
            if hit and running and int(running.group(1)) >= min_running:
                rates.append(float(hit.group(1)))
    return max(rates) if rates else None


def logged_max_running(log: str) -> int | None:
    """The most requests running at once in an engine log's periodic stats lines (``Running: N reqs``,
    one line every 10 s, so a sample, not every step); None when the log has no such line."""
    counts = [int(m) for m in _RUNNING.findall(log)]
    return max(counts) if counts else None


def engine_logs(measurements) -> list[str]:
    """Every engine log kept in a lab's measurements (any string value holding vLLM's stats line)."""
    if isinstance(measurements, dict):
        return [log for v in measurements.values() for log in engine_logs(v)]
    if isinstance(measurements, list):
        return [log for v in measurements for log in engine_logs(v)]
    return [measurements] if isinstance(measurements, str) and "Prefix cache hit rate" in measurements else []


def bench_prefix_caches(measurements) -> list[dict]:
    """Every ``prefix_cache`` record (:func:`servebook.lab.harness.bench.prefix_cache_delta`) in a lab's
    measurements, in the order found: one per ``vllm bench serve`` load. Empty for recordings made
    before the harness kept them."""
    if isinstance(measurements, dict):
        own = [measurements["prefix_cache"]] if isinstance(measurements.get("prefix_cache"), dict) else []
        return own + [r for k, v in measurements.items() if k != "prefix_cache" for r in bench_prefix_caches(v)]
    if isinstance(measurements, list):
        return [r for v in measurements for r in bench_prefix_caches(v)]
    return []


def load_hit_pct(doc: dict) -> tuple[float | None, str]:
    """(the highest prefix-cache hit rate of a recording's loads, %; how it was read).

    From the ``prefix_cache`` counters when the file has them (hits / queries over each load),
    else the highest rate the engines logged (:func:`logged_prefix_hit_pct`, the older files).
    """
    rates = [r["hit_rate"] for r in bench_prefix_caches(doc["measurements"]) if r.get("hit_rate") is not None]
    if rates:
        return max(rates) * 100, "counters"
    return logged_prefix_hit_pct(engine_logs(doc["measurements"])), "engine log"
