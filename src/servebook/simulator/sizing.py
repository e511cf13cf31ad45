"""Size an online deployment for a latency SLO and a budget, by simulating one replica.

Replicas behind a load balancer are independent: ``R`` replicas serving ``rate``
requests/s each see Poisson arrivals at ``rate / R``. :func:`replica_latency` runs
one replica through the scheduler simulator (:mod:`servebook.simulator`) with
vLLM 0.27.1's ``vllm serve`` batch defaults for the GPU, a KV pool sized by the
memory model (``servebook plan``) and steps priced by the calibrated performance
model (:class:`~servebook.simulator.step_time.PerfStepTime`), and reports the p99
TTFT and p99 TPOT over the requests, defined as ``vllm bench serve`` defines them
(TPOT of a request = (latency - TTFT) / (output tokens - 1)).

:func:`size_for_slo` tries each (GPU, TP) candidate with 1, 2, 3 ... replicas until
one meets the SLO (or the next would exceed the budget), and returns every
candidate's outcome with the cheapest that meets both. Prices are inputs (currency
units per GPU-hour): they change by provider and month, so the library holds none.

Times are per the calibrated model (see ``servebook step``); a GPU that was never
measured uses the measured GPU's efficiencies with its own peak figures, and the
result's ``note`` says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from servebook.errors import ServebookError
from servebook.kv_cache import usable_kv_blocks
from servebook.reductions import percentile, require_numpy
from servebook.simulator.run import simulate
from servebook.simulator.workload import RequestSpec


@dataclass(frozen=True)
class SLO:
    """Latency targets, seconds: p99 time to first token and p99 time per output token."""

    p99_ttft_s: float
    p99_tpot_s: float

    def __post_init__(self) -> None:
        if not (self.p99_ttft_s > 0 and self.p99_tpot_s > 0):
            raise ServebookError("SLO targets must be > 0 seconds (p99 TTFT and p99 TPOT)")


@dataclass(frozen=True)
class ReplicaLatency:
    """What one replica achieves at a given arrival rate (seconds, tokens/s)."""

    rate_per_s: float
    p99_ttft_s: float
    p99_tpot_s: float
    output_tokens_per_s: float
    preemptions: int
    num_blocks: int
    max_num_seqs: int
    note: str


@dataclass(frozen=True)
class Option:
    """One (GPU, TP) candidate: the fewest replicas that meet the SLO, or why none does.

    ``replicas`` is 0 when no replica count within the budget (or ``max_replicas``)
    meets the SLO; ``reason`` then says what failed. ``cost_per_hour`` =
    replicas x TP x price per GPU-hour.
    """

    gpu: str
    tp: int
    replicas: int
    gpus: int
    cost_per_hour: float
    latency: ReplicaLatency | None
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.replicas > 0


def poisson_requests(rate_per_s: float, num_requests: int, input_tokens: int, output_tokens: int,
                     seed: int = 0) -> list[RequestSpec]:
    """``num_requests`` requests of fixed lengths with Poisson arrivals at ``rate_per_s``.

    The arrival times are numpy's random draws (``default_rng(seed)``): this needs numpy.
    """
    if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
        raise ServebookError(f"arrival rate must be a positive number of requests/s, got {rate_per_s}")
    np = require_numpy("poisson_requests (numpy's random generator draws the arrivals)")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=num_requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [RequestSpec(f"r{i}", input_tokens, output_tokens, float(t)) for i, t in enumerate(arrivals)]


def planned_num_blocks(model: str, gpu: str, *, tp: int = 1, max_model_len: int | None = None,
                       kv_cache_dtype: str = "auto", block_size: int | None = None,
                       max_num_batched_tokens: int | None = None,
                       gpu_memory_utilization: float | None = None) -> int:
    """Usable KV blocks (count) vLLM would allocate for ``model`` on ``gpu``, per the memory model.

    The plan's GPU blocks (:func:`servebook.plan.make_plan`) less vLLM's null block.
    """
    from servebook.plan import make_plan

    extra = {} if gpu_memory_utilization is None else {"gpu_memory_utilization": gpu_memory_utilization}
    plan = make_plan(model, gpu=gpu, tp=tp, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                     block_size=block_size, max_num_batched_tokens=max_num_batched_tokens, **extra)
    return usable_kv_blocks(plan.capacity.num_gpu_blocks)


@lru_cache(maxsize=64)
def _replica_setup(model: str, gpu: str, tp: int, max_model_len: int, kv_cache_dtype: str):
    """KV pool, vLLM batch defaults and step-time model of one replica (cached: loading is the slow part)."""
    from servebook.plan import make_plan
    from servebook.simulator.step_time import perf_step_time_for

    from servebook.simulator.config import scheduler_config

    plan = make_plan(model, gpu=gpu, tp=tp, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype)
    step, where = perf_step_time_for(model, gpu, tp=tp, kv_cache_dtype=kv_cache_dtype,
                                     max_num_seqs=plan.max_num_seqs,
                                     max_num_batched_tokens=plan.max_num_batched_tokens)
    return scheduler_config(plan), step, where


@lru_cache(maxsize=256)
def replica_latency(model: str, gpu: str, tp: int, rate_per_s: float, input_tokens: int, output_tokens: int, *,
                    kv_cache_dtype: str = "auto", duration_s: float = 60.0, min_requests: int = 200,
                    max_requests: int = 1500, seed: int = 0) -> ReplicaLatency:
    """p99 TTFT and TPOT of one replica fed Poisson arrivals at ``rate_per_s`` (seconds).

    The run covers ``duration_s`` seconds of arrivals (between ``min_requests`` and
    ``max_requests`` requests). A replica that cannot keep up shows it as a TTFT that
    grows with the run; the p99 then exceeds any sensible target.
    """
    if output_tokens < 2:
        raise ServebookError("TPOT needs at least 2 output tokens per request")
    max_model_len = input_tokens + output_tokens
    config, step, where = _replica_setup(model, gpu, tp, max_model_len, kv_cache_dtype)
    n = int(min(max_requests, max(min_requests, math.ceil(rate_per_s * duration_s))))
    result = simulate(poisson_requests(rate_per_s, n, input_tokens, output_tokens, seed), config, step)
    ttft = [r.ttft_s for r in result.requests]
    tpot = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in result.requests]
    s = result.summary()
    return ReplicaLatency(rate_per_s=rate_per_s, p99_ttft_s=percentile(ttft, 99),
                          p99_tpot_s=percentile(tpot, 99), output_tokens_per_s=s["output_tokens_per_s"],
                          preemptions=result.num_preemptions, num_blocks=config.num_blocks,
                          max_num_seqs=config.max_num_seqs, note=where)


def size_candidate(model: str, gpu: str, tp: int, price_per_gpu_hour: float, *, rate_per_s: float,
                   input_tokens: int, output_tokens: int, slo: SLO, budget_per_hour: float = math.inf,
                   max_replicas: int = 64, kv_cache_dtype: str = "auto") -> Option:
    """Fewest replicas of ``model`` on ``gpu`` at ``tp`` meeting ``slo`` within the budget."""
    if price_per_gpu_hour < 0:
        raise ServebookError(f"price per GPU-hour must be >= 0, got {price_per_gpu_hour}")
    try:
        config, step, _ = _replica_setup(model, gpu, tp, input_tokens + output_tokens, kv_cache_dtype)
    except ServebookError as exc:
        return Option(gpu, tp, 0, 0, 0.0, None, f"does not fit: {exc}")
    # Floors no replica count can beat: one request alone (its prefill; a batch-1 decode step).
    alone_tpot = step.step_s([], [input_tokens])
    if alone_tpot > slo.p99_tpot_s:
        return Option(gpu, tp, 0, 0, 0.0, None, f"a lone request already decodes at {alone_tpot * 1e3:.1f} ms "
                      f"per token, above the {slo.p99_tpot_s * 1e3:.0f} ms target; use a higher TP or a faster GPU")
    last = None
    for replicas in range(1, max_replicas + 1):
        cost = replicas * tp * price_per_gpu_hour
        if cost > budget_per_hour:
            why = f"{replicas} replicas would cost {cost:.2f}/h, over the budget {budget_per_hour:.2f}/h"
            return Option(gpu, tp, 0, 0, 0.0, last, why)
        last = replica_latency(model, gpu, tp, rate_per_s / replicas, input_tokens, output_tokens,
                               kv_cache_dtype=kv_cache_dtype)
        if last.p99_ttft_s <= slo.p99_ttft_s and last.p99_tpot_s <= slo.p99_tpot_s:
            return Option(gpu, tp, replicas, replicas * tp, cost, last)
    return Option(gpu, tp, 0, 0, 0.0, last, f"no replica count up to {max_replicas} meets the SLO")


def size_for_slo(model: str, prices_per_gpu_hour: dict[str, float], tps: list[int], *, rate_per_s: float,
                 input_tokens: int, output_tokens: int, slo: SLO, budget_per_hour: float = math.inf,
                 max_replicas: int = 64, kv_cache_dtype: str = "auto") -> tuple[Option | None, list[Option]]:
    """Every (GPU, TP) candidate's outcome, and the cheapest feasible one (None if none is).

    Ties in cost go to fewer GPUs, then to the lower p99 TPOT.
    """
    if not prices_per_gpu_hour or not tps:
        raise ServebookError("give at least one GPU with its price and one TP size")
    options = [size_candidate(model, gpu, tp, price, rate_per_s=rate_per_s, input_tokens=input_tokens,
                              output_tokens=output_tokens, slo=slo, budget_per_hour=budget_per_hour,
                              max_replicas=max_replicas, kv_cache_dtype=kv_cache_dtype)
               for gpu, price in prices_per_gpu_hour.items() for tp in tps]
    feasible = [o for o in options if o.feasible]
    best = min(feasible, key=lambda o: (o.cost_per_hour, o.gpus, o.latency.p99_tpot_s)) if feasible else None
    return best, options
