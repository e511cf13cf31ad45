"""The time a lab has left when its runner gave it a deadline.

A device ``run`` call lasts at most 600 s, so ``labs/tools/run_labs_gpu.sh`` caps every lab and
exports ``SERVEBOOK_LAB_DEADLINE``: the Unix time (seconds) by which the lab must have saved its
result. A lab that measures one engine after another asks :func:`fits` before each start, skips
what cannot finish in time (saying so in its result) and saves after every engine, so a lab cut
short still records what it measured. Without the variable (a lab run by hand) there is no limit.
"""
from __future__ import annotations

import os
import time

ENV = "SERVEBOOK_LAB_DEADLINE"


def seconds_left(now: float | None = None) -> float | None:
    """Seconds until the deadline (negative once past it), or None when no deadline is set."""
    from servebook.lab.errors import LabError

    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        deadline = float(raw)
    except ValueError:
        raise LabError(f"{ENV}={raw!r} is not a Unix time in seconds; set it like "
                       f"{ENV}=$(( $(date +%s) + 540 )) or unset it for no limit") from None
    return deadline - (time.time() if now is None else now)


def fits(needed_s: float, now: float | None = None) -> bool:
    """True when ``needed_s`` seconds of work can finish before the deadline (always, without one)."""
    left = seconds_left(now)
    return left is None or left >= needed_s
