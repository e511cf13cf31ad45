"""One scheduling step of a vLLM-like engine, and two older policies to compare.

:class:`PagedScheduler` follows ``Scheduler.schedule()`` in
``vllm/v1/core/sched/scheduler.py`` (vllm 0.27.1) for a decoder-only model with
one full-attention KV group, no speculative decoding and no KV connector:

1. The step has a token budget, ``max_num_batched_tokens``.
2. **Running requests first**, in running-queue order. Each asks for
   ``num_tokens - num_computed_tokens`` tokens (its whole remaining prompt, or 1
   when decoding), capped by ``long_prefill_token_threshold`` (if > 0), by the
   budget left, and by ``max_model_len - num_computed_tokens - 1``.
3. Blocks come from ``KVCacheManager.allocate_slots`` (``kv_cache_manager.py``):
   ``ceil((computed + new) / block_size)`` blocks minus those already held. If
   the free queue is too short the scheduler **preempts the last request of the
   running queue** (FCFS policy, ``self.running.pop()``), freeing its blocks and
   putting it at the *front* of the waiting queue with ``num_computed_tokens = 0``
   (``_preempt_request``: preemption by recompute), and retries. If the request
   preempted is the one being scheduled, the running pass stops.
4. **Waiting requests next**, only if nothing was preempted in this step and
   while the budget lasts and fewer than ``max_num_seqs`` requests run. The head
   of the queue first looks up the prefix cache (``get_computed_blocks``: full
   blocks only, at most ``num_tokens - 1`` tokens, so the last prompt token is
   always recomputed). With ``scheduler_reserve_full_isl`` (default True in
   0.27.1) it is admitted only if blocks for *all* its tokens fit
   (``full_sequence_must_fit``), plus the watermark. Cached blocks that sit in
   the free queue count against the free blocks since taking them removes them
   from it. If the head does not fit the waiting pass stops (no skipping).
5. After the step (``_update_after_schedule`` and ``update_from_output``),
   ``num_computed_tokens`` grows by the tokens scheduled; a request whose
   computed tokens reach its length samples one token; a request with all its
   output tokens finishes and frees its blocks.

Source locations in vllm 0.27.1 (``site-packages/vllm/``): ``v1/core/sched/scheduler.py``
``Scheduler.schedule`` (line 439; running pass 485, ``self.running.pop()`` 615, waiting pass
683, full-prompt check via ``allocate_slots(full_sequence_must_fit=...)``),
``_preempt_request`` (1274), ``_update_after_schedule`` (1317);
``v1/core/kv_cache_manager.py`` ``get_computed_blocks`` (229), ``allocate_slots`` (344);
``v1/core/block_pool.py`` ``get_new_blocks`` (647), ``touch`` (702), ``free_blocks`` (719);
``config/scheduler.py`` ``scheduler_reserve_full_isl`` and ``watermark`` (130-141);
``platforms/cpu.py`` ``check_and_update_config`` sets ``async_scheduling = False`` (144).

Differences from vLLM that the simulator accepts: no async scheduling (vLLM
0.27.1 turns it off on CPU; on GPU it only moves when outputs become visible),
no priority policy, no encoder inputs, no spec decoding, no sliding window.
"""
from __future__ import annotations

from collections import deque

from servebook.errors import ServebookError
from servebook.simulator.block_pool import BlockPool
from servebook.simulator.config import SchedulerConfig
from servebook.simulator.contiguous import ContiguousAllocator, reservation_tokens
from servebook.simulator.workload import RequestSpec
from servebook.vllm_rules import effective_long_prefill_threshold


