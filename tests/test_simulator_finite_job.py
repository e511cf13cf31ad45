"""servebook.simulator.finite_job: fleet's steady state plus the ramp and drain replayed in the simulator."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servebook.hf_config import load_model_spec
from servebook.simulator.finite_job import REPLAY_BATCHES, finite_job_seconds
from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan
from servebook.perf.gpu import gpu_numbers
from servebook.perf.model import calibrated_coefficients


@pytest.fixture(scope="module")
def setup():
    g = gpu_numbers("h200")
    coeffs, _ = calibrated_coefficients(g.name)
    d = Deployment.of(load_model_spec("llama-3.1-8b"), gpu=g, gpus=1, name="llama", max_num_seqs=64,
                   max_num_batched_tokens=8192, gpu_memory_utilization=0.9)
    return d, coeffs


def _work(n, out_mean=400):
    return Workload(n, LengthDistribution.lognormal(300, 0.5, n=32), LengthDistribution.lognormal(out_mean, 0.5, n=32))


def test_a_small_job_is_slower_than_the_steady_state(setup):
    d, coeffs = setup
    f = finite_job_seconds(_work(128), d, coeffs)
    assert f["replayed_requests"] == 128
    # two batches of requests: the drain at a falling batch costs more than the steady state charges
    assert f["ramp_drain_s"] > 0 and f["seconds"] == pytest.approx(f["steady_seconds"] + f["ramp_drain_s"])
    assert f["output_tokens_per_s"] * f["seconds"] == pytest.approx(128 * _work(128).output_tokens.mean)


def test_the_ramp_and_drain_do_not_grow_with_the_job(setup):
    d, coeffs = setup
    small, big = finite_job_seconds(_work(10_000), d, coeffs), finite_job_seconds(_work(100_000), d, coeffs)
    assert small["replayed_requests"] == big["replayed_requests"] == REPLAY_BATCHES * plan(_work(10_000), d, coeffs).batch
    assert big["ramp_drain_s"] == pytest.approx(small["ramp_drain_s"], rel=1e-9)
    assert big["steady_seconds"] == pytest.approx(10 * small["steady_seconds"], rel=1e-9)
    assert big["ramp_drain_s"] < 0.01 * big["seconds"]


def test_cli_reports_the_job_with_its_ramp_and_drain_by_default_and_refuses_speculation_with_the_alias():
    base = [sys.executable, "-m", "servebook", "fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "2",
            "--requests", "600", "--input-tokens", "750", "--input-cv", "0.5", "--output-tokens", "260",
            "--output-cv", "0.5", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192"]
    out = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, check=True).stdout)
    f = out["finite_job"]   # no flag: the default answer is the job's, ramp and drain included
    assert f["seconds"] > f["steady_seconds"] == pytest.approx(out["hours"] * 3600)
    assert f["replayed_requests"] == 300  # a replica's share: 600 requests over 2 replicas
    assert 1 <= f["peak_running"] <= 256
    alias = json.loads(subprocess.run(base + ["--finite-job", "--json"], capture_output=True, text=True,
                                      check=True).stdout)
    assert alias["finite_job"] == f
    steady = json.loads(subprocess.run(base + ["--steady-state", "--json"], capture_output=True, text=True,
                                       check=True).stdout)
    assert "finite_job" not in steady and steady["hours"] == out["hours"]
    text = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    assert "the job:" in text and "ramp and drain" in text and "cost" not in text  # no price, no cost line
    priced = subprocess.run(base + ["--price-per-gpu-hour", "2.5"], capture_output=True, text=True, check=True).stdout
    cost = f["seconds"] * 2 / 3600 * 2.5
    assert f"cost: {cost:,.2f} at 2.5 per GPU-hour" in priced
    bad = subprocess.run(base + ["--finite-job", "--spec-k", "2", "--spec-alpha", "0.7"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--finite-job" in bad.stderr
    spec_ok = subprocess.run(base + ["--spec-k", "2", "--spec-alpha", "0.7"], capture_output=True, text=True)
    assert spec_ok.returncode == 0 and "steady state only" in spec_ok.stdout


def test_a_jobs_lengths_are_its_n_quantiles_so_the_longest_is_the_expected_longest_of_n_draws():
    import random
    import statistics

    dist = LengthDistribution.lognormal(600, 0.5)          # what fleet builds from --output-tokens/--output-cv
    lengths = dist.job_lengths(192)
    assert len(lengths) == 192 and lengths == sorted(lengths)
    assert statistics.fmean(lengths) == pytest.approx(600, rel=0.01)
    # the expected longest of 192 lognormal draws, by simulation (seeded)
    import math

    rng = random.Random(7)
    sigma = math.sqrt(math.log1p(0.25))
    mu = math.log(600) - sigma * sigma / 2
    expected_max = statistics.fmean(max(rng.lognormvariate(mu, sigma) for _ in range(192)) for _ in range(3000))
    assert lengths[-1] == pytest.approx(expected_max, rel=0.05)
    # the steady state's 64 quantiles would cut it by more than 10%
    assert max(dist.samples) < 0.9 * expected_max
    # given samples are cycled, not re-drawn
    given = LengthDistribution.from_samples([5, 7, 9])
    assert given.job_lengths(5) == [5.0, 7.0, 9.0, 5.0, 7.0]
    with pytest.raises(Exception, match="at least 1 request"):
        dist.job_lengths(0)


def test_the_default_answer_is_the_mean_wall_time_over_random_draws_of_the_job(setup):
    """The typed answer (n quantiles) against the replay of random draws of the same job: unbiased,
    where the steady state's 64 quantiles priced a drain-bound job several per cent fast."""
    import random
    import statistics

    from servebook.lab.e2e.plan import lognormal_lengths

    d, coeffs = setup
    n = 128                       # two batches of 64: the drain is a large share of the job
    typed = finite_job_seconds(_work_typed(n), d, coeffs)["seconds"]
    draws = []
    for seed in range(16):
        ins = lognormal_lengths(n, 300, 0.5, 100 + 2 * seed)
        outs = lognormal_lengths(n, 400, 0.5, 101 + 2 * seed)
        w = Workload(n, LengthDistribution.from_samples(ins), LengthDistribution.from_samples(outs))
        draws.append(finite_job_seconds(w, d, coeffs)["seconds"])
    mean = statistics.fmean(draws)
    assert typed == pytest.approx(mean, rel=0.04)
    cut = Workload(n, LengthDistribution(_work_typed(n).input_tokens.samples),
                   LengthDistribution(_work_typed(n).output_tokens.samples))   # 64 quantiles, no job draw
    assert finite_job_seconds(cut, d, coeffs)["seconds"] < typed


def _work_typed(n):
    return Workload(n, LengthDistribution.lognormal(300, 0.5), LengthDistribution.lognormal(400, 0.5))


def test_a_recorded_jobs_lengths_enter_whole_for_the_replay_and_as_quantiles_for_the_steady_state():
    lengths = list(range(1, 1001))                      # a job of 1,000 requests, 1..1000 tokens
    dist = LengthDistribution.of_job(lengths)
    assert len(dist.samples) == 64 and max(dist.samples) < 1000
    assert dist.job_lengths(1000) == [float(x) for x in lengths]            # all of them, longest included
    fewer = dist.job_lengths(100)                       # a replay shorter than the job: spread, not the shortest
    assert len(fewer) == 100 and min(fewer) <= 10 and max(fewer) >= 990
    assert dist.job_lengths(2000).count(1000.0) == 2    # cycled past the job's size
