"""The sizing worksheet (servebook.simulator.worksheet): each stage is the library's own figure for
that stage. That the chapter's worked example is the deployment `servebook tune` picks is asserted
by page 6.20, which runs the search (the book build and tests/test_book_claims.py execute it)."""
from __future__ import annotations

import pytest

from servebook.errors import ServebookError
from servebook.plan import make_plan
from servebook.simulator.online import OnlineWorkload, predict_latency
from servebook.simulator.tune import default_max_model_len
from servebook.simulator.worksheet import worksheet


@pytest.fixture(scope="module")
def small():
    return worksheet("llama-3.1-8b", gpu="H200", tp=1, replicas=2, rate_per_s=6.0, prompt_tokens=1000,
                     output_tokens=200, price_per_gpu_hour=2.0)


def test_stages_are_the_plan_and_the_latency_model(small):
    w = small
    workload = OnlineWorkload(6.0, 1000, 200)
    plan = make_plan("llama-3.1-8b", gpu="H200", max_model_len=default_max_model_len(workload), usage_context="serve")
    assert w.kv_tokens == plan.capacity.kv_cache_tokens
    assert w.full_length_running == plan.running.max_running
    pred = predict_latency(plan, workload, replicas=2)
    assert w.tpot_s[90] == pytest.approx(pred.tpot_s[90])
    assert w.running_at_rate == pytest.approx(pred.mean_running)
    # the budget adds up: what the four claims leave is the KV cache
    gib = w.weights_gib + w.activation_gib + w.non_torch_gib + w.cudagraph_gib + w.kv_gib
    assert gib == pytest.approx(plan.budget.requested_bytes / 2**30, rel=1e-9)


def test_a_step_with_a_prefill_chunk_costs_more_than_the_decode_step_alone(small):
    assert small.prefill_chunk_tokens == 1000   # the whole prompt fits beside the decodes
    assert small.mixed_step_s > small.decode_step_s > 0


def test_cost_follows_the_gpus_and_the_tokens(small):
    w = small
    assert w.gpus == 2 and w.cost_per_hour == pytest.approx(4.0)
    # two GPUs for an hour, over the tokens both emit in that hour, per million
    per_million = 4.0 / (w.output_tokens_per_s_per_gpu * 2 * 3600) * 1e6
    assert w.cost_per_million_output_tokens == pytest.approx(per_million)
    assert [r[0] for r in w.rows()][-1] == "6. cost"


def test_a_negative_price_is_refused():
    with pytest.raises(ServebookError, match="price per GPU-hour"):
        worksheet("llama-3.1-8b", gpu="H200", tp=1, replicas=1, rate_per_s=1.0, prompt_tokens=100,
                  output_tokens=10, price_per_gpu_hour=-1.0)


def test_the_worked_example_is_what_tune_picks():
    """6.20 shows the worked example as the pick of its latency-target search: the layout named in
    data/worked_example.toml must be the one servebook tune picks for that workload and those targets."""
    from servebook.simulator.tune import LatencyTargets, tune
    from servebook.simulator.worksheet import example_parameters, worked_example

    p = example_parameters()
    workload = OnlineWorkload(p["rate_per_s"], p["prompt_tokens"], p["output_tokens"], range_ratio=p["range_ratio"])
    result = tune(p["model"], gpu=p["gpu"], max_gpus=p["max_gpus"], workload=workload,
                  targets=LatencyTargets(ttft_s=p["ttft_target_s"], tpot_s=p["tpot_target_s"],
                                         percentile=p["percentile"]))
    best = result.best
    assert best is not None and best.changed_flags == ()
    assert (best.plan.tp, best.replicas, best.plan.kv_cache_dtype) == (p["tp"], p["replicas"], p["kv_cache_dtype"])
    w = worked_example()
    assert w.tpot_s[90] == pytest.approx(best.prediction.tpot_s[90])
    assert w.output_tokens_per_s_per_gpu == pytest.approx(best.output_tokens_per_s_per_gpu)
    assert w.serve_command == best.serve_command()
