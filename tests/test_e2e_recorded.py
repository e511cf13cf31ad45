"""What labs/e2e_results.md and 6.22 say about the end-to-end jobs recorded on the H200 (labs/results/e2e).

The page glues every number from the records; the sentences that compare numbers or name a cause are
checked here against the same records, so a re-recording or a model change that moves a number past
what a sentence states fails this file.
"""
from __future__ import annotations

import pytest

from servebook.lab.e2e.analysis import fitted_models, job_rows, summary
from servebook.records import e2e_results, results_path


@pytest.fixture(scope="module")
def rows():
    return [r for d in e2e_results() for r in job_rows(d, fitted=fitted_models())]


def _held(rows, moe: bool | None = None):
    return [r for r in rows if r["group"] == "held out" and (moe is None or r["moe"] == moe)]


def test_every_model_shape_and_both_workload_shapes_are_recorded(rows):
    kinds = {r["kind"] for r in rows}
    assert len({r["model"] for r in rows}) >= 6 and any(r["moe"] for r in rows) and any("MLA" in k for k in kinds)
    jobs = {r["job"].rsplit("-", 1)[0] for r in rows}
    assert {"long-prompt", "long-output"} <= jobs
    assert {r["group"] for r in rows} == {"fitted", "held out"}, "the page compares fitted with held-out jobs"


def test_the_goal_is_met_in_scope_and_far_off_over_every_held_out_job(rows):
    """labs/e2e_results.md: with `servebook fleet --finite-job`, on the held-out jobs that ran what the
    model describes (dense models, MoE with uniform routing) the mean absolute error is at most 10% and the
    worst case within 20%; over every held-out job the mean is far over."""
    from servebook.lab.e2e.analysis import in_scope

    scope = [r for r in _held(rows) if in_scope(r)]
    s = summary(scope, "finite_error")
    # 12 since DeepSeek-V2-Lite shaped a term (its two uniform-routing jobs count as fitted now)
    assert s["jobs"] >= 12 and abs(s["worst"]) <= 0.20 and s["mae"] <= 0.10, s
    assert summary(_held(rows), "finite_error")["mae"] > 0.10


def test_two_held_out_moe_engines_of_large_experts_are_priced_within_the_worst_case_goal(rows):
    """labs/e2e_results.md, expert-GEMM bullet: Mixtral-8x7B (whose error led to the expert-width term) and
    Qwen2-57B-A14B (recorded before that term was fitted) are held out, ran with uniform routing, and each
    of their jobs is priced within 20% by `servebook fleet --finite-job`."""
    for model in ("mixtral-8x7b-uniform", "qwen2-57b-a14b-uniform"):
        got = [r for r in rows if r["model"] == model]
        assert len(got) == 2 and all(r["group"] == "held out" and r["routing"] == "uniform (simulated)" for r in got)
        assert all(abs(r["finite_error"]) <= 0.20 for r in got), [(r["job"], r["finite_error"]) for r in got]


def test_the_fitted_moes_uniform_long_prompt_job_is_the_worst_priced_fitted_job(rows):
    """labs/e2e_results.md, expert-GEMM bullet: among the fitted jobs in scope, Qwen3-30B-A3B's long-prompt job with
    uniform routing is priced worst, and its steps that carry a prompt chunk are priced too fast."""
    from servebook.lab.e2e.analysis import in_scope

    fitted = [r for r in rows if r["group"] == "fitted" and in_scope(r)]
    worst = max(fitted, key=lambda r: abs(r["finite_error"]))
    assert (worst["model"], worst["job"].rsplit("-", 1)[0]) == ("qwen3-30b-a3b-uniform", "long-prompt")
    assert worst["step_error_mixed"] < -0.1


def test_moe_jobs_held_out_are_further_off_than_the_dense_ones(rows):
    dense, moe = summary(_held(rows, False), "finite_error"), summary(_held(rows, True), "finite_error")
    assert moe["mae"] > dense["mae"], "labs/e2e_results.md: dense held-out jobs come closer than the MoE ones"


def test_the_longest_held_out_job_is_priced_closely_with_its_ramp_and_drain(rows):
    """labs/e2e_results.md: the longest held-out job spent most of its time at the peak batch; `fleet`'s
    steady state promised more than it delivered, `servebook fleet --finite-job` came within 5%."""
    longest = max(_held(rows), key=lambda r: r["requests"])
    assert longest["steady_share"] > 0.5, "the longest job spent most of its wall time at the peak batch"
    assert longest["error"] > 0 and abs(longest["finite_error"]) < 0.05


