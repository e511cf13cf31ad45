"""servebook.reductions gives numpy's digits (sum, mean, percentile) without numpy, checked against numpy."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from servebook.errors import ServebookError
from servebook.reductions import dot, mean, pairwise_sum, percentile

SIZES = [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000, 4097, 10_000, 32_768]


def _values(rng: random.Random, n: int) -> list[float]:
    kind = rng.choice(["spread", "tiny", "counts"])
    if kind == "counts":
        return [float(rng.randrange(300)) for _ in range(n)]
    scale = 1e-3 if kind == "tiny" else 1e5
    return [rng.lognormvariate(0, 2) * rng.choice([1.0, scale]) for _ in range(n)]


@pytest.mark.parametrize("n", SIZES)
def test_sum_and_mean_are_numpys_to_the_last_bit(n):
    rng = random.Random(n)
    for _ in range(5):
        xs = _values(rng, n)
        assert pairwise_sum(xs) == float(np.sum(np.array(xs)))
        assert mean(xs) == float(np.mean(np.array(xs)))


def test_pairwise_differs_from_a_plain_loop_so_the_check_means_something():
    rng = random.Random(0)
    xs = [rng.lognormvariate(0, 3) for _ in range(10_000)]
    plain = 0.0
    for x in xs:
        plain += x
    assert pairwise_sum(xs) != plain


@pytest.mark.parametrize("n", [1, 2, 3, 10, 99, 100, 101, 1000, 10_000])
def test_percentile_is_numpys_linear_percentile(n):
    rng = random.Random(n)
    xs = _values(rng, n)
    for q in (0, 0.5, 1, 25, 50, 75, 90, 95, 99, 99.9, 100):
        assert percentile(xs, q) == float(np.percentile(np.array(xs), q)), q


def test_dot_is_the_correctly_rounded_sum_of_products():
    w, v = [0.1] * 10, [3.0] * 10
    assert dot(w, v) == math.fsum(a * b for a, b in zip(w, v))
    assert dot([0.125] * 8, [float(i) for i in range(8)]) == 3.5


def test_bad_input_says_what_to_change():
    with pytest.raises(ServebookError, match="at least one value"):
        mean([])
    with pytest.raises(ServebookError, match="at least one value"):
        percentile([], 50)
    with pytest.raises(ServebookError, match="outside 0-100"):
        percentile([1.0], 101)
    with pytest.raises(ServebookError, match="3 weights and 2 values"):
        dot([1.0, 2.0, 3.0], [1.0, 2.0])
