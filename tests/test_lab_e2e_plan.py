"""servebook.lab.e2e.plan: the end-to-end job plan, its seeded workloads and fleet's predictions."""
from __future__ import annotations

import math
from pathlib import Path
import statistics

import pytest

from servebook.errors import ServebookError
from servebook.hf_config import reference_model_ids
from servebook.lab.e2e.plan import (
    FIRST_TOKEN_ID, Job, Shape, job_lengths, load_plan, lognormal_lengths, plan_rows, predict, token_prompts,
)


@pytest.mark.parametrize("mean,cv", [(2000, 0.5), (250, 0.5), (600, 0.5), (128, 1.0)])
def test_lognormal_lengths_have_the_asked_mean_and_cv(mean, cv):
    xs = lognormal_lengths(40_000, mean, cv, seed=3)
    m = statistics.fmean(xs)
    assert m == pytest.approx(mean, rel=0.03)
    assert statistics.pstdev(xs) / m == pytest.approx(cv, rel=0.08)
    # lognormal: the median sits below the mean by exp(sigma^2 / 2)
    assert statistics.median(xs) == pytest.approx(mean / math.sqrt(1 + cv * cv), rel=0.04)


def test_lognormal_lengths_are_seeded_clipped_and_whole():
    a = lognormal_lengths(500, 300, 0.5, seed=1)
    assert a == lognormal_lengths(500, 300, 0.5, seed=1)
    assert a != lognormal_lengths(500, 300, 0.5, seed=2)
    assert all(isinstance(x, int) and x >= 1 for x in a)
    assert max(lognormal_lengths(500, 300, 1.5, seed=1, high=400)) == 400
    assert lognormal_lengths(5, 6000, 0.0, seed=9) == [6000] * 5
    with pytest.raises(ServebookError):
        lognormal_lengths(5, 0.5, 0.5, seed=1)


def test_token_prompts_are_distinct_in_range_and_seeded():
    lengths = [64] * 300
    prompts = token_prompts(lengths, 32_000, seed=5)
    assert [len(p) for p in prompts] == lengths
    assert all(FIRST_TOKEN_ID <= t < 32_000 - FIRST_TOKEN_ID for p in prompts for t in p)
    # the prefix cache hashes 16-token blocks: no two prompts share their first block
    assert len({tuple(p[:16]) for p in prompts}) == len(prompts)
    assert prompts == token_prompts(lengths, 32_000, seed=5)
    assert prompts != token_prompts(lengths, 32_000, seed=6)
    with pytest.raises(ServebookError, match="too small"):
        token_prompts([4], 150, seed=0)


def test_job_lengths_fit_the_context():
    job = Job("m", Shape("s", 6000, 1.0, 2000, 1.0), 400, seed=4)
    inputs, outputs = job_lengths(job, 8192)
    assert len(inputs) == len(outputs) == 400
    assert max(i + o for i, o in zip(inputs, outputs)) <= 8192
    assert max(outputs) <= 4096 and min(inputs) >= 1


def test_shipped_plan_names_shipped_models_and_both_shapes():
    plan = load_plan()
    models = [m for t in plan.targets.values() for m in t]
    assert len(models) == len(set(models)) >= 6
    assert set(models) <= set(reference_model_ids())
    for name in models:
        mp = plan.model(name)
        shapes = {j.shape.name for j in mp.jobs}
        assert {"long-prompt", "long-output"} <= shapes
        assert mp.engine_args["max_num_seqs"] == 256
    gemma = plan.model("gemma-3-27b")
    assert gemma.engine_args["max_model_len"] == 16384
    [peak] = [j for j in gemma.jobs if j.shape.name == "peak-6000"]
    assert (peak.requests, peak.shape.input_mean, peak.shape.output_mean, peak.shape.input_cv) == (96, 6000, 256, 0)
    seeds = [j.seed for m in plan.models.values() for j in m.jobs]
    assert len(seeds) == len(set(seeds))