def test_dense_steps_with_a_prefill_are_priced_within_a_tenth(rows):
    """labs/e2e_results.md: the held-out dense long-output jobs' steps that carried a prefill, priced by the
    step model with the second-stage host terms (fitted on the fitted models' steps only)."""
    dense_long_output = [r for r in rows if not r["moe"] and r["group"] == "held out" and r["job"].startswith("long-output")
                         and r.get("step_error_mixed") is not None and r["requests"] >= 2 * r["peak_running"]]
    assert dense_long_output and all(abs(r["step_error_mixed"]) < 0.10 for r in dense_long_output), \
        [(r["model"], r["job"], r["step_error_mixed"]) for r in dense_long_output]


def test_the_same_requests_run_twice_differ_by_more_than_the_goal():
    """labs/e2e_results.md: jobs recorded twice (same seed) on fresh engines differ by more than 10% in wall time."""
    docs = e2e_results()
    walls = {}
    for d in docs:
        for j in d["jobs"]:
            if "wall_s" in j:
                walls.setdefault((d["model_id"], j["name"], j["seed"]), []).append(j["wall_s"])
    repeats = [v for v in walls.values() if len(v) == 2]
    assert len(repeats) >= 4 and max(max(v) / min(v) - 1 for v in repeats) > 0.10


def test_gpt_oss_long_prompt_stays_slow_after_a_warm_up_of_its_shape():
    """labs/e2e_results.md: every jit_monitor warning of the warm run came during the warm-up jobs, and the timed
    long-prompt job still took over twice the model's time."""
    docs = e2e_results()
    warm = next(d for d in docs if d["model_id"] == "gpt-oss-20b" and d.get("warm_up_jobs"))
    log = (results_path("raw") / "e2e-warm-gptoss-2026-12-02.log").read_text().splitlines()
    first_timed = next(i for i, line in enumerate(log) if "[e2e] gpt-oss-20b warm-up job long-output-512" in line)
    assert any("jit_monitor.py:135" in line for line in log[:first_timed])
    assert not any("jit_monitor.py:135" in line for line in log[first_timed:])
    row = next(r for r in job_rows(warm, fitted=fitted_models()) if r["job"].startswith("long-prompt"))
    assert row["measured_s"] > 2 * row["finite_s"]


def test_a_random_router_makes_deepseek_decode_cheaper_than_uniform_routing(rows):
    """labs/e2e_results.md, the MoE bullet: the same DeepSeek-V2-Lite requests, priced by the same model:
    with its random router its decode steps cost far less than the model says; with vLLM's uniform-random
    routing simulation they are priced closely at every batch size."""
    random_router = [r for r in rows if r["model"] == "deepseek-v2-lite"]
    uniform = [r for r in rows if r["model"] == "deepseek-v2-lite-uniform"]
    assert random_router and all(r["routing"] == "random router" and r["step_error_decode"] > 0.2 for r in random_router)
    assert uniform and all(r["routing"] == "uniform (simulated)" for r in uniform)
    assert all(abs(v["error"]) < 0.15 for r in uniform for v in r["steps_by_batch"].values() if v["steps"] >= 5)
    assert {r["job"] for r in uniform} == {r["job"] for r in random_router}, "the same jobs, re-run"


def test_in_scope_means_dense_or_uniformly_routed(rows):
    from servebook.lab.e2e.analysis import in_scope

    simulated = {d["model_id"] for d in e2e_results()
                 if d.get("environment", {}).get("VLLM_MOE_ROUTING_SIMULATION_STRATEGY") == "uniform_random"}
    assert {"deepseek-v2-lite-uniform", "mixtral-8x7b-uniform", "qwen3-30b-a3b-uniform",
            "qwen2-57b-a14b-uniform"} <= simulated
    for r in rows:
        assert in_scope(r) == (not r["moe"] or r["model"] in simulated), (r["model"], r["routing"])


def test_gpt_oss_decode_with_mxfp4_experts_is_priced_within_a_third(rows):
    """labs/e2e_results.md, "Quantized experts": decode steps of 8-64 requests."""
    errors = [v["error"] for r in rows if r["model"] == "gpt-oss-20b" for b, v in r["steps_by_batch"].items()
              if 8 <= b <= 64 and v["steps"] >= 5]
    assert errors and max(abs(e) for e in errors) < 0.35


