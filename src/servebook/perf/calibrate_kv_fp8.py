"""Calibration, fifth stage: how fast a 1-byte (fp8) KV cache is read, beside a 16-bit one.

The first stage fits the KV bandwidth efficiency (``kv_bandwidth_eff``) on 16-bit KV caches. With
``--kv-cache-dtype fp8`` a decode step reads half the bytes, but the attention kernel converts every
element it reads (the query is quantized and the scores rescaled), and on the H200 (vLLM 0.26.0) a
long-context decode step of Llama-3.1-8B with an fp8 cache took ~70% of the 16-bit step's KV time, not
50%. This stage measures that on a *fitted* model's shape, as the third stage does for sliding windows:

* two engines ran the very same requests (``labs/tools/e2e_issue39.toml``: Llama-3.1-8B at 8k-32k
  contexts, ``kv_cache_dtype`` auto and fp8, records in ``labs/results/e2e_issue39``);
* over each engine's decode-only steps, the ratio of measured to priced seconds is computed;
* ``fp8_kv_bandwidth_eff`` (a fraction of ``kv_bandwidth_eff``, at most 1) is set so that the fp8
  engine's ratio equals the 16-bit engine's. What the two share (whatever the model misses at long
  contexts in both) stays out of the coefficient; only what the fp8 read adds goes in.

Every other coefficient is kept.
"""
from __future__ import annotations

from dataclasses import replace

from servebook.errors import ServebookError
from servebook.perf.calibrate_steps import measured_over_priced

#: The coefficient this stage fits.
FITTED = ("fp8_kv_bandwidth_eff",)
#: Its search interval (a fraction of ``kv_bandwidth_eff``).
BOUNDS = (0.05, 1.0)


def _kv_dtype(doc: dict) -> str:
    return doc["engine_args"].get("kv_cache_dtype") or "auto"


def decode_steps(doc: dict, gpu, coeffs):
    """``(pricer, [(work tuple, measured s)])`` for the record's decode-only steps, priced with its KV dtype."""
    from servebook.hf_config import load_model_spec
    from servebook.perf.calibrate_steps import recorded_steps
    from servebook.perf.model import StepPricer
    from servebook.perf.work import decode_work
    from servebook.vllm_rules.compilation import cudagraph_max_tokens

    spec = load_model_spec(doc["config"], name=doc["model_id"])
    flags = doc["engine_args"]
    graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                 enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
    pricer = StepPricer(spec, gpu, coeffs, cudagraph_max_tokens=graph, kv_cache_dtype=_kv_dtype(doc))
    steps = [(decode_work(spec, decodes, ctx, kv_cache_dtype=_kv_dtype(doc)).astuple(), measured)
             for job in doc["jobs"] for chunks, decodes, ctx, measured in recorded_steps(job)
             if decodes and not chunks and measured > 0]
    return pricer, steps


def is_fp8(doc: dict) -> bool:
    """Whether a record's engine kept a 1-byte KV cache."""
    from servebook.perf.work import kv_dtype_bytes

    return kv_dtype_bytes(_kv_dtype(doc)) == 1


def pairs(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(16-bit, fp8)`` records of the configs that were recorded with both KV dtypes."""
    shas = {d.get("config_sha256") for d in docs if is_fp8(d)} & {d.get("config_sha256") for d in docs if not is_fp8(d)}
    return ([d for d in docs if not is_fp8(d) and d.get("config_sha256") in shas],
            [d for d in docs if is_fp8(d) and d.get("config_sha256") in shas])


def fit_fp8_kv_eff(coeffs, docs: list[dict], gpu) -> tuple:
    """``coeffs`` with ``fp8_kv_bandwidth_eff`` fitted on ``docs`` (see the module docstring).

    ``docs``: ``servebook.e2e/1`` records; those of one config recorded with both KV dtypes are used.
    Returns ``(coefficients, report)``; raises ServebookError when no such pair exists.
    """
    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    auto_docs, fp8_docs = pairs(docs)
    if not auto_docs or not fp8_docs:
        raise ServebookError("the fp8 KV stage needs one model's records with kv_cache_dtype auto and fp8 "
                             f"(labs/tools/e2e_issue39.toml); got {[d['model_id'] for d in docs]}")
    base = replace(coeffs, fp8_kv_bandwidth_eff=1.0)
    full = [decode_steps(d, g, base) for d in auto_docs]
    fp8 = [decode_steps(d, g, base) for d in fp8_docs]
    target = measured_over_priced(full, base)
    before = measured_over_priced(fp8, base)
    lo, hi = BOUNDS
    if before <= target:  # an fp8 byte reads as fast as a 16-bit one
        eff = 1.0
    else:
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if measured_over_priced(fp8, replace(base, fp8_kv_bandwidth_eff=mid)) > target:
                hi = mid
            else:
                lo = mid
        eff = 0.5 * (lo + hi)
    fitted = replace(coeffs, fp8_kv_bandwidth_eff=eff)
    report = {"auto_ratio": target, "fp8_ratio_before": before, "fp8_ratio_after": measured_over_priced(fp8, fitted),
              "decode_steps": {"auto": sum(len(s) for _, s in full), "fp8": sum(len(s) for _, s in fp8)},
              "models": sorted({d["model_id"] for d in auto_docs + fp8_docs}), "fp8_kv_bandwidth_eff": eff}
    return fitted, report