def test_plan_errors_name_what_to_change(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[engine]\nmax_model_len = 1024\n[shapes.a]\ninput_mean = 10\ninput_cv = 0\n'
                   'output_mean = 5\noutput_cv = 0\n[models.x]\njobs = [["b", 3]]\n')
    with pytest.raises(ServebookError, match="unknown shape 'b'"):
        load_plan(bad)
    bad.write_text('[shapes.a]\ninput_mean = 10\ninput_cv = 0\noutput_mean = 5\noutput_cv = 0\n'
                   '[targets]\nt = ["y"]\n[models.x]\njobs = [["a", 3]]\n')
    with pytest.raises(ServebookError, match="names model 'y'"):
        load_plan(bad)
    with pytest.raises(ServebookError, match="lacks output_cv"):
        bad.write_text('[shapes.a]\ninput_mean = 10\ninput_cv = 0\noutput_mean = 5\n')
        load_plan(bad)
    with pytest.raises(ServebookError, match="unknown end-to-end target"):
        load_plan().target_models("e2e-z")


def test_prediction_is_fleets_and_longer_jobs_take_longer():
    plan = load_plan()
    mp = plan.model("llama-3.1-8b")
    job = mp.jobs[0]
    inputs, outputs = job_lengths(job, mp.engine_args["max_model_len"])
    p = predict(mp.config(), inputs, outputs, mp.engine_args)
    assert p["seconds"] > 0 and 1 <= p["batch"] <= 256
    # tokens/s times seconds gives back the output tokens fleet was asked for (64 quantiles of them)
    assert p["output_tokens_per_s"] * p["seconds"] == pytest.approx(statistics.fmean(outputs) * len(outputs), rel=0.03)
    p2 = predict(mp.config(), inputs * 2, outputs * 2, mp.engine_args)
    assert p2["seconds"] == pytest.approx(2 * p["seconds"], rel=0.02)


def test_plan_rows_cover_every_job_of_a_target():
    plan = load_plan()
    rows = plan_rows(plan, plan.target_models("e2e-b"))
    assert len(rows) == sum(len(plan.model(m).jobs) for m in plan.target_models("e2e-b"))
    assert all(r["predicted_s"] > 0 for r in rows)


def test_records_reads_e2e_files_and_rejects_others(tmp_path):
    import json

    from servebook.records import e2e_results

    fixture = Path(__file__).parent / "fixtures" / "e2e"
    [doc] = e2e_results(fixture)
    assert doc["schema"] == "servebook.e2e/1" and doc["model_id"] == "tiny"
    (tmp_path / "e2e").mkdir()
    with pytest.raises(FileNotFoundError, match="e2e-a / e2e-b"):
        e2e_results(tmp_path)
    (tmp_path / "e2e" / "e2e_x.json").write_text(json.dumps({"schema": "servebook.lab/1"}))
    with pytest.raises(ValueError, match="servebook.lab.e2e.job"):
        e2e_results(tmp_path)


# ---- the GPU runner's e2e targets (labs/tools/run_labs_gpu.sh), with a fake interpreter ------------

