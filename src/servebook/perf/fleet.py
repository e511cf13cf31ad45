"""Plans for a large offline batch job: replicas, batch, hours, GPU-hours, cost.

The fleet is ``gpus / tp`` independent replicas (data parallelism needs no
communication between them). Each replica runs continuous batching in steady
state; per engine step:

* ``B`` sequences decode (``B`` bounded by ``--max-num-seqs`` and by the KV cache:
  the time-averaged KV a running sequence holds, from the *distributions* of
  input and output lengths, must fit the replica's KV budget);
* each yields ``E(k, alpha)`` tokens (1 without speculation), so ``B x E / mean(out)``
  requests finish per step and as many new prompts must be prefilled in the same
  step's token budget (chunked prefill), their attention cost taken from the
  input-length distribution (it grows with the *square* of each prompt);
* the step's time comes from the calibrated step-time model with the KV cache
  read for every running sequence, plus ``k`` draft passes when speculating.

Hours = steps per replica x step time. Because sequences of different lengths
hold KV for different times, the time-averaged context is
``E[out x (in + out/2)] / E[out]``, not ``mean(in) + mean(out)/2``; and
``E[in^2]`` (not ``mean(in)^2``) sets the prefill attention cost.
"""
from __future__ import annotations

import dataclasses

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servebook.plan import Plan

from servebook.errors import DoesNotFitError, ServebookError
from servebook.model_spec import ModelSpec
from servebook.perf.gpu import gpu_numbers
from servebook.perf.model import Coefficients, StepPricer
from servebook.perf.speculative import Drafter, draft_pass_s, expected_tokens_per_step
from servebook.kv_cache import admission_bytes, mean_running_bytes
from servebook.perf.work import (
    Work,
    check_sequence_length,
    decode_work,
    kv_bytes_per_sequence,
    prefill_work,
    prompt_chunks,
)
from servebook.reductions import dot, mean, pairwise_sum
from servebook.vllm_rules import CUDA_DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION


