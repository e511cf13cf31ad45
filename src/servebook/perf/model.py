"""Step time in seconds: the work of a step (:mod:`servebook.perf.work`) over calibrated rates.

One engine step runs three kinds of kernels one after another, and each kind is
limited by whichever of bandwidth or compute it exhausts first (a roofline per
kernel class, joined by a smooth maximum):

``step_s = overhead_s + body_s``, where

``overhead_s = step_overhead_s + per_sequence_overhead_s x sequences``
``           + per_layer_overhead_s x layers + per_moe_layer_overhead_s x MoE layers``
``gpu_s = smoothmax(weights_bytes / (BW x weight_eff) + expert_bytes / (BW x expert_eff),``
``                  linear_flops / (FLOPS x matmul_eff(tokens)))``
``      + smoothmax(kv_read_bytes / (BW x kv_eff), attention_flops / (FLOPS x attention_eff))``
``      + allreduces x (allreduce_latency_s + 2 (tp-1)/tp x bytes / link_bandwidth)``
(sliding-window layers' share of the KV read goes at ``kv_eff x sliding_kv_bandwidth_eff``; a 1-byte
fp8 KV cache is read at ``kv_eff x fp8_kv_bandwidth_eff``)
``body_s`` depends on how vLLM runs the step (``cudagraph_mode`` FULL_AND_PIECEWISE, its default):

* a decode-only step of at most ``cudagraph_max_tokens`` tokens replays one full CUDA graph:
  ``body_s = gpu_s``;
* a step that carries a prefill chunk, of at most ``cudagraph_max_tokens`` tokens, replays
  *piecewise* graphs with attention run eagerly between them: ``body_s = gpu_s +
  piecewise_sequence_s x sequences`` (measured on the H200: such steps of Llama-3.1-8B with
  ~250 decoding requests took ~22 ms where the decode-only steps beside them took ~12 ms);
* a larger step runs eagerly, the host launching every kernel, and for small GPU work
  that launch time is the floor: ``body_s = smoothmax(gpu_s, eager_layer_s x layers +
  eager_moe_layer_s x MoE layers + eager_mla_layer_s x MLA layers + eager_sequence_s x sequences)`` (measured: Llama-3.1-8B steps of 513-2,048 tokens
  all took ~40 ms; a Qwen3-30B-A3B prefill of 1,024-4,096 tokens the same ~85 ms).

A step carries a prefill chunk when it computes more tokens than it samples
(``Work.tokens > Work.sampled_tokens``: a decoding sequence samples every token it computes).

``matmul_eff(rows) = peak_eff x rows / (rows + matmul_half_tokens)``: a GEMM
with few rows (decode) cannot use the tensor cores as well as a prefill's
thousands. Dense layers see every token of the step as a row; a routed expert
sees only the tokens routed to it (``tokens x top-k / experts touched``):
``expert_eff = expert_matmul_peak_eff x rows / (rows + expert_half_rows) x size / (size +
expert_half_size)``, where ``size`` is the expert's FFN width on one GPU
(:func:`servebook.perf.work.expert_gemm_size`; narrow experts give the fused MoE kernel few
tiles and a short inner loop); the two half points are fitted to timings of that kernel alone
(:mod:`servebook.perf.calibrate_experts`), the peak to whole steps. The rows are scaled by ``2 / bytes per
expert weight`` (:func:`servebook.perf.work.expert_gemm_rows`: quantized experts
reach the compute-bound regime at fewer rows than the 16-bit ones it was fitted on). ``smoothmax(a, b) = (a^p + b^p)^(1/p)``.

Every ``*_eff``, overhead and ``p`` is a :class:`Coefficients` field fitted by
:mod:`servebook.perf.calibrate` to recorded vLLM measurements; peaks come from
the GPU catalogue. Nothing here assumes an efficiency.
"""
from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec
from servebook.perf._arith import maximum, where
from servebook.perf.gpu import GPUNumbers, gpu_numbers
from servebook.reductions import is_number, require_numpy
from servebook.perf.work import (
    Work,
    _allreduce_bytes,
    _expert_weight_bytes_read,
    _expert_gemm_rows,
    allreduce_count,
    check_tp,
    decode_work,
    dense_weight_bytes_read,
    expert_gemm_size,
    kv_dtype_bytes,
    prefill_work,
    prompt_chunks,
)
from servebook.vllm_rules.compilation import DEFAULT_CUDAGRAPH_MAX_TOKENS, cudagraph_max_tokens  # noqa: F401


