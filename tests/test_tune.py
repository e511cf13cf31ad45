"""The online latency model and the latency-target search (``servebook tune``), issue 37.

Checked against what must hold whatever the coefficients: arrivals at the rate asked, lengths in
the declared range, latencies that grow with load, the serving path added where it belongs, a pick
that is the cheapest (one replica fewer misses), a pick's serve line that names what changed, and
the binding target named when nothing meets. The H200 records are checked in test_serve_latency.py.
"""
from __future__ import annotations

import json
import shlex
import statistics

import pytest

from servebook.errors import ServebookError
from servebook.plan import make_plan
from servebook.simulator.online import OnlineWorkload, ServingPath, predict_latency
from servebook.simulator.tune import LatencyTargets, tune

LLAMA = "llama-3.1-8b"


def test_arrivals_come_at_the_rate_asked_and_lengths_stay_in_range():
    w = OnlineWorkload(8.0, 1000, 200, range_ratio=0.5, num_requests=400, seed=3)
    reqs = w.requests()
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    assert (len(reqs) - 1) / span == pytest.approx(8.0, rel=1e-9)
    assert min(r.prompt_tokens for r in reqs) >= 500 and max(r.prompt_tokens for r in reqs) <= 1500
    assert min(r.output_tokens for r in reqs) >= 100 and max(r.output_tokens for r in reqs) <= 300
    # uniform on [500, 1500]: the mean is near the middle, not at an end
    assert 900 < statistics.mean(r.prompt_tokens for r in reqs) < 1100


def test_burstier_arrivals_have_more_spread_gaps():
    def gap_cv(burstiness):
        reqs = OnlineWorkload(5.0, 100, 10, burstiness=burstiness, num_requests=2000).requests()
        gaps = [b.arrival_s - a.arrival_s for a, b in zip(reqs, reqs[1:])]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    assert gap_cv(1.0) == pytest.approx(1.0, abs=0.1)      # Poisson: exponential gaps
    assert gap_cv(0.25) > 1.6                                 # gamma shape 1/4: cv 2


@pytest.mark.parametrize("kwargs, phrase", [
    ({"rate_per_s": 0}, "--rate must be a positive"),
    ({"output_tokens": 1}, "--output-tokens must be >= 2"),
    ({"range_ratio": 1.0}, "--range-ratio must be in [0, 1)"),
    ({"prefix_tokens": 600}, "--prefix-tokens must be in [0, input tokens)"),
])
def test_bad_workloads_say_what_to_change(kwargs, phrase):
    args = {"rate_per_s": 1.0, "input_tokens": 500, "output_tokens": 10, **kwargs}
    with pytest.raises(ServebookError, match=phrase.replace("[", r"\[").replace(")", r"\)")):
        OnlineWorkload(**args)


@pytest.fixture(scope="module")
def llama_plan():
    return make_plan(LLAMA, gpu="h200", max_model_len=2048)


def test_latency_grows_with_load(llama_plan):
    none = ServingPath()
    light, heavy = (predict_latency(llama_plan, OnlineWorkload(r, 1024, 256, num_requests=300), serving_path=none)
                    for r in (2.0, 30.0))
    assert heavy.tpot_s[50] > 2 * light.tpot_s[50]
    assert heavy.ttft_s[90] > light.ttft_s[90]
    assert heavy.mean_running > 5 * light.mean_running
    assert not light.saturated


def test_a_replica_that_falls_behind_is_flagged(llama_plan):
    p = predict_latency(llama_plan, OnlineWorkload(200.0, 1024, 256, num_requests=600), serving_path=ServingPath())
    assert p.saturated
    assert p.ttft_s[90] > 2.0


def test_the_serving_path_adds_its_seconds_to_ttft_and_each_token(llama_plan):
    w = OnlineWorkload(4.0, 1024, 64, num_requests=200)
    base = predict_latency(llama_plan, w, serving_path=ServingPath())
    path = ServingPath(ttft_s=0.010, tpot_s=0.001)
    added = predict_latency(llama_plan, w, serving_path=path)
    for q in (50, 90, 99):
        assert added.ttft_s[q] - base.ttft_s[q] == pytest.approx(0.010, abs=1e-9)
        assert added.tpot_s[q] - base.tpot_s[q] == pytest.approx(0.001, abs=1e-9)
    with pytest.raises(ServebookError):
        ServingPath(ttft_s=-0.001)