@dataclass(frozen=True)
class LengthDistribution:
    """Token lengths as equally likely samples (deterministic: quantiles, not random draws)."""

    samples: tuple[float, ...]
    #: ``(mean_tokens, cv, max_tokens)`` when the samples are a lognormal's quantiles, so a job's
    #: ``n`` requests can be drawn as ``n`` quantiles (:meth:`job_lengths`); None for given samples.
    lognormal_params: tuple[float, float, int | None] | None = None
    #: a recorded job's own lengths (:meth:`of_job`): the replay of its ramp and drain takes them whole.
    job_draws: tuple[float, ...] | None = None

    def __post_init__(self):
        if not self.samples or min(self.samples) < 1:
            raise ServebookError("a length distribution needs samples of at least 1 token")

    @classmethod
    def fixed(cls, tokens: int) -> "LengthDistribution":
        return cls((float(tokens),))

    @classmethod
    def lognormal(cls, mean_tokens: float, cv: float, *, n: int = 64, max_tokens: int | None = None):
        """Lognormal with the given mean and coefficient of variation (std/mean), ``n`` quantiles."""
        from statistics import NormalDist

        if mean_tokens < 1 or cv < 0:
            raise ServebookError("lognormal lengths need mean >= 1 token and cv >= 0")
        sigma = math.sqrt(math.log1p(cv * cv))
        mu = math.log(mean_tokens) - sigma * sigma / 2
        z = [NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
        xs = [max(1.0, math.exp(mu + sigma * zi)) for zi in z]
        if max_tokens:
            xs = [min(x, max_tokens) for x in xs]
        return cls(tuple(xs), (float(mean_tokens), float(cv), max_tokens))

    def job_lengths(self, n: int) -> list[float]:
        """Lengths (tokens) for a job of ``n`` requests, shortest first.

        A lognormal gives the expected lengths of ``n`` sorted draws (Blom's plotting positions,
        quantiles at ``(i + 0.625) / (n + 0.25)``): the longest is as long as the longest of ``n``
        requests is expected to be, and the longest request sets a job's drain. The 64 quantiles the
        steady state uses would cut a 192-request job's longest output from about 1,940 to 1,680
        tokens at mean 600, cv 0.5. A recorded job's own lengths (:meth:`of_job`) are taken whole (``n``
        evenly spaced of them when ``n`` is smaller; cycled past the job's size); other given samples are cycled (``n`` of them, in order).
        """
        if n < 1:
            raise ServebookError(f"a job needs at least 1 request, got {n}")
        if self.job_draws is not None:
            draws, m = self.job_draws, len(self.job_draws)      # sorted
            if n <= m:   # n evenly spaced of the job's sorted lengths (all of them when n == m)
                return [draws[int((i + 0.5) * m / n)] for i in range(n)]
            return sorted(draws[i % m] for i in range(n))
        if self.lognormal_params is None:
            return [self.samples[i % len(self.samples)] for i in range(n)]
        from statistics import NormalDist

        mean_tokens, cv, max_tokens = self.lognormal_params
        sigma = math.sqrt(math.log1p(cv * cv))
        mu = math.log(mean_tokens) - sigma * sigma / 2
        # Blom's plotting positions: the i-th of n sorted draws is expected near this quantile
        xs = [max(1.0, math.exp(mu + sigma * NormalDist().inv_cdf((i + 0.625) / (n + 0.25)))) for i in range(n)]
        return [min(x, max_tokens) for x in xs] if max_tokens else xs

    @classmethod
    def of_job(cls, lengths, *, n: int = 64) -> "LengthDistribution":
        """A recorded job's lengths: ``n`` quantiles of them for the steady state (its cost grows with
        the samples), all of them for :meth:`job_lengths` (the longest sets the job's drain)."""
        ordered = sorted(float(x) for x in lengths)
        if not ordered:
            raise ServebookError("a job needs at least one length")
        q = [ordered[min(len(ordered) - 1, int((i + 0.5) * len(ordered) / n))] for i in range(n)]
        return cls(tuple(q), job_draws=tuple(ordered))

    @classmethod
    def from_samples(cls, samples) -> "LengthDistribution":
        return cls(tuple(float(s) for s in samples))

    @property
    def mean(self) -> float:
        return mean(self.samples)

    @property
    def max(self) -> float:
        return float(max(self.samples))


@dataclass(frozen=True)
class Workload:
    """The job: how many requests and their input/output lengths (tokens)."""

    requests: int
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding with ``k`` drafts at per-token acceptance ``alpha``."""

    k: int
    alpha: float
    drafter: Drafter = Drafter()


@dataclass(frozen=True)
class Deployment:
    """One way to run the job: a :class:`~servebook.plan.Plan` (the engine, one replica) and what only a
    fleet adds.

    Every engine setting (model, GPU, TP, KV dtype, utilisation, ``max_num_seqs``,
    ``max_num_batched_tokens``, the KV budget, the CUDA-graph size) lives in ``plan``, resolved
    once by :func:`servebook.plan.make_plan`; the properties below read it. Build one with
    :meth:`of` (a batch job runs the offline ``LLM`` class: ``usage_context="offline"``).

    Attributes:
        plan: the engine of one replica.
        gpus: GPUs in the fleet (a multiple of the plan's TP).
        batch: decode batch wanted; None = as many as the KV cache and ``max_num_seqs`` allow.
        speculation: speculative decoding, or None.
        price_per_gpu_hour: currency units per GPU-hour; None = no price (no cost line).
        name: a label for tables (default: the model's name).
    """

    plan: "Plan"
    gpus: int
    batch: int | None = None
    speculation: Speculation | None = None
    price_per_gpu_hour: float | None = None
    name: str = ""
    #: the plan's max_model_len was lowered from the model's context to what the KV cache fits
    max_model_len_lowered: bool = False

    @classmethod
    def of(cls, model, *, gpu, gpus: int, tp: int = 1, batch: int | None = None,
           max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
           kv_cache_dtype: str = "auto", gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
           kv_budget_bytes_per_gpu: float | None = None, speculation: Speculation | None = None,
           price_per_gpu_hour: float | None = None, cudagraph_max_tokens: int | None = None,
           usage_context: str = "offline", max_model_len: int | None = None, name: str = "",
           vllm_version: str | None = None) -> "Deployment":
        """A deployment of ``model`` (ModelSpec, reference id or config path) on ``gpus`` x ``gpu``.

        The engine settings go to :func:`servebook.plan.make_plan` (None = vLLM's default for
        the usage context); ``kv_budget_bytes_per_gpu`` replaces the memory model's KV budget;
        ``vllm_version`` the release whose rules apply (None: the newest checked).
        """
        from servebook.plan import make_plan_that_fits

        gpu_name = gpu if isinstance(gpu, str) else gpu_numbers(gpu).name
        engine = dict(gpu=gpu_name, tp=tp, gpu_memory_utilization=gpu_memory_utilization,
                      kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, usage_context=usage_context, cudagraph_max_tokens=cudagraph_max_tokens,
                      available_kv_gib=None if kv_budget_bytes_per_gpu is None else kv_budget_bytes_per_gpu / 2**30,
                      vllm_version=vllm_version)
        # vLLM refuses to start when one request of the default max_model_len (the model's context)
        # does not fit; a batch job then sets --max-model-len to what fits (fleet's notes say so)
        plan, lowered = make_plan_that_fits(model, max_model_len=max_model_len, **engine)
        return cls(plan=plan, gpus=gpus, batch=batch, speculation=speculation,
                   price_per_gpu_hour=price_per_gpu_hour, name=name, max_model_len_lowered=lowered)

    # -- the engine, read from the plan --------------------------------------------------
    @property
    def spec(self) -> ModelSpec:
        return self.plan.spec

    @property
    def gpu(self):
        """The GPU's catalogue numbers (:func:`servebook.perf.gpu.gpu_numbers`)."""
        return gpu_numbers(self.plan.gpu_name)

    @property
    def tp(self) -> int:
        return self.plan.tp

    @property
    def max_num_seqs(self) -> int:
        return self.plan.max_num_seqs

    @property
    def max_num_batched_tokens(self) -> int:
        return self.plan.max_num_batched_tokens

    @property
    def kv_cache_dtype(self) -> str:
        return self.plan.kv_cache_dtype

    @property
    def gpu_memory_utilization(self) -> float:
        return self.plan.gpu_memory_utilization

    @property
    def kv_budget_bytes_per_gpu(self) -> float:
        """KV cache bytes per GPU the plan carves its blocks from."""
        return float(self.plan.available_kv_bytes)

    @property
    def label(self) -> str:
        return self.name or self.spec.name


@dataclass(frozen=True)
class FleetPlan:
    """What a deployment does with a workload (hours are wall-clock for the whole job)."""

    name: str
    replicas: int
    gpus: int
    tp: int
    batch: int
    batch_kv_bound: int
    bound: str
    mean_running_context_tokens: float
    tokens_per_step: float
    step_s: float
    draft_s: float
    prefill_tokens_per_step: float
    steps_per_replica: float
    prefill_hours: float
    decode_hours: float
    hours: float
    gpu_hours: float
    cost: float | None
    requests_per_s: float
    output_tokens_per_s: float
    kv_budget_bytes_per_gpu: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: Seconds each step-time term (``linear_s``, ``attention_s``, ``allreduce_s``, ``overhead_s``) gains
    #: when the step's prefill chunks join its decode tokens; they sum to the step's prefill share, so
    #: ``steps_per_replica x term / 3600`` are the prefill hours due to that term.
    prefill_step_terms_s: dict = field(default_factory=dict)
    #: "memory" or "compute": what bounds the linear layers of the mixed (decode + prefill) step.
    step_bound: str = ""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def _running_contexts(w: Workload, points_per_sequence: int = 8) -> tuple[list[float], list[float]]:
    """Contexts of running sequences and their time weights (a sequence is present ~ its output length).

    Every (input, output) pair of samples, at ``points_per_sequence`` evenly spaced moments of its
    decode; weights proportional to the output length, summing to 1.
    """
    frac = [(j + 0.5) / points_per_sequence for j in range(points_per_sequence)]
    outputs = [float(o) for o in w.output_tokens.samples]
    ctx = [i + o * f for i in (float(x) for x in w.input_tokens.samples) for o in outputs for f in frac]
    per_output = [o / points_per_sequence for o in outputs]
    weight = [p for _ in w.input_tokens.samples for p in per_output for _ in frac]
    total = pairwise_sum(weight)
    return ctx, [x / total for x in weight]


def _prefill_work_per_request(spec: ModelSpec, w: Workload, chunk: int, tp: int, kv: str) -> tuple[Work, float]:
    """The mean prefill work of one of the workload's prompts with ``chunk`` tokens of budget per step,
    and the mean number of chunks (steps) it takes."""
    total = Work()
    samples = w.input_tokens.samples
    n_chunks = 0
    for n in samples:
        chunks = prompt_chunks(int(round(n)), max(chunk, 1))
        n_chunks += len(chunks)
        for j, (t, prior) in enumerate(chunks):
            total = total + prefill_work(spec, t, prior_tokens=prior, tp=tp, kv_cache_dtype=kv,
                                         last_chunk=j == len(chunks) - 1)
    work = total.scaled(1.0 / len(samples))
    # chunks of different requests share a step: count sequences once per step, not per chunk
    return dataclasses.replace(work, sequences=1.0), n_chunks / len(samples)


def _expected_step_s(pricer: StepPricer, decode: Work, chunk: Work, chunks_per_step: float, max_chunks: int) -> float:
    """Mean seconds of a steady-state step whose prefill chunks arrive Poisson(``chunks_per_step``) per step.

    A step with no chunk is decode-only (one full CUDA graph); a step with ``n`` chunks carries
    ``n x chunk`` of prefill work beside the decodes (piecewise graphs, or eager when large), so
    the mean over the Poisson count prices the mix of steps a running batch really takes, not one
    step carrying the mean prefill. At most ``max_chunks`` fit the token budget (the tail is put there).
    """
    top = max(0, min(max_chunks, int(chunks_per_step + 6.0 * math.sqrt(chunks_per_step) + 2)))
    p = math.exp(-chunks_per_step)
    total, mass = 0.0, 0.0
    for n in range(top + 1):
        weight = p if n < top else max(0.0, 1.0 - mass)
        work = decode if n == 0 else decode + chunk.scaled(float(n))
        total += weight * pricer.breakdown(work).step_s
        mass += weight
        p *= chunks_per_step / (n + 1)
    return total


def plan(workload: Workload, d: Deployment, coeffs: Coefficients) -> FleetPlan:
    """Hours, GPU-hours, cost and throughput of ``workload`` on deployment ``d``.

    Raises:
        DoesNotFitError: the longest request cannot fit the KV cache, or the wanted
            batch exceeds what the KV cache holds (the message gives the bound).
        ServebookError: GPUs not a multiple of TP, TP incompatible with the heads, ...
    """
    spec, tp = d.spec, d.tp
    if d.gpus < 1:
        raise ServebookError(f"a fleet needs at least one GPU, got {d.gpus}")
    if d.batch is not None and d.batch > d.max_num_seqs:
        raise ServebookError(f"--batch {d.batch} is more than --max-num-seqs {d.max_num_seqs}: vLLM never runs more "
                             "sequences at once; lower --batch or raise --max-num-seqs")
    if d.batch is not None and d.batch < 1:
        raise ServebookError(f"batch {d.batch} is not allowed; use at least 1 (or None: what the KV cache holds)")
    if d.price_per_gpu_hour is not None and d.price_per_gpu_hour < 0:
        raise ServebookError(f"price per GPU-hour {d.price_per_gpu_hour:g} is negative; use a price >= 0 "
                             "(omit it for no cost line)")
    if d.gpus < tp or d.gpus % tp:
        raise ServebookError(f"{d.gpus} GPUs do not split into replicas of tp={tp}; use a multiple of {tp}")
    if workload.requests < 1:
        raise ServebookError("the workload needs at least one request")
    notes = []
    replicas = d.gpus // tp
    kv_budget = d.kv_budget_bytes_per_gpu
    where = ("given" if d.plan.kv_budget_given
             else f"servebook.memory.memory_budget ({d.plan.budget.coefficients_status} coefficients)")
    notes.append(f"KV budget per GPU: {where}")
    if d.max_model_len_lowered:
        notes.append(f"one request of the model's full context does not fit the KV cache, so vLLM would refuse "
                     f"its default --max-model-len: this plan uses --max-model-len {d.plan.max_model_len}")
    spec_k = d.speculation.k if d.speculation else 0
    drafter = d.speculation.drafter if d.speculation else None
    if drafter is not None and drafter.spec is not None:
        kv_budget -= drafter.spec.weight_bytes / drafter.tp
        notes.append("draft weights taken out of the KV budget; the drafter's own KV cache is not modelled")
    if kv_budget <= 0:
        raise DoesNotFitError(f"{spec.name} weights do not leave KV cache room on {d.gpu} at tp={tp}; "
                              "raise --tp or use a GPU with more memory")
    longest = workload.input_tokens.max + workload.output_tokens.max
    check_sequence_length(spec, longest, "the longest request (input + output)",
                          "lower the input/output lengths (--input-tokens, --output-tokens) or their spread")
    if longest > d.plan.max_model_len:
        fix = ("the KV cache holds one request of at most that many tokens: raise --tp, use --kv-cache-dtype fp8 "
               "or shorten the requests (--input-tokens, --output-tokens or their spread)"
               if d.max_model_len_lowered else "raise --max-model-len or shorten the requests")
        raise DoesNotFitError(f"the longest request ({longest:,.0f} tokens) is longer than the engine's "
                              f"--max-model-len {d.plan.max_model_len:,}; {fix}")
    layout = d.plan.capacity.layout
    if admission_bytes(layout, longest, in_flight_tokens=d.plan.capacity.in_flight_tokens) > kv_budget:
        raise DoesNotFitError(f"the longest request ({longest:.0f} tokens) needs more KV cache than the "
                              f"{kv_budget / 2**30:.1f} GiB per GPU available; raise --tp, use --kv-cache-dtype fp8 "
                              "or shorten the requests (--input-tokens, --output-tokens or their spread)")
    ctx, weights = _running_contexts(workload)
    # while decoding, vLLM frees sliding-window blocks that fell out of the window (the run-time hold)
    kv_hold = mean_running_bytes(layout, ctx, weights, unsettled_tokens=d.plan.running.unsettled_tokens)
    batch_kv = int(kv_budget // kv_hold)
    # a request is admitted only when its whole prompt fits in every group (sliding ones too): for a
    # sliding-window model that is more than a running request holds, and costs a few in the batch
    admission = admission_bytes(layout, workload.input_tokens.mean, in_flight_tokens=d.plan.capacity.in_flight_tokens)
    if admission > kv_hold:
        batch_kv = min(batch_kv, int(max(0.0, kv_budget - admission) // kv_hold) + 1)
    if d.batch is not None:
        if d.batch > batch_kv:
            raise DoesNotFitError(
                f"batch {d.batch} needs {d.batch * kv_hold / 2**30:.1f} GiB of KV cache per GPU on average "
                f"but {kv_budget / 2**30:.1f} GiB are available: at most {batch_kv} sequences fit; "
                "lower --batch, raise --tp or use --kv-cache-dtype fp8")
        batch = d.batch
    else:
        batch = min(d.max_num_seqs, batch_kv)
    if batch < 1:
        raise DoesNotFitError("not even one average sequence fits the KV cache")
    notes.append("batch bounded by time-averaged KV occupancy; peaks above it cause preemptions")

    e_tok = expected_tokens_per_step(spec_k, d.speculation.alpha) if d.speculation else 1.0
    q = spec_k + 1
    mean_in, mean_out = workload.input_tokens.mean, workload.output_tokens.mean
    per_request_prefill = None
    bound = "decode"
    b_eff = float(batch)
    for _ in range(3):
        cap = d.max_num_batched_tokens - b_eff * q
        if cap <= 0:
            raise ServebookError(f"max_num_batched_tokens {d.max_num_batched_tokens} leaves no room for prefill "
                                 f"beside {b_eff:.0f} x {q} decode tokens; raise it")
        per_request_prefill, chunks = _prefill_work_per_request(spec, workload, int(cap), tp, d.kv_cache_dtype)
        finish_per_step = b_eff * e_tok / mean_out
        if finish_per_step * mean_in > cap:
            finish_per_step = cap / mean_in
            b_eff = finish_per_step * mean_out / e_tok
            bound = "prefill token budget"
        else:
            break
    decode = decode_work(spec, b_eff, ctx, tp=tp, kv_cache_dtype=d.kv_cache_dtype, query_tokens=q,
                         context_weights=weights)
    prefill = per_request_prefill.scaled(finish_per_step)
    graph_max = d.plan.cudagraph_max_tokens(num_speculative_tokens=spec_k)
    step_tokens = (decode + prefill).tokens
    if step_tokens > graph_max:
        notes.append(f"steady-state steps carry {step_tokens:.0f} tokens, more than the largest CUDA graph "
                     f"({graph_max} tokens): they run eagerly (raise compilation_config.max_cudagraph_capture_size "
                     "or lower max_num_batched_tokens)")
    pricer = StepPricer(spec, d.gpu, coeffs, tp=tp, cudagraph_max_tokens=graph_max, kv_cache_dtype=d.kv_cache_dtype)
    mixed = pricer.breakdown(decode + prefill)
    alone = pricer.breakdown(decode)
    decode_only = alone.step_s
    if bound == "decode":
        # new prompts arrive a few per step: most steps decode only, some carry a chunk (see _expected_step_s)
        step = _expected_step_s(pricer, decode, per_request_prefill.scaled(1.0 / chunks), finish_per_step * chunks,
                                max(1, int(cap // max(1.0, per_request_prefill.tokens / chunks))))
    else:  # every step is filled with prefill up to the token budget
        step = mixed.step_s

    prefill_terms = {t: getattr(mixed, t) - getattr(alone, t)
                     for t in ("linear_s", "attention_s", "allreduce_s", "overhead_s")}
    # the mix of decode-only steps and steps carrying whole chunks, against one step carrying the mean prefill.
    # Not a fitted term: a difference of two priced steps (the expected step of the Poisson mix minus one
    # step with the mean prefill), so it may be negative where the mix is cheaper than the mean step
    # (a chunk's cost is concave in its size: Jensen's gap). Every fitted coefficient is non-negative
    # (tests/test_perf_calibration.py), so no fitted term makes a step cheaper than its parts.
    prefill_terms["step_mix_s"] = step - mixed.step_s
    draft_s = 0.0
    if spec_k and drafter.method != "ngram":
        draft_s = spec_k * draft_pass_s(drafter, d.gpu, coeffs, batch=b_eff, context_tokens=ctx,
                                        kv_cache_dtype=d.kv_cache_dtype, context_weights=weights)
    elif spec_k:
        notes.append("n-gram drafting: no GPU cost counted for drafts")
    steps = workload.requests / replicas / finish_per_step
    seconds = steps * (step + draft_s)
    hours = seconds / 3600
    out_tokens = workload.requests * mean_out
    if not coeffs.tp_calibrated and tp > 1:
        notes.append("TP all-reduce cost not calibrated (no TP>1 measurements): bandwidth term only, a lower bound")
    return FleetPlan(
        name=d.label, replicas=replicas, gpus=d.gpus, tp=tp, batch=int(batch), batch_kv_bound=batch_kv, bound=bound,
        mean_running_context_tokens=dot(weights, ctx), tokens_per_step=e_tok, step_s=step,
        draft_s=draft_s, prefill_tokens_per_step=finish_per_step * mean_in, steps_per_replica=steps,
        prefill_hours=steps * (step - decode_only) / 3600, decode_hours=steps * (decode_only + draft_s) / 3600,
        hours=hours, gpu_hours=hours * d.gpus,
        cost=None if d.price_per_gpu_hour is None else hours * d.gpus * d.price_per_gpu_hour,
        requests_per_s=workload.requests / seconds, output_tokens_per_s=out_tokens / seconds,
        kv_budget_bytes_per_gpu=kv_budget, notes=tuple(notes), prefill_step_terms_s=prefill_terms,
        step_bound=mixed.bound)


def decode_batch_limit(spec: ModelSpec, gpu, *, context_tokens: float, tp: int = 1, kv_cache_dtype: str = "auto",
                       gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                       max_num_batched_tokens: int | None = None,
                       max_num_seqs: int | None = None) -> tuple[int, float, float]:
    """(most sequences of ``context_tokens`` whose KV fits one GPU, KV budget bytes, KV bytes per sequence).

    The budget is the :class:`~servebook.plan.Plan`'s for ``vllm serve`` on this GPU (``None``
    engine arguments: vLLM's defaults, as ``servebook plan`` resolves them). Per-sequence bytes
    round the context up to whole 16-token blocks; sliding layers hold vLLM's run-time window
    (:func:`servebook.kv_cache.mean_running_bytes`).
    """
    from servebook.plan import make_plan_that_fits

    g = gpu_numbers(gpu)
    plan, _ = make_plan_that_fits(spec, gpu=g.name, tp=tp, kv_cache_dtype=kv_cache_dtype,
                                  gpu_memory_utilization=gpu_memory_utilization,
                                  max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    budget = float(plan.available_kv_bytes)
    ctx = math.ceil(context_tokens / CUDA_DEFAULT_BLOCK_SIZE) * CUDA_DEFAULT_BLOCK_SIZE
    per_seq = float(kv_bytes_per_sequence(spec, ctx, tp=tp, kv_cache_dtype=kv_cache_dtype, running=True))
    if budget <= 0:
        return 0, budget, per_seq
    return int(budget // per_seq), budget, per_seq


def check_decode_fits(spec: ModelSpec, gpu, *, batch: int, context_tokens: float, tp: int = 1,
                      kv_cache_dtype: str = "auto", gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                      max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> int:
    """Raise DoesNotFitError (with the bound) when ``batch`` sequences at this context exceed the KV cache.

    ``max_num_batched_tokens`` / ``max_num_seqs``: None for vLLM's defaults on the GPU (:func:`decode_batch_limit`).
    """
    limit, budget, per_seq = decode_batch_limit(spec, gpu, context_tokens=context_tokens, tp=tp,
                                                kv_cache_dtype=kv_cache_dtype,
                                                gpu_memory_utilization=gpu_memory_utilization,
                                                max_num_batched_tokens=max_num_batched_tokens,
                                                max_num_seqs=max_num_seqs)
    if budget <= 0:
        raise DoesNotFitError(f"{spec.name} leaves no KV cache room on {gpu_numbers(gpu).name} at tp={tp} "
                              f"(weights {spec.weight_bytes / tp / 2**30:.1f} GiB per GPU); raise --tp")
    if batch > limit:
        raise DoesNotFitError(
            f"batch {batch} at {context_tokens:.0f} tokens of context needs {batch * per_seq / 2**30:.1f} GiB of KV "
            f"cache per GPU, but {budget / 2**30:.1f} GiB are available ({per_seq / 2**20:.1f} MiB per sequence): "
            f"at most {limit} sequences fit; lower --batch or --context, raise --tp, or use --kv-cache-dtype fp8")
    return limit
