"""The step loop: arrivals, scheduling, the clock, and what gets recorded.

:func:`simulate` runs a list of :class:`~servebook.simulator.workload.RequestSpec`
through a scheduler (see :mod:`servebook.simulator.scheduler`) one step at a time.
Each step lasts ``step_time_s(num_prefill_tokens, num_decode_seqs, context_tokens)``
seconds; tokens sampled in a step become visible at its end. A step that schedules
no tokens (every running request was preempted) takes no time, as vLLM skips the
forward pass when ``total_num_scheduled_tokens`` is 0.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

from servebook.errors import ServebookError
from servebook.reductions import mean, pairwise_sum, percentile
from servebook.simulator.config import SchedulerConfig
from servebook.simulator.contiguous import reservation_tokens
from servebook.simulator.decode_lane import DecodeLane
from servebook.simulator.scheduler import RequestState, make_scheduler
from servebook.simulator.step_time import LinearStepTime, StepTimeModel
from servebook.simulator.workload import RequestSpec


@dataclass
class StepTrace:
    """Per-step columns (one entry per step; times in seconds, memory in slots/blocks).

    ``reserved_slots`` are KV slots set aside for running requests (allocated blocks
    × block_size for paged; reserved ranges for contiguous); ``held_tokens`` those
    that hold a computed token; ``blocks_used`` = ``ceil(reserved_slots / block_size)``.
    ``batches`` (only with ``record_batches=True``): ``{request_id: tokens}`` per step.
    """

    start_s: list[float] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    scheduled_tokens: list[int] = field(default_factory=list)
    prefill_tokens: list[int] = field(default_factory=list)
    decode_seqs: list[int] = field(default_factory=list)
    scheduled_seqs: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)
    blocks_used: list[int] = field(default_factory=list)
    blocks_free: list[int] = field(default_factory=list)
    reserved_slots: list[int] = field(default_factory=list)
    held_tokens: list[int] = field(default_factory=list)
    batches: list[dict[str, int]] | None = None

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def reserved_empty_slots(self) -> list[int]:
        """Reserved KV slots that hold no token, per step."""
        return [r - h for r, h in zip(self.reserved_slots, self.held_tokens)]


@dataclass(frozen=True)
class RequestMetrics:
    """Latencies of one request, in seconds from its arrival.

    ``ttft_s``: arrival to first output token; ``mean_itl_s``: mean gap between
    later tokens (0 for one-token outputs); ``max_itl_s``: longest such gap (a
    preemption shows up here); ``latency_s``: arrival to being returned.
    ``start_s``, ``first_token_s``, ``last_token_s``, ``finish_s`` are clock times
    (seconds from the start of the run): first scheduled, first and last token,
    returned (static batching returns a request with its whole batch).
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    mean_itl_s: float
    max_itl_s: float
    latency_s: float
    preemptions: int
    prefix_hit_tokens: int
    start_s: float
    first_token_s: float
    last_token_s: float
    finish_s: float


@dataclass
class SimulationResult:
    """Everything one run produced."""

    config: SchedulerConfig
    steps: StepTrace
    requests: list[RequestMetrics]
    num_preemptions: int
    snapshot: dict | None = None

    def summary(self) -> dict:
        """Headline numbers: throughput (tokens/s), latency percentiles (s), KV use (fraction).

        Means and percentiles as numpy computes them (:mod:`servebook.reductions`), without numpy.
        """
        steps = self.steps
        makespan = steps.start_s[-1] + steps.duration_s[-1] if len(steps) else 0.0
        ttft = [r.ttft_s for r in self.requests]
        itl = [r.mean_itl_s for r in self.requests if r.output_tokens > 1] or [0.0]
        latency = [r.latency_s for r in self.requests]
        out_tokens = sum(r.output_tokens for r in self.requests)
        prompt_tokens = sum(r.prompt_tokens for r in self.requests)
        busy = [(float(h), float(r), d) for h, r, d in zip(steps.held_tokens, steps.reserved_slots, steps.duration_s)
                if r > 0 and d > 0]
        util = (pairwise_sum([h / r * d for h, r, d in busy]) / pairwise_sum([d for _, _, d in busy])
                if busy else 0.0)
        return {
            "policy": self.config.policy,
            "num_requests": len(self.requests),
            "num_steps": len(steps),
            "makespan_s": makespan,
            "output_tokens_per_s": out_tokens / makespan if makespan else 0.0,
            "total_tokens_per_s": (out_tokens + prompt_tokens) / makespan if makespan else 0.0,
            "requests_per_s": len(self.requests) / makespan if makespan else 0.0,
            "ttft_mean_s": mean(ttft),
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p99_s": percentile(ttft, 99),
            "itl_mean_s": mean(itl),
            "latency_mean_s": mean(latency),
            "latency_p99_s": percentile(latency, 99),
            "preemptions": self.num_preemptions,
            # sliding-window pools hold several groups' blocks per token: no slot-level figure
            "kv_utilisation": None if self.config.grouped else util,
            "peak_blocks_used": max(steps.blocks_used) if len(steps) else 0,
            # a sum of counts is exact in floats in any order, so this is numpy.mean's value too
            "mean_running": float(sum(steps.running)) / len(steps) if len(steps) else 0.0,
            "peak_running": max(steps.running) if len(steps) else 0,
        }

    def to_json(self, include_steps: bool = False) -> str:
        """The summary (and optionally the per-step trace) as JSON."""
        data: dict = {"config": asdict(self.config), "summary": self.summary()}
        if include_steps:
            data["steps"] = {k: v for k, v in asdict(self.steps).items() if v is not None}
            data["requests"] = [asdict(r) for r in self.requests]
        return json.dumps(data, indent=2)


