"""Performance model: step time of prefill and decode, calibrated on measured vLLM steps.

Modules:
    gpu          peak figures of a GPU (from the catalogue)
    work         bytes and FLOPs of a step, per GPU (physics, no efficiencies)
    model        step time = work over calibrated rates; loading the calibration
    calibrate    fit to labs/results/step_timing/*.json, held-out error
    roofline     arithmetic intensity vs batch (dense and MoE)
    chunk_budget prefill tokens that fit in a target step time
    speculative  expected tokens per step, costs, break-even, k schedules
    fleet        plans for a large batch job (replicas, hours, cost)
    error_bands  held-out error bands per regime (perf/data/error_bands.json) and what was never measured
"""
from servebook.perf.gpu import GPUNumbers, gpu_numbers
from servebook.perf.model import (
    Coefficients,
    StepBreakdown,
    calibrated_coefficients,
    cudagraph_max_tokens,
    decode_step,
    load_calibration,
    prefill_request_s,
    prefill_step,
    step_time,
)
from servebook.perf.work import Work, check_tp, decode_work, expected_distinct_experts, prefill_work

__all__ = [
    "Coefficients", "GPUNumbers", "StepBreakdown", "Work", "calibrated_coefficients", "check_tp", "cudagraph_max_tokens",
    "decode_step", "decode_work", "expected_distinct_experts", "gpu_numbers", "load_calibration",
    "prefill_request_s", "prefill_step", "prefill_work", "step_time",
]
