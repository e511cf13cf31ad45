"""Golden outputs of the calculators a reader drives, to prove a rewrite changes no printed digit.

``python tests/golden_core.py`` runs every case below and writes their outputs (the CLI's stdout
as printed, and the ``repr`` of library results) to ``tests/fixtures/golden_core.json``, with the
commit the outputs came from. ``tests/test_golden_core.py`` re-runs the cases on the current code
and asserts the same text, character for character.

The fixture was first written at commit 516197f (numpy in every step-model, fleet, speculation
and simulator module), before those modules were made to run on the standard library alone, and
re-recorded from main's numpy code when main was merged into the numpy-free branch (the commit is
in the fixture's ``generated_at``).

To re-record it from another tree that still has the numpy code (e.g. main before the numpy-free
branch is merged), export that tree's ``src`` and point PYTHONPATH at it::

    mkdir /tmp/golden-src && git archive COMMIT src | tar -x -C /tmp/golden-src
    PYTHONPATH=/tmp/golden-src/src SERVEBOOK_GOLDEN_COMMIT=COMMIT python tests/golden_core.py
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURE = Path(__file__).parent / "fixtures" / "golden_core.json"

#: ``servebook`` command lines (argv after the program name); stdout is recorded as printed.
CLI_CASES: dict[str, list[str]] = {
    "plan llama 8b h200": ["plan", "--config", "llama-3.1-8b", "--json"],
    "plan llama 8b h200 text": ["plan", "--config", "llama-3.1-8b", "--max-model-len", "32768"],
    "plan llama 70b h100 tp4 fp8": ["plan", "--config", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4",
                                    "--kv-cache-dtype", "fp8", "--json"],
    "plan gemma-3-27b 16k": ["plan", "--config", "gemma-3-27b", "--max-model-len", "16384", "--json"],
    "plan gemma-4-26b-a4b 16k": ["plan", "--config", "gemma-4-26b-a4b", "--max-model-len", "16384", "--json"],
    "plan deepseek-v2-lite a100": ["plan", "--config", "deepseek-v2-lite", "--gpu", "a100", "--json"],
    "plan gpt-oss-20b l40s util": ["plan", "--config", "gpt-oss-20b", "--gpu", "l40s", "--max-model-len", "8192",
                                   "--gpu-memory-utilization", "0.85", "--json"],
    "step llama decode": ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "decode", "--batch", "64",
                          "--context", "2048", "--json"],
    "step llama prefill": ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "prefill", "--tokens",
                           "2048", "--prior-tokens", "1024", "--json"],
    "step qwen3-30b-a3b decode fp8": ["step", "--config", "qwen3-30b-a3b", "--gpu", "h200", "--phase", "decode",
                                      "--batch", "128", "--context", "4096", "--kv-cache-dtype", "fp8", "--json"],
    "step qwen3-30b-a3b prefill eager": ["step", "--config", "qwen3-30b-a3b", "--gpu", "h200", "--phase", "prefill",
                                         "--tokens", "4096", "--json"],
    "step llama 70b tp4 decode": ["step", "--config", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--phase",
                                  "decode", "--batch", "32", "--context", "8192", "--json"],
    "step gemma-3-27b decode": ["step", "--config", "gemma-3-27b", "--gpu", "h200", "--phase", "decode", "--batch",
                                "16", "--context", "12000", "--json"],
    "step deepseek-v2-lite decode text": ["step", "--config", "deepseek-v2-lite", "--gpu", "h200", "--phase",
                                          "decode", "--batch", "32", "--context", "1000"],
    "fleet llama 8b": ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--requests", "1000000",
                       "--input-tokens", "750", "--output-tokens", "260", "--json"],
    "fleet llama 8b text": ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--requests",
                            "1000000", "--input-tokens", "750", "--output-tokens", "260"],
    "fleet qwen3-30b cv": ["fleet", "--config", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "4", "--requests",
                           "500000", "--input-tokens", "2000", "--input-cv", "0.8", "--output-tokens", "500",
                           "--output-cv", "0.5", "--price-per-gpu-hour", "3.5", "--json"],
    "fleet gemma-3-27b tp2 fp8": ["fleet", "--config", "gemma-3-27b", "--gpu", "h100-sxm", "--gpus", "8", "--tp", "2",
                                  "--requests", "200000", "--input-tokens", "6000", "--output-tokens", "256",
                                  "--kv-cache-dtype", "fp8", "--json"],
    "fleet llama 70b tp4 batch": ["fleet", "--config", "llama-3.1-70b", "--gpu", "h200", "--gpus", "8", "--tp", "4",
                                  "--requests", "100000", "--input-tokens", "1000", "--output-tokens", "300",
                                  "--batch", "64", "--json"],
    "fleet llama 8b ngram spec": ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "1", "--requests",
                                  "10000", "--input-tokens", "500", "--output-tokens", "500", "--spec-k", "4",
                                  "--spec-alpha", "0.7", "--json"],
    "fleet llama 70b draft spec": ["fleet", "--config", "llama-3.1-70b", "--gpu", "h200", "--gpus", "4", "--tp", "2",
                                   "--requests", "10000", "--input-tokens", "500", "--output-tokens", "500",
                                   "--spec-k", "3", "--spec-alpha", "0.8", "--draft-config", "llama-3.1-8b", "--json"],
    "fleet gpt-oss-120b mla-free moe": ["fleet", "--config", "gpt-oss-120b", "--gpu", "h200", "--gpus", "2",
                                        "--requests", "50000", "--input-tokens", "3000", "--output-tokens", "1000",
                                        "--output-cv", "1.0", "--json"],
    "fleet deepseek-v2-lite mla": ["fleet", "--config", "deepseek-v2-lite", "--gpu", "h200", "--gpus", "1",
                                   "--requests", "20000", "--input-tokens", "800", "--output-tokens", "300", "--json"],
    "fleet compare-draft": ["fleet", "--compare-draft"],
    "fleet gemma-3-27b finite job": ["fleet", "--config", "gemma-3-27b", "--gpu", "h200", "--gpus", "1", "--requests",
                                     "600", "--input-tokens", "750", "--input-cv", "0.5", "--output-tokens", "260",
                                     "--output-cv", "0.5", "--max-num-seqs", "256", "--finite-job", "--json"],
    "simulate stand-in": ["simulate", "--requests", "400", "--json"],
    "simulate stand-in steps": ["simulate", "--requests", "20", "--json", "--steps"],
    "simulate stand-in text": ["simulate", "--requests", "300", "--rate", "5", "--lengths", "alpaca-like"],
    "simulate contiguous pow2": ["simulate", "--requests", "300", "--policy", "contiguous", "--reservation", "pow2",
                                 "--rate", "20", "--json"],
    "simulate static": ["simulate", "--requests", "200", "--policy", "static", "--json"],
    "simulate prefix": ["simulate", "--requests", "200", "--shared-prefix-tokens", "256", "--rate", "8",
                        "--long-prefill-token-threshold", "512", "--json"],
    "simulate perf llama": ["simulate", "--requests", "1500", "--config", "llama-3.1-8b", "--gpu", "h200", "--json"],
    "simulate perf qwen3 moe rate": ["simulate", "--requests", "500", "--config", "qwen3-30b-a3b", "--gpu", "h200",
                                     "--rate", "30", "--lengths", "long-context", "--json"],
    "simulate perf gemma tp2 fp8 steps": ["simulate", "--requests", "12", "--config", "gemma-3-27b", "--gpu",
                                          "h100-sxm", "--tp", "2", "--kv-cache-dtype", "fp8", "--json", "--steps"],
    "simulate perf llama text": ["simulate", "--requests", "300", "--config", "llama-3.1-8b", "--gpu", "h200",
                                 "--rate", "10"],
}


def _jsonable(x):
    """Library results as JSON-able values whose floats keep every digit (``repr``)."""
    if hasattr(x, "tolist"):  # a numpy array or scalar
        return _jsonable(x.tolist())
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return repr(float(x))
    if hasattr(x, "__dataclass_fields__"):
        from dataclasses import asdict

        return _jsonable(asdict(x))
    raise TypeError(f"cannot record {type(x)}")


def function_cases() -> dict:
    """Library calls a page or notebook makes, with their results."""
    from servebook import load_model_spec
    from servebook.perf import calibrated_coefficients, decode_step, prefill_step
    from servebook.perf import work as W
    from servebook.perf.chunk_budget import prefill_tokens_within, recommend_max_num_batched_tokens
    from servebook.perf.fleet import LengthDistribution, check_decode_fits, decode_batch_limit
    from servebook.perf.long_prompt import predict_long_prompt
    from servebook.perf.model import prefill_request_s, smoothmax
    from servebook.perf.roofline import attainable_flops, decode_intensity, prefill_intensity, ridge_batch
    from servebook.perf.speculative import (Drafter, acceptance_for_tokens_per_step, best_k, break_even_acceptance,
                                            expected_tokens_per_step, k_schedule, speculative_step)
    from servebook.simulator import synthetic_workload
    from servebook.simulator.sizing import SLO, replica_latency, size_for_slo

    llama, moe = load_model_spec("llama-3.1-8b"), load_model_spec("qwen3-30b-a3b")
    gemma, mla = load_model_spec("gemma-3-27b"), load_model_spec("deepseek-v2-lite")
    c, _ = calibrated_coefficients("h200")
    out = {
        "causal_keys": [W.causal_keys(p, n, w) for p, n, w in ((0, 4096, None), (1000, 512, 1024), (5, 3, 4))],
        "expected_distinct_experts": [W.expected_distinct_experts(moe, t) for t in (1, 2, 48, 4096)],
        "expert_weight_bytes_read": [W.expert_weight_bytes_read(moe, t, tp) for t, tp in ((1, 1), (256, 2))],
        "tokens_per_touched_expert": [W.tokens_per_touched_expert(moe, t) for t in (1, 64, 8192)],
        "allreduce_bytes": [W.allreduce_bytes(llama, 64, 2), W.allreduce_bytes(llama, 64, 1)],
        "kv_bytes_per_sequence": [W.kv_bytes_per_sequence(s, ctx, tp=tp, kv_cache_dtype=d, sliding_extra_tokens=e)
                                  for s, ctx, tp, d, e in ((llama, 4096, 1, "auto", 0), (gemma, 30000, 2, "fp8", 16),
                                                           (mla, 1234.5, 1, "auto", 0))],
        "decode_work": [W.decode_work(s, b, ctx, tp=tp, query_tokens=q)
                        for s, b, ctx, tp, q in ((llama, 64, 2048, 1, 1), (gemma, 7, 20000, 2, 3), (moe, 300, 10.5, 1, 1))],
        "decode_work_weighted": W.decode_work(gemma, 12.5, [100, 5000, 40000], context_weights=[1, 2, 3]),
        "prefill_work": [W.prefill_work(s, n, prior_tokens=p, tp=tp, last_chunk=last)
                         for s, n, p, tp, last in ((llama, 2048, 0, 1, True), (gemma, 8192, 4096, 2, False))],
        "smoothmax": [smoothmax(3.0, 4.0, 2.0), smoothmax(1e-3, 2e-3, 7.5)],
        "decode_step": [decode_step(s, g, c, batch=b, context_tokens=ctx, tp=tp, kv_cache_dtype=d, query_tokens=q)
                        for s, g, b, ctx, tp, d, q in ((llama, "h200", 1, 100, 1, "auto", 1),
                                                       (moe, "h200", 256, 3000, 2, "fp8", 1),
                                                       (mla, "h100-sxm", 32, 1000, 1, "auto", 4),
                                                       (gemma, "b200", 600, 8000, 4, "auto", 1))],
        "prefill_step": [prefill_step(s, g, c, tokens=n, prior_tokens=p, tp=tp)
                         for s, g, n, p, tp in ((llama, "h200", 16, 0, 1), (moe, "h200", 8192, 8192, 1),
                                                (gemma, "h100-sxm", 2048, 30000, 2))],
        "prefill_request_s": prefill_request_s(llama, "h200", c, prompt_tokens=20000, max_num_batched_tokens=8192),
        "expected_tokens_per_step": [expected_tokens_per_step(k, a) for k, a in ((4, 0.7), (3, 1.0), (0, 0.2),
                                                                                  (8, 0.0))],
        "expected_tokens_per_step_array": expected_tokens_per_step(3, [0.0, 0.5, 0.99, 1.0]),
        "acceptance_for_tokens_per_step": acceptance_for_tokens_per_step(2.5, 4),
        "speculative_step": speculative_step(load_model_spec("llama-3.1-70b"), "h200", c, k=3, alpha=0.8, batch=8,
                                             context_tokens=2000, drafter=Drafter("draft_model", llama), tp=2),
        "break_even_acceptance": [break_even_acceptance(llama, "h200", c, k=k, batch=b, context_tokens=1000)
                                  for k, b in ((2, 1), (4, 256))],
        "best_k": [best_k(llama, "h200", c, alpha=0.7, batch=b, context_tokens=1000) for b in (1, 64, 512)],
        "k_schedule": k_schedule(moe, "h200", c, alpha=0.75, context_tokens=2000, max_num_seqs=256,
                                 drafter=Drafter("eagle", llama)),
        "prefill_tokens_within": prefill_tokens_within(llama, "h200", c, target_step_s=0.05, decode_batch=64,
                                                       decode_context_tokens=2000),
        "recommend_max_num_batched_tokens": recommend_max_num_batched_tokens(
            moe, "h200", c, target_step_s=0.08, max_num_seqs=128, decode_context_tokens=3000),
        "predict_long_prompt": predict_long_prompt(gemma, "h200", c, prompt_tokens=30000, decode_batch=32,
                                                   decode_context_tokens=4000, max_num_batched_tokens=4096),
        "lognormal": LengthDistribution.lognormal(750, 0.5).samples[:5],
        "lognormal_mean_max": [LengthDistribution.lognormal(750, 0.5, max_tokens=1500).mean,
                               LengthDistribution.lognormal(750, 0.5).max],
        "decode_batch_limit": [decode_batch_limit(s, "h200", context_tokens=ctx, tp=tp)
                               for s, ctx, tp in ((llama, 5000, 1), (gemma, 20000, 2))],
        "check_decode_fits": check_decode_fits(llama, "h200", batch=10, context_tokens=10000),
        "decode_intensity": decode_intensity(moe, [1, 8, 64, 512], 2048),
        "prefill_intensity": prefill_intensity(llama, [128, 2048, 16384]),
        "attainable_flops": attainable_flops("h200", [1.0, 50.0, 1e4]),
        "ridge_batch": [ridge_batch(llama, "h200", 0), ridge_batch(moe, "h200", 2048)],
        "synthetic_workload": [(r.prompt_tokens, r.output_tokens, r.arrival_s)
                               for r in synthetic_workload(20, arrival_rate_per_s=3.0, seed=7)],
        "replica_latency": replica_latency("llama-3.1-8b", "h200", 1, 20.0, 1000, 200, max_requests=300),
    }
    best, options = size_for_slo("llama-3.1-8b", {"h200": 3.5, "h100-sxm": 2.5}, [1, 2], rate_per_s=15.0,
                                 input_tokens=1000, output_tokens=200, slo=SLO(p99_ttft_s=2.0, p99_tpot_s=0.05),
                                 max_replicas=3)
    out["size_for_slo"] = [best, options]
    return {k: _jsonable(v) for k, v in out.items()}


def cli_output(argv: list[str]) -> str:
    """What ``servebook ARGV`` prints on stdout (the exit status appended when it is not 0)."""
    from servebook.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(list(argv))
    return buf.getvalue() + (f"[exit {rc}]\n" if rc else "")


def record() -> dict:
    import servebook

    commit = os.environ.get("SERVEBOOK_GOLDEN_COMMIT")
    if not commit:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
        commit += " (src modified)" if dirty else ""
    print(f"recording the outputs of {servebook.__file__} as commit {commit}", file=sys.stderr)
    return {"generated_at": commit,
            "cli": {name: cli_output(argv) for name, argv in CLI_CASES.items()},
            "functions": function_cases()}


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
