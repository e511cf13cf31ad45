"""Discrete-event model of vLLM's scheduler: paged KV blocks, continuous batching,
chunked prefill, preemption by recompute and prefix caching — plus contiguous
worst-case reservation and static batching to compare against.

Public API::

    from servebook.simulator import (
        RequestSpec, synthetic_workload,          # workloads
        SchedulerConfig,                          # settings (vLLM engine-argument names)
        LinearStepTime, StepTimeModel,            # step cost: step_time_s(P, D, C) -> s
        simulate, SimulationResult,               # run; .steps, .requests, .summary()
    )
    PerfStepTime(spec, gpu, coeffs, tp=1)        # price steps with the calibrated servebook.perf model
    servebook.simulator.step_time.perf_step_time_for(config, gpu)   # the same, loaded by name
    servebook.simulator.plots                     # memory maps, block tables, Gantt, KV over time
    servebook.simulator.engine_trace              # record vLLM's own schedule; compare step by step
    servebook.simulator.sizing                    # replicas x TP for a p99 TTFT/TPOT SLO and a budget
    servebook.simulator.decode_lane               # how simulate() skips requests that only decode (same results)
"""
from servebook.simulator.config import POLICIES, RESERVATIONS, SchedulerConfig
from servebook.simulator.run import RequestMetrics, SimulationResult, StepTrace, simulate
from servebook.simulator.step_time import LinearStepTime, PerfStepTime, StepTimeModel
from servebook.simulator.workload import (LENGTH_PRESETS, RequestSpec, Truncation, synthetic_workload,
                                          synthetic_workload_with_truncation)

__all__ = [
    "LENGTH_PRESETS",
    "POLICIES",
    "RESERVATIONS",
    "LinearStepTime",
    "PerfStepTime",
    "RequestMetrics",
    "RequestSpec",
    "SchedulerConfig",
    "SimulationResult",
    "StepTimeModel",
    "StepTrace",
    "Truncation",
    "simulate",
    "synthetic_workload",
    "synthetic_workload_with_truncation",
]
