"""A finite job's wall time: fleet's steady state plus the ramp and the drain, replayed in the simulator.

:func:`servebook.perf.fleet.plan` charges every request at the steady state's rate. A real job
starts with an empty batch (every first prompt is prefilled before most decoding can start) and
ends with a drain: the queue is empty, the last requests finish one after another at a falling
batch, and each step still costs nearly a full one (the weights are read whatever the batch). labs/e2e_results.md
compares fleet and this replay with the jobs recorded on an H200.

:func:`finite_job_seconds` replays ``n = min(requests per replica, REPLAY_BATCHES x batch)``
requests (lengths from :meth:`~servebook.perf.fleet.LengthDistribution.job_lengths`: a lognormal's ``n``
quantiles, so the longest request is as long as the longest of ``n`` draws is expected to be; in a
fixed shuffled order, all submitted at once) and adds what the replay took beyond the steady state's charge for those ``n`` requests
to fleet's time: the ramp and the drain cost the same whether the job has ``n`` requests or a
million. A job of at most ``n`` requests is the replay itself.

The replay runs the deployment's own engine: the KV pool, its groups (sliding-window groups free
the blocks that left the window, as vLLM does), ``max_num_seqs`` and the token budget all come
from the deployment's :class:`~servebook.plan.Plan` (:func:`~servebook.simulator.config.scheduler_config`).
"""
from __future__ import annotations

#: Requests replayed: this many times fleet's batch (the ramp and the drain are done by then).
REPLAY_BATCHES = 4


_GOLDEN = (5 ** 0.5 - 1) / 2


def _spread(sorted_lengths: list, *, offset: float) -> list:
    """``sorted_lengths`` in submission order: the request at position ``k`` gets the length of rank
    ``frac(offset + k x 0.618...) x n`` (a golden-ratio sequence), so every stretch of the job holds a
    representative spread of short and long requests, as random draws do on average, without one
    random shuffle's luck (which long requests land in the last wave) deciding a multi-wave job's drain.
    Prompt and output lengths use different offsets so that they are not paired rank for rank."""
    n = len(sorted_lengths)
    ranks = sorted(range(n), key=lambda k: (offset + k * _GOLDEN) % 1.0)
    out = [0.0] * n
    for rank, position in enumerate(ranks):
        out[position] = sorted_lengths[rank]
    return out


def _replay_requests(workload, n: int):
    from servebook.simulator.workload import RequestSpec

    order_in = _spread(workload.input_tokens.job_lengths(n), offset=0.0)
    order_out = _spread(workload.output_tokens.job_lengths(n), offset=0.5)
    return [RequestSpec(f"r{i}", max(1, round(a)), max(1, round(b))) for i, (a, b) in enumerate(zip(order_in, order_out))]


def finite_job_seconds(workload, d, coeffs, steady=None) -> dict:
    """Wall time (s) of ``workload`` on deployment ``d`` with the ramp and the drain.

    ``steady`` is :func:`servebook.perf.fleet.plan`'s result for the same arguments (computed when
    None). Returns ``seconds``, ``steady_seconds`` (fleet's), ``ramp_drain_s`` (their difference),
    ``replayed_requests``, ``output_tokens_per_s``, and of the replay ``peak_running`` (most requests
    running in one step), ``preemptions`` and ``kv_blocks`` (the pool's usable blocks).
    """
    from servebook.perf.fleet import plan
    from servebook.simulator.config import scheduler_config
    from servebook.simulator.run import simulate
    from servebook.simulator.step_time import perf_step_time

    p = steady or plan(workload, d, coeffs)
    per_replica = workload.requests / p.replicas
    n = int(min(per_replica, REPLAY_BATCHES * max(p.batch, 1)))
    n = max(n, 1)
    longest = int(workload.input_tokens.max + workload.output_tokens.max) + 1
    config = scheduler_config(d.plan, max_model_len=max(longest, d.plan.max_model_len),
                                     enable_prefix_caching=False)
    step = perf_step_time(d.spec, d.gpu, coeffs, tp=d.tp, kv_cache_dtype=d.kv_cache_dtype,
                          cudagraph_max_tokens=d.plan.cudagraph_max_tokens())
    summary = simulate(_replay_requests(workload, n), config, step).summary()
    replay = summary["makespan_s"]
    steady_s = p.hours * 3600
    extra = replay - steady_s * n / per_replica
    total = steady_s + extra
    return {"seconds": total, "steady_seconds": steady_s, "ramp_drain_s": extra, "replayed_requests": n,
            "output_tokens_per_s": workload.requests * workload.output_tokens.mean / total,
            "peak_running": summary["peak_running"], "preemptions": summary["preemptions"],
            "kv_blocks": config.num_blocks}