@dataclass(frozen=True)
class Coefficients:
    """Calibrated constants of the step-time model (seconds and fractions of peak).

    Attributes:
        step_overhead_s: fixed cost of one engine step (scheduling, launch, sampling), s.
        per_sequence_overhead_s: extra cost per sequence in the step, s.
        request_overhead_s: fixed cost of one whole request outside its steps
            (admission, detokenising, output), s; part of a measured prefill
            wall time, not of a step.
        weight_bandwidth_eff: fraction of peak HBM bandwidth reached streaming dense weights.
        expert_bandwidth_eff: same for routed-expert weights (fused MoE kernels).
        kv_bandwidth_eff: fraction of peak HBM bandwidth reached reading the KV cache.
        matmul_peak_eff: fraction of peak bf16 FLOP/s linear layers reach with many tokens.
        matmul_half_tokens: GEMM rows (tokens) at which linear layers reach half of that.
        expert_matmul_peak_eff: the same peak for routed-expert GEMMs (fused MoE kernels).
        expert_half_rows: rows per expert at which routed-expert GEMMs reach half of their peak;
            None: ``matmul_half_tokens``.
        expert_half_size: expert FFN width per GPU (elements) at which routed-expert GEMMs reach half
            of their peak (narrow experts give the kernel few tiles and a short inner loop); None: no
            such term (the efficiency does not depend on the expert's width).
        attention_eff: fraction of peak bf16 FLOP/s reached by attention math.
        per_layer_overhead_s: fixed cost per decoder layer per step (gaps between kernels), s.
        per_moe_layer_overhead_s: extra fixed cost per MoE layer per step (routing, sorting), s.
        eager_layer_s: host time to launch one decoder layer's kernels in an eager step, s.
        eager_moe_layer_s: extra host time per MoE layer in an eager step, s.
        eager_sequence_s: extra host time per sequence in an eager step, s.
        piecewise_sequence_s: extra time per sequence of a step that carries a prefill chunk and
            runs under piecewise CUDA graphs (attention launched eagerly), s.
        sliding_kv_bandwidth_eff: the KV bandwidth sliding-window layers reach, as a fraction of
            ``kv_bandwidth_eff`` (vLLM's sliding-window attention is slower per byte read); 1.0: the same.
        fp8_kv_bandwidth_eff: the KV bandwidth a 1-byte (fp8) KV cache is read at, as a fraction of
            ``kv_bandwidth_eff`` (the attention kernel converts every element it reads; measured on the
            H200, half the bytes did not take half the time); 1.0: the same, never above it.
        eager_mla_layer_s: extra host time per MLA attention layer in an eager step, s (beside
            ``eager_layer_s``): vLLM's MLA layer runs two attention paths in Python, each a chain of
            small ops (absorbed decode: W_UK and W_UV batched matmuls around the latent-attention kernel;
            prefill: the kv_b_proj up-projection, splits and concatenations around varlen attention), so
            an eager step launches more kernels per MLA layer than per GQA layer; >= 0.
        smoothmax_p: exponent of the smooth maximum joining bandwidth and compute limits.
        allreduce_latency_s: fixed cost of one TP all-reduce, s; None when no TP>1
            measurement calibrated it (then 0 is used and results say so).
        link_eff: fraction of peak interconnect bandwidth reached by all-reduce; None when
            not calibrated (then 1.0, a lower bound on the cost, and results say so).
        gpu: GPU the coefficients were calibrated on.
        source: where they came from (calibration file, "synthetic", ...).
    """

    step_overhead_s: float
    per_sequence_overhead_s: float
    request_overhead_s: float
    weight_bandwidth_eff: float
    expert_bandwidth_eff: float
    kv_bandwidth_eff: float
    matmul_peak_eff: float
    matmul_half_tokens: float
    attention_eff: float
    smoothmax_p: float
    allreduce_latency_s: float | None = None
    link_eff: float | None = None
    expert_matmul_peak_eff: float | None = None
    expert_half_rows: float | None = None
    expert_half_size: float | None = None
    per_layer_overhead_s: float = 0.0
    per_moe_layer_overhead_s: float = 0.0
    eager_layer_s: float = 0.0
    eager_moe_layer_s: float = 0.0
    eager_sequence_s: float = 0.0
    piecewise_sequence_s: float = 0.0
    sliding_kv_bandwidth_eff: float = 1.0
    fp8_kv_bandwidth_eff: float = 1.0
    eager_mla_layer_s: float = 0.0
    gpu: str = ""
    source: str = ""

    @property
    def tp_calibrated(self) -> bool:
        """True when the all-reduce terms were fitted to TP>1 measurements."""
        return self.allreduce_latency_s is not None and self.link_eff is not None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Coefficients":
        names = {f.name for f in fields(cls)}
        optional = {f.name for f in fields(cls) if f.default is not MISSING}
        missing = names - set(data) - optional
        if missing:
            raise ServebookError(f"coefficients file lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in names})


#: The coefficients that are numbers (``gpu`` and ``source`` are text).
_NUMERIC_COEFFICIENTS = frozenset(f.name for f in fields(Coefficients) if f.name not in ("gpu", "source"))

#: What each numeric coefficient is, and so the values it may take: ``"efficiency"`` a fraction of a peak,
#: in (0, 1]; ``"seconds"`` a cost added to a step or request, >= 0 (no term may make a step cheaper than its
#: parts); ``"count"`` a half point (rows, tokens, elements), > 0; ``"exponent"`` the smooth maximum's p, >= 1
#: (p = 1 adds the limits, larger p tends to their maximum; below 1 the step would cost more than their sum
#: and the smooth maximum would not be one).
COEFFICIENT_KINDS = {
    "step_overhead_s": "seconds", "per_sequence_overhead_s": "seconds", "request_overhead_s": "seconds",
    "per_layer_overhead_s": "seconds", "per_moe_layer_overhead_s": "seconds", "eager_layer_s": "seconds",
    "eager_moe_layer_s": "seconds", "eager_mla_layer_s": "seconds", "eager_sequence_s": "seconds",
    "piecewise_sequence_s": "seconds", "allreduce_latency_s": "seconds",
    "weight_bandwidth_eff": "efficiency", "expert_bandwidth_eff": "efficiency", "kv_bandwidth_eff": "efficiency",
    "matmul_peak_eff": "efficiency", "expert_matmul_peak_eff": "efficiency", "attention_eff": "efficiency",
    "link_eff": "efficiency", "sliding_kv_bandwidth_eff": "efficiency", "fp8_kv_bandwidth_eff": "efficiency",
    "matmul_half_tokens": "count", "expert_half_rows": "count", "expert_half_size": "count",
    "smoothmax_p": "exponent",
}


def coefficient_problems(values: dict) -> list[str]:
    """Each numeric coefficient in ``values`` outside what its kind allows (:data:`COEFFICIENT_KINDS`), as
    ``"name = value (why)"``; None values (not calibrated) pass. Empty when every one is in range."""
    bad = []
    for name, value in values.items():
        kind = COEFFICIENT_KINDS.get(name)
        if kind is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        ok = {"efficiency": 0.0 < value <= 1.0, "seconds": value >= 0.0, "count": value > 0.0,
              "exponent": value >= 1.0}[kind]
        if not ok or value != value:
            why = {"efficiency": "a fraction of a peak is in (0, 1]", "seconds": "a cost cannot be negative",
                   "count": "a half point is > 0", "exponent": "the smooth maximum needs p >= 1"}[kind]
            bad.append(f"{name} = {value:g} ({why})")
    return bad


def smoothmax(a, b, p: float):
    """``(a^p + b^p)^(1/p)``: equals max(a, b) as p grows, their sum at p = 1.

    Two numbers give a float (no numpy needed); arrays give a numpy array."""
    if is_number(a) and is_number(b):
        return _smoothmax(float(a), float(b), p)
    np = require_numpy("smoothmax over arrays")
    return _smoothmax(np.asarray(a, dtype=float), np.asarray(b, dtype=float), p)


def _smoothmax(a, b, p: float):
    """:func:`smoothmax` of floats or float arrays (a float for floats)."""
    m = maximum(maximum(a, b), 1e-300)
    return m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)