def test_the_measured_serving_path_is_used_by_default(llama_plan):
    from servebook.simulator.online import measured_serving_path

    path = measured_serving_path("H200")
    assert path.ttft_s > 0
    w = OnlineWorkload(2.0, 512, 32, num_requests=100)
    gap = predict_latency(llama_plan, w).ttft_s[50] - predict_latency(llama_plan, w, serving_path=ServingPath()).ttft_s[50]
    assert gap == pytest.approx(path.ttft_s, abs=1e-9)


@pytest.fixture(scope="module")
def pick():
    w = OnlineWorkload(40.0, 1024, 256, range_ratio=0.5, duration_s=20)
    return tune(LLAMA, gpu="h200", max_gpus=4, workload=w, targets=LatencyTargets(ttft_s=0.5, tpot_s=0.030), tps=(1,))


def test_the_pick_meets_its_targets_with_the_allowance(pick):
    best = pick.best
    assert best is not None and best.meets
    q, f = pick.targets.percentile, pick.targets.factor
    assert best.prediction.ttft_s[q] * f <= 0.5 and best.prediction.tpot_s[q] * f <= 0.030
    assert best.prediction.rate_per_s == pytest.approx(40.0 / best.replicas)


def test_the_pick_is_the_cheapest(pick):
    """One replica fewer, whatever flags, misses a target (or the pick is already one GPU)."""
    best = pick.best
    fewer = [c for c in pick.tried if c.gpus == best.gpus - 1]
    assert best.gpus == 1 or (fewer and not any(c.meets for c in fewer))


def test_the_pick_serve_line_names_what_changed(pick):
    argv = shlex.split(pick.best.serve_command())
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    assert argv[argv.index("--max-model-len") + 1] == "2048"    # 1,536 + 384 tokens, rounded up to 1,024
    for flag in pick.best.changed_flags:
        assert "--" + flag.replace("_", "-") in argv


def test_the_frontier_is_not_dominated(pick):
    q = pick.targets.percentile
    front = pick.frontier()
    assert front
    for c in front:
        assert not any(o.output_tokens_per_s_per_gpu > c.output_tokens_per_s_per_gpu
                       and o.prediction.tpot_s[q] < c.prediction.tpot_s[q] for o in front)


def test_a_target_below_a_lone_request_binds_at_any_load():
    w = OnlineWorkload(1.0, 1024, 64, duration_s=10)
    r = tune(LLAMA, gpu="h200", max_gpus=1, workload=w, targets=LatencyTargets(tpot_s=0.001), tps=(1,))
    assert r.best is None
    assert "TPOT binds at any load" in r.binding and "faster GPU" in r.binding


def test_too_much_traffic_for_the_gpus_says_capacity_binds():
    w = OnlineWorkload(300.0, 1024, 256, duration_s=5)
    r = tune(LLAMA, gpu="h200", max_gpus=1, workload=w, targets=LatencyTargets(ttft_s=1.0, tpot_s=0.1), tps=(1,))
    assert r.best is None and r.binding.startswith("capacity binds")


def test_cli_json_carries_the_band_and_the_watch_list(capsys):
    from servebook.cli import main

    rc = main(["tune", "--config", LLAMA, "--gpu", "h200", "--gpus", "2", "--rate", "10", "--input-tokens", "512",
               "--output-tokens", "64", "--ttft-ms", "400", "--tpot-ms", "30", "--tp", "1", "--price-per-gpu-hour", "2",
               "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["best"]["gpus"] >= 1 and out["best"]["cost_per_million_output_tokens"] > 0
    assert set(out["error_band"]) == {"ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90"}
    assert {w["metric"] for w in out["watch"]} >= {"vllm:time_to_first_token_seconds", "vllm:num_requests_waiting"}