def test_gpt_oss_pays_on_the_first_job_of_a_fresh_engine_not_for_sampling():
    """labs/e2e_results.md, section "a one-time cost for each new step size": single prompts run twice, and
    the long-output requests in both orders of greedy and sampled decoding."""
    docs = {d["model_id"]: d for d in e2e_results(folder="e2e_routing")}
    singles = [j for j in docs["gpt-oss-20b-sampled"]["jobs"] if j["name"].startswith("single-prefill")]
    pairs = list(zip(singles[::2], singles[1::2]))
    assert len(pairs) == 6 and all(a["seed"] == b["seed"] and a["wall_s"] > 5 * b["wall_s"] for a, b in pairs)
    for name in ("gpt-oss-20b-decode", "gpt-oss-20b-decode-swap"):
        walls = [j["wall_s"] for j in docs[name]["jobs"]]
        assert walls[0] > 1.3 * max(walls[1:]), (name, walls)
    # both orders: the slow first job was greedy on one engine and sampled on the other
    assert [docs[n]["jobs"][0]["temperature"] for n in ("gpt-oss-20b-decode", "gpt-oss-20b-decode-swap")] == [0.0, 1.0]


def test_dense_engines_repeat_themselves_closely():
    """labs/e2e_results.md: Gemma 3 27B's long-output job and Llama-3.1-8B's long-prompt job on fresh engines."""
    from servebook.lab.e2e.analysis import find_job_record

    docs = e2e_results()
    gemma = [j["wall_s"] for d in docs if d["model_id"] == "gemma-3-27b" for j in d["jobs"]
             if j.get("name") == "long-output-192"]
    assert len(gemma) == 2 and max(gemma) / min(gemma) - 1 < 0.01
    first = next(j for j in find_job_record(docs, "llama-3.1-8b", "long-prompt-256")["jobs"] if j["name"] == "long-prompt-256")
    again = next(j for d in e2e_results(folder="e2e_attention") if d["model_id"] == "llama-3.1-8b"
                 for j in d["jobs"] if j["name"] == "long-prompt-256")
    assert first["seed"] == again["seed"] and abs(again["wall_s"] / first["wall_s"] - 1) < 0.05


def test_sliding_window_kernels_not_mixed_lengths_cost_the_extra_decode_time():
    """labs/e2e_results.md, section "Decode steps at long contexts": the same shape and KV bytes, one
    length per step or lognormal lengths, full or sliding-window attention; the third calibration stage
    fitted on exactly these two records."""
    import json

    from servebook.lab.e2e.analysis import large_batch_decode_gap
    from servebook.perf.model import CALIBRATION_FILE

    gaps = {}
    for d in e2e_results(folder="e2e_attention"):
        for r in job_rows(d, fitted=fitted_models()):
            gaps[(r["model"], r["job"].startswith("long-prompt-fixed"))] = large_batch_decode_gap(r)
    full = [gaps[("llama-3.1-8b", fixed)] for fixed in (False, True)]
    assert abs(full[0] - full[1]) < 0.05, "one length per step does not remove the gap"
    report = json.loads(CALIBRATION_FILE.read_text())["stage3"]["report"]["H200-SXM-141GB"]
    assert report["sliding_ratio_before"] > report["full_attention_ratio"] + 0.10, "the sliding-window kernel adds to it"
    sliding = [gaps[("llama-3.1-8b-sliding4096", fixed)] for fixed in (False, True)]
    assert max(abs(a - b) for a in sliding for b in full) < 0.05, "with the fitted term the two engines agree"


def test_vllm_logged_triton_compilation_during_gpt_oss_first_job():
    log = (results_path("raw") / "e2e-c-2026-12-02.log").read_text()
    start = log.index("[e2e] gpt-oss-20b: engine started")
    first_job = log.index("[e2e] gpt-oss-20b long-prompt-384:")
    assert "Triton kernel JIT compilation during inference" in log[start:first_job]


def test_deepseek_decode_steps_beat_the_uniform_routing_floor():
    """labs/e2e_results.md: with random weights DeepSeek-V2-Lite's decode steps at batch 16-64 took less
    time than reading the experts uniform routing touches would take at the H200's peak HBM bandwidth."""
    from servebook.hf_config import load_model_spec
    from servebook.lab.e2e.analysis import decode_step_medians, uniform_routing_floor_s

    doc = next(d for d in e2e_results() if d["model_id"] == "deepseek-v2-lite")
    spec = load_model_spec(doc["config"], name=doc["model_id"])
    for job in doc["jobs"]:
        medians = decode_step_medians(job)
        for b in (16, 32, 64):
            assert medians[b] < uniform_routing_floor_s(spec, "h200", b), (job["name"], b, medians[b])


