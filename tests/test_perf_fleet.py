"""Fleet plans: hand-checked occupancy, KV bounds, scaling, the draft's table, bad input."""
import pytest

from perf_fixtures import H200, KNOWN, LLAMA_8B, spec
from servebook.errors import DoesNotFitError, ServebookError
from servebook.perf.chunk_budget import mixed_step_s, prefill_tokens_within, recommend_max_num_batched_tokens
from servebook.draft.fleet import draft_estimate
from servebook.perf.fleet import Deployment, LengthDistribution, Speculation, Workload, check_decode_fits, plan
from servebook.perf.work import kv_bytes_per_sequence

LLAMA = spec(LLAMA_8B, "llama-3.1-8b")
KV_PER_TOKEN = 131072  # 32 layers x 8 heads x 256 x 2 B


def _job(n_in=(1000,), n_out=(100, 300), requests=1_000_000):
    return Workload(requests, LengthDistribution.from_samples(n_in), LengthDistribution.from_samples(n_out))


def test_time_weighted_context_by_hand():
    # outputs 100 and 300 after a 1000-token prompt: E[o (i + o/2)] / E[o] = (100*1050 + 300*1150) / 400
    p = plan(_job(), Deployment.of(LLAMA, gpu=H200, gpus=1, name="x", kv_budget_bytes_per_gpu=50 * 2**30, max_num_batched_tokens=8192), KNOWN)
    assert p.mean_running_context_tokens == pytest.approx((100 * 1050 + 300 * 1150) / 400)


