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
    ({"prefix_tokens": 500}, "so it must be shorter"),
    ({"prefix_tokens": 100, "prefix_share": 1.5}, "--prefix-share must be a fraction of requests in [0, 1]"),
    ({"prefix_tokens": 100, "prefix_share": -0.1}, "--prefix-share must be a fraction of requests in [0, 1]"),
    ({"prefix_tokens": 100, "prefix_share": float("nan")}, "--prefix-share must be a fraction"),
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


# -- prefix caching and speculative decoding in the search ------------------------------------------

def test_the_prefix_share_picks_that_many_carriers_spread_over_the_arrivals():
    reqs = OnlineWorkload(5.0, 1000, 50, prefix_tokens=300, prefix_share=0.25, num_requests=400).requests()
    carriers = [i for i, r in enumerate(reqs) if r.prefix_id is not None]
    assert len(carriers) == 100
    assert all(reqs[i].prefix_tokens == 300 for i in carriers)
    assert all(r.prefix_tokens == 0 for r in reqs if r.prefix_id is None)
    assert max(b - a for a, b in zip(carriers, carriers[1:])) == 4     # one in four, evenly
    # the share does not move arrivals or lengths (the same draws, only the prefix differs)
    plain = OnlineWorkload(5.0, 1000, 50, range_ratio=0.3, num_requests=400).requests()
    shared = OnlineWorkload(5.0, 1000, 50, range_ratio=0.3, prefix_tokens=300, prefix_share=0.0,
                            num_requests=400).requests()
    assert plain == shared


PREFIX_TARGETS = LatencyTargets(ttft_s=0.5, tpot_s=0.030)


def _prefix_tune(**kw):
    w = OnlineWorkload(30.0, 3072, 256, range_ratio=0.25, duration_s=15, **kw)
    return tune(LLAMA, gpu="h200", max_gpus=4, workload=w, targets=PREFIX_TARGETS, tps=(1,),
                kv_cache_dtypes=("auto",), speculative="ngram:k=4,alpha=0.0")


@pytest.fixture(scope="module")
def no_prefix():
    return _prefix_tune()


@pytest.fixture(scope="module")
def big_prefix():
    return _prefix_tune(prefix_tokens=2048, prefix_share=0.9)


def test_a_prefix_share_of_zero_searches_as_without_a_prefix(no_prefix):
    zero = _prefix_tune(prefix_tokens=2048, prefix_share=0.0)
    assert [c.to_dict() for c in zero.tried] == [c.to_dict() for c in no_prefix.tried]
    assert zero.best.to_dict() == no_prefix.best.to_dict()
    assert not any("prefix caching" in n for n in zero.notes)


def test_a_large_shared_prefix_makes_the_pick_faster_or_cheaper(no_prefix, big_prefix):
    a, b = no_prefix.best, big_prefix.best
    assert a is not None and b is not None
    q = PREFIX_TARGETS.percentile
    assert b.gpus < a.gpus or (b.gpus == a.gpus and b.prediction.ttft_s[q] < a.prediction.ttft_s[q])
    # the hits are the prefix's whole 16-token blocks on 90% of prompts of ~3,072 tokens
    assert 0.9 * 2048 / 3072 * 0.9 < b.prediction.prefix_hit_share <= 0.9 * 2048 / 3072 * 1.01
    assert no_prefix.best.prediction.prefix_hit_share == 0


def test_prefix_caching_off_is_tried_and_loses_its_hits(big_prefix):
    best = big_prefix.best
    assert best.prefix_caching and "enable-prefix-caching" not in best.serve_command()   # vLLM's default: on
    off = [c for c in big_prefix.tried if not c.prefix_caching and c.gpus == best.gpus and not c.changed_flags]
    assert off, "the pick with prefix caching off was not simulated"
    q = PREFIX_TARGETS.percentile
    assert off[0].prediction.prefix_hit_share == 0
    assert off[0].prediction.ttft_s[q] > best.prediction.ttft_s[q]
    assert shlex.split(off[0].serve_command())[-1] == "--no-enable-prefix-caching"
    assert any(n.startswith("prefix caching: a 2,048-token shared prefix on 90% of requests") for n in big_prefix.notes)


def test_speculation_at_no_acceptance_is_never_picked_and_says_why(no_prefix, big_prefix):
    for r in (no_prefix, big_prefix):
        assert "--speculative-config" not in r.best.serve_command()
        note = next(n for n in r.notes if n.startswith("speculative decoding"))
        assert "is not searched" in note and "it would slow decoding" in note
        assert "turns async scheduling off" in note       # ngram, by vLLM 0.32.0's rule


def test_speculation_that_accepts_most_drafts_would_pay_on_a_small_batch(pick):
    from servebook.perf.speculative import SpeculativeAsk
    from servebook.simulator.tune import speculation_note

    assert "it would pay" in speculation_note(pick.best, SpeculativeAsk("ngram", 4, 0.9), pick.workload)
    assert "it would slow decoding" in speculation_note(pick.best, SpeculativeAsk("ngram", 4, 0.0), pick.workload)


