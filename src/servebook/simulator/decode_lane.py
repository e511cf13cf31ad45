"""Plain decoders advanced together: the simulator's fast path, with the same results.

In most steps of a busy engine most running requests are *plain decoders*: each is scheduled one
token, samples one token, and nothing else happens to it until it needs a new KV block (once every
``block_size`` tokens), finishes, reaches ``max_model_len`` or its context reaches a sliding window.
Visiting each of them in every step is most of a long simulation's time; a step of 256 decoders
would cost 256 visits where about 256 / 16 of them need anything.

A :class:`DecodeLane` holds such requests without visiting them. A member's counters are those it
had when it joined plus the steps since (``num_computed``, ``num_tokens`` and ``num_output`` each
grow by one a step), its last token came at the end of the latest step, and its longest gap between
tokens is the longest step since it joined. What the step needs of the lane is kept as sums: the
number of members, the sum of their contexts and, per sliding window, the sum of their contexts
capped at the window (what the step-time model reads). Each member has one pending *event*:

* a **block** step, where its next token needs a new KV block: the lane takes it from the pool in
  that step (the step's takes all come off the head of the free queue, so which request gets which
  of the step's blocks does not change anything but the block numbers), and the member stays;
* its **exit** step, where it finishes, would pass ``max_model_len`` or its context reaches a
  window: it is brought up to date and scheduled one by one again (and may rejoin after the step).

Its full blocks are hashed for the prefix cache when it leaves (the scheduler does it): no other
request can look up a running request's own blocks, and it frees them only after leaving.

A step the lane cannot take this way -- one whose running pass might run out of token budget or of
free blocks, where vLLM's order decides who is cut or preempted -- first brings every member up to
date (:meth:`DecodeLane.leave_all`) and runs one request at a time. ``simulate(...,
lazy_decoders=False)`` never uses the lane; tests check that both give the same results.
"""
from __future__ import annotations


