"""How long one engine step takes: the simulator's clock.

The simulator only needs a callable

    step_time_s(num_prefill_tokens, num_decode_seqs, context_tokens) -> seconds

where ``num_prefill_tokens`` is the number of prompt (or recompute) tokens in the
step, ``num_decode_seqs`` the number of requests that decode one token, and
``context_tokens`` the sum over scheduled requests of the tokens their attention
reads (their context after the step). Any object with that signature plugs in,
e.g. a model built by :mod:`servebook.perf`.

:class:`LinearStepTime` is a deliberately simple stand-in: a fixed cost per step
(reading the weights, launching kernels) plus costs proportional to prefill
tokens, decode sequences and context. Its defaults are round illustrative
numbers of the size one sees for an 8B model on one H100-class GPU
(≈ 10 ms per decode step at small batch, ≈ 0.1 ms per prefill token); they are
not a measurement. Only *relative* timings (who waits for whom) depend on them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from servebook.errors import ServebookError


class StepTimeModel(Protocol):
    """Anything that prices one engine step in seconds."""

    def __call__(self, num_prefill_tokens: int, num_decode_seqs: int, context_tokens: int) -> float: ...


@dataclass(frozen=True)
class LinearStepTime:
    """``base_s + prefill_token_s * P + decode_seq_s * D + context_token_s * C`` seconds.

    Attributes:
        base_s: fixed cost of a step in seconds (weights read once per step).
        prefill_token_s: seconds per prefill token (compute-bound work).
        decode_seq_s: seconds per decoding sequence (sampling, per-row overheads).
        context_token_s: seconds per context token read by attention (KV reads).
    """

    base_s: float = 0.010
    prefill_token_s: float = 1.0e-4
    decode_seq_s: float = 5.0e-5
    context_token_s: float = 5.0e-8

    def __post_init__(self) -> None:
        for name in ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s"):
            if getattr(self, name) < 0:
                raise ServebookError(f"{name} is {getattr(self, name)}; step costs must be >= 0 seconds")

    def __call__(self, num_prefill_tokens: int, num_decode_seqs: int, context_tokens: int) -> float:
        return (
            self.base_s
            + self.prefill_token_s * num_prefill_tokens
            + self.decode_seq_s * num_decode_seqs
            + self.context_token_s * context_tokens
        )


def perf_step_time(spec, gpu, coeffs, *, tp: int = 1, kv_cache_dtype: str = "auto") -> StepTimeModel:
    """A step-time callable backed by :mod:`servebook.perf` (``chunk_budget.mixed_step_s``).

    ``spec`` is a ModelSpec, ``gpu`` and ``coeffs`` what :mod:`servebook.perf` expects
    (a catalogue GPU and calibrated ``Coefficients``). The simulator reports the sum of
    context over all scheduled requests; the decoding sequences' mean context is
    approximated as ``context_tokens / (num_decode_seqs + 1 if prefill else num_decode_seqs)``
    and the prefill chunk is priced without prior tokens. Imported lazily so that the
    simulator does not depend on the performance model.
    """
    from servebook.perf.chunk_budget import mixed_step_s

    def step_time_s(num_prefill_tokens: int, num_decode_seqs: int, context_tokens: int) -> float:
        users = num_decode_seqs + (1 if num_prefill_tokens else 0)
        mean_context = context_tokens / users if users else 0.0
        return mixed_step_s(spec, gpu, coeffs, prefill_tokens=num_prefill_tokens, decode_batch=num_decode_seqs,
                            decode_context_tokens=mean_context, tp=tp, kv_cache_dtype=kv_cache_dtype)

    return step_time_s