class RequestState:
    """Mutable progress of one request inside the simulator.

    Token counters follow vLLM's ``Request``: ``num_tokens`` = prompt + tokens
    generated so far; ``num_computed_tokens`` = tokens whose KV is in the cache.
    """

    __slots__ = (
        "spec", "rid", "num_prompt", "num_output_target", "num_tokens", "num_computed",
        "num_output", "blocks", "num_cached_blocks", "prefix_full_blocks", "prefix_id",
        "first_token_s", "last_token_s", "max_gap_s", "finish_s", "start_s",
        "num_preemptions", "prefix_hit_tokens", "done", "index", "lane_since", "lane_exit",
    )

    def __init__(self, spec: RequestSpec, index: int, block_size: int) -> None:
        self.spec = spec
        self.index = index
        self.rid = spec.request_id
        self.num_prompt = spec.prompt_tokens
        self.num_output_target = spec.output_tokens
        self.num_tokens = spec.prompt_tokens
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        self.prefix_id = spec.prefix_id
        self.prefix_full_blocks = spec.prefix_tokens // block_size if spec.prefix_id else 0
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.max_gap_s = 0.0
        self.finish_s: float | None = None
        self.start_s: float | None = None
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.done = False
        #: the step after which it joined the simulator's decode lane (None: not in it) and the step it leaves
        self.lane_since: int | None = None
        self.lane_exit = 0

    def block_key(self, index: int):
        """Prefix-cache key of full block ``index`` (shared prefix or own content)."""
        if index < self.prefix_full_blocks:
            return (self.prefix_id, index)
        return (self.rid, index)