def test_gpt_oss_pays_once_for_each_new_eager_step_size():
    """labs/e2e_results.md, "a one-time cost for each new step size": on one engine that ran the same requests
    twice, eager steps of a size already run take a small fraction of those of a new size, and of the first pass's."""
    from servebook.lab.e2e.analysis import step_size_first_costs
    from servebook.vllm_rules import cudagraph_max_tokens

    repeats = {d["model_id"]: d for d in e2e_results(folder="e2e_repeat")}
    doc = repeats["gpt-oss-20b-nocache"]
    assert doc["engine_args"]["enable_prefix_caching"] is False
    graph = cudagraph_max_tokens(256, 8192, architecture=doc["config"]["architectures"][0])
    assert graph == 1024
    ss = step_size_first_costs(doc, graph)
    assert min(ss[k]["steps"] for k in ("warm_up", "seen", "new")) >= 10
    assert ss["seen"]["median_s"] < 0.2 * ss["new"]["median_s"]
    assert ss["seen"]["median_s"] < 0.2 * ss["warm_up"]["median_s"]
    assert ss["timed_s"] < ss["warm_up_s"]
    cached = next(j for j in repeats["gpt-oss-20b"]["jobs"] if j["name"].startswith("long-prompt"))
    assert cached["prefix_cache_hit_rate"] > 0.9  # "measures the prefix cache": why it is not compared


# ---- issue 39's jobs: the held-out set was declared (heldout.toml) before the records ----------------
@pytest.fixture(scope="module")
def declared():
    import tomllib

    from servebook.lab.e2e.analysis import declared_rows

    declaration = tomllib.loads(results_path("e2e_issue39", "heldout.toml").read_text())
    return declaration, declared_rows(declaration, e2e_results(folder="e2e_issue39"))


def test_every_declared_job_is_reported_with_the_groups_it_was_declared_with(declared):
    declaration, rows = declared
    assert [(j["record"], j["job"], j["group"], j["strict_group"]) for j in declaration["job"]] == \
        [(r["record"], r["job"], r["declared_group"], r["declared_strict_group"]) for r in rows]
    assert all(r["recorded"] for r in rows) and len(rows) == 10
    # the page tells the fp8-KV engine's jobs from the same requests on the 16-bit one
    assert {r["kv_cache_dtype"] for r in rows if r["record"].endswith("-fp8kv")} == {"fp8"}
    assert {r["kv_cache_dtype"] for r in rows if r["record"] == "e2e_llama-3.1-8b-longctx"} == {"auto"}
    # the stricter reading never holds out a job the primary one counts as fitted
    assert all(r["group"] == "held out" for r in rows if r["strict_group"] == "held out")


def test_a_declared_job_changes_group_only_by_an_appended_entry_when_its_model_shaped_a_term(declared):
    """heldout.toml is only appended to: a held-out job becomes fitted through a [[regrouped]] entry, and
    only when its model shaped a term of the step model (perf/data/e2e_split.json); no job goes the other way."""
    from servebook.lab.e2e.analysis import fitted_models

    declaration, rows = declared
    shaped = fitted_models()
    for r in rows:
        if (r["group"], r["strict_group"]) != (r["declared_group"], r["declared_strict_group"]):
            assert r["regrouped_why"] and r["group"] == r["strict_group"] == "fitted"
            assert r["model"] in shaped, f"{r['record']} regrouped, but {r['model']} shaped no term"
        elif r["model"] in shaped:  # a model that shaped a term never stays held out
            assert r["group"] == "fitted", f"{r['record']}: {r['model']} shaped a term; append a [[regrouped]] entry"
    # the MLA + MoE job whose error shaped the eager MLA term is one of them
    assert any(r["model"] == "deepseek-v2-lite" and r["declared_group"] == "held out" and r["group"] == "fitted"
               for r in rows)


def test_declared_errors_are_the_measured_seconds_against_the_default_answer(declared):
    _, rows = declared
    for r in rows:
        # predicted / measured output tokens/s - 1 = measured / predicted seconds - 1 (same tokens)
        assert r["error"] == pytest.approx(r["measured_s"] / r["predicted_s"] - 1)


