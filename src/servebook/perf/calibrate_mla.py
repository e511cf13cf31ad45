"""Calibration, fourth stage: the extra host time of an MLA layer in a step that runs eagerly.

A step of more tokens than the largest CUDA graph runs eagerly: the host launches every kernel, and
for moderate GPU work that launch time is the step's floor (the second stage,
:mod:`servebook.perf.calibrate_steps`, fits it per layer, per MoE layer and per sequence on dense and
GQA-MoE models). vLLM's MLA layer (``MLAAttention.forward_impl``) launches more than a GQA layer: it
splits the step's tokens into an absorbed decode path (``forward_mqa``: a batched matmul by W_UK into
the latent space, the latent-attention kernel over kv_lora_rank + rope dims, a batched matmul by W_UV
back out) and an un-absorbed prefill path (``forward_mha``: the kv_b_proj up-projection of the new
tokens' latents, splits and concatenations, varlen attention; ``_compute_prefill_context`` repeats it for
cached context), each a chain of small ops in Python. Measured on the H200 (vLLM 0.26.0), eager steps of
DeepSeek-V2-Lite took ~1.3x what the step model priced where Qwen3-30B-A3B's, in the same plan at the
same engine flags, took ~1.03x.

This stage fits one coefficient, ``eager_mla_layer_s`` (>= 0, seconds per MLA layer added to an eager
step's host floor), the way the third stage fits the sliding-window efficiency: over the eager steps of
an MLA model's job (``mla``) and of a GQA MoE model's job recorded with the same engine flags
(``reference``), the ratio of measured to priced seconds is computed, and the coefficient is set so
the MLA job's ratio equals the reference's. What both miss (the host time that grows over a long job
in both) stays out; only what the MLA layers add goes in. Every other coefficient is kept.
"""
from __future__ import annotations

from dataclasses import replace

from servebook.errors import ServebookError
from servebook.perf.calibrate_steps import measured_over_priced

#: The coefficient this stage fits.
FITTED = ("eager_mla_layer_s",)
#: Its search interval, s per MLA layer (0: MLA layers cost no more than GQA ones).
BOUNDS = (0.0, 0.01)


def eager_steps(doc: dict, gpu, coeffs):
    """``(pricer, [(work tuple, measured s)])`` for the record's steps that ran eagerly (more tokens than the
    largest CUDA graph); ``pricer.spec`` is its model."""
    from servebook.hf_config import load_model_spec
    from servebook.perf.calibrate_steps import recorded_steps
    from servebook.perf.model import StepPricer
    from servebook.perf.work import NO_WORK, PrefillWork, decode_work
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    spec = load_model_spec(doc["config"], name=doc["model_id"])
    flags = doc["engine_args"]
    kv = flags.get("kv_cache_dtype") or "auto"
    graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                 enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
    pricer = StepPricer(spec, gpu, coeffs, cudagraph_max_tokens=graph, kv_cache_dtype=kv)
    prefill = PrefillWork(spec, kv_cache_dtype=kv)
    steps = []
    for job in doc["jobs"]:
        for chunks, decodes, ctx, measured in recorded_steps(job):
            if measured <= 0 or decodes + sum(n for n, _, _ in chunks) <= graph:
                continue
            w = list(decode_work(spec, decodes, ctx, kv_cache_dtype=kv).astuple()) if decodes else list(NO_WORK)
            for n, before, last in chunks:
                w = [a + b for a, b in zip(w, prefill(n, before, last))]
            steps.append((tuple(w), measured))
    return pricer, steps


def has_mla(spec) -> bool:
    """Whether any attention layer of ``spec`` is MLA."""
    return any(layer.kind == "mla" for layer in spec.layers)


def fit_eager_mla_layer(coeffs, mla_docs: list[dict], reference_docs: list[dict], gpu) -> tuple:
    """``coeffs`` with ``eager_mla_layer_s`` fitted (see the module docstring); returns ``(coefficients, report)``.

    ``mla_docs``: ``servebook.e2e/1`` records of MLA models; ``reference_docs``: records of GQA models with
    the same engine flags. Raises ServebookError when either has no eager step.
    """
    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    base = replace(coeffs, eager_mla_layer_s=0.0)
    mla = [eager_steps(d, g, base) for d in mla_docs]
    ref = [eager_steps(d, g, base) for d in reference_docs]
    if not any(s for _, s in mla) or not any(s for _, s in ref):
        raise ServebookError("the MLA stage needs eager steps of an MLA model's job and of a GQA model's job at the "
                             f"same engine flags; got {[d['model_id'] for d in mla_docs + reference_docs]}")
    if any(not has_mla(p.spec) for p, _ in mla) or any(has_mla(p.spec) for p, _ in ref):
        raise ServebookError("the MLA stage's records are mixed up: MLA records must be MLA models, references not")
    target = measured_over_priced(ref, base)
    before = measured_over_priced(mla, base)
    lo, hi = BOUNDS
    if before <= target:  # MLA layers cost nothing extra
        value = 0.0
    else:  # the MLA job's ratio falls as the term grows (its eager steps are priced longer): bisect
        if measured_over_priced(mla, replace(base, eager_mla_layer_s=hi)) > target:
            raise ServebookError(f"eager_mla_layer_s would exceed {hi} s per layer; the MLA records are not "
                                 "explained by host time")
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if measured_over_priced(mla, replace(base, eager_mla_layer_s=mid)) > target:
                lo = mid
            else:
                hi = mid
        value = 0.5 * (lo + hi)
    fitted = replace(coeffs, eager_mla_layer_s=value)
    report = {"reference_ratio": target, "mla_ratio_before": before,
              "mla_ratio_after": measured_over_priced(mla, fitted),
              "eager_steps": {"mla": sum(len(s) for _, s in mla), "reference": sum(len(s) for _, s in ref)},
              "mla_models": sorted({d["model_id"] for d in mla_docs}),
              "reference_models": sorted({d["model_id"] for d in reference_docs}),
              "eager_mla_layer_s": value}
    return fitted, report