@dataclass(frozen=True)
class StepBreakdown:
    """Seconds of one step by term, plus the counts behind them (per GPU)."""

    step_s: float
    overhead_s: float  # fixed costs, plus the host-launch excess of an eager step
    linear_s: float
    attention_s: float
    allreduce_s: float
    weight_bytes: float
    expert_bytes: float
    kv_read_bytes: float
    linear_flops: float
    attention_flops: float
    tokens: float
    bound: str  # "memory" or "compute" for the linear layers

    def to_dict(self) -> dict:
        return asdict(self)


def step_seconds(g: GPUNumbers, c: Coefficients, *, weight_bytes, expert_bytes, tokens, sequences,
                 linear_flops, kv_read_bytes, attention_flops, allreduces=0, allreduce_bytes_each=0.0,
                 tp: int = 1, expert_flops=0.0, expert_rows=1.0, expert_size=None, layers=0, moe_layers=0,
                 eager=False, kv_read_bytes_sliding=0.0, piecewise=False, mla_layers=0, kv_dtype_bytes=2) -> dict:
    """Vectorised step-time formula (see module docstring) over arrays of per-GPU counts.

    Returns a dict of arrays: ``step_s`` and its terms ``overhead_s``, ``linear_s``,
    ``attention_s``, ``allreduce_s``, plus ``compute_bound`` (bool). ``eager``: the step runs
    without CUDA graphs; ``piecewise``: it carries a prefill chunk and replays piecewise graphs
    (ignored where ``eager``); ``mla_layers``: MLA attention layers (their extra eager host time);
    ``kv_dtype_bytes``: bytes per KV element (1: the KV read goes at ``fp8_kv_bandwidth_eff``);
    ``expert_size``: the routed experts' FFN width per GPU (elements), needed
    for steps with expert FLOPs when ``c.expert_half_size`` is set. Needs numpy (calibration
    and sweeps use it); :class:`StepPricer` prices one step in floats without it.
    """
    np = require_numpy("step_seconds (the step-time formula over arrays)")
    if expert_size is None:
        if c.expert_half_size is not None and np.any(np.asarray(expert_flops) > 0):
            raise ServebookError("step_seconds: steps with routed-expert FLOPs need expert_size, the expert's FFN "
                                 "width on one GPU (servebook.perf.work.expert_gemm_size), when the coefficients "
                                 "price it (expert_half_size)")
        expert_size = 0.0
    return _step_seconds(g, c, weight_bytes=np.asarray(weight_bytes), expert_bytes=np.asarray(expert_bytes),
                         tokens=np.asarray(tokens, dtype=float), sequences=np.asarray(sequences, dtype=float),
                         linear_flops=np.asarray(linear_flops), kv_read_bytes=np.asarray(kv_read_bytes),
                         attention_flops=np.asarray(attention_flops), allreduces=np.asarray(allreduces),
                         allreduce_bytes_each=np.asarray(allreduce_bytes_each), tp=tp,
                         expert_flops=np.asarray(expert_flops, dtype=float),
                         expert_rows=np.asarray(expert_rows, dtype=float),
                         expert_size=np.asarray(expert_size, dtype=float), layers=np.asarray(layers, dtype=float),
                         moe_layers=np.asarray(moe_layers, dtype=float), eager=np.asarray(eager, dtype=bool),
                         piecewise=np.asarray(piecewise, dtype=bool),
                         kv_read_bytes_sliding=np.asarray(kv_read_bytes_sliding, dtype=float),
                         mla_layers=np.asarray(mla_layers, dtype=float),
                         kv_dtype_bytes=np.asarray(kv_dtype_bytes, dtype=float))