class DecodeLane:
    """Running requests that only decode, advanced as sums (see module docstring).

    Args:
        block_size: tokens per KV block.
        max_model_len: the engine's limit on a request's tokens.
        windows: sliding windows (tokens) whose capped context sums the step model reads.
    """

    #: steps nobody joins after the lane had to be emptied, at first and at most
    FIRST_PAUSE = 32
    LONGEST_PAUSE = 4096

    def __init__(self, block_size: int, max_model_len: int, windows: tuple[int, ...] = (), pool_config=None) -> None:
        self.block_size = block_size
        #: the scheduler's config when its pool has sliding-window groups (blocks per group), else None
        self.grouped = pool_config if pool_config is not None and pool_config.grouped else None
        self.max_model_len = max_model_len
        self.windows = tuple(windows)
        #: the sum of the members' contexts (tokens in their KV cache) and, per window, the sum of
        #: contexts capped at it and how many members are still below it
        self.context_total = 0
        self.capped = [0] * len(self.windows)
        self.below = [0] * len(self.windows)
        self.members: set = set()
        self._block_due: dict[int, list] = {}
        self._exit_due: dict[int, list] = {}
        #: per step index (one entry per closed step, see :meth:`advance`): when the step ended and its
        #: length as seen by a decoder (end - start), seconds
        self.step_ends: list[float] = []
        self.step_gaps: list[float] = []
        #: after a step run one request at a time, nobody joins before step ``open_at``; the pause
        #: doubles while such steps keep coming soon after it ends (a pool that keeps running short)
        self.pause = self.FIRST_PAUSE
        self.open_at = 0

    @property
    def count(self) -> int:
        """Members now (each is scheduled one token in the step being scheduled)."""
        return len(self.members)

    @property
    def step(self) -> int:
        """Index of the step being scheduled: the steps closed so far."""
        return len(self.step_ends)

    # -- joining and leaving ---------------------------------------------------
    def join(self, r, step: int) -> bool:
        """Take ``r``, up to date after step ``step`` in which it sampled a token, if it stays a plain
        decoder for at least one more step; returns whether it joined."""
        if step < self.open_at:
            return False
        c0 = r.num_computed
        exit_in = min(r.num_output_target - r.num_output, self.max_model_len - c0)
        for w in self.windows:
            if c0 < w and w - c0 + 1 < exit_in:
                exit_in = w - c0 + 1
        if exit_in < 2:
            return False
        r.lane_since = step
        r.lane_exit = step + exit_in
        allocated = (-(-c0 // self.block_size) if self.grouped else len(r.blocks)) * self.block_size
        self._plan(r, step + allocated - c0 + 1)
        self.members.add(r)
        self.context_total += c0
        for i, w in enumerate(self.windows):
            if c0 < w:
                self.capped[i] += c0
                self.below[i] += 1
            else:
                self.capped[i] += w
        return True

    def _plan(self, r, block_step: int) -> None:
        """File ``r``'s next event: its next block, or its exit if that comes first."""
        if block_step < r.lane_exit:
            self._block_due.setdefault(block_step, []).append(r)
        else:
            self._exit_due.setdefault(r.lane_exit, []).append(r)

    def _leave(self, r, upto: int) -> None:
        """Bring ``r`` up to date after step ``upto`` and take it out."""
        since = r.lane_since
        c0 = r.num_computed
        steps = upto - since
        c = c0 + steps
        if steps:
            r.num_computed = c
            r.num_tokens += steps
            r.num_output += steps
            r.last_token_s = self.step_ends[upto]
            gap = max(self.step_gaps[since + 1:upto + 1])
            if gap > r.max_gap_s:
                r.max_gap_s = gap
        r.lane_since = None
        self.members.discard(r)
        self.context_total -= c
        for i, w in enumerate(self.windows):
            if c0 < w:  # counted below the window since joining: its share grew to c (<= w)
                self.capped[i] -= c
                self.below[i] -= 1
            else:
                self.capped[i] -= w

    def leave_due(self, step: int) -> list:
        """Members whose exit is step ``step``, brought up to date after the step before and taken out."""
        due = self._exit_due.pop(step, [])
        for r in due:
            self._leave(r, step - 1)
        return due

    def leave_all(self, step: int) -> list:
        """Every member, brought up to date after step ``step - 1`` and taken out (before a step run
        one request at a time)."""
        self.pause = min(2 * self.pause, self.LONGEST_PAUSE) if step < self.open_at + self.pause else self.FIRST_PAUSE
        self.open_at = step + self.pause
        gone = list(self.members)
        for r in gone:
            self._leave(r, step - 1)
        self._block_due.clear()
        self._exit_due.clear()
        return gone

    # -- a step -------------------------------------------------------------------
    def blocks_due(self, step: int) -> int:
        """KV blocks the members need in step ``step``."""
        due = self._block_due.get(step, ())
        if self.grouped is None:
            return len(due)
        return sum(self._increment(r, step) for r in due)

    def _increment(self, r, step: int) -> int:
        """Block ids member ``r`` takes in its block step ``step`` (sliding-window pools)."""
        context = r.num_computed + (step - r.lane_since) + 1
        return self.grouped.decode_block_increment(-(-context // self.block_size))

    def take_blocks(self, step: int, pool) -> int:
        """Give each member that needs one in step ``step`` a block from ``pool``; returns how many."""
        due = self._block_due.pop(step, None)
        if not due:
            return 0
        if self.grouped is not None:
            taken = 0
            for r in due:
                n = self._increment(r, step)
                r.blocks.extend(pool.take(n))
                taken += n
                self._plan(r, step + self.block_size)
            return taken
        for r, block in zip(due, pool.take(len(due))):
            r.blocks.append(block)
            self._plan(r, step + self.block_size)
        return len(due)

    def advance(self, end_s: float, start_s: float) -> None:
        """Close a step (every step, with members or not) that ran from ``start_s`` to ``end_s``:
        each member computed and sampled one more token."""
        self.step_ends.append(end_s)
        self.step_gaps.append(end_s - start_s)
        if self.count:
            self.context_total += self.count
            for i, n in enumerate(self.below):
                self.capped[i] += n

    def context_now(self, r, step: int) -> int:
        """A member's context (tokens in its KV cache) before step ``step``."""
        return r.num_computed + (step - 1 - r.lane_since)
