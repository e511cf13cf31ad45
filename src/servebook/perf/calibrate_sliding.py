"""Calibration, third stage: what a sliding-window layer's KV read costs beside a full-attention one's.

The first stage fits the KV bandwidth efficiency (``kv_bandwidth_eff``) on models whose layers all
attend to their whole context. vLLM runs a sliding-window layer through a different attention path,
and on the H200 (vLLM 0.26.0) that path read the same KV bytes more slowly. This stage measures that
on a *fitted* model's shape, so no held-out model enters it:

* two engines ran the very same requests (``labs/tools/e2e_attention.toml``, records in
  ``labs/results/e2e_attention``): Llama-3.1-8B, and Llama-3.1-8B with every layer a sliding-window
  layer whose window (4,096 tokens) holds every context, so both read the same KV bytes;
* over each engine's decode-only steps, the ratio of measured to priced seconds is computed;
* ``sliding_kv_bandwidth_eff`` (a fraction of ``kv_bandwidth_eff``) is set so that the sliding
  engine's ratio equals the full-attention engine's. What the two engines share (whatever the model
  misses in both) stays out of the coefficient; only what the window adds goes in.

Every other coefficient is kept.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from servebook.errors import ServebookError

#: The coefficient this stage fits.
FITTED = ("sliding_kv_bandwidth_eff",)
#: Its search interval (a fraction of ``kv_bandwidth_eff``).
BOUNDS = (0.05, 1.0)


def _decode_steps(doc: dict, gpu, coeffs):
    """``(pricer, [(work tuple, measured s)])`` for the record's decode-only steps (``pricer.spec``: its model)."""
    from servebook.hf_config import load_model_spec
    from servebook.perf.calibrate_steps import recorded_steps
    from servebook.perf.model import StepPricer
    from servebook.perf.work import decode_work
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    spec = load_model_spec(doc["config"], name=doc["model_id"])
    flags = doc["engine_args"]
    graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                 enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
    pricer = StepPricer(spec, gpu, coeffs, cudagraph_max_tokens=graph, kv_cache_dtype=flags.get("kv_cache_dtype") or "auto")
    steps = [(decode_work(spec, decodes, ctx).astuple(), measured)
             for job in doc["jobs"] for chunks, decodes, ctx, measured in recorded_steps(job)
             if decodes and not chunks and measured > 0]
    return pricer, steps


def _has_sliding_layers(pricer) -> bool:
    return any(layer.sliding_window is not None for layer in pricer.spec.layers)


def fit_sliding_kv_eff(coeffs, docs: list[dict], gpu) -> tuple:
    """``coeffs`` with ``sliding_kv_bandwidth_eff`` fitted on ``docs`` (see the module docstring).

    ``docs``: ``servebook.e2e/1`` records of one model shape, with and without sliding-window layers.
    Returns ``(coefficients, report)``; raises ServebookError when either kind of record is missing.
    """
    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    priced = [_decode_steps(d, g, coeffs) for d in docs]
    full_steps = [p for p in priced if not _has_sliding_layers(p[0])]
    sliding_steps = [p for p in priced if _has_sliding_layers(p[0])]
    if not full_steps or not sliding_steps:
        raise ServebookError("the sliding-window stage needs records of one shape with and without sliding-window "
                             f"layers (labs/tools/e2e_attention.toml); got {[d['model_id'] for d in docs]}")

    def ratio(groups, c):
        measured = sum(m for _, steps in groups for _, m in steps)
        priced = 0.0
        for pricer, steps in groups:
            pricer.coeffs = c
            priced += sum(pricer.step_s(*w) for w, _ in steps)
        return measured / priced

    base = replace(coeffs, sliding_kv_bandwidth_eff=1.0)
    target = ratio(full_steps, base)
    before = ratio(sliding_steps, base)
    lo, hi = BOUNDS
    if before <= target:  # the window costs nothing extra
        eff = 1.0
    else:  # the sliding engine's ratio falls as the efficiency falls (its steps are priced longer): bisect
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if ratio(sliding_steps, replace(base, sliding_kv_bandwidth_eff=mid)) > target:
                hi = mid
            else:
                lo = mid
        eff = 0.5 * (lo + hi)
    fitted = replace(coeffs, sliding_kv_bandwidth_eff=eff)
    report = {"full_attention_ratio": target, "sliding_ratio_before": before,
              "sliding_ratio_after": ratio(sliding_steps, fitted),
              "decode_steps": {"full_attention": sum(len(s) for _, s in full_steps),
                               "sliding": sum(len(s) for _, s in sliding_steps)},
              "sliding_kv_bandwidth_eff": eff}
    return fitted, report


def sources(paths: list[Path], root: Path | None = None) -> list[dict]:
    """:func:`servebook.perf.calibrate_steps.record_source` of each record the stage used."""
    from servebook.perf.calibrate_steps import record_source

    return [record_source(p, json.loads(p.read_text()), root) for p in paths]