def _step_seconds(g: GPUNumbers, c: Coefficients, *, weight_bytes, expert_bytes, tokens, sequences, linear_flops,
                  kv_read_bytes, attention_flops, allreduces, allreduce_bytes_each, tp: int, expert_flops,
                  expert_rows, layers, moe_layers, eager, piecewise=False, kv_read_bytes_sliding=0.0,
                  expert_size=0.0, mla_layers=0.0, kv_dtype_bytes=2.0) -> dict:
    """:func:`step_seconds` on float arrays, or on Python floats (then it returns floats).

    The one copy of the formula: :func:`step_seconds` gives it arrays, :class:`StepPricer`
    (one step at a time) floats, for which it makes no numpy call.
    """
    bw = g.hbm_bandwidth_bytes_per_s
    flops = g.bf16_dense_flops
    read_s = weight_bytes / (bw * c.weight_bandwidth_eff) + expert_bytes / (bw * c.expert_bandwidth_eff)
    matmul_eff = c.matmul_peak_eff * tokens / (tokens + c.matmul_half_tokens)
    rows = maximum(expert_rows, 1e-9)
    expert_peak = c.expert_matmul_peak_eff if c.expert_matmul_peak_eff is not None else c.matmul_peak_eff
    half_rows = c.expert_half_rows if c.expert_half_rows is not None else c.matmul_half_tokens
    expert_eff = expert_peak * rows / (rows + half_rows)
    if c.expert_half_size is not None:
        size = maximum(expert_size, 1.0)  # (a dense model has no expert FLOPs; 1 keeps 0/0 away)
        expert_eff = expert_eff * size / (size + c.expert_half_size)
    compute_s = (linear_flops - expert_flops) / (flops * matmul_eff) + expert_flops / (flops * expert_eff)
    linear_s = _smoothmax(read_s, compute_s, c.smoothmax_p)
    # sliding-window layers read their share of the KV at their own (lower) efficiency: the extra time of
    # those bytes (exactly 0 when the efficiency is the full-attention one)
    # a 1-byte (fp8) KV cache is read at its own (lower or equal) efficiency
    kv_bw = bw * c.kv_bandwidth_eff * where(kv_dtype_bytes == 1, c.fp8_kv_bandwidth_eff, 1.0)
    kv_s = kv_read_bytes / kv_bw + kv_read_bytes_sliding * (1.0 / (kv_bw * c.sliding_kv_bandwidth_eff) - 1.0 / kv_bw)
    attention_s = _smoothmax(kv_s, attention_flops / (flops * c.attention_eff), c.smoothmax_p)
    allreduce_s = 0.0 * tokens
    if tp > 1:
        link = g.link_bytes_per_s_each_way * (c.link_eff if c.link_eff is not None else 1.0)
        if link <= 0:
            raise ServebookError(f"GPU {g.name} has no interconnect bandwidth in the catalogue; "
                                 "tensor parallelism cannot be modelled on it")
        per = (c.allreduce_latency_s or 0.0) + 2 * (tp - 1) / tp * allreduce_bytes_each / link
        allreduce_s = allreduces * per
    overhead_s = (c.step_overhead_s + c.per_sequence_overhead_s * sequences
                  + c.per_layer_overhead_s * layers + c.per_moe_layer_overhead_s * moe_layers)
    gpu_s = linear_s + attention_s + allreduce_s
    host_s = (c.eager_layer_s * layers + c.eager_moe_layer_s * moe_layers + c.eager_mla_layer_s * mla_layers
              + c.eager_sequence_s * sequences)
    # (a float step that is not eager skips the smooth maximum it would discard)
    body_s = gpu_s if eager is False else where(eager, _smoothmax(gpu_s, host_s, c.smoothmax_p), gpu_s)
    piece_s = c.piecewise_sequence_s * sequences
    if isinstance(piecewise, bool):  # one step in floats
        body_s = body_s + (piece_s if piecewise and not eager else 0.0)
    else:
        body_s = body_s + where(piecewise & ~eager, piece_s, 0.0)
    return {"step_s": overhead_s + body_s, "overhead_s": overhead_s,
            "linear_s": linear_s, "attention_s": attention_s, "allreduce_s": allreduce_s,
            "eager_extra_s": body_s - gpu_s, "compute_bound": compute_s > read_s}