def test_batch_bounded_by_kv_budget_by_hand():
    budget = 10 * 2**30
    p = plan(_job(n_out=(200,)), Deployment.of(LLAMA, gpu=H200, gpus=1, name="x", kv_budget_bytes_per_gpu=budget, max_num_batched_tokens=8192), KNOWN)
    assert p.batch == int(budget // (1100 * KV_PER_TOKEN)) == p.batch_kv_bound


def test_batch_beyond_kv_capacity_is_refused_with_the_bound():
    with pytest.raises(DoesNotFitError, match="at most 74 sequences fit"):
        plan(_job(n_out=(200,)), Deployment.of(LLAMA, gpu=H200, gpus=1, name="x", batch=500, kv_budget_bytes_per_gpu=10 * 2**30, max_num_batched_tokens=8192),
             KNOWN)


def test_gpus_must_split_into_replicas():
    with pytest.raises(ServebookError, match="multiple of 4"):
        plan(_job(), Deployment.of(LLAMA, gpu=H200, gpus=6, name="x", tp=4, kv_budget_bytes_per_gpu=2**34, max_num_batched_tokens=8192), KNOWN)


def test_replicas_scale_exactly():
    a = plan(_job(), Deployment.of(LLAMA, gpu=H200, gpus=1, name="a", kv_budget_bytes_per_gpu=2**34, max_num_batched_tokens=8192), KNOWN)
    b = plan(_job(), Deployment.of(LLAMA, gpu=H200, gpus=16, name="b", kv_budget_bytes_per_gpu=2**34, max_num_batched_tokens=8192), KNOWN)
    assert a.hours / b.hours == pytest.approx(16)
    assert a.gpu_hours == pytest.approx(b.gpu_hours)


def test_hours_are_steps_times_step_time():
    p = plan(_job(n_out=(200,)), Deployment.of(LLAMA, gpu=H200, gpus=2, name="x", batch=32, kv_budget_bytes_per_gpu=2**34,
                                            price_per_gpu_hour=2.0, max_num_batched_tokens=8192), KNOWN)
    # 32 sequences x 1 token per step / 200 tokens per request = 0.16 requests finish per step
    assert p.steps_per_replica == pytest.approx(1_000_000 / 2 / 0.16)
    assert p.hours == pytest.approx(p.steps_per_replica * p.step_s / 3600)
    assert p.cost == pytest.approx(p.hours * 2 * 2.0)


def test_speculation_reduces_steps_by_its_yield():
    base = plan(_job(n_out=(200,)), Deployment.of(LLAMA, gpu=H200, gpus=1, name="x", batch=8, kv_budget_bytes_per_gpu=2**34, max_num_batched_tokens=8192), KNOWN)
    spec_ = plan(_job(n_out=(200,)), Deployment.of(LLAMA, gpu=H200, gpus=1, name="x", batch=8, kv_budget_bytes_per_gpu=2**34,
                                                speculation=Speculation(3, 0.5), max_num_batched_tokens=8192), KNOWN)
    assert base.steps_per_replica / spec_.steps_per_replica == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_lognormal_lengths_keep_their_mean():
    d = LengthDistribution.lognormal(3000, 1.0, n=256)
    assert d.mean == pytest.approx(3000, rel=0.03)
    assert d.max > 3 * 3000


def test_draft_formula_reproduces_its_printed_table():
    # 6.22 of the draft: "26B-A4B MoE, 8 GPU, batch 48  74.9h 481.2h 556.1h 5.0"
    d = draft_estimate(10_000_000, 12_000, 3_000, active_params=4e9, total_params=26e9, gpus=8, batch=48)
    assert (round(d["prefill_hours"], 1), round(d["decode_hours"], 1), round(d["hours"], 1)) == (74.9, 481.2, 556.1)
    # "31B dense, 8 GPU, batch 32, spec  580.5h 331.0h 911.5h 3.0"
    d = draft_estimate(10_000_000, 12_000, 3_000, active_params=31e9, total_params=31e9, gpus=8, batch=32,
                       accept_rate=1.6)
    assert (round(d["prefill_hours"], 1), round(d["decode_hours"], 1), round(d["requests_per_s"], 1)) == (580.5, 331.0, 3.0)


def test_draft_scenarios_reproduce_every_row_of_its_printed_table():
    """All five rows of the draft's 6.22 table (prefill h, decode h, total h, req/s), typed from its text;
    the corrections appendix prints these scenarios (moved here from the fleet-plan notebook)."""
    from servebook.draft.fleet import DRAFT_JOB, DRAFT_SCENARIOS

    printed = {"26B-A4B MoE, 8 GPU, batch 48": (74.9, 481.2, 556.1, 5.0),
               "26B-A4B MoE, 8 GPU, batch 48, spec": (74.9, 185.1, 260.0, 10.7),
               "31B dense, 8 GPU, batch 32": (580.5, 860.7, 1441.1, 1.9),
               "31B dense, 8 GPU, batch 32, spec": (580.5, 331.0, 911.5, 3.0),
               "26B-A4B MoE, 64 GPU, batch 48": (9.4, 60.2, 69.5, 40.0)}
    assert [s[0] for s in DRAFT_SCENARIOS] == list(printed)
    requests, n_in, n_out = DRAFT_JOB
    for label, _, active_b, total_b, gpus, batch, accept in DRAFT_SCENARIOS:
        d = draft_estimate(requests, n_in, n_out, active_params=active_b * 1e9, total_params=total_b * 1e9,
                           gpus=gpus, batch=batch, accept_rate=accept)
        got = (d["prefill_hours"], d["decode_hours"], d["hours"], d["requests_per_s"])
        assert got == pytest.approx(printed[label], abs=0.051), label


def test_decode_fit_check_names_the_limit():
    with pytest.raises(DoesNotFitError, match="at most .* sequences fit"):
        check_decode_fits(LLAMA, "h200", batch=4096, context_tokens=16000)


def test_chunk_budget_meets_its_target():
    n = prefill_tokens_within(LLAMA, H200, KNOWN, target_step_s=0.05, decode_batch=16, decode_context_tokens=2000)
    assert mixed_step_s(LLAMA, H200, KNOWN, prefill_tokens=n, decode_batch=16, decode_context_tokens=2000) <= 0.05
    assert mixed_step_s(LLAMA, H200, KNOWN, prefill_tokens=n + 1, decode_batch=16, decode_context_tokens=2000) > 0.05
    rec = recommend_max_num_batched_tokens(LLAMA, H200, KNOWN, target_step_s=0.05, max_num_seqs=16,
                                           decode_context_tokens=2000)
    assert rec["recommended"] <= n + 16 < 2 * rec["recommended"]
    with pytest.raises(ServebookError, match="already take longer"):
        recommend_max_num_batched_tokens(LLAMA, H200, KNOWN, target_step_s=0.001, max_num_seqs=16,
                                         decode_context_tokens=2000)


def test_draft_comparison_names_the_prefill_terms_by_hand():
    from servebook.perf import gpu_numbers
    from servebook.draft.fleet import compare_with_draft

    h100 = gpu_numbers("h100")
    moe = compare_with_draft(KNOWN, h100)[0]          # Gemma 4 26B-A4B, TP 8, batch 48, 12,000 in / 3,000 out
    ours = moe["ours"]
    # 48 sequences finish 3,000 tokens each, so a step admits 48 / 3000 requests = 192 prompt tokens; each of
    # the 2 x 30 all-reduces per step moves 2 (tp - 1) / tp of a tokens x 2816 x 2-byte activation over the
    # link (KNOWN has no latency and link efficiency 1).
    assert ours["prefill_tokens_per_step"] == pytest.approx(48 / 3000 * 12000)
    allreduce_s = 2 * 30 * (2 * 7 / 8) * 192 * 2816 * 2 / h100.link_bytes_per_s_each_way
    assert ours["prefill_step_terms_s"]["allreduce_s"] == pytest.approx(allreduce_s, rel=1e-9)
    steps = 10_000_000 / (48 / 3000)                   # one replica
    assert ours["steps_per_replica"] == pytest.approx(steps)
    assert f"TP all-reduce of their activations {allreduce_s * 1e3:.2f} ms ({steps * allreduce_s / 3600:.0f} h)" \
        in moe["why"]
    # the terms are the whole prefill share of the step, so their hours add up to our prefill hours
    assert sum(ours["prefill_step_terms_s"].values()) * steps / 3600 == pytest.approx(ours["prefill_hours"])
    assert "rather than the assumed" not in moe["why"]


def test_fleet_holds_running_sliding_windows_by_hand():
    # Gemma 3 27B: 10 full layers keep every token, 52 sliding layers (window 1024) keep what vLLM's
    # remove_skipped_blocks leaves a decoding request on CUDA: 1024 / 16 + 1 = 65 blocks of 16 tokens.
    from servebook.hf_config import load_model_spec

    gemma = load_model_spec("gemma-3-27b")
    per_layer_token = 2 * 16 * 128 * 2           # K+V x 16 KV heads x head_dim 128 x bf16
    assert kv_bytes_per_sequence(gemma, 6256, running=True) == \
        (10 * 6256 + 52 * 65 * 16) * per_layer_token
    # the admission booking with 2 x 8192 tokens in flight counts the whole context in every layer
    assert kv_bytes_per_sequence(gemma, 6256, sliding_extra_tokens=16384) == 62 * 6256 * per_layer_token