def _check_fits(requests: list[RequestSpec], config: SchedulerConfig) -> None:
    """Refuse requests that could never be served under ``config``."""
    for spec in requests:
        if spec.total_tokens > config.max_model_len:
            raise ServebookError(
                f"request {spec.request_id} needs {spec.total_tokens} tokens (prompt + output) but "
                f"max_model_len is {config.max_model_len}; raise max_model_len or shorten the request"
            )
        if config.policy == "paged":
            # The last sampled token is never written to the cache: at most total - 1 slots.
            if config.grouped:
                need = max(config.admission_blocks(min(spec.prompt_tokens, config.max_model_len)),
                           config.running_blocks(spec.total_tokens - 1, 1))
            else:
                need = math.ceil((spec.total_tokens - 1) / config.block_size)
            if need > config.num_blocks:
                raise ServebookError(
                    f"request {spec.request_id} needs {need} KV blocks but the pool has "
                    f"{config.num_blocks}; give more num_blocks or shorter requests"
                )
        else:
            need = reservation_tokens(spec.total_tokens, config.max_model_len, config.reservation)
            if need > config.capacity_tokens:
                raise ServebookError(
                    f"request {spec.request_id} reserves {need} contiguous slots but the pool has "
                    f"{config.capacity_tokens}; give more num_blocks or a smaller max_model_len"
                )