def carries_prefill(tokens, sampled_tokens):
    """Whether a step carries a prefill chunk: it computes more tokens than it samples (a decoding
    sequence samples every token it computes). Floats or arrays."""
    return tokens - sampled_tokens >= 0.5


def _moe_layers(spec: ModelSpec) -> int:
    return len(spec.moe.moe_layer_indices) if spec.moe else 0


def step_time(spec: ModelSpec, gpu, work: Work, coeffs: Coefficients, *, tp: int = 1,
              cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS, kv_cache_dtype: str | int = "auto") -> StepBreakdown:
    """Seconds of one engine step whose content is ``work`` (per GPU of a TP group).

    Steps of more than ``cudagraph_max_tokens`` tokens run eagerly (see module docstring).
    """
    return StepPricer(spec, gpu, coeffs, tp=tp, cudagraph_max_tokens=cudagraph_max_tokens,
                      kv_cache_dtype=kv_cache_dtype).breakdown(work)


#: Weight schemes whose step time the model prices from bytes and FLOPs as for 16-bit weights: FP8 on its
#: native tensor-core kernels and gpt-oss's MXFP4 experts (recorded end to end on the H200).
STEP_TIME_SCHEMES = frozenset({"fp8_block", "fp8_tensor", "fp8_channel", "mxfp4"})


