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

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from servebook.errors import ServebookError

#: The coefficient this stage fits.
FITTED = ("sliding_kv_bandwidth_eff",)
#: Its search interval (a fraction of ``kv_bandwidth_eff``).
BOUNDS = (0.05, 1.0)


def _has_sliding_layers(doc: dict) -> bool:
    from servebook.hf_config import load_model_spec

    return any(layer.sliding_window is not None for layer in load_model_spec(doc["config"]).layers)


def _decode_steps(doc: dict, gpu, coeffs):
    """``(pricer, [(work tuple, measured s)])`` for the record's decode-only steps."""
    from servebook.hf_config import load_model_spec
    from servebook.perf.calibrate_steps import recorded_steps
    from servebook.perf.model import StepPricer
    from servebook.perf.work import decode_work
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    spec = load_model_spec(doc["config"], name=doc["model_id"])
    flags = doc["engine_args"]
    graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                 enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
    pricer = StepPricer(spec, gpu, coeffs, cudagraph_max_tokens=graph)
    steps = [(decode_work(spec, decodes, ctx).astuple(), measured)
             for job in doc["jobs"] for chunks, decodes, ctx, measured in recorded_steps(job)
             if decodes and not chunks and measured > 0]
    return pricer, steps


def fit_sliding_kv_eff(coeffs, docs: list[dict], gpu) -> tuple:
    """``coeffs`` with ``sliding_kv_bandwidth_eff`` fitted on ``docs`` (see the module docstring).

    ``docs``: ``servebook.e2e/1`` records of one model shape, with and without sliding-window layers.
    Returns ``(coefficients, report)``; raises ServebookError when either kind of record is missing.
    """
    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    full = [d for d in docs if not _has_sliding_layers(d)]
    sliding = [d for d in docs if _has_sliding_layers(d)]
    if not full or not sliding:
        raise ServebookError("the sliding-window stage needs records of one shape with and without sliding-window "
                             f"layers (labs/tools/e2e_attention.toml); got {[d['model_id'] for d in docs]}")
    full_steps = [_decode_steps(d, g, coeffs) for d in full]
    sliding_steps = [_decode_steps(d, g, coeffs) for d in sliding]

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
    """Provenance of the records the stage used: file, sha256, model, date, vLLM version."""
    out = []
    for p in paths:
        doc = json.loads(p.read_text())
        rel = str(p.relative_to(root)) if root and p.is_relative_to(root) else str(p)
        out.append({"file": rel, "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "model": doc["model_id"],
                    "date": doc.get("date"), "vllm_version": doc.get("vllm_version")})
    return out
