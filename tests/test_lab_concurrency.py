"""servebook.lab.harness.concurrency.peak_concurrency: the most requests running at one instant."""
from __future__ import annotations

import random

import pytest

from servebook.errors import ServebookError
from servebook.lab.harness.concurrency import peak_concurrency


def _peak_by_probing(intervals):
    """Independent oracle: the peak of closed intervals is reached at some interval's start."""
    return max((sum(1 for a, b in intervals if a <= t <= b) for t, _ in intervals), default=0)


def test_hand_cases():
    assert peak_concurrency([]) == 0
    assert peak_concurrency([(0, 1)]) == 1
    assert peak_concurrency([(0, 1), (2, 3)]) == 1          # one after the other
    assert peak_concurrency([(0, 10), (2, 3), (4, 5)]) == 2  # nested, the inner ones apart
    assert peak_concurrency([(0, 10), (1, 9), (2, 8)]) == 3
    assert peak_concurrency([(5, 5)]) == 1                   # one output token: first == last


def test_intervals_touching_at_a_step_timestamp_overlap():
    # Requests whose tokens came out of one engine step share its timestamp: both were in that step.
    assert peak_concurrency([(0, 2), (2, 4)]) == 2
    assert peak_concurrency([(0, 2), (2, 4), (4, 6)]) == 2


def test_matches_probing_on_random_step_grids():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        intervals = []
        for _ in range(n):
            a = rng.randint(0, 50)  # integer "step timestamps", so ties are common
            intervals.append((a, a + rng.randint(0, 20)))
        assert peak_concurrency(intervals) == _peak_by_probing(intervals)


def test_interval_ending_before_it_starts_is_an_error():
    with pytest.raises(ServebookError, match="one clock"):
        peak_concurrency([(3.0, 1.0)])
