"""How many requests an engine held at once, from each request's start and end timestamps.

vLLM stamps every request's engine-side events (``RequestOutput.metrics``, a
``RequestStateStats`` when the engine runs with ``disable_log_stats=False``): ``scheduled_ts``,
``first_token_ts``, ``last_token_ts`` (seconds, the engine core's ``time.monotonic``). All
requests whose tokens came out of one engine step carry that step's timestamp, so two intervals
that touch at a timestamp belonged to the same step: the sweep counts an interval as open at both
of its ends (closed intervals), starts before ends at equal times.
"""
from __future__ import annotations

from typing import Iterable

from servebook.errors import ServebookError


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """The most closed intervals ``[start, end]`` (seconds) that share an instant; 0 for none.

    Raises ServebookError when an interval ends before it starts (timestamps out of order:
    check that both come from the same clock).
    """
    events = []
    for start, end in intervals:
        if end < start:
            raise ServebookError(f"interval ends at {end} before it starts at {start}; use timestamps from one clock")
        events.append((start, 0))  # 0 sorts before 1: at equal times a start is counted before an end
        events.append((end, 1))
    events.sort()
    running = peak = 0
    for _, kind in events:
        running += 1 if kind == 0 else -1
        peak = max(peak, running)
    return peak
