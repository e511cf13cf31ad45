"""vLLM schedulers that write one JSON line per engine step (imported by the engine, never by the book).

Pass ``--scheduler-cls servebook.lab.harness.step_recorder.RecordingScheduler`` (or
``RecordingAsyncScheduler`` where async scheduling is on, as on CUDA; the choice is made by
:func:`servebook.lab.harness.step_log.step_log_engine_args`) and set ``SERVEBOOK_STEP_LOG`` to a file
path in the engine's environment. Each ``schedule()`` call then appends::

    {"t": <time.monotonic() when the step was scheduled, s>, "total": <tokens scheduled>,
     "decodes": <requests given exactly 1 token>,
     "decode_ctx": <tokens already in the KV cache of those decoding requests, summed>,
     "prefills": [[tokens this step, prompt tokens, tokens computed before this step], ...]}

``total`` is vLLM's own ``SchedulerOutput.total_num_scheduled_tokens``. Scheduling is not
changed: the classes call vLLM's ``schedule()`` and only read its output. ``time.monotonic``
is the machine-wide monotonic clock, so the book's process can line steps up with the token
arrival times it measured (:mod:`servebook.lab.harness.itl`).

This module imports vLLM at import time: only the engine's interpreter (``.venv-vllm``) loads it.
"""
from __future__ import annotations

import json
import os
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

#: Environment variable naming the JSON-lines file the engine appends its steps to.
STEP_LOG_ENV = "SERVEBOOK_STEP_LOG"


class _StepWriter:
    def __init__(self) -> None:
        path = os.environ.get(STEP_LOG_ENV)
        self._file = open(path, "a", buffering=1) if path else None  # line-buffered: readable at once

    def write(self, scheduler, out) -> None:
        if self._file is None:
            return
        prefills, decodes, decode_ctx = [], 0, 0
        for req_id, n in out.num_scheduled_tokens.items():
            request = scheduler.requests.get(req_id)
            if request is None:
                prefills.append([int(n), -1, -1])
                continue
            # schedule() has already advanced num_computed_tokens by this step's share.
            before = request.num_computed_tokens - n
            # A request past its prompt that gets one token is decoding; anything else is prefill.
            if n == 1 and before >= request.num_prompt_tokens:
                decodes += 1
                decode_ctx += before
            else:
                prefills.append([int(n), int(request.num_prompt_tokens), int(before)])
        self._file.write(json.dumps({"t": time.monotonic(), "total": int(out.total_num_scheduled_tokens),
                                     "decodes": decodes, "decode_ctx": int(decode_ctx),
                                     "prefills": prefills}) + "\n")


class _RecordsSteps:
    """Mixin: call the vLLM scheduler's own ``schedule()``, then write one line for the step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._step_writer = _StepWriter()

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        self._step_writer.write(self, out)
        return out


class RecordingScheduler(_RecordsSteps, Scheduler):
    """vLLM's synchronous scheduler, recording every step (see the module docstring)."""


class RecordingAsyncScheduler(_RecordsSteps, AsyncScheduler):
    """vLLM's async scheduler (the CUDA default), recording every step (see the module docstring)."""
