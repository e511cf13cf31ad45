"""Recorded H200 start-ups (vLLM 0.26.0, labs/results/startup_logs/) against servebook.lab.recordings.startup_cases.

The comparison predicts each start-up from its config and engine arguments alone; the logged
``Model loading took``, ``Available KV cache memory`` and ``GPU KV cache size`` are the truth.
Issue 40's goal: KV tokens within 0.5% of the log, for 16-bit models as today and for the quantized
checkpoints and LoRA setting recorded by /work/notes/quant_gpu.md's command (AWQ int4, GPTQ int4,
FP8 weights, LoRA 4 x rank 64).
"""
from __future__ import annotations

import json
import re

import pytest

from servebook.hf_config import load_model_spec
from servebook.lab.recordings.startup_cases import compare_startup_case, dummy_load_artifact
from servebook.records import results_path

KV_TOKENS_TOLERANCE_PCT = 0.5
QUANT_CASES = ("llama-3.1-8b-awq-int4--eager", "llama-3.1-8b-gptq-int4--eager", "qwen3-32b-fp8--eager",
               "llama-3.1-8b--lora")


def _cases() -> dict[str, dict]:
    """Cases whose engine sized its KV cache (a case killed later, during its warm-up, counts), each
    with the file's GPU total."""
    out = {}
    for path in sorted(results_path("startup_logs").glob("h200-vllm0.26.0-*.json")):
        doc = json.loads(path.read_text())
        for case in doc["cases"]:
            if case.get("returncode") == 0 or "GPU KV cache size:" in (case.get("log") or ""):
                out[case["name"]] = dict(case, gpu_total_memory_bytes=doc["gpu"]["total_memory_bytes"])
    return out


def _compare(case: dict):
    return compare_startup_case(case, gpu_total_memory_bytes=case["gpu_total_memory_bytes"])


def test_the_comparison_reads_what_the_engine_printed_and_predicts_dense_16_bit_within_half_a_percent():
    cases = _cases()
    for name in ("llama-3.1-8b--util50", "llama-3.1-8b--fp8kv", "mistral-7b-v0.1--eager", "mistral-7b-v0.1--graphs"):
        c = _compare(cases[name])
        logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", cases[name]["log"]).group(1).replace(",", ""))
        assert c.logged_kv_tokens == logged
        assert abs(c.kv_tokens_error_pct) <= KV_TOKENS_TOLERANCE_PCT, (name, c.row())


MOE_CASES = ("qwen3-30b-a3b--eager16k", "qwen3-30b-a3b--eager16k-b4k", "gpt-oss-20b--eager16k",
             "gpt-oss-20b--eager16k-b4k", "deepseek-v2-lite--eager16k")


def test_moe_startups_within_half_a_percent_of_kv_tokens():
    """Issue 40's MoE budget: the V1 runner's sampler run and the persistent fused-MoE workspace
    (servebook.memory's docstring). Before they were modelled: Qwen3-30B-A3B +2.43% / +2.70%,
    gpt-oss-20b +0.91% / +2.05%. The *-b4k cases are held out of the shipped fit."""
    cases = _cases()
    rows = [_compare(cases[n]) for n in MOE_CASES]
    print("\n" + "\n".join(r.row() for r in rows))
    bad = [r.row() for r in rows if abs(r.kv_tokens_error_pct) > KV_TOKENS_TOLERANCE_PCT]
    assert not bad, bad


def test_quantized_and_lora_startups_within_half_a_percent_of_kv_tokens():
    cases = _cases()
    present = [n for n in QUANT_CASES if n in cases]
    if not present:
        pytest.skip("the issue-40 H200 start-ups (AWQ, GPTQ, FP8, LoRA) are not recorded yet: "
                    "see /work/notes/quant_gpu.md for the command")
    artifacts = {n: why for n in present if (why := dummy_load_artifact(cases[n]))}
    rows = [_compare(cases[n]) for n in present if n not in artifacts]
    print("\n" + "\n".join(r.row() for r in rows) + "".join(f"\n{n}: not compared ({w})" for n, w in artifacts.items()))
    bad = [r.row() for r in rows if abs(r.kv_tokens_error_pct) > KV_TOKENS_TOLERANCE_PCT]
    assert not bad, bad


def test_a_gptq_dummy_start_up_without_a_module_list_loads_16_bit_weights():
    """The artifact the comparison leaves out is real: the GPTQ case logged the 16-bit model's weights."""
    cases = _cases()
    if "llama-3.1-8b-gptq-int4--eager" not in cases or "llama-3.1-8b--lora" not in cases:
        pytest.skip("the issue-40 H200 start-ups are not recorded yet")
    gptq = cases["llama-3.1-8b-gptq-int4--eager"]
    assert dummy_load_artifact(gptq) is not None
    logged = _compare(gptq).logged_loading_bytes
    assert abs(logged - load_model_spec("llama-3.1-8b").weight_bytes) < 0.05 * 2**30