def simulate(
    requests: list[RequestSpec],
    config: SchedulerConfig,
    step_time_s: StepTimeModel | None = None,
    *,
    record_batches: bool = False,
    max_steps: int | None = None,
    snapshot_at_step: int | None = None,
    lazy_decoders: bool = True,
) -> SimulationResult:
    """Serve ``requests`` under ``config`` and record every step.

    Args:
        requests: the workload (any order; served by arrival time, ties by list order).
        config: scheduler settings and policy.
        step_time_s: step cost model; default :class:`LinearStepTime()`. A model whose
            ``prices_step_content`` is true (e.g. :class:`~servebook.simulator.step_time.PerfStepTime`)
            is called as ``step_time_s.step_s(prefill_chunks, decode_contexts)`` instead:
            ``(tokens, prior_tokens, completes_prompt)`` per request prefilling in the step
            and the tokens already cached for each decoding request.
        record_batches: also record ``{request_id: tokens}`` for every step.
        max_steps: stop with an error after this many steps (a guard; default unlimited).
        snapshot_at_step: keep a picture of KV memory after this step's writes
            (``result.snapshot``, see :func:`memory_snapshot`).
        lazy_decoders: advance requests that only decode as sums
            (:mod:`servebook.simulator.decode_lane`; paged policy, without ``record_batches`` or
            ``snapshot_at_step``): the same results, several times faster at large batches.
            False visits every request in every step.
    """
    if not requests:
        raise ServebookError("the workload is empty; give at least one request")
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ServebookError("request ids repeat; give every request a unique request_id")
    _check_fits(requests, config)
    cost = step_time_s or LinearStepTime()
    detailed = bool(getattr(cost, "prices_step_content", False))
    with_total = detailed and bool(getattr(cost, "takes_context_total", False))
    lane = _decode_lane(config, cost, detailed) if (
        lazy_decoders and not record_batches and snapshot_at_step is None) else None
    sched = make_scheduler(config, lane)
    states = [RequestState(spec, i, config.block_size) for i, spec in enumerate(requests)]
    order = sorted(states, key=lambda s: (s.spec.arrival_s, s.index))
    trace = StepTrace(batches=[] if record_batches else None)
    bs = config.block_size
    clock = 0.0
    next_arrival = 0
    unfinished = len(states)
    metrics: list[RequestMetrics | None] = [None] * len(states)
    snapshot = None

    while unfinished:
        while next_arrival < len(order) and order[next_arrival].spec.arrival_s <= clock:
            sched.add(order[next_arrival])
            next_arrival += 1
        if not sched.running and not sched.waiting:
            clock = order[next_arrival].spec.arrival_s
            continue
        scheduled, preempted = sched.schedule()
        in_lane = lane.count if lane is not None else 0  # decoders scheduled as one sum, one token each
        if not scheduled and not preempted and not in_lane:
            if sched.running and all(r.done for r in sched.running):
                pass  # static batch of finished members: released below
            elif next_arrival < len(order) and not sched.running:
                clock = order[next_arrival].spec.arrival_s
                continue
            else:
                head = sched.waiting[0].rid if sched.waiting else "?"
                raise ServebookError(
                    f"the scheduler is stuck: request {head} cannot be admitted into an otherwise "
                    f"idle engine; give more KV blocks or a larger max_num_batched_tokens"
                )
        # The step's content, in one pass: (tokens, prior_tokens, completes_prompt) per prefilling
        # request and the tokens already cached for each decoding request (its context), before the step.
        decode = context = total = decode_context = 0
        chunks: list[tuple[int, int, bool]] = []
        contexts: list[int] = []
        for r, n in scheduled:
            total += n
            before = r.num_computed
            computed = before + n
            context += computed
            # a decode: one new token right after an output token (not a prompt's last token)
            if n == 1 and r.num_output and computed == r.num_tokens:
                decode += 1
                decode_context += before
                contexts.append(before)
            else:
                chunks.append((n, before, computed >= r.num_tokens))
        if in_lane:
            total += in_lane
            decode += in_lane
            context += lane.context_total + in_lane
        prefill = total - decode
        if not total:
            dt = 0.0
        elif in_lane and detailed:
            dt = cost.step_s_with_lane(chunks, contexts, in_lane, lane.context_total, lane.capped)
            if dt is None:  # a sum passed 2**53: price with every context, in the running queue's order
                dt = cost.step_s(chunks, _decode_contexts_in_order(sched, scheduled))
        elif with_total:
            dt = cost.step_s(chunks, contexts, context_total=decode_context)
        elif detailed:
            dt = cost.step_s(chunks, contexts)
        else:
            dt = cost(prefill, decode, context)
        end = clock + dt
        sched.computed_running += total
        finished: list[RequestState] = []
        sampled: list[RequestState] = []
        for r, n in scheduled:
            if r.start_s is None:
                r.start_s = clock
            computed = r.num_computed + n
            r.num_computed = computed
            if computed >= r.num_tokens:
                r.num_tokens += 1
                r.num_output = out = r.num_output + 1
                if r.first_token_s is None:
                    r.first_token_s = end
                else:
                    gap = end - r.last_token_s
                    if gap > r.max_gap_s:
                        r.max_gap_s = gap
                r.last_token_s = end
                sampled.append(r)
                if out >= r.num_output_target:
                    finished.append(r)
        # Occupancy is recorded after the step's KV writes, before frees.
        reserved = sched.reserved_slots()
        trace.start_s.append(clock)
        trace.duration_s.append(dt)
        trace.scheduled_tokens.append(total)
        trace.prefill_tokens.append(prefill)
        trace.decode_seqs.append(decode)
        trace.scheduled_seqs.append(len(scheduled) + in_lane)
        trace.running.append(len(sched.running))
        trace.waiting.append(len(sched.waiting))
        trace.preemptions.append(preempted)
        trace.reserved_slots.append(reserved)
        trace.held_tokens.append(sched.held_tokens())
        used = -(-reserved // bs)
        trace.blocks_used.append(used)
        trace.blocks_free.append(config.num_blocks - used)
        if record_batches:
            trace.batches.append({r.rid: n for r, n in scheduled})
        if snapshot_at_step == len(trace) - 1:
            snapshot = memory_snapshot(sched)
            snapshot["time_s"] = end
        if lane is not None:
            lane.advance(end, clock)
            step = len(trace) - 1
            if step >= lane.open_at:
                for r in sampled:  # joins if it only decodes for another step or more (not when it finished)
                    if sched.settled(r):
                        lane.join(r, step)
        clock = end
        if finished or (sched.running and all(r.done for r in sched.running)):
            for r in sched.finish(finished):
                r.finish_s = clock
                unfinished -= 1
                spec = r.spec
                n_out = r.num_output
                metrics[r.index] = RequestMetrics(
                    request_id=r.rid,
                    arrival_s=spec.arrival_s,
                    prompt_tokens=spec.prompt_tokens,
                    output_tokens=n_out,
                    ttft_s=r.first_token_s - spec.arrival_s,
                    mean_itl_s=(r.last_token_s - r.first_token_s) / (n_out - 1) if n_out > 1 else 0.0,
                    max_itl_s=r.max_gap_s,
                    latency_s=clock - spec.arrival_s,
                    preemptions=r.num_preemptions,
                    prefix_hit_tokens=r.prefix_hit_tokens,
                    start_s=r.start_s,
                    first_token_s=r.first_token_s,
                    last_token_s=r.last_token_s,
                    finish_s=clock,
                )
        if max_steps is not None and len(trace) >= max_steps:
            raise ServebookError(f"simulation passed max_steps={max_steps}; raise the limit")
    return SimulationResult(config=config, steps=trace, requests=metrics,
                            num_preemptions=sched.num_preemptions, snapshot=snapshot)


def _decode_lane(config: SchedulerConfig, cost, detailed: bool) -> DecodeLane | None:
    """A decode lane for this run, or None where it cannot be used: other policies than paged, and
    step models that need every decoder's context (those that price from sums say which windows)."""
    if config.policy != "paged":
        return None
    windows = getattr(cost, "lane_windows", None) if detailed else ()
    if windows is None:
        return None
    return DecodeLane(config.block_size, config.max_model_len, windows, pool_config=config)


def _decode_contexts_in_order(sched, scheduled) -> list[int]:
    """Every decoder's context before this step, in the running queue's order, lane members included
    (what ``step_s`` is given when nobody is in the lane)."""
    lane = sched.lane
    step = lane.step
    outside = {id(r): r.num_computed for r, n in scheduled
               if n == 1 and r.num_output and r.num_computed + 1 == r.num_tokens}
    return [lane.context_now(r, step) if r.lane_since is not None else outside[id(r)]
            for r in sched.running if r.lane_since is not None or id(r) in outside]


def memory_snapshot(sched) -> dict:
    """KV memory of a scheduler at this moment, for pictures.

    Paged: ``{"kind": "paged", "block_size", "num_blocks", "tables": {request: [block ids]},
    "owner": [request | "shared" | None per block], "filled": [tokens per block],
    "cached_free": [bool per block]}`` (a free block that still holds a findable prefix).
    Contiguous/static: ``{"kind": "contiguous", "capacity_tokens",
    "ranges": [(start, length, request, filled tokens)]}``.
    """
    cfg = sched.config
    if cfg.policy == "paged":
        bs = cfg.block_size
        owner: list = [None] * cfg.num_blocks
        filled = [0] * cfg.num_blocks
        tables = {}
        for r in sched.running:
            tables[r.rid] = list(r.blocks)
            for i, block in enumerate(r.blocks):
                owner[block] = "shared" if sched.pool.ref_cnt[block] > 1 else r.rid
                filled[block] = max(filled[block], min(bs, max(0, r.num_computed - i * bs)))
        cached_free = [owner[b] is None and sched.pool.block_key[b] is not None for b in range(cfg.num_blocks)]
        return {"kind": "paged", "block_size": bs, "num_blocks": cfg.num_blocks, "tables": tables,
                "owner": owner, "filled": filled, "cached_free": cached_free}
    by_id = {r.rid: r for r in sched.running}
    ranges = [(start, length, rid, min(length, by_id[rid].num_computed) if rid in by_id else 0)
              for rid, (start, length) in sorted(sched.memory.ranges.items(), key=lambda kv: kv[1][0])]
    return {"kind": "contiguous", "capacity_tokens": cfg.capacity_tokens, "ranges": ranges}