@pytest.mark.parametrize("target", ["e2e-a", "e2e-b", "e2e-c", "e2e-gemma"])
def test_runner_e2e_targets_run_the_recorder_with_a_deadline(tmp_path, target):
    import os
    import subprocess
    import time

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@ $SERVEBOOK_LAB_DEADLINE" > "$SERVEBOOK_LAB_RESULTS/seen"\n'
                    'echo "{}" > "$SERVEBOOK_LAB_RESULTS/e2e_m.json"\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "OUT": str(out), "PY": str(fake)}
    t0 = time.time()
    proc = subprocess.run(["bash", str(root / "labs" / "tools" / "run_labs_gpu.sh"), target], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *argv, deadline = (out / "seen").read_text().split()
    assert argv == ["-m", "servebook.lab.e2e.job", "run", "--target", target, "--out", str(out)]
    # 580 s cap, 15 s kept to save and stop: the deadline falls 565 s after the start
    assert 560 <= float(deadline) - t0 <= 566
    assert f"results: {out}/e2e_m.json" in proc.stdout


def test_runner_plan_text_lists_every_e2e_model():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(["bash", str(root / "labs" / "tools" / "run_labs_gpu.sh"), "plan"], capture_output=True,
                          text=True, timeout=60).stdout
    plan = load_plan()
    assert "capped at 580 s" in text
    for target, models in plan.targets.items():
        section = text.split(f"  {target} ", 1)[1]
        for m in models:
            assert m in section.split("\n  e2e-", 1)[0]


def test_run_does_not_start_an_engine_that_cannot_finish_before_the_deadline(tmp_path, monkeypatch, capsys):
    import time

    from servebook.lab.e2e.job import main

    monkeypatch.setenv("SERVEBOOK_LAB_DEADLINE", str(int(time.time()) + 30))
    assert main(["run", "--models", "llama-3.1-8b", "--out", str(tmp_path)]) == 0
    assert "llama-3.1-8b: not started, needs ~" in capsys.readouterr().out
    assert not list(tmp_path.glob("e2e_*.json"))


def _plan_text(models: str) -> str:
    return ("[engine]\nmax_num_seqs = 8\nmax_num_batched_tokens = 256\ngpu_memory_utilization = 0.5\n"
            "max_model_len = 512\n[shapes.s]\ninput_mean = 64\ninput_cv = 0\noutput_mean = 8\noutput_cv = 0\n"
            + models)


def test_a_job_may_be_sampled_and_a_model_may_set_the_engines_environment(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(_plan_text('[models."llama-3.1-8b"]\n'
                               'environment = { VLLM_MOE_ROUTING_SIMULATION_STRATEGY = "uniform_random" }\n'
                               'jobs = [["s", 4, 7], ["s", 4, 7, { temperature = 1.0 }]]\n'))
    mp = load_plan(path).model("llama-3.1-8b")
    greedy, sampled = mp.jobs
    assert (greedy.seed, greedy.temperature, sampled.seed, sampled.temperature) == (7, 0.0, 7, 1.0)
    assert greedy.name == "s-4" and sampled.name == "s-4-sampled", "the two must stay apart in a record"
    assert mp.environment == {"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "uniform_random"}
    # what the engine child reads back is the same job
    case = sampled.as_case()
    assert Job(mp.model, Shape(**case["shape"]), case["requests"], case["seed"], case["temperature"]) == sampled


@pytest.mark.parametrize("models,message", [
    ('[models."llama-3.1-8b"]\njobs = [["s", 4, 7, { top_p = 0.9 }]]\n', "temperature = T"),
    ('[models."llama-3.1-8b"]\njobs = [["s", 4, 7, { temperature = -1.0 }]]\n', "temperature must be >= 0"),
    ('[models."llama-3.1-8b"]\nenvironment = { VLLM_X = 1 }\njobs = [["s", 4]]\n', "table of strings"),
])
def test_bad_job_options_and_environments_are_refused_by_name(tmp_path, models, message):
    path = tmp_path / "plan.toml"
    path.write_text(_plan_text(models))
    with pytest.raises(ServebookError, match=message):
        load_plan(path)


def test_the_routing_and_attention_plans_load_and_say_what_they_test():
    root = Path(__file__).resolve().parents[1] / "labs" / "tools"
    routing = load_plan(root / "e2e_routing.toml")
    assert routing.model("deepseek-v2-lite-uniform").environment["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random"
    swap = routing.model("gpt-oss-20b-decode-swap").jobs
    assert [j.temperature for j in swap] == [1.0, 0.0, 1.0] and len({j.seed for j in swap}) == 1
    attention = load_plan(root / "e2e_attention.toml")
    sliding = attention.model("llama-3.1-8b-sliding4096").config()
    assert set(sliding["layer_types"]) == {"sliding_attention"} and sliding["sliding_window"] == 4096
    assert [j.seed for j in attention.model("llama-3.1-8b").jobs] == [j.seed for j in attention.model(
        "llama-3.1-8b-sliding4096").jobs], "the two engines run the same requests"
