"""servebook.perf.finite_job: step mixtures and the drain, against hand arithmetic."""
from __future__ import annotations

import math

import pytest

from servebook.errors import ServebookError
from servebook.perf.finite_job import admission_probabilities, drain_extra_s, expected_step_s, residual_outputs


def test_admissions_are_poisson():
    probs = dict(admission_probabilities(0.5))
    assert sum(probs.values()) == pytest.approx(1.0)
    assert probs[0] == pytest.approx(math.exp(-0.5)) and probs[2] == pytest.approx(math.exp(-0.5) * 0.125)
    assert admission_probabilities(0.0)[0] == (0, 1.0)
    with pytest.raises(ServebookError):
        admission_probabilities(-1)


def test_expected_step_of_a_linear_price_is_the_price_of_the_average_step():
    # a step linear in prompts: the mixture and the average step agree (Jensen with equality)
    price = lambda k: 0.010 + 0.004 * k  # noqa: E731
    assert expected_step_s(price, 0.7, max_prompts_per_step=20) == pytest.approx(price(0.7))


def test_a_graph_threshold_makes_the_mixture_differ_from_the_average_step():
    # one prompt fits the CUDA graph (10 ms), two or more run eagerly (30 ms); decode-only 8 ms
    price = lambda k: 0.008 if k == 0 else (0.010 if k <= 1 else 0.030)  # noqa: E731
    f = 0.5
    p0, p1 = math.exp(-f), math.exp(-f) * f
    assert expected_step_s(price, f, max_prompts_per_step=20) == pytest.approx(
        p0 * 0.008 + p1 * 0.010 + (1 - p0 - p1) * 0.030, rel=1e-6)
    assert price(f) == 0.010  # the average step would have been a graph step


def test_a_prefill_bound_job_fills_every_step():
    price = lambda k: 0.01 * (1 + k)  # noqa: E731
    assert expected_step_s(price, 4.0, max_prompts_per_step=4.0) == pytest.approx(0.05)
    with pytest.raises(ServebookError, match="max_num_batched_tokens"):
        expected_step_s(price, 1.0, max_prompts_per_step=0)


def test_residuals_of_equal_outputs_are_uniform():
    r = residual_outputs([100.0], 4, points_per_sequence=400)
    assert r == sorted(r)
    assert r == pytest.approx([12.5, 37.5, 62.5, 87.5], abs=0.3)


def test_residuals_are_length_biased():
    # outputs 10 and 1000: the long one runs 100x as long, so almost every running request is long
    r = residual_outputs([10.0, 1000.0], 100)
    assert sum(x > 10 for x in r) >= 98


def test_drain_with_a_flat_step_costs_the_longest_residual_in_steps():
    # step time independent of batch (weights-bound): the drain lasts max(residual) steps
    r = [10.0, 20.0, 40.0]
    extra = drain_extra_s(r, lambda b: 0.02, tokens_per_steady_s=3 / 0.02)
    assert extra == pytest.approx(40 * 0.02 - 70 * 0.02 / 3)


def test_drain_with_a_step_proportional_to_batch_costs_nothing_extra():
    # a step that costs 1 ms per running request: tokens cost the same at any batch
    r = [5.0, 9.0, 30.0]
    assert drain_extra_s(r, lambda b: 0.001 * b, tokens_per_steady_s=1000.0) == pytest.approx(0.0, abs=1e-12)
