"""The engine's own record of every step: how many tokens vLLM scheduled, and for which prefill.

:mod:`servebook.lab.harness.step_recorder` (loaded by the engine through ``--scheduler-cls``) appends one
JSON line per ``schedule()`` call to the file named by ``SERVEBOOK_STEP_LOG``. This module, which
needs no vLLM, tells the engine to do so (:func:`step_log_engine_args`) and reads the file.

A step is ``{"t": s (time.monotonic), "total": tokens, "decodes": requests given 1 token,
"decode_ctx": tokens cached for those decodes (summed), "prefills": [[tokens, prompt tokens,
tokens computed before], ...]}``.
"""
from __future__ import annotations

import json
from pathlib import Path

from servebook.lab.errors import LabError

STEP_LOG_ENV = "SERVEBOOK_STEP_LOG"
_RECORDER = "servebook.lab.harness.step_recorder"


def step_log_engine_args(device: str) -> dict:
    """Engine flags that make vLLM record its steps (``vllm serve`` names, underscores).

    On CUDA vLLM 0.27.1 schedules asynchronously by default; the recording class must then
    subclass the async scheduler, so async scheduling is asked for explicitly to keep the two
    in step. On CPU async scheduling is off (the platform turns it off) and the plain scheduler
    is recorded.
    """
    if device == "cuda":
        return {"scheduler_cls": f"{_RECORDER}.RecordingAsyncScheduler", "async_scheduling": True}
    if device == "cpu":
        return {"scheduler_cls": f"{_RECORDER}.RecordingScheduler"}
    raise LabError(f"device {device!r} is not 'cuda' or 'cpu'")


def step_log_env(env: dict[str, str], path: str | Path) -> dict[str, str]:
    """A copy of ``env`` telling the recording scheduler to append its steps to ``path``."""
    return dict(env, **{STEP_LOG_ENV: str(path)})


def read_step_log(path: str | Path) -> list[dict]:
    """Every step the engine recorded, in order. Raises :class:`LabError` when the file is missing
    or empty (the engine did not load the recording scheduler)."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        raise LabError(f"no engine steps in {p}: start the engine with step_log_engine_args(...) and "
                       f"{STEP_LOG_ENV} in its environment (step_log_env)")
    steps = []
    for line in p.read_text().splitlines():
        if line.strip():
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a read during a write: the next read has it whole
    return steps


def steps_since(steps: list[dict], t0_s: float) -> list[dict]:
    """Steps scheduled at or after ``t0_s`` (``time.monotonic()`` seconds)."""
    return [s for s in steps if s["t"] >= t0_s]


def prompt_chunks_scheduled(steps: list[dict], prompt_tokens: int) -> list[dict]:
    """The steps that prefilled a prompt of ``prompt_tokens`` tokens, in order:
    ``{"t", "tokens" (this chunk), "before" (computed before it), "total", "decodes"}``."""
    out = []
    for s in steps:
        for tokens, prompt, before in s["prefills"]:
            if prompt == prompt_tokens:
                out.append({"t": s["t"], "tokens": tokens, "before": before, "total": s["total"],
                            "decodes": s["decodes"]})
    return out


def step_intervals(steps: list[dict]) -> list[tuple[float, float]]:
    """``(time a step was scheduled, seconds until the next one was)`` for each step but the last.

    With synchronous scheduling (CPU) the interval is the step's wall time: run the model,
    process the outputs, schedule again. Idle gaps (no request) show up as long intervals.
    """
    return [(a["t"], b["t"] - a["t"]) for a, b in zip(steps, steps[1:])]