def test_the_page_claims_on_the_declared_jobs(declared):
    """labs/e2e_results.md: DeepSeek-V2-Lite's MLA+MoE job, declared held out, is the one regrouped (its error
    shaped the MLA term); the KV-bound hybrid job (which preempted) is priced within 5%; the default answer
    beats the steady state alone on the held-out set; the stricter reading holds out one job."""
    from servebook.lab.e2e.analysis import declared_summary

    _, rows = declared
    moved = [r for r in rows if r["group"] != r["declared_group"]]
    assert [(r["model"], r["declared_group"], r["group"]) for r in moved] == [("deepseek-v2-lite", "held out", "fitted")]
    assert abs(moved[0]["error"]) < 0.1
    hybrid = next(r for r in rows if r["kind"].startswith("hybrid"))
    assert hybrid["preemptions"] > 0 and abs(hybrid["error"]) < 0.05
    assert declared_summary(rows)["mae"] < declared_summary(rows, key="steady_error")["mae"]
    assert declared_summary(rows, strict=True)["jobs"] == 1


def test_the_terms_ablation_the_page_shows():
    """labs/e2e_results.md, the two terms: without the MLA term DeepSeek-V2-Lite's job is priced > 20% fast and
    its eager steps (most of its time) > 20% too fast where the fitted MoE's at the same flags are within 10%;
    its GPU-bound steps are right at the median; the fp8 term moves only the fp8 jobs, and no recorded
    held-out job moves (none has MLA layers or an fp8 cache)."""
    from servebook.lab.e2e.ablation import ablation_summary, declared_ablation, terms_switched_off, variants
    from servebook.lab.e2e.analysis import step_regimes

    rows = declared_ablation(["e2e_issue39", "e2e_issue39b"])
    ds = next(r for r in rows if r["model"] == "deepseek-v2-lite")
    assert ds["errors"]["neither"] > 0.2 and abs(ds["errors"]["both"]) < 0.1
    assert ds["errors"]["fp8_kv_bandwidth_eff only"] == ds["errors"]["neither"]
    for r in rows:
        if r["recorded"] and not r["record"].endswith("fp8kv"):
            assert r["errors"]["eager_mla_layer_s only"] == r["errors"]["both"], r["record"]
        if r["recorded"] and r["kind"] != "MLA + MoE":
            assert r["errors"]["fp8_kv_bandwidth_eff only"] == r["errors"]["both"], r["record"]
    # the second declaration (recorded after the terms were fitted): the MLA term brings both held-out MLA+MoE
    # models from > 15% too fast to within the held-out goal's median (6%; Moonlight is -5.7% since the replay
    # takes a job's longest requests, -4% before), and only they move with it; the fp8 term moves only Gemma's fp8 job
    second = {r["model"]: r for r in rows if r["folder"] == "e2e_issue39b"}
    assert all(r["recorded"] for r in second.values()) and len(second) == 3
    for model in ("moonlight-16b-a3b", "glm-4.7-flash"):
        e = second[model]["errors"]
        assert e["neither"] > 0.15 and abs(e["both"]) <= 0.06 and e["fp8_kv_bandwidth_eff only"] == e["neither"]
    g = second["gemma-3-27b"]["errors"]
    assert g["eager_mla_layer_s only"] == g["neither"] and abs(g["both"]) < abs(g["neither"])
    held = ablation_summary(rows, "held out")
    assert held["both"]["jobs"] == 5 and held["both"]["mae"] < held["neither"]["mae"]
    assert held["both"]["median"] <= 0.06 and held["both"]["mae"] <= 0.08 and abs(held["both"]["worst"]) <= 0.15
    docs = {d["model_id"]: d for d in e2e_results(folder="e2e_issue39")}
    with terms_switched_off(variants()[0][1]):
        mla = step_regimes(docs["deepseek-v2-lite-mixed-uniform"], docs["deepseek-v2-lite-mixed-uniform"]["jobs"][0])
        ref = step_regimes(docs["qwen3-30b-a3b-mixed-uniform"], docs["qwen3-30b-a3b-mixed-uniform"]["jobs"][0])
    eager = [k for k in mla if "eager" in k and "> 8k" not in k]
    assert eager and all(mla[k]["error"] < -0.2 for k in eager)
    assert sum(mla[k]["measured_s"] for k in mla if "eager" in k) > 0.8 * sum(v["measured_s"] for v in mla.values())
    assert all(abs(v["error"]) < 0.1 for k, v in ref.items() if "eager" in k)
    assert abs(mla["mixed, eager, prefill > 8k"]["median_error"]) < 0.05