@pytest.mark.parametrize("text, phrase", [
    ("ngram:k=0,alpha=0.6", "k >= 1"),
    ("ngram:k=4,alpha=1.5", "alpha is a per-token acceptance probability in [0, 1]"),
    ("ngram:k=4", "needs both k and alpha"),
    ("medusa:k=4,alpha=0.5", "is not priced here"),
    ("draft_model:k=3,alpha=0.7", "needs model=REF"),
    ("ngram:k=four,alpha=0.5", "k is a whole number"),
])
def test_bad_speculation_says_what_to_write(text, phrase):
    from servebook.perf.speculative import parse_speculative

    with pytest.raises(ServebookError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        parse_speculative(text)


def test_cli_bad_prefix_share_is_a_clear_error(capsys):
    from servebook.cli import main

    rc = main(["tune", "--config", LLAMA, "--gpu", "h200", "--gpus", "1", "--rate", "1", "--input-tokens", "512",
               "--output-tokens", "64", "--ttft-ms", "400", "--prefix-tokens", "100", "--prefix-share", "2"])
    err = capsys.readouterr().err
    assert rc != 0 and "--prefix-share must be a fraction of requests in [0, 1], got 2" in err
    assert "Traceback" not in err


def test_a_sliding_window_model_says_its_hits_are_not_simulated():
    w = OnlineWorkload(2.0, 1024, 64, prefix_tokens=512, prefix_share=0.5, duration_s=10)
    r = tune("gemma-3-27b", gpu="h200", max_gpus=1, workload=w, targets=LatencyTargets(ttft_s=2.0, tpot_s=0.1),
             tps=(1,), kv_cache_dtypes=("auto",))
    assert r.best is not None and r.best.prefix_caching          # vLLM 0.32.0 caches prefixes here too
    assert r.best.prediction.prefix_hit_share == 0               # ... but the simulator prices every prompt token
    assert "--no-enable-prefix-caching" not in r.best.serve_command()
    assert any("does not model hits in sliding-window KV groups" in n for n in r.notes)


def test_a_draft_model_as_large_as_the_target_never_pays(pick):
    """k passes of an 8B draft cost about k plain steps: 2.3 tokens per step at alpha 0.6 cannot pay for them."""
    from servebook.perf.speculative import SpeculativeAsk
    from servebook.simulator.tune import speculation_note

    note = speculation_note(pick.best, SpeculativeAsk("draft_model", 4, 0.6, LLAMA), pick.workload)
    assert "it would slow decoding" in note and "draft llama-3.1-8b" in note
    assert "async scheduling off" not in note          # draft_model keeps it on in vLLM 0.32.0


def test_an_unknown_draft_model_fails_before_the_search():
    w = OnlineWorkload(1.0, 512, 64)
    with pytest.raises(ServebookError, match="neither a file"):
        tune(LLAMA, gpu="h200", max_gpus=1, workload=w, targets=LatencyTargets(ttft_s=1.0), tps=(1,),
             speculative="draft_model:k=3,alpha=0.7,model=no-such-draft")


def test_a_narrower_grid_tries_only_its_flags_and_a_path_names_a_config():
    """tune(..., max_num_seqs_choices=..., max_num_batched_tokens_choices=...) prices exactly the grid a
    measured sweep runs (issue 37's comparison), and a config.json given as a Path reads like its text."""
    from pathlib import Path

    from servebook.shipped import MODELS_DIR

    w = OnlineWorkload(24, 1024, 256, range_ratio=0.5, num_requests=120)
    # a target no default meets at one replica, so the search must try the other flags
    r = tune(Path(MODELS_DIR) / "mistral-7b-v0.1.json", gpu="h200", max_gpus=1, workload=w,
             targets=LatencyTargets(1.0, 0.015, percentile=50), tps=(1,), kv_cache_dtypes=("auto",),
             max_model_len=2048, max_num_seqs_choices=(None, 128), max_num_batched_tokens_choices=(None,))
    tried = {(c.plan.max_num_seqs, c.plan.max_num_batched_tokens) for c in r.tried}
    default = next(c.plan for c in r.tried if not c.changed_flags)
    assert tried <= {(default.max_num_seqs, default.max_num_batched_tokens), (128, default.max_num_batched_tokens)}
    assert all(set(c.changed_flags) <= {"max_num_seqs"} for c in r.tried)
    assert (128, default.max_num_batched_tokens) in tried   # the default missed TPOT: the grid's other point was priced


def test_a_grid_must_start_with_the_default():
    w = OnlineWorkload(4, 512, 64, num_requests=50)
    with pytest.raises(ServebookError, match="start with None"):
        tune("llama-3.1-8b", gpu="h200", max_gpus=1, workload=w, targets=LatencyTargets(1.0, 0.05),
             max_num_seqs_choices=(128,))
