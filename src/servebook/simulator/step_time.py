"""How long one engine step takes: the simulator's clock.

The simulator only needs a callable

    step_time_s(num_prefill_tokens, num_decode_seqs, context_tokens) -> seconds

where ``num_prefill_tokens`` is the number of prompt (or recompute) tokens in the
step, ``num_decode_seqs`` the number of requests that decode one token, and
``context_tokens`` the sum over scheduled requests of the tokens their attention
reads (their context after the step). Any object with that signature plugs in,
e.g. :class:`PerfStepTime`, which prices the step with the calibrated
performance model of :mod:`servebook.perf` (a model may instead set
``prices_step_content = True`` and take the step's content, see there).

:class:`LinearStepTime` is a deliberately simple stand-in: a fixed cost per step
(reading the weights, launching kernels) plus costs proportional to prefill
tokens, decode sequences and context. Its defaults are round illustrative
numbers of the size one sees for an 8B model on one H100-class GPU
(≈ 10 ms per decode step at small batch, ≈ 0.1 ms per prefill token); they are
not a measurement. Only *relative* timings (who waits for whom) depend on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from servebook.errors import ServebookError
from servebook.simulator.config import SchedulerConfig
from servebook.vllm_rules.compilation import DEFAULT_CUDAGRAPH_MAX_TOKENS, cudagraph_max_tokens


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


@dataclass(frozen=True)
class PerfStepTime:
    """Step time from the calibrated performance model (:mod:`servebook.perf`), in seconds.

    The simulator hands it each step's content (:attr:`prices_step_content`):
    ``prefill_chunks``, one ``(tokens, prior_tokens, completes_prompt)`` per request
    prefilling (or recomputing) in the step, and ``decode_contexts``, the tokens
    already in each decoding sequence's KV cache. The step's work is the sum of
    :func:`~servebook.perf.work.decode_work` over the decoders (their context
    distribution, so sliding windows are capped per sequence) and one
    :func:`~servebook.perf.work.prefill_work` per chunk (attending its prior
    tokens; logits for the prompt's last token only), priced by
    :func:`~servebook.perf.model.step_time` -- the same call as ``servebook step``.

    Attributes:
        spec: the model (a ModelSpec).
        gpu: a catalogue GPU name or GPUNumbers.
        coeffs: calibrated ``Coefficients`` (see ``calibrated_coefficients``).
        tp: tensor-parallel size; times are per step of the TP group.
        kv_cache_dtype: ``auto`` or ``fp8``.
        cudagraph_max_tokens: largest step replayed as a CUDA graph (larger ones run
            eagerly); see :func:`servebook.vllm_rules.compilation.cudagraph_max_tokens`.
    """

    spec: object
    gpu: object
    coeffs: object
    tp: int = 1
    kv_cache_dtype: str = "auto"
    cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS
    _pricer: object = field(default=None, init=False, repr=False, compare=False)
    _prefill: object = field(default=None, init=False, repr=False, compare=False)
    _decode_rows: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _decode_sums: object = field(default=None, init=False, repr=False, compare=False)

    #: Tells :func:`servebook.simulator.simulate` to call :meth:`step_s` with the step's content.
    prices_step_content = True

    #: :func:`servebook.simulator.simulate` may pass ``context_total`` to :meth:`step_s`.
    takes_context_total = True

    def step_s(self, prefill_chunks, decode_contexts, context_total: int | None = None) -> float:
        """Seconds of a step with these prefill chunks and decoding sequences' contexts (tokens).

        Equals ``step_time(spec, gpu, work, coeffs, ...).step_s`` for the step's ``work``
        (the decoders' ``decode_work`` plus each chunk's ``prefill_work``), through the
        same functions with their per-model constants kept (``StepPricer``,
        ``PrefillWork``) and the step's work summed as a tuple of floats.

        ``context_total``: ``sum(decode_contexts)``, when the caller has it (the simulator adds
        it up while the contexts are at hand); passing it also vouches that every context is a
        whole number >= 0, so they are not checked again.
        """
        pricer = self._pricer or self._keep_constants()
        if decode_contexts:
            work = self._decode_work(decode_contexts, context_total)
        else:
            from servebook.perf.work import NO_WORK

            work = list(NO_WORK)
        return self._with_prefill(pricer, work, prefill_chunks)

    @property
    def lane_windows(self) -> tuple[int, ...] | None:
        """The sliding windows (tokens) whose capped context sums :meth:`step_s_with_lane` takes, in its
        order; None when this model cannot price decoders from sums (then every context is needed)."""
        sums = self._sums()
        return sums.window_sizes if sums else None

    def step_s_with_lane(self, prefill_chunks, decode_contexts, lane_decoders: int, lane_context_total: int,
                         lane_capped) -> float | None:
        """:meth:`step_s` for a step whose decoders are ``decode_contexts`` plus ``lane_decoders`` more
        (>= 1) of which the simulator knows only sums: their contexts add up to ``lane_context_total``
        tokens and, capped at each of :attr:`lane_windows`, to ``lane_capped``. The same float as
        :meth:`step_s` with every context; None when a sum passes 2**53 (then call :meth:`step_s`)."""
        pricer = self._pricer or self._keep_constants()
        sums = self._sums()
        capped = [own + lane for own, lane in zip(sums.capped_sums(decode_contexts), lane_capped)]
        work = sums.from_sums(len(decode_contexts) + lane_decoders, sum(decode_contexts) + lane_context_total,
                              capped)
        if work is None:
            return None
        return self._with_prefill(pricer, work, prefill_chunks)

    def _with_prefill(self, pricer, work: list, prefill_chunks) -> float:
        """Price ``work`` (the decoders' summed row) plus each chunk's prefill work, added in order."""
        prefill = self._prefill
        for tokens, prior, last in prefill_chunks:
            work = [a + b for a, b in zip(work, prefill(tokens, prior, last))]
        if work[0] == 0:
            raise ServebookError("a step needs at least one decode sequence or one prefill token")
        return pricer.step_s(*work)

    def _keep_constants(self):
        """Build (on the first step) what does not change from step to step; returns the StepPricer."""
        from servebook.perf.model import StepPricer
        from servebook.perf.work import PrefillWork

        object.__setattr__(self, "_prefill", PrefillWork(self.spec, tp=self.tp, kv_cache_dtype=self.kv_cache_dtype))
        object.__setattr__(self, "_pricer", StepPricer(self.spec, self.gpu, self.coeffs, tp=self.tp,
                                                       cudagraph_max_tokens=self.cudagraph_max_tokens,
                                                       kv_cache_dtype=self.kv_cache_dtype))
        return self._pricer

    def _decode_work(self, decode_contexts, context_total: int | None = None) -> list[float]:
        """Sum of ``decode_work(spec, 1, c).astuple()`` over the decoders' contexts ``c``.

        Work is additive over sequences (``decode_work`` of a batch with a context
        distribution is ``batch`` times its mean), so each sequence's work is looked up
        in a table filled on first use: one ``decode_work`` call per distinct context
        instead of one per step, which keeps 10,000-request simulations fast.
        """
        sums = self._sums()
        if sums:
            exact = sums(decode_contexts, context_total)
            if exact is not None:
                return exact
        table = self._decode_rows
        try:
            rows = list(map(table.__getitem__, decode_contexts))
        except KeyError:  # a context seen for the first time (decode_work refuses a negative one)
            rows = [table[c] if c in table else self._decode_row(c) for c in decode_contexts]
        return list(map(sum, zip(*rows)))

    def _sums(self):
        """The model's :class:`_DecodeSums` (built on first use), or False when its work is not whole numbers."""
        sums = self._decode_sums
        if sums is None:
            sums = _DecodeSums.for_model(self.spec, self.tp, self.kv_cache_dtype, self._decode_row)
            object.__setattr__(self, "_decode_sums", sums)
        return sums

    def _decode_row(self, context: int) -> tuple[float, ...]:
        from servebook.perf.work import decode_work

        row = decode_work(self.spec, 1, float(context), tp=self.tp, kv_cache_dtype=self.kv_cache_dtype).astuple()
        self._decode_rows[context] = row
        return row

    def __call__(self, num_prefill_tokens: int, num_decode_seqs: int, context_tokens: int) -> float:
        """Approximate price from totals alone (for callers that have no step content).

        The decoding sequences' mean context is taken as ``context_tokens`` over all
        scheduled requests, and the prefill tokens as one chunk without prior tokens.
        """
        from servebook.perf import chunk_budget

        users = num_decode_seqs + (1 if num_prefill_tokens else 0)
        mean_context = context_tokens / users if users else 0.0
        return chunk_budget.mixed_step_s(self.spec, self.gpu, self.coeffs, prefill_tokens=num_prefill_tokens,
                                         decode_batch=num_decode_seqs, decode_context_tokens=mean_context,
                                         tp=self.tp, kv_cache_dtype=self.kv_cache_dtype)


#: Integers up to this are exact in a float64 (the 53-bit significand), and so are their sums below it.
_EXACT_INT = 2 ** 53


class _DecodeSums:
    """The column sums of ``decode_work(spec, 1, c).astuple()`` over a step's decoders, without a row per decoder.

    One decoder's work is ``a + b_full x c + sum over windows W of b_W x min(c, W)`` for its context
    ``c`` (:func:`~servebook.perf.work.decode_work`: the KV it reads and the keys it attends grow with
    the context, capped at the window on sliding layers, the last also counted apart for the sliding
    layers alone; the other five fields are constant).
    :meth:`PerfStepTime._decode_work` adds the rows one by one in floats. Here:

    * a constant field's sum is that of ``n`` equal terms, kept per ``n`` (:func:`sum` of them, once);
    * the three growing fields (attention FLOPs, KV bytes, sliding layers' KV bytes) have whole-number coefficients, so each
      decoder's value is a whole number and every partial sum below 2**53 is exact in floats, in any
      order: ``n x a + b_full x sum(c) + sum_W b_W x sum(min(c, W))`` in Python integers is the same
      float -- three sums over the step's contexts instead of seven per decoder.

    Calling it returns None (the caller takes the table) when the contexts are not all ``int``, one
    is negative, or a sum reaches 2**53.
    """

    GROWING = (4, 5, 7)  # Work.astuple() positions of attention_flops, kv_read_bytes, kv_read_bytes_sliding

    def __init__(self, const: tuple, full: tuple[int, int], windows: tuple[tuple[int, tuple[int, int]], ...]):
        self.const, self.full, self.windows = const, full, windows
        self.const_attn, self.const_kv, self.const_sliding = (int(const[i]) for i in self.GROWING)
        self.repeated: dict[int, list] = {}

    def __bool__(self) -> bool:
        return True

    @classmethod
    def for_model(cls, spec, tp: int, kv_cache_dtype, row) -> "_DecodeSums | bool":
        """The sums for this model, or False when its growing fields' coefficients are not whole numbers.

        ``row(c)`` is ``decode_work(spec, 1, c).astuple()``; the coefficients derived here from the
        model's layers are checked against it at every context where the form could bend.
        """
        from servebook.perf.work import _attention_dims, kv_dtype_bytes, kv_elements_per_token_per_gpu

        q_heads = spec.num_attention_heads / tp
        dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
        per_window: dict = {}
        for layer in spec.layers:
            flops_per_key = 2 * q_heads * _attention_dims(spec, layer)
            bytes_per_key = kv_elements_per_token_per_gpu(layer, tp) * dtype_bytes
            attn, kv = per_window.get(layer.sliding_window, (0.0, 0.0))
            per_window[layer.sliding_window] = (attn + flops_per_key, kv + bytes_per_key)
        zero = row(0)
        numbers = [zero[i] for i in cls.GROWING] + [v for pair in per_window.values() for v in pair]
        if not all(float(v).is_integer() and 0 <= v < _EXACT_INT for v in numbers):
            return False
        full = tuple(int(v) for v in per_window.pop(None, (0.0, 0.0)))
        windows = tuple((int(w), (int(a), int(k))) for w, (a, k) in sorted(per_window.items()))
        sums = cls(zero, full, windows)
        checks = {0, 1, 2, 3, 1000, 4097, spec.max_position_embeddings or 0}
        for w, _ in windows:
            checks |= {w - 1, w, w + 1, 2 * w + 3}
        for c in sorted(x for x in checks if x >= 0):
            if sums([c]) != list(row(c)):
                return False
        return sums

    @property
    def window_sizes(self) -> tuple[int, ...]:
        """The sliding windows (tokens) whose capped context sums :meth:`from_sums` takes, in its order."""
        return tuple(w for w, _ in self.windows)

    def __call__(self, contexts, total: int | None = None) -> list | None:
        """The summed row for these contexts; ``total`` is their sum when known (and vouched for)."""
        if total is None:
            total = sum(contexts)
            if type(total) is not int or min(contexts) < 0:  # decode_work refuses a negative context
                return None
        return self.from_sums(len(contexts), total, self.capped_sums(contexts))

    def capped_sums(self, contexts) -> list[int]:
        """Per window of :attr:`window_sizes`, the sum of ``contexts`` capped at it (tokens)."""
        return [sum([c if c < w else w for c in contexts]) for w, _ in self.windows]

    def from_sums(self, n: int, total: int, capped) -> list | None:
        """The summed row for ``n`` decoders whose contexts (whole tokens >= 0) sum to ``total`` and,
        capped at each window of :attr:`window_sizes`, to ``capped[i]``; None past 2**53."""
        b_attn, b_kv = self.full
        attn, kv = self.const_attn * n + b_attn * total, self.const_kv * n + b_kv * total
        sliding = self.const_sliding * n
        for (_, (b_attn, b_kv)), capped in zip(self.windows, capped):
            attn += b_attn * capped
            kv += b_kv * capped
            sliding += b_kv * capped
        if attn >= _EXACT_INT or kv >= _EXACT_INT:
            return None
        out = self.repeated.get(n)
        if out is None:  # each constant field summed as the table path sums it: n equal terms, in order
            out = self.repeated[n] = [sum([v] * n) for v in self.const]
        out = out.copy()
        out[4] = float(attn)
        out[5] = float(kv)
        out[7] = float(sliding)
        return out


def perf_step_time(spec, gpu, coeffs, *, tp: int = 1, kv_cache_dtype: str = "auto",
                   cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> PerfStepTime:
    """A :class:`PerfStepTime` for ``spec`` on ``gpu`` with calibrated ``coeffs``."""
    return PerfStepTime(spec, gpu, coeffs, tp=tp, kv_cache_dtype=kv_cache_dtype,
                        cudagraph_max_tokens=cudagraph_max_tokens)


def perf_step_time_for(config: str, gpu: str, *, tp: int = 1, kv_cache_dtype: str = "auto",
                       max_num_seqs: int = SchedulerConfig.max_num_seqs,
                       max_num_batched_tokens: int = SchedulerConfig.max_num_batched_tokens,
                       calibration: str | None = None) -> tuple[PerfStepTime, str]:
    """Load a model (config.json path, directory or reference id) and a GPU's calibration.

    Returns the step-time model and a note on where its coefficients come from. The
    CUDA-graph limit follows vLLM's default for ``max_num_seqs`` and
    ``max_num_batched_tokens`` (default: the toy engine's, :class:`SchedulerConfig`; a
    deployment passes its :class:`~servebook.plan.Plan`'s).
    """
    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.vllm_rules import check_tp

    spec = load_model_spec(config)
    g = gpu_numbers(gpu)
    check_tp(spec, tp)
    coeffs, where = calibrated_coefficients(g.name, calibration)
    if tp > 1 and not coeffs.tp_calibrated:
        where += "; TP all-reduce not calibrated (bandwidth term at peak link speed only, a lower bound)"
    model = perf_step_time(spec, g, coeffs, tp=tp, kv_cache_dtype=kv_cache_dtype,
                           cudagraph_max_tokens=cudagraph_max_tokens(max_num_seqs, max_num_batched_tokens,
                                                                     architecture=spec.architecture))
    return model, where
