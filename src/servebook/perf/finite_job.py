"""What a steady-state fleet plan leaves out of a finite job: which steps carry a prefill, and the drain.

:func:`servebook.perf.fleet.plan` prices one *average* step: the decode batch plus the average
share of a prompt (``finish_per_step x mean prompt`` tokens). An engine never runs that step.
When ``f`` requests finish per step, the next step admits and prefills ``k`` new prompts, ``k``
about Poisson(``f``): most steps carry no prompt (``k = 0``: a decode-only step, replayed as a
CUDA graph) or one, a few carry several (more tokens than the largest CUDA graph: eager). The
step time is not linear in tokens (expert weights read saturate with tokens in MoE models, the
graph/eager switch is a step), so the time of the average step is not the average step time:
:func:`expected_step_s` prices each ``k`` and weights it by its probability.

When the queue is empty the last requests still running finish one after another at falling
batch, each step costing nearly as much as a full one (weights are read whatever the batch):
:func:`drain_extra_s` is the time that drain takes beyond what the steady state would charge
for the same tokens. The requests running at that moment are a length-biased sample of the
outputs, each at a uniformly random point of its output: :func:`residual_outputs`.

Pure Python (no numpy). Times in seconds, lengths in tokens.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from servebook.errors import ServebookError

#: Admissions per step beyond this many carry less than 1e-9 of the probability for f <= 3.
_MAX_ADMISSIONS = 16


def admission_probabilities(finish_per_step: float, max_admissions: int = _MAX_ADMISSIONS) -> list[tuple[int, float]]:
    """``[(k, P(k prompts admitted in a step))]`` for Poisson(``finish_per_step``), renormalised to sum to 1."""
    if finish_per_step < 0:
        raise ServebookError(f"requests finishing per step must be >= 0, got {finish_per_step}")
    terms = [(k, math.exp(-finish_per_step) * finish_per_step ** k / math.factorial(k))
             for k in range(max_admissions + 1)]
    total = sum(p for _, p in terms)
    return [(k, p / total) for k, p in terms]


def expected_step_s(price: Callable[[float], float], finish_per_step: float, *,
                    max_prompts_per_step: float) -> float:
    """Mean step time when ``k`` ~ Poisson(``finish_per_step``) prompts join a step's decodes.

    Args:
        price: seconds of a step that prefills ``prompts`` whole prompts (a float: average
            prompts' work) beside the decode batch; ``price(0)`` is the decode-only step.
        finish_per_step: requests that finish (and are replaced) per step.
        max_prompts_per_step: prompts the step's token budget holds (budget left by the
            decodes / mean prompt). When the steady state already fills it every step (the
            job is bound by the prefill budget), every step carries that many.
    """
    if max_prompts_per_step <= 0:
        raise ServebookError("the token budget leaves no room for a prompt beside the decodes; "
                             "raise max_num_batched_tokens")
    if finish_per_step >= max_prompts_per_step * 0.999:
        return price(max_prompts_per_step)
    return sum(p * price(min(float(k), max_prompts_per_step)) for k, p in admission_probabilities(finish_per_step))


def residual_outputs(outputs: Sequence[float], batch: int, points_per_sequence: int = 8) -> list[float]:
    """Output tokens still to come for each of ``batch`` requests running when the queue empties (ascending).

    A running request is a length-biased draw (a request of ``o`` tokens is running ``o`` steps)
    at a uniformly random point of its output, so its residual is ``o x u``, ``u`` uniform; the
    ``batch`` values returned are the quantiles of that distribution.
    """
    if batch < 1 or not outputs or min(outputs) <= 0:
        raise ServebookError("residual outputs need a batch >= 1 and output lengths > 0")
    points = []
    for o in outputs:
        for j in range(points_per_sequence):
            points.append((o * (j + 0.5) / points_per_sequence, o))
    points.sort()
    total = sum(w for _, w in points)
    out, acc, i = [], 0.0, 0
    for q in range(batch):
        target = (q + 0.5) / batch * total
        while i < len(points) - 1 and acc + points[i][1] < target:
            acc += points[i][1]
            i += 1
        out.append(points[i][0])
    return out


def drain_extra_s(residuals: Sequence[float], decode_step_s: Callable[[int], float], *,
                  tokens_per_steady_s: float) -> float:
    """Seconds the drain takes beyond the steady state's charge for the same tokens.

    ``residuals`` (ascending) are the tokens each running request has left when the queue
    empties; while ``b`` of them remain, a step costs ``decode_step_s(b)`` and gives each one
    token. The steady state would have produced ``sum(residuals)`` tokens at
    ``tokens_per_steady_s``. Negative when the drain's decode-only steps are cheaper than the
    steady state's prefill-carrying ones.
    """
    if tokens_per_steady_s <= 0:
        raise ServebookError("the steady state's output tokens per second must be > 0")
    rs = sorted(residuals)
    t, prev = 0.0, 0.0
    for j, r in enumerate(rs):
        t += (r - prev) * decode_step_s(len(rs) - j)
        prev = r
    return t - sum(rs) / tokens_per_steady_s


def finite_job_seconds(workload, d, coeffs, steady=None, *, mixture: bool = True, drain: bool = True) -> dict:
    """A fleet plan's wall time for ``workload`` with the step mixture and the drain (one replica's share).

    ``steady`` is :func:`servebook.perf.fleet.plan`'s result for the same arguments (computed when
    None). Returns ``seconds`` (the job's wall time), ``steady_seconds`` (fleet's), ``step_s`` (the
    mixture's mean step), ``drain_extra_s`` and ``output_tokens_per_s``.
    """
    from servebook.perf import fleet as F
    from servebook.perf.model import step_time
    from servebook.perf.work import decode_work
    from servebook.vllm_rules import cudagraph_max_tokens

    p = steady or F.plan(workload, d, coeffs)
    spec, tp = d.spec, d.tp
    ctx, weights = F._running_contexts(workload)
    mean_in, mean_out = workload.input_tokens.mean, workload.output_tokens.mean
    finish = p.prefill_tokens_per_step / mean_in
    b_eff = finish * mean_out / p.tokens_per_step
    cap = d.max_num_batched_tokens - b_eff * (1 + (d.speculation.k if d.speculation else 0))
    per_prompt = F._prefill_work_per_request(spec, workload, int(cap), tp, d.kv_cache_dtype)
    graph = d.cudagraph_max_tokens or cudagraph_max_tokens(d.max_num_seqs, d.max_num_batched_tokens)

    def decode(b):
        return decode_work(spec, b, ctx, tp=tp, kv_cache_dtype=d.kv_cache_dtype, context_weights=weights)

    def price(work):
        return step_time(spec, d.gpu, work, coeffs, tp=tp, cudagraph_max_tokens=graph).step_s

    full = decode(b_eff)
    step = p.step_s
    if mixture:
        step = expected_step_s(lambda k: price(full + per_prompt.scaled(k)) if k else price(full), finish,
                               max_prompts_per_step=cap / mean_in)
    seconds = p.steps_per_replica * (step + p.draft_s)
    extra = 0.0
    if drain:
        batch = max(1, int(round(min(b_eff, workload.requests / p.replicas))))
        cache: dict = {}

        def decode_step(b):
            if b not in cache:
                cache[b] = price(decode(b))
            return cache[b]

        extra = drain_extra_s(residual_outputs(workload.output_tokens.samples, batch), decode_step,
                              tokens_per_steady_s=b_eff * p.tokens_per_step / step)
    total = seconds + extra
    return {"seconds": total, "steady_seconds": p.hours * 3600, "step_s": step, "drain_extra_s": extra,
            "output_tokens_per_s": workload.requests * mean_out / total}