def check_step_time_modelled(spec: ModelSpec, gpu_name: str | None) -> None:
    """Refuse a step time for weights whose kernels were never measured (int4 AWQ/GPTQ/W4A16 through
    Marlin, NVFP4, W8A8 int8, any scheme on a weight-only fallback kernel), instead of guessing one.

    Raises:
        ServebookError: naming the scheme and kernel; ``servebook plan`` still sizes the memory.
    """
    from servebook.hf_config import spec_quantization
    from servebook.quant_schemes import kernel_on

    q = spec_quantization(spec)
    if q is None:
        return
    kernel = kernel_on(q, gpu_name) if gpu_name else None
    fallback = kernel is not None and not kernel.native
    if q.scheme.name not in STEP_TIME_SCHEMES or fallback:
        how = kernel.kernel if kernel is not None else q.scheme.kernel
        raise ServebookError(
            f"step times of {spec.name} ({q.scheme.description}, run by {how}) are not modelled: no such "
            "kernel was measured, and weight bytes alone do not give its speed (dequantization happens in "
            "the GEMM). servebook plan sizes its memory; for step times, time it on the GPU "
            "(labs/tools/gpu_record.py timing); the 16-bit checkpoint's step time is not this kernel's.")


class StepPricer:
    """:func:`step_time` for one model, GPU, coefficients, TP size and CUDA-graph limit.

    What does not depend on the step (GPU peaks, weight bytes, layer counts) is computed
    once; each step is then priced in Python floats by the formula :func:`step_seconds`
    evaluates over arrays. :func:`step_time` builds one per call; a simulator keeps one
    for all its steps (:meth:`step_s`, about 10 us a step).
    """

    def __init__(self, spec: ModelSpec, gpu, coeffs: Coefficients, *, tp: int = 1,
                 cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS, kv_cache_dtype: str | int = "auto"):
        self.spec = spec
        self.gpu = gpu_numbers(gpu)
        check_step_time_modelled(spec, getattr(self.gpu, "name", None) or getattr(gpu, "name", None))
        self.coeffs = coeffs
        self.tp = tp
        self.cudagraph_max_tokens = cudagraph_max_tokens
        self.weight_bytes = dense_weight_bytes_read(spec, tp)
        self.allreduces = float(allreduce_count(spec, tp))
        self.layers = float(spec.num_layers)
        self.moe_layers = float(_moe_layers(spec))
        self.expert_size = expert_gemm_size(spec, tp)
        self.mla_layers = float(sum(1 for layer in spec.layers if layer.kind == "mla"))
        self.kv_dtype_bytes = float(kv_dtype_bytes(kv_cache_dtype))

    def formula_args(self, tokens, sequences, sampled_tokens, linear_flops, attention_flops, kv_read_bytes,
                     expert_flops, kv_read_bytes_sliding=0.0) -> dict:
        """The keyword arguments of :func:`step_seconds` (floats, ``tp`` included) for a step whose
        :meth:`Work.astuple` is the arguments: what the step reads and computes, and how vLLM runs it."""
        spec, tp = self.spec, self.tp
        t = float(tokens)
        return dict(weight_bytes=self.weight_bytes, expert_bytes=_expert_weight_bytes_read(spec, t, tp), tokens=t,
                    sequences=float(sequences), linear_flops=float(linear_flops),
                    kv_read_bytes=float(kv_read_bytes), attention_flops=float(attention_flops),
                    allreduces=self.allreduces, allreduce_bytes_each=_allreduce_bytes(spec, t, tp), tp=tp,
                    expert_flops=float(expert_flops), expert_rows=_expert_gemm_rows(spec, t),
                    expert_size=self.expert_size,
                    layers=self.layers, moe_layers=self.moe_layers, eager=t > self.cudagraph_max_tokens,
                    piecewise=carries_prefill(t, float(sampled_tokens)),
                    kv_read_bytes_sliding=float(kv_read_bytes_sliding), mla_layers=self.mla_layers,
                    kv_dtype_bytes=self.kv_dtype_bytes)

    def terms(self, tokens, sequences, sampled_tokens, linear_flops, attention_flops, kv_read_bytes,
              expert_flops, kv_read_bytes_sliding=0.0) -> dict:
        """:func:`step_seconds`' dict (floats) for a step whose :meth:`Work.astuple` is the arguments,
        plus ``expert_bytes``, the routed-expert weight bytes it reads."""
        args = self.formula_args(tokens, sequences, sampled_tokens, linear_flops, attention_flops, kv_read_bytes,
                                 expert_flops, kv_read_bytes_sliding)
        t, expert_bytes = args["tokens"], args["expert_bytes"]
        try:
            out = _step_seconds(self.gpu, self.coeffs, **args)
        except (ZeroDivisionError, OverflowError):  # e.g. a step of no tokens: numpy's inf/nan, as over arrays
            try:
                require_numpy("")
            except ServebookError:
                raise ServebookError(f"a step of {t:g} tokens has no finite time in the step model; "
                                     "price steps of at least one token") from None
            out = {k: v[()] for k, v in step_seconds(self.gpu, self.coeffs, **args).items()}
        out["expert_bytes"] = expert_bytes
        return out

    def step_s(self, *work: float) -> float:
        """Seconds of a step whose :meth:`Work.astuple` is ``work``."""
        return self.terms(*work)["step_s"]

    def breakdown(self, work: Work) -> StepBreakdown:
        """The :class:`StepBreakdown` of a step of content ``work``."""
        t = self.terms(*work.astuple())
        return StepBreakdown(step_s=float(t["step_s"]), overhead_s=float(t["overhead_s"]) + float(t["eager_extra_s"]),
                             linear_s=float(t["linear_s"]), attention_s=float(t["attention_s"]),
                             allreduce_s=float(t["allreduce_s"]), weight_bytes=self.weight_bytes,
                             expert_bytes=float(t["expert_bytes"]), kv_read_bytes=work.kv_read_bytes,
                             linear_flops=work.linear_flops, attention_flops=work.attention_flops,
                             tokens=work.tokens, bound="compute" if bool(t["compute_bound"]) else "memory")