class _Base:
    """Queues and counters shared by the policies."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.num_preemptions = 0
        #: sum of num_computed over the running queue (the step loop adds each step's tokens)
        self.computed_running = 0

    def add(self, request: RequestState) -> None:
        self.waiting.append(request)

    def _long_prefill_cap(self) -> int:
        """This step's per-request prefill cap, tokens (0: none), by the configured release's rule
        (:func:`servebook.vllm_rules.effective_long_prefill_threshold`: from 0.32.0 a lone request,
        running or waiting, is not capped). Admitting moves a request from waiting to running, so
        the count is the same throughout the step, as vLLM's count at the step's start."""
        cfg = self.config
        return effective_long_prefill_threshold(cfg.long_prefill_token_threshold,
                                                len(self.running) + len(self.waiting), cfg.vllm_version)

    # Occupancy, for the trace ------------------------------------------------
    def reserved_slots(self) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def held_tokens(self) -> int:
        """Tokens whose KV is in memory (distinct slots; shared prefixes once)."""
        raise NotImplementedError  # pragma: no cover

    def release(self, request: RequestState) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def finish(self, finished: list[RequestState]) -> list[RequestState]:
        """Drop finished requests from the running queue (order kept) and free them;
        returns the requests handed back to their clients now."""
        if len(finished) <= 8:  # the usual step: one or two finish; list.remove is a scan in C
            for r in finished:
                self.running.remove(r)  # no __eq__: finds that very object
        else:
            gone = set(id(r) for r in finished)
            self.running = [r for r in self.running if id(r) not in gone]
        for r in finished:
            self.computed_running -= r.num_computed
            self.release(r)
        return finished


class PagedScheduler(_Base):
    """vLLM 0.27.1's scheduler over a paged :class:`BlockPool` (see module docstring).

    With a :class:`~servebook.simulator.decode_lane.DecodeLane`, running requests that only decode
    are kept in it and scheduled as one sum (their tokens, their block events), which gives the same
    steps.
    """

    def __init__(self, config: SchedulerConfig, lane=None) -> None:
        super().__init__(config)
        self.pool = BlockPool(config.num_blocks, enable_caching=config.enable_prefix_caching)
        self.caching = config.enable_prefix_caching
        #: sum of len(blocks) over the running queue (shared blocks counted once per user)
        self.blocks_running = 0
        self.lane = lane

    def _cache_full_blocks(self, r: RequestState, num_tokens_done: int) -> None:
        """Hash the request's blocks that are full once ``num_tokens_done`` are written
        (``KVCacheManager.allocate_slots`` caches up to ``min(computed + new, num_tokens)``)."""
        full = min(num_tokens_done, r.num_tokens) // self.config.block_size
        if full > r.num_cached_blocks:
            pool, blocks = self.pool, r.blocks
            for i in range(r.num_cached_blocks, full):
                pool.cache(blocks[i], r.block_key(i))
            r.num_cached_blocks = full

    def _preempt(self, victim: RequestState) -> None:
        """Preemption by recompute (``Scheduler._preempt_request``)."""
        self.computed_running -= victim.num_computed
        self.blocks_running -= len(victim.blocks)
        self.pool.free(victim.blocks)
        victim.blocks = []
        victim.num_cached_blocks = 0
        victim.num_computed = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def release(self, r: RequestState) -> None:
        self.blocks_running -= len(r.blocks)
        self.pool.free(r.blocks)
        r.blocks = []

    def schedule(self) -> tuple[list[tuple[RequestState, int]], int]:
        """One step: returns ``[(request, tokens scheduled)]`` and the preemptions made.

        With a lane, the list leaves out its members (``lane.count`` of them, one token each)."""
        lane = self.lane
        if lane is None:
            return self._schedule(self.running, self.config.max_num_batched_tokens)
        step = lane.step
        for r in lane.leave_due(step):
            self._caught_up(r)
        if lane.count:
            others = [r for r in self.running if r.lane_since is None]
            if self._lane_cannot_run_short(others):
                self.blocks_running += lane.take_blocks(step, self.pool)
                return self._schedule(others, self.config.max_num_batched_tokens - lane.count)
            for r in lane.leave_all(step):
                self._caught_up(r)
        return self._schedule(self.running, self.config.max_num_batched_tokens)

    def _lane_cannot_run_short(self, others: list[RequestState]) -> bool:
        """Whether this step's running pass gives every lane member its token and preempts nobody,
        even if each of ``others`` (the running requests outside the lane, in queue order) took all
        its remaining tokens: then the queue's order decides nothing for the lane. The budget must
        cover the members and the others ahead of the last member (those behind it may be cut, as
        a long prompt's chunk is); the free blocks must cover every block anyone could need."""
        cfg = self.config
        bs = cfg.block_size
        running = self.running
        behind = 0  # others after the last lane member
        while running[-1 - behind].lane_since is None:
            behind += 1
        ahead = len(others) - behind
        tokens = self.lane.count
        blocks = self.lane.blocks_due(self.lane.step)
        for i, r in enumerate(others):
            left = r.num_tokens - r.num_computed
            if left > 0:
                if i < ahead:
                    tokens += left
                if cfg.grouped:
                    need = cfg.running_blocks(r.num_tokens, r.num_tokens - r.num_computed) - len(r.blocks)
                else:
                    need = (r.num_tokens + bs - 1) // bs - len(r.blocks)
                if need > 0:
                    blocks += need
        return tokens <= cfg.max_num_batched_tokens and blocks <= len(self.pool.free_queue)

    def settled(self, r: RequestState) -> bool:
        """Whether ``r`` holds exactly what a decode step at its context holds (a sliding-window pool
        keeps a prefill chunk's extra blocks until the request's next step frees them): only then can
        it join the decode lane, whose members take blocks one token block at a time."""
        cfg = self.config
        return not cfg.grouped or len(r.blocks) == cfg.running_blocks(r.num_computed, 1)

    def _caught_up(self, r: RequestState) -> None:
        """Hash the blocks a request filled while in the lane (it did not, to save the visits)."""
        if self.caching:
            self._cache_full_blocks(r, r.num_computed)

    def _schedule(self, queue: list[RequestState], budget: int) -> tuple[list[tuple[RequestState, int]], int]:
        """The running pass over ``queue`` (the running queue, or the part of it outside the lane
        when nothing can be cut or preempted) with ``budget`` tokens, then the waiting pass."""
        cfg = self.config
        bs = cfg.block_size
        threshold = self._long_prefill_cap()
        max_len = cfg.max_model_len
        pool = self.pool
        scheduled: list[tuple[RequestState, int]] = []
        preempted = 0
        running = self.running

        caching = self.caching
        grouped = cfg.grouped
        free_queue = pool.free_queue
        append = scheduled.append
        i = 0
        n_running = len(queue)  # kept in step with running.pop() below (queue is running when it preempts)
        last_slot = max_len - 1
        while i < n_running and budget > 0:
            r = queue[i]
            computed = r.num_computed
            new = r.num_tokens - computed
            if new > 1:  # a decode (1 token) is never above the threshold or the budget (> 0 here)
                if 0 < threshold < new:
                    new = threshold
                if new > budget:
                    new = budget
            if new > last_slot - computed:
                new = last_slot - computed
            if new <= 0:
                i += 1
                continue
            end = computed + new
            blocks = r.blocks
            need = (cfg.running_blocks(end, new) if grouped else (end + bs - 1) // bs) - len(blocks)
            if need < 0:  # sliding groups: blocks that left the window go back (remove_skipped_blocks)
                pool.free(blocks[need:])
                del blocks[need:]
                self.blocks_running += need
            elif need > 0:
                ok = True
                while need > len(free_queue):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted += 1
                    if victim is r:
                        ok = False
                        break
                n_running = len(queue)
                if not ok:
                    break
                blocks.extend(pool.take(need))
                self.blocks_running += need
            if caching and end // bs > r.num_cached_blocks:
                self._cache_full_blocks(r, end)
            append((r, new))
            budget -= new
            i += 1

        if not preempted:
            waiting = self.waiting
            watermark = cfg.watermark_blocks
            while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
                r = waiting[0]
                hits: list[int] = []
                if self.caching and r.num_computed == 0:
                    max_hit_blocks = (r.num_tokens - 1) // bs
                    hits = pool.lookup([r.block_key(b) for b in range(max_hit_blocks)])
                hit_tokens = len(hits) * bs
                new = r.num_tokens - hit_tokens
                if 0 < threshold < new:
                    new = threshold
                if not cfg.enable_chunked_prefill and new > budget:
                    break
                if new > budget:
                    new = budget
                evictable = sum(1 for b in hits if pool.ref_cnt[b] == 0)
                mark = watermark if running else 0
                free = len(pool.free_queue)
                if cfg.reserve_full_prompt:
                    if grouped:  # no prefix caching here: no hits
                        full_need = cfg.admission_blocks(min(r.num_tokens, max_len))
                    else:
                        full_need = (min(r.num_tokens, max_len) + bs - 1) // bs - len(hits) + evictable
                    if full_need + mark > free:
                        break
                if grouped:
                    fresh = cfg.running_blocks(new, new)
                else:
                    fresh = (hit_tokens + new + bs - 1) // bs - len(hits)
                if fresh + evictable + mark > free:
                    break
                waiting.popleft()
                pool.touch(hits)
                r.blocks = hits + pool.take(fresh)
                self.blocks_running += len(r.blocks)
                self.computed_running += hit_tokens
                r.num_cached_blocks = len(hits)
                r.num_computed = hit_tokens
                if r.num_preemptions == 0:
                    r.prefix_hit_tokens = hit_tokens
                if self.caching:
                    self._cache_full_blocks(r, hit_tokens + new)
                running.append(r)
                scheduled.append((r, new))
                budget -= new
        return scheduled, preempted

    def reserved_slots(self) -> int:
        """Slots in allocated blocks (used blocks × block_size)."""
        return (self.pool.num_blocks - len(self.pool.free_queue)) * self.config.block_size

    def held_tokens(self) -> int:
        """Slots in used blocks minus the unwritten tail of each running request
        (shared blocks are full, so counting them once per user cancels out). A pool with
        sliding-window groups holds block ids of several groups per token: there it returns the
        reserved slots (the utilisation figure is not reported for such pools)."""
        if self.config.grouped:
            return self.reserved_slots()
        empty = self.blocks_running * self.config.block_size - self.computed_running
        return self.reserved_slots() - empty


class ContiguousScheduler(_Base):
    """Continuous batching over a contiguous, worst-case reservation per request.

    Same step rules as :class:`PagedScheduler` (running first, token budget,
    chunked prefill, ``max_num_seqs``), but a request is admitted only when a
    contiguous hole of :func:`reservation_tokens` slots exists; it then never
    needs more memory, so nothing is ever preempted, and prefixes are not shared.
    """

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.memory = ContiguousAllocator(config.capacity_tokens)

    def release(self, r: RequestState) -> None:
        self.memory.release(r.rid)

    def _reservation(self, r: RequestState) -> int:
        return reservation_tokens(r.spec.total_tokens, self.config.max_model_len, self.config.reservation)

    def _schedule_running(self, budget: int) -> tuple[list[tuple[RequestState, int]], int]:
        threshold = self._long_prefill_cap()
        scheduled = []
        for r in self.running:
            if budget <= 0:
                break
            if r.done:
                continue
            new = r.num_tokens - r.num_computed
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            if new > 0:
                scheduled.append((r, new))
                budget -= new
        return scheduled, budget

    def _admit(self, r: RequestState, budget: int) -> int | None:
        """Tokens to schedule for newly admitted ``r``, or None if it cannot start."""
        cfg = self.config
        new = r.num_tokens
        threshold = self._long_prefill_cap()
        if 0 < threshold < new:
            new = threshold
        if not cfg.enable_chunked_prefill and new > budget:
            return None
        if self.memory.allocate(r.rid, self._reservation(r)) is None:
            return None
        return min(new, budget)

    def schedule(self) -> tuple[list[tuple[RequestState, int]], int]:
        scheduled, budget = self._schedule_running(self.config.max_num_batched_tokens)
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            new = self._admit(self.waiting[0], budget)
            if new is None:
                break
            r = self.waiting.popleft()
            self.running.append(r)
            scheduled.append((r, new))
            budget -= new
        return scheduled, 0

    def reserved_slots(self) -> int:
        return self.memory.reserved_tokens

    def held_tokens(self) -> int:
        return self.computed_running


class StaticScheduler(ContiguousScheduler):
    """Static batching: a batch of up to ``max_num_seqs`` starts only when the
    previous batch has *wholly* finished; members that finish early keep their
    reservation and are returned with the batch (``done`` until the batch ends)."""

    def schedule(self) -> tuple[list[tuple[RequestState, int]], int]:
        if self.running:
            scheduled, _ = self._schedule_running(self.config.max_num_batched_tokens)
            return scheduled, 0
        budget = self.config.max_num_batched_tokens
        scheduled = []
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            r = self.waiting[0]
            if self.memory.allocate(r.rid, self._reservation(r)) is None:
                break
            self.waiting.popleft()
            self.running.append(r)
            if budget > 0:
                new = r.num_tokens
                threshold = self._long_prefill_cap()
                if 0 < threshold < new:
                    new = threshold
                new = min(new, budget)
                scheduled.append((r, new))
                budget -= new
        return scheduled, 0

    def finish(self, finished: list[RequestState]) -> list[RequestState]:
        """Mark members done; release (and return) the whole batch once every member is done."""
        for r in finished:
            r.done = True
        if self.running and all(r.done for r in self.running):
            batch, self.running = self.running, []
            for r in batch:
                self.computed_running -= r.num_computed
                self.release(r)
            return batch
        return []


def make_scheduler(config: SchedulerConfig, lane=None):
    """The scheduler object for ``config.policy`` (``lane``: a DecodeLane, paged policy only)."""
    if config.policy == "paged":
        return PagedScheduler(config, lane)
    if config.policy == "contiguous":
        return ContiguousScheduler(config)
    if config.policy == "static":
        return StaticScheduler(config)
    raise ServebookError(f"unknown policy {config.policy!r}")  # pragma: no cover - config validates
