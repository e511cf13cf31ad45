"""Speculative decoding: tokens per step, what drafting and verification cost, when it pays.

With ``k`` draft tokens per step and a per-token acceptance probability ``alpha``
(each draft accepted only if all earlier ones were), a step emits

``E(k, alpha) = 1 + alpha + alpha^2 + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)``

tokens per sequence (the ``1`` is the target model's own token, always produced).

The price: ``k`` draft passes (a draft model's decode steps, or ~nothing for
n-gram lookup) plus a verification step in which every sequence carries ``k + 1``
query tokens. Verification reads the weights once, so it is nearly free while
decode is memory-bound (small batches) and costs up to ``k + 1`` times a plain
step once the batch is compute-bound - hence speculation helps quiet servers and
hurts saturated ones, and the best ``k`` falls as the batch grows.

vLLM 0.27.1 takes such a per-batch-size schedule as
``num_speculative_tokens_per_batch_size``: a list of inclusive
``[range_start, range_end, k]`` entries, the first starting at batch 1, ranges
sorted and non-overlapping; each ``k`` is capped at ``num_speculative_tokens``;
batch sizes past the last range keep its ``k`` (``vllm/config/speculative.py``,
``vllm/v1/spec_decode/dynamic/utils.py``). Turning it on makes vLLM fall back from
full to piecewise CUDA graphs (``vllm/config/vllm.py``) - a cost this model does
not include.
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec
from servebook.perf.model import Coefficients, decode_step
from servebook.reductions import is_number, require_numpy

METHODS = ("draft_model", "eagle", "mtp", "ngram")


def expected_tokens_per_step(k: int, alpha):
    """``(1 - alpha^(k+1)) / (1 - alpha)`` tokens per sequence per step (``k + 1`` at ``alpha = 1``).

    A float for a number ``alpha`` (no numpy needed), a numpy array for an array of them."""
    if int(k) != k or k < 0:
        raise ServebookError(f"number of draft tokens must be a whole number >= 0, got {k}")
    if is_number(alpha):
        a = float(alpha)
        if not 0.0 <= a <= 1.0:
            raise ServebookError(f"acceptance must be a probability in [0, 1], got {alpha}")
        return (1.0 - a ** (k + 1)) / (1.0 - a) if a < 1.0 else k + 1.0
    np = require_numpy("expected_tokens_per_step over an array of acceptances")
    a = np.asarray(alpha, dtype=float)
    if np.any((a < 0) | (a > 1)):
        raise ServebookError(f"acceptance must be a probability in [0, 1], got {alpha}")
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(a < 1.0, (1.0 - a ** (k + 1)) / np.where(a < 1.0, 1.0 - a, 1.0), k + 1.0)
    return float(e) if e.ndim == 0 else e


def acceptance_for_tokens_per_step(tokens_per_step: float, k: int) -> float:
    """The per-token acceptance ``alpha`` at which ``k`` drafts yield ``tokens_per_step`` tokens."""
    if not 1.0 <= tokens_per_step <= k + 1:
        raise ServebookError(f"{tokens_per_step} tokens per step is impossible with k={k} drafts "
                             f"(between 1 and {k + 1})")
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if expected_tokens_per_step(k, mid) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Drafter:
    """How drafts are made.

    Attributes:
        method: ``"draft_model"`` / ``"eagle"`` / ``"mtp"`` (a small network run ``k``
            times per step: give its ``spec``) or ``"ngram"`` (prompt lookup on the
            CPU: no GPU cost).
        spec: the drafting network's ModelSpec (for draft models, the small model;
            for EAGLE/MTP, the head's layers).
        tp: tensor-parallel size the drafter runs with.
    """

    method: str = "ngram"
    spec: ModelSpec | None = None
    tp: int = 1

    def __post_init__(self):
        if self.method not in METHODS:
            raise ServebookError(f"unknown speculative method {self.method!r}; use one of {METHODS}")
        if self.method != "ngram" and self.spec is None:
            raise ServebookError(f"method {self.method!r} drafts with a network: give its ModelSpec "
                                 "(Drafter(method, spec=...))")


@dataclass(frozen=True)
class SpeculativeStep:
    """Cost and yield of one speculative step for a batch (seconds, tokens per sequence)."""

    k: int
    alpha: float
    batch: int
    tokens_per_step: float
    verify_s: float
    draft_s: float
    plain_step_s: float

    @property
    def step_s(self) -> float:
        return self.verify_s + self.draft_s

    @property
    def speedup(self) -> float:
        """Decode throughput with speculation over without (>1: it pays)."""
        return (self.tokens_per_step / self.step_s) / (1.0 / self.plain_step_s)


def draft_pass_s(drafter: Drafter, gpu, coeffs: Coefficients, *, batch: float, context_tokens,
                 kv_cache_dtype: str = "auto", context_weights=None) -> float:
    """Seconds of one draft pass over ``batch`` sequences (kernel time only; 0 for n-gram)."""
    if drafter.method == "ngram":
        return 0.0
    from servebook.perf.model import step_time
    from servebook.perf.work import decode_work

    work = decode_work(drafter.spec, batch, context_tokens, tp=drafter.tp, kv_cache_dtype=kv_cache_dtype,
                       context_weights=context_weights)
    b = step_time(drafter.spec, gpu, work, coeffs, tp=drafter.tp)
    return b.linear_s + b.attention_s + b.allreduce_s


def speculative_step(spec: ModelSpec, gpu, coeffs: Coefficients, *, k: int, alpha: float, batch: int,
                     context_tokens: float, drafter: Drafter = Drafter(), tp: int = 1,
                     kv_cache_dtype: str = "auto") -> SpeculativeStep:
    """Verification step (``k + 1`` query tokens per sequence) plus ``k`` draft passes.

    A draft pass is costed as the drafting network's decode-step *kernel* time at
    the same batch and context (linear layers, attention, all-reduce), without the
    engine's per-step and per-sequence overheads: the passes run inside the one
    engine step. Draft passes were not measured separately.
    """
    plain = decode_step(spec, gpu, coeffs, batch=batch, context_tokens=context_tokens, tp=tp,
                        kv_cache_dtype=kv_cache_dtype).step_s
    verify = decode_step(spec, gpu, coeffs, batch=batch, context_tokens=context_tokens, tp=tp,
                         kv_cache_dtype=kv_cache_dtype, query_tokens=k + 1).step_s if k else plain
    draft = 0.0
    if k and drafter.method != "ngram":
        draft = k * draft_pass_s(drafter, gpu, coeffs, batch=batch, context_tokens=context_tokens,
                                 kv_cache_dtype=kv_cache_dtype)
    return SpeculativeStep(k=k, alpha=alpha, batch=batch, tokens_per_step=expected_tokens_per_step(k, alpha),
                           verify_s=verify, draft_s=draft, plain_step_s=plain)


def break_even_acceptance(spec: ModelSpec, gpu, coeffs: Coefficients, *, k: int, batch: int,
                          context_tokens: float, drafter: Drafter = Drafter(), tp: int = 1,
                          kv_cache_dtype: str = "auto") -> float | None:
    """Smallest per-token acceptance at which ``k`` drafts do not slow decoding; None if none does.

    Solves ``E(k, alpha) = (verify_s + draft_s) / plain_step_s``.
    """
    if k < 1:
        raise ServebookError("break-even acceptance needs k >= 1 draft token")
    s = speculative_step(spec, gpu, coeffs, k=k, alpha=0.0, batch=batch, context_tokens=context_tokens,
                         drafter=drafter, tp=tp, kv_cache_dtype=kv_cache_dtype)
    need = s.step_s / s.plain_step_s
    if need > k + 1:
        return None
    return acceptance_for_tokens_per_step(max(need, 1.0), k)


def best_k(spec: ModelSpec, gpu, coeffs: Coefficients, *, alpha: float, batch: int, context_tokens: float,
           k_max: int = 8, drafter: Drafter = Drafter(), tp: int = 1, kv_cache_dtype: str = "auto") -> int:
    """Draft length in ``0..k_max`` with the highest decode throughput at this batch (0: do not speculate)."""
    speed = [speculative_step(spec, gpu, coeffs, k=k, alpha=alpha, batch=batch, context_tokens=context_tokens,
                              drafter=drafter, tp=tp, kv_cache_dtype=kv_cache_dtype).speedup
             for k in range(k_max + 1)]
    return speed.index(max(speed))  # the first best, as numpy.argmax


def k_schedule(spec: ModelSpec, gpu, coeffs: Coefficients, *, alpha: float, context_tokens: float,
               max_num_seqs: int | None = None, k_max: int = 8, drafter: Drafter = Drafter(), tp: int = 1,
               kv_cache_dtype: str = "auto", batches=None) -> dict:
    """A per-batch-size draft-length schedule in vLLM 0.27.1's format.

    Evaluates :func:`best_k` at each batch in ``batches`` (default: powers of two up
    to ``max_num_seqs``, itself by default ``vllm serve``'s on ``gpu``), assigns every batch size the ``k`` of the nearest
    evaluated batch at or below it, and merges equal neighbours.

    Returns:
        ``{"num_speculative_tokens": K, "num_speculative_tokens_per_batch_size":
        [[start, end, k], ...]}`` - paste into ``--speculative-config``.
    """
    if max_num_seqs is None:
        from servebook.perf.gpu import gpu_numbers
        from servebook.vllm_rules import vllm_batch_defaults

        g = gpu_numbers(gpu)
        max_num_seqs = vllm_batch_defaults(int(g.memory_bytes), g.name)[1]
    if max_num_seqs < 1:
        raise ServebookError("max_num_seqs must be >= 1")
    if batches is None:
        batches = [1]
        while batches[-1] * 2 <= max_num_seqs:
            batches.append(batches[-1] * 2)
    batches = sorted({int(b) for b in batches if 1 <= b <= max_num_seqs} | {1})
    ks = [best_k(spec, gpu, coeffs, alpha=alpha, batch=b, context_tokens=context_tokens, k_max=k_max,
                 drafter=drafter, tp=tp, kv_cache_dtype=kv_cache_dtype) for b in batches]
    schedule: list[list[int]] = []
    for i, (b, k) in enumerate(zip(batches, ks)):
        end = batches[i + 1] - 1 if i + 1 < len(batches) else max_num_seqs
        if schedule and schedule[-1][2] == k:
            schedule[-1][1] = end
        else:
            schedule.append([b, end, k])
    top = max(ks)
    validate_schedule(schedule)
    return {"num_speculative_tokens": max(top, 1), "num_speculative_tokens_per_batch_size": schedule}


def validate_schedule(schedule) -> None:
    """Raise ServebookError unless ``schedule`` follows vLLM 0.27.1's rules (see module docstring)."""
    if not isinstance(schedule, list) or not schedule:
        raise ServebookError("num_speculative_tokens_per_batch_size must be a non-empty list of [start, end, k]")
    previous_end = 0
    for entry in sorted(schedule, key=lambda e: e[0]):
        if len(entry) != 3:
            raise ServebookError(f"schedule entry {entry} is not [range_start, range_end, k]")
        start, end, k = (int(x) for x in entry)
        if start <= 0 or end < start or k < 0:
            raise ServebookError(f"schedule entry {entry}: need 1 <= start <= end and k >= 0")
        if start <= previous_end:
            raise ServebookError(f"schedule entry {entry} overlaps the previous range")
        previous_end = end
    if min(int(e[0]) for e in schedule) != 1:
        raise ServebookError("the first batch-size range must start at 1")


def k_for_batch(schedule, batch: int, num_speculative_tokens: int) -> int:
    """The ``k`` vLLM uses at ``batch`` under ``schedule`` (gaps and the tail carry the previous k)."""
    validate_schedule(schedule)
    k = None
    for start, end, kk in sorted(schedule, key=lambda e: e[0]):
        if start <= batch:
            k = kk
        if start <= batch <= end:
            break
    return min(int(k), num_speculative_tokens)


#: Methods a speculation request (:func:`parse_speculative`) may name: those whose drafting this
#: module can price without a separate head description.
ASKABLE_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeAsk:
    """Speculative decoding a search is asked to consider.

    Attributes:
        method: ``"ngram"`` (prompt lookup, no GPU cost) or ``"draft_model"``.
        k: draft tokens per step (>= 1).
        alpha: expected per-token acceptance, a probability in [0, 1] (workload-dependent: measure it,
            e.g. Lab 7's ``LLM.get_metrics()``).
        draft_model: config.json path or reference id of the draft model (``draft_model`` only).
    """

    method: str
    k: int
    alpha: float
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in ASKABLE_METHODS:
            raise ServebookError(f"--speculative method {self.method!r} is not priced here; use one of "
                                 f"{', '.join(ASKABLE_METHODS)} (e.g. ngram:k=4,alpha=0.6)")
        if int(self.k) != self.k or self.k < 1:
            raise ServebookError(f"--speculative needs k >= 1 draft tokens per step, got k={self.k}")
        if not (0.0 <= self.alpha <= 1.0):
            raise ServebookError(f"--speculative alpha is a per-token acceptance probability in [0, 1], got {self.alpha}")
        if (self.method == "draft_model") != (self.draft_model is not None):
            raise ServebookError("--speculative draft_model needs model=REF (the draft's config.json or reference "
                                 "id), and only draft_model takes one")

    def text(self) -> str:
        extra = f", draft {self.draft_model}" if self.draft_model else ""
        return f"{self.method}, k={self.k}, alpha {self.alpha:g}{extra}"


def parse_speculative(text: str) -> SpeculativeAsk:
    """``METHOD:k=K,alpha=A[,model=REF]`` (e.g. ``ngram:k=4,alpha=0.6``) as a :class:`SpeculativeAsk`."""
    method, _, rest = str(text).partition(":")
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in ("k", "alpha", "model"):
            raise ServebookError(f"--speculative {text!r}: write METHOD:k=K,alpha=A[,model=REF], "
                                 "e.g. ngram:k=4,alpha=0.6")
        fields[key.strip()] = value.strip()
    if "k" not in fields or "alpha" not in fields:
        raise ServebookError(f"--speculative {text!r} needs both k and alpha, e.g. ngram:k=4,alpha=0.6")
    try:
        k, alpha = int(fields["k"]), float(fields["alpha"])
    except ValueError:
        raise ServebookError(f"--speculative {text!r}: k is a whole number and alpha a probability, "
                             "e.g. ngram:k=4,alpha=0.6") from None
    return SpeculativeAsk(method.strip(), k, alpha, fields.get("model"))
