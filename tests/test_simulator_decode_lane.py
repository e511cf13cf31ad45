"""The decode lane changes how fast the simulator runs, never what it computes.

``simulate(..., lazy_decoders=True)`` (the default) keeps requests that only decode in a
:class:`~servebook.simulator.decode_lane.DecodeLane` and advances them as sums; ``lazy_decoders=False``
visits every request in every step. Each test runs both and compares the whole result -- every
step's columns and every request's metrics, as JSON text, so a float that moved in its last bit
fails -- and checks that the lane was really used (members joined, took blocks, left at their
events), so that a lane that never engages cannot pass for one that works.
"""
from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from random_requests import fitting_requests, raw_requests
from servebook.simulator import LinearStepTime, RequestSpec, SchedulerConfig, simulate, synthetic_workload
from servebook.simulator import decode_lane
from servebook.simulator.step_time import PerfStepTime, perf_step_time_for


@pytest.fixture
def lane_events(monkeypatch):
    """Counts of what the lanes of the runs that follow did."""
    counts = {"joined": 0, "blocks": 0, "left": 0, "at_window": 0, "emptied": 0}
    lane = decode_lane.DecodeLane
    join, take, due, all_ = lane.join, lane.take_blocks, lane.leave_due, lane.leave_all

    def counted_join(self, r, step):
        ok = join(self, r, step)
        counts["joined"] += ok
        return ok

    def counted_take(self, step, pool):
        n = take(self, step, pool)
        counts["blocks"] += n
        return n

    def counted_due(self, step):
        gone = due(self, step)
        counts["left"] += len(gone)
        counts["at_window"] += sum(1 for r in gone if r.num_computed in self.windows)
        return gone

    def counted_all(self, step):
        counts["emptied"] += 1
        return all_(self, step)

    monkeypatch.setattr(lane, "join", counted_join)
    monkeypatch.setattr(lane, "take_blocks", counted_take)
    monkeypatch.setattr(lane, "leave_due", counted_due)
    monkeypatch.setattr(lane, "leave_all", counted_all)
    return counts


def _both(requests, config, step_model=None):
    """The two runs' results as JSON text (lane, no lane)."""
    lazy = simulate(requests, config, step_model).to_json(include_steps=True)
    every = simulate(requests, config, step_model, lazy_decoders=False).to_json(include_steps=True)
    return lazy, every


def _config(**kw):
    base = dict(num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=2048)
    base.update(kw)
    return SchedulerConfig(**base)


def test_stand_in_clock_same_steps_and_metrics(lane_events):
    requests = synthetic_workload(400, arrival_rate_per_s=40.0, max_model_len=2048, seed=3)
    lazy, every = _both(requests, _config())
    assert lazy == every
    assert lane_events["joined"] > 300 and lane_events["blocks"] > 1000 and lane_events["left"] > 300


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gemma-3-27b", "gpt-oss-20b"])
def test_perf_clock_same_steps_with_sliding_windows(model, lane_events):
    """Gemma 3 (1,024-token windows) and gpt-oss (128) price capped context sums: members leave
    when their context reaches a window, and the sums still give the per-decoder float."""
    step_model, _ = perf_step_time_for(model, "h200")
    rng = random.Random(1)
    requests = [RequestSpec(f"r{i}", rng.randint(50, 1500), rng.randint(20, 1200), i * 0.02) for i in range(150)]
    lazy, every = _both(requests, _config(max_model_len=4096, num_blocks=20000), step_model)
    assert lazy == every
    assert lane_events["joined"] >= len(requests) and lane_events["blocks"] > 1000 and lane_events["left"] > 100
    crossing = sum(1 for r in requests if any(r.prompt_tokens < w < r.prompt_tokens + r.output_tokens - 1
                                              for w in step_model.lane_windows))
    assert lane_events["at_window"] == crossing and (crossing >= 5 or model == "llama-3.1-8b")


def test_a_short_pool_empties_the_lane_and_stays_the_same(lane_events):
    """Few blocks: preemptions, so steps where the lane must be emptied and run one by one."""
    requests = synthetic_workload(300, arrival_rate_per_s=math.inf, max_model_len=1024, seed=5)
    lazy, every = _both(requests, _config(num_blocks=300, max_model_len=1024))
    assert lazy == every
    assert json.loads(lazy)["summary"]["preemptions"] > 0
    assert lane_events["emptied"] > 0 and lane_events["joined"] > 0


def test_prefix_sharing_and_a_prefill_threshold(lane_events):
    requests = synthetic_workload(300, arrival_rate_per_s=30.0, max_model_len=2048, shared_prefix_tokens=200,
                                  seed=7)
    config = _config(long_prefill_token_threshold=128, max_num_batched_tokens=512, num_blocks=1500)
    lazy, every = _both(requests, config)
    assert lazy == every
    assert lane_events["joined"] > 0 and lane_events["blocks"] > 0


def test_pricing_every_context_when_the_sums_cannot(monkeypatch, lane_events):
    """Where the step model's integer sums would pass 2**53 it answers None; the simulator then
    hands it every decoder's context in the running queue's order, lane members included."""
    monkeypatch.setattr(PerfStepTime, "step_s_with_lane", lambda self, *args: None)
    step_model, _ = perf_step_time_for("gemma-3-27b", "h200")
    requests = synthetic_workload(120, arrival_rate_per_s=20.0, max_model_len=2048, seed=2)
    lazy, every = _both(requests, _config(), step_model)
    assert lazy == every
    assert lane_events["joined"] > 100


def test_a_plain_function_clock(lane_events):
    def clock(prefill_tokens, decode_seqs, context_tokens):
        return 0.004 + 1e-4 * prefill_tokens + 3e-5 * decode_seqs + 1e-8 * context_tokens

    requests = synthetic_workload(200, arrival_rate_per_s=math.inf, max_model_len=2048, seed=4)
    lazy, every = _both(requests, _config(), clock)
    assert lazy == every
    assert lane_events["joined"] > 100


requests_st = raw_requests(max_prompt=150, max_output=120, max_arrival_s=3, max_size=40)


@settings(max_examples=60, deadline=None)
@given(requests_st, st.integers(6, 120), st.sampled_from([4, 8, 16]), st.integers(1, 24), st.integers(8, 300),
       st.integers(0, 40), st.booleans(), st.sampled_from([0.0, 0.01]))
def test_random_workloads_same_with_and_without_the_lane(raw, num_blocks, block_size, max_num_seqs, budget,
                                                         threshold, caching, base_s):
    """Any workload and pool, tight or loose: the same steps and metrics (a zero-cost step model too,
    where every token of a run comes at the same clock time)."""
    requests = fitting_requests(raw, num_blocks, block_size, max_model_len=256)
    config = SchedulerConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=budget, max_model_len=256,
                             long_prefill_token_threshold=threshold, enable_prefix_caching=caching)
    clock = LinearStepTime(base_s=base_s, prefill_token_s=base_s / 100, decode_seq_s=base_s / 200,
                           context_token_s=base_s / 10000)
    lazy, every = _both(requests, config, clock)
    assert lazy == every
