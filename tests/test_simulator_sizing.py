"""Sizing an online deployment for an SLO: one replica simulated with calibrated step times."""
import math

import numpy as np
import pytest

from servebook.errors import ServebookError
from servebook.hf_config import load_model_spec
from servebook.perf import calibrated_coefficients, decode_step, gpu_numbers, prefill_work, step_time
from servebook.simulator.sizing import SLO, poisson_requests, replica_latency, size_candidate, size_for_slo


def test_poisson_arrivals_have_the_requested_rate():
    reqs = poisson_requests(4.0, 4000, 100, 10, seed=1)
    arrivals = np.array([r.arrival_s for r in reqs])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert len(reqs) / arrivals[-1] == pytest.approx(4.0, rel=0.05)
    with pytest.raises(ServebookError, match="positive"):
        poisson_requests(0.0, 10, 100, 10)


def test_a_lone_request_sees_the_perf_models_prefill_and_batch_one_decode():
    # At 0.01 requests/s requests never overlap: TTFT is one prefill step, TPOT the mean batch-1 decode step.
    lat = replica_latency("llama-3.1-8b", "h200", 1, 0.01, 100, 4, min_requests=5, duration_s=1.0)
    spec, gpu = load_model_spec("llama-3.1-8b"), gpu_numbers("h200")
    coeffs, _ = calibrated_coefficients(gpu.name)
    # vLLM's serve defaults on an H200 (1,024 sequences, 8,192 tokens) put 100-token steps in a CUDA graph.
    prefill = step_time(spec, gpu, prefill_work(spec, 100), coeffs, cudagraph_max_tokens=512).step_s
    tpot = np.mean([decode_step(spec, gpu, coeffs, batch=1, context_tokens=100 + i).step_s for i in range(3)])
    assert lat.p99_ttft_s == pytest.approx(prefill, rel=1e-9)
    assert lat.p99_tpot_s == pytest.approx(tpot, rel=1e-9)
    assert lat.preemptions == 0 and lat.max_num_seqs == 1024


def test_more_load_per_replica_means_worse_latency():
    light = replica_latency("llama-3.1-8b", "h200", 1, 2.0, 1024, 128, duration_s=30.0)
    heavy = replica_latency("llama-3.1-8b", "h200", 1, 30.0, 1024, 128, duration_s=30.0)
    assert heavy.p99_tpot_s > light.p99_tpot_s and heavy.p99_ttft_s > light.p99_ttft_s
    assert heavy.output_tokens_per_s > light.output_tokens_per_s


def test_candidates_say_why_they_fail():
    kw = dict(rate_per_s=2.0, input_tokens=1024, output_tokens=128)
    # A TPOT target below what one request alone achieves: no replica count helps.
    o = size_candidate("qwen3-32b", "h200", 1, 3.5, slo=SLO(2.0, 0.001), **kw)
    assert not o.feasible and "lone request" in o.reason and "TP" in o.reason
    # A budget below one GPU-hour.
    o = size_candidate("llama-3.1-8b", "h200", 1, 3.5, slo=SLO(2.0, 0.05), budget_per_hour=1.0, **kw)
    assert not o.feasible and "budget" in o.reason
    # A model that does not fit the GPU at TP 1.
    o = size_candidate("llama-3.1-70b", "h100", 1, 2.5, slo=SLO(2.0, 0.05), **kw)
    assert not o.feasible and "does not fit" in o.reason
    with pytest.raises(ServebookError, match="> 0 seconds"):
        SLO(0.0, 0.05)


def test_cheapest_option_wins_and_cost_is_gpus_times_price():
    best, options = size_for_slo("llama-3.1-8b", {"h100": 2.5, "h200": 3.5}, [1, 2], rate_per_s=4.0,
                                 input_tokens=1024, output_tokens=128, slo=SLO(1.0, 0.05))
    feasible = [o for o in options if o.feasible]
    assert len(options) == 4 and best in feasible
    assert best.cost_per_hour == min(o.cost_per_hour for o in feasible)
    for o in feasible:
        price = {"h100": 2.5, "h200": 3.5}[o.gpu]
        assert math.isclose(o.cost_per_hour, o.replicas * o.tp * price)
        assert o.latency.p99_tpot_s <= 0.05 and o.latency.p99_ttft_s <= 1.0
