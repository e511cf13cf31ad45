"""Read a vLLM ``/metrics`` page (Prometheus text format) with ``prometheus_client``'s parser.

The metric names are vLLM 0.27.1's (``vllm/v1/metrics/loggers.py``): for example
``vllm:num_preemptions`` (a counter, exposed as ``vllm:num_preemptions_total``),
``vllm:kv_cache_usage_perc`` (a gauge in [0, 1]), ``vllm:num_requests_running``.
"""
from __future__ import annotations



def parse_metrics(text: str) -> dict[str, float]:
    """Sum every sample over its labels: ``{sample name: value}``.

    Counters appear under their sample names (``vllm:num_preemptions_total``); histogram
    samples keep their suffixes (``..._sum``, ``..._count``, ``..._bucket`` summed over ``le``
    is not meaningful and is left out). One engine per server, so summing over the
    ``engine``/``model_name`` labels loses nothing.
    """
    from prometheus_client.parser import text_string_to_metric_families  # vLLM depends on it

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def metric(values: dict[str, float], name: str, default: float = 0.0) -> float:
    """One metric by name, accepting the name with or without ``_total``."""
    for key in (name, f"{name}_total", name.removesuffix("_total")):
        if key in values:
            return values[key]
    return default


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """How much a counter grew between two scrapes."""
    return metric(after, name) - metric(before, name)
