"""Prometheus histogram buckets from a vLLM ``/metrics`` page.

:func:`servebook.lab.harness.metrics.parse_metrics` leaves buckets out (summed over ``le`` they mean
nothing). Here one histogram's buckets are kept, cumulative as Prometheus exposes them, summed
over the other labels (one engine per server). Lab 5 uses them to show what
``vllm:iteration_tokens_total`` (buckets 1, 8, 16, ..., 16384 tokens) books per step.
"""
from __future__ import annotations

import math

from servebook.lab.errors import LabError


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """``{upper bound: cumulative count}`` of histogram ``name`` (``+Inf`` is ``math.inf``).

    ``name`` is the registered name (``vllm:iteration_tokens_total``); its ``_bucket`` samples are
    read. Returns an empty dict when the page has no such histogram.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            bound = float(sample.labels["le"])
            out[bound] = out.get(bound, 0.0) + float(sample.value)
    return out


def count_above(buckets: dict[float, float], bound: float) -> float:
    """Observations greater than ``bound``, which must be one of the histogram's bucket bounds."""
    if bound not in buckets:
        raise LabError(f"{bound} is not a bucket bound of this histogram ({sorted(buckets)}); "
                         "pick a bound the histogram has")
    return buckets.get(math.inf, 0.0) - buckets[bound]


def buckets_delta(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """What was observed between two scrapes, bucket by bucket (cumulative)."""
    return {b: after[b] - before.get(b, 0.0) for b in after}