def decode_step(spec: ModelSpec, gpu, coeffs: Coefficients, *, batch: int, context_tokens: float,
                tp: int = 1, kv_cache_dtype: str | int = "auto", query_tokens: int = 1,
                cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> StepBreakdown:
    """One decode step of ``batch`` sequences whose mean context is ``context_tokens``."""
    check_tp(spec, tp)
    if batch < 1:
        raise ServebookError(f"decode batch must be >= 1 sequence, got {batch}")
    work = decode_work(spec, batch, context_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype,
                       query_tokens=query_tokens)
    return step_time(spec, gpu, work, coeffs, tp=tp, cudagraph_max_tokens=cudagraph_max_tokens,
                     kv_cache_dtype=kv_cache_dtype)


def prefill_step(spec: ModelSpec, gpu, coeffs: Coefficients, *, tokens: int, prior_tokens: int = 0,
                 tp: int = 1, kv_cache_dtype: str | int = "auto",
                 cudagraph_max_tokens: int = DEFAULT_CUDAGRAPH_MAX_TOKENS) -> StepBreakdown:
    """One step that prefills ``tokens`` prompt tokens of one request (after ``prior_tokens``)."""
    check_tp(spec, tp)
    work = prefill_work(spec, tokens, prior_tokens=prior_tokens, tp=tp, kv_cache_dtype=kv_cache_dtype)
    return step_time(spec, gpu, work, coeffs, tp=tp, cudagraph_max_tokens=cudagraph_max_tokens,
                     kv_cache_dtype=kv_cache_dtype)


def prefill_request_s(spec: ModelSpec, gpu, coeffs: Coefficients, *, prompt_tokens: int,
                      max_num_batched_tokens: int, tp: int = 1, kv_cache_dtype: str | int = "auto",
                      include_request_overhead: bool = True) -> float:
    """Wall seconds to prefill one prompt alone (chunked by the token budget), plus request overhead.

    This is what a ``max_tokens=1`` request on an idle engine measures.
    """
    check_tp(spec, tp)
    chunks = prompt_chunks(prompt_tokens, max_num_batched_tokens)
    total = 0.0
    for i, (n, prior) in enumerate(chunks):
        work = prefill_work(spec, n, prior_tokens=prior, tp=tp, kv_cache_dtype=kv_cache_dtype,
                            last_chunk=i == len(chunks) - 1)
        total += step_time(spec, gpu, work, coeffs, tp=tp, kv_cache_dtype=kv_cache_dtype).step_s
    return total + (coeffs.request_overhead_s if include_request_overhead else 0.0)


# ---------------------------------------------------------------------------
# Calibrated coefficients shipped with the package

_DATA = Path(__file__).parent / "data"
CALIBRATION_FILE = _DATA / "calibration.json"
#: vllm serve's measured serving path and the latency model's held-out band (scripts/fit_serving_path.py).
SERVING_PATH_FILE = _DATA / "serving_path.json"


def _calibration_source(path) -> str:
    """How a message names where the calibration path came from (what the reader changes)."""
    if path:
        return "--calibration"
    if os.environ.get("SERVEBOOK_PERF_CALIBRATION"):
        return "$SERVEBOOK_PERF_CALIBRATION"
    return "the shipped calibration (reinstall servebook)"


def load_calibration(path: str | Path | None = None) -> dict:
    """The calibration record (coefficients per GPU, split, held-out errors, provenance).

    ``path`` defaults to ``$SERVEBOOK_PERF_CALIBRATION`` if set, else the shipped file.

    Raises:
        ServebookError: the file is missing, a directory, not JSON, not a JSON object or has no
            ``"coefficients"`` object; the message names the file and where its path came from.
    """
    p = Path(path or os.environ.get("SERVEBOOK_PERF_CALIBRATION") or CALIBRATION_FILE)
    fix = (f"point {_calibration_source(path)} at a calibration record written by "
           "`python -m servebook.perf.calibrate`")
    if not p.exists():
        raise ServebookError(
            f"no step-time calibration at {p}: record measurements under labs/results/step_timing/ "
            "and run `python -m servebook.perf.calibrate` (efficiencies are never assumed)"
        )
    if p.is_dir():
        raise ServebookError(f"calibration file {p} is a directory; {fix} (a .json file)")
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ServebookError(f"calibration file {p} is not valid JSON ({exc}); {fix}") from None
    except OSError as exc:
        raise ServebookError(f"cannot read calibration file {p}: {exc.strerror}; {fix}") from None
    if not isinstance(record, dict):
        raise ServebookError(f"calibration file {p} holds a JSON {type(record).__name__}, not an object with "
                             f"\"coefficients\"; {fix}")
    coefficients = record.get("coefficients")
    if not isinstance(coefficients, dict) or not coefficients:
        raise ServebookError(f"calibration file {p} has no \"coefficients\" object (one entry per GPU); {fix}")
    for gpu, entry in coefficients.items():
        if not isinstance(entry, dict):
            raise ServebookError(f"calibration file {p}: coefficients for {gpu!r} are a JSON "
                                 f"{type(entry).__name__}, not an object of named coefficients; {fix}")
        bad = [k for k, v in entry.items() if k in _NUMERIC_COEFFICIENTS and v is not None
               and (isinstance(v, bool) or not isinstance(v, (int, float)))]
        if bad:
            raise ServebookError(f"calibration file {p}: coefficients for {gpu!r} are not numbers: "
                                 f"{', '.join(sorted(bad))}; {fix}")
        out_of_range = coefficient_problems(entry)
        if out_of_range:
            raise ServebookError(f"calibration file {p}: coefficients for {gpu!r} out of range: "
                                 f"{'; '.join(out_of_range)}; {fix}")
    return record


def canonical_gpu_name(name: str) -> str:
    """The catalogue's canonical name for a GPU name or alias ("NVIDIA H200" -> "H200-SXM-141GB")."""
    from servebook.hardware import get_gpu

    n = str(name)
    try:
        return get_gpu(n).name
    except ServebookError:
        stripped = n.lower().replace("nvidia", "").strip()
        return get_gpu(stripped).name


def calibrated_coefficients(gpu_name: str, path: str | Path | None = None) -> tuple[Coefficients, str]:
    """Coefficients for ``gpu_name`` and a note on where they come from.

    When the GPU itself was never measured, the efficiencies of the one that was
    are used with the new GPU's peaks, and the note says so.
    """
    record = load_calibration(path)
    per_gpu = {}
    for name, entry in record["coefficients"].items():
        try:
            per_gpu[canonical_gpu_name(name)] = entry
        except ServebookError:
            raise ServebookError(f"the calibration file's coefficients are for GPU {name!r}, which is not in the "
                                 f"catalogue; name a GPU of servebook/data/gpus.toml there, or point "
                                 f"{_calibration_source(path)} at another record") from None
    key = canonical_gpu_name(gpu_name)
    if key in per_gpu:
        return Coefficients.from_dict(per_gpu[key]), f"calibrated on {key}"
    measured = sorted(per_gpu)
    if not measured:
        raise ServebookError("the calibration file holds no coefficients")
    src = measured[0]
    return (Coefficients.from_dict(per_gpu[src]),
            f"efficiencies calibrated on {src}, applied to {key}'s peak figures (not measured on {key})")
