"""The memory budget: what is left for the KV cache after the engine's four claims.

vLLM sizes its KV cache at start-up (``Worker.determine_available_memory`` in
``v1/worker/gpu_worker.py``, 0.26.0 and 0.27.1)::

    requested  = ceil(total GPU memory x gpu_memory_utilization)   (v1/worker/utils.request_memory)
    available  = requested - weights - peak activation - non-torch - CUDA-graph estimate

and prints ``Available KV cache memory: X GiB``. The four claims:

* **weights**: ``Model loading took X GiB`` (per GPU; here ``weight_bytes / tp``,
  which ignores the few tensors TP replicates, such as norms);
* **peak activation**: the torch allocator's peak while the engine runs one
  dummy batch of ``max_num_batched_tokens`` tokens and samples
  ``min(max_num_seqs, max_num_batched_tokens)`` rows of logits
  (``GPUModelRunner.profile_run`` and ``_dummy_sampler_run``);
* **non-torch**: memory outside PyTorch's allocator that grew while starting
  (NCCL and custom all-reduce buffers, cuBLAS workspaces);
* **CUDA graphs**: the estimate of ``profile_cudagraph_memory`` (0 with
  ``--enforce-eager``).

Weights and the budget are arithmetic. The other three are measured by the
engine, so they are modelled here as linear functions whose coefficients are
*fitted to recorded start-up logs* (:func:`calibrate`) and stored as data in
``data/memory_coefficients.json``. The peak activation model is::

    peak = c0 + c_hidden x T x hidden x 2 + c_mlp x T x mlp_width / tp x 2
              + c_qkv x T x qkv_width / tp x 2 + c_logits x S x vocab x 4

with ``T = max_num_batched_tokens``, ``S = min(max_num_seqs, T)``, bf16
activations (2 bytes) and float32 logits (4 bytes). Each coefficient is "how
many live copies of that tensor the peak holds". The shipped file says whether
its coefficients are a first-principles ``prior`` or ``fitted`` to logs (and
which); the book must quote that status with any number it prints.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servebook.errors import DoesNotFitError, ServebookError
from servebook.kv_cache import tp_splits_heads
from servebook.model_spec import ModelSpec

GIB = 2**30
#: ``CacheConfig.gpu_memory_utilization`` default in 0.26.0 and 0.27.1
#: (``config/cache.py``: ``Field(default=0.92, gt=0, le=1)``).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
#: Tensor-parallel sizes tried when looking for the smallest one that fits.
TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
#: Activation features, in the order of the fitted coefficient vector.
ACTIVATION_FEATURES = ("constant_bytes", "hidden", "mlp", "qkv", "logits")

_DATA = Path(__file__).resolve().parent / "data" / "memory_coefficients.json"


@dataclass(frozen=True)
class MemoryCoefficients:
    """Fitted (or prior) coefficients of the activation, non-torch and CUDA-graph models.

    Attributes:
        activation: coefficient per name in :data:`ACTIVATION_FEATURES`
            (``constant_bytes`` in bytes; the others are dimensionless copies).
        non_torch_tp1_bytes: non-torch memory with one GPU, bytes.
        non_torch_tp_gt1_bytes: non-torch memory per GPU with TP > 1, bytes.
        cudagraph_constant_bytes: CUDA-graph estimate, constant part, bytes.
        cudagraph_per_layer_bytes: CUDA-graph estimate per decoder layer, bytes.
        status: ``"prior"`` (first-principles guess) or ``"fitted"``.
        fitted_on: names of the start-up logs the fit used.
        vllm_version: release of those logs.
        gpu: GPU of those logs.
    """

    activation: Mapping[str, float]
    non_torch_tp1_bytes: float
    non_torch_tp_gt1_bytes: float
    cudagraph_constant_bytes: float
    cudagraph_per_layer_bytes: float
    status: str = "prior"
    fitted_on: tuple[str, ...] = ()
    vllm_version: str | None = None
    gpu: str | None = None

    def to_dict(self) -> dict:
        """The JSON layout of ``data/memory_coefficients.json``."""
        return {
            "status": self.status,
            "fitted_on": list(self.fitted_on),
            "vllm_version": self.vllm_version,
            "gpu": self.gpu,
            "activation": {k: float(self.activation[k]) for k in ACTIVATION_FEATURES},
            "non_torch": {
                "tp1_bytes": float(self.non_torch_tp1_bytes),
                "tp_gt1_bytes": float(self.non_torch_tp_gt1_bytes),
            },
            "cudagraph": {
                "constant_bytes": float(self.cudagraph_constant_bytes),
                "per_layer_bytes": float(self.cudagraph_per_layer_bytes),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> MemoryCoefficients:
        """Inverse of :meth:`to_dict`; a malformed file is a :class:`ServebookError`."""
        try:
            act = {k: float(data["activation"][k]) for k in ACTIVATION_FEATURES}
            return cls(
                activation=act,
                non_torch_tp1_bytes=float(data["non_torch"]["tp1_bytes"]),
                non_torch_tp_gt1_bytes=float(data["non_torch"]["tp_gt1_bytes"]),
                cudagraph_constant_bytes=float(data["cudagraph"]["constant_bytes"]),
                cudagraph_per_layer_bytes=float(data["cudagraph"]["per_layer_bytes"]),
                status=str(data.get("status", "prior")),
                fitted_on=tuple(data.get("fitted_on", ())),
                vllm_version=data.get("vllm_version"),
                gpu=data.get("gpu"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServebookError(
                f"memory coefficients are malformed ({exc!r}); regenerate them with "
                "servebook.memory.calibrate()"
            ) from None


def load_coefficients(path: str | Path | None = None) -> MemoryCoefficients:
    """Read coefficients (default: the shipped ``data/memory_coefficients.json``)."""
    p = Path(path) if path is not None else _DATA
    try:
        return MemoryCoefficients.from_dict(json.loads(p.read_text()))
    except OSError as exc:
        raise ServebookError(f"cannot read memory coefficients {p}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ServebookError(f"memory coefficients {p} are not JSON ({exc.msg})") from None


def write_coefficients(coefficients: MemoryCoefficients, path: str | Path | None = None) -> Path:
    """Write coefficients as JSON (default: replace the shipped file)."""
    p = Path(path) if path is not None else _DATA
    p.write_text(json.dumps(coefficients.to_dict(), indent=2) + "\n")
    return p


#: Total memory from which vLLM 0.27.1 uses the larger batch defaults (unless an A100).
LARGE_GPU_BYTES = 70 * GIB


def vllm_batch_defaults(
    gpu_memory_bytes: int | None,
    gpu_name: str | None = None,
    *,
    usage_context: str = "OPENAI_API_SERVER",
    max_model_len: int | None = None,
    device: str = "cuda",
) -> tuple[int, int]:
    """vLLM 0.27.1's default ``(max_num_batched_tokens, max_num_seqs)``.

    ``EngineArgs.get_batch_defaults`` (``engine/arg_utils.py``): on CUDA GPUs
    with at least 70 GiB whose name lacks "a100", 16384/1024 for the ``LLM``
    class and 8192/1024 for ``vllm serve``; on other GPUs 8192/256 and
    2048/256; on CPU 4096/256 and 2048/128 (times the world size, here 1).
    ``_set_default_max_num_seqs_and_batched_tokens_args`` then caps the token
    budget at ``max_num_seqs x max_model_len`` (with chunked prefill on).

    Args:
        gpu_memory_bytes: total device memory as the platform reports it.
        gpu_name: device name (only "a100" matters).
        usage_context: ``"OPENAI_API_SERVER"`` (``vllm serve``) or ``"LLM_CLASS"``.
        max_model_len: context length for the cap; None for no cap.
        device: ``"cuda"`` or ``"cpu"``.
    """
    if usage_context not in ("OPENAI_API_SERVER", "LLM_CLASS"):
        raise ServebookError(f"usage_context {usage_context!r} is not known; use OPENAI_API_SERVER or LLM_CLASS")
    server = usage_context == "OPENAI_API_SERVER"
    if device == "cpu":
        tokens, seqs = (2048, 128) if server else (4096, 256)
    elif gpu_memory_bytes is not None and gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in (gpu_name or "").lower():
        tokens, seqs = (8192, 1024) if server else (16384, 1024)
    else:
        tokens, seqs = (2048, 256) if server else (8192, 256)
    if max_model_len is not None:
        tokens = min(tokens, seqs * max_model_len)
    return tokens, seqs


def _mlp_width(spec: ModelSpec) -> int:
    """Widest MLP a token passes through, in elements (before TP)."""
    width = spec.intermediate_size
    if spec.moe is not None:
        moe = spec.moe
        routed = moe.experts_per_token * moe.expert_intermediate_size
        width = max(width, routed + moe.shared_intermediate_size)
    return width


def _qkv_width(spec: ModelSpec) -> int:
    """Width of the fused QKV projection output, in elements (before TP)."""
    widest = 0
    for layer in spec.layers:
        if layer.kind == "mla":
            w = spec.num_attention_heads * layer.head_dim + layer.head_dim
        else:
            w = spec.num_attention_heads * layer.head_dim + layer.num_kv_heads * (
                layer.head_dim + (layer.v_head_dim or layer.head_dim)
            )
        widest = max(widest, w)
    return widest


def activation_features(
    spec: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1
) -> dict[str, float]:
    """The regressors of the peak-activation model, in bytes of one copy each.

    ``hidden``: ``T x hidden_size x 2``; ``mlp``: ``T x mlp_width / tp x 2``
    (dense ``intermediate_size``, or top-k experts plus shared experts for
    MoE); ``qkv``: ``T x (q + k + v width) / tp x 2``; ``logits``:
    ``min(max_num_seqs, T) x vocab x 4`` (float32, as the sampler sees them).
    """
    t = max_num_batched_tokens
    s = min(max_num_seqs, t)
    return {
        "constant_bytes": 1.0,
        "hidden": float(t * spec.hidden_size * 2),
        "mlp": float(t * _mlp_width(spec) / tp * 2),
        "qkv": float(t * _qkv_width(spec) / tp * 2),
        "logits": float(s * spec.vocab_size * 4),
    }


def peak_activation_bytes(
    spec: ModelSpec,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int = 1,
    coefficients: MemoryCoefficients | None = None,
) -> int:
    """Predicted torch peak of the profiling run, bytes per GPU (never negative)."""
    c = coefficients or load_coefficients()
    x = activation_features(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=tp)
    return max(0, round(sum(c.activation[k] * x[k] for k in ACTIVATION_FEATURES)))


def non_torch_bytes(tp: int = 1, coefficients: MemoryCoefficients | None = None) -> int:
    """Predicted non-torch memory per GPU, bytes (more with TP: NCCL buffers)."""
    c = coefficients or load_coefficients()
    return max(0, round(c.non_torch_tp1_bytes if tp == 1 else c.non_torch_tp_gt1_bytes))


def cudagraph_bytes(
    spec: ModelSpec, *, enforce_eager: bool = False, coefficients: MemoryCoefficients | None = None
) -> int:
    """Predicted CUDA-graph memory estimate, bytes per GPU (0 with ``--enforce-eager``)."""
    if enforce_eager:
        return 0
    c = coefficients or load_coefficients()
    return max(0, round(c.cudagraph_constant_bytes + c.cudagraph_per_layer_bytes * spec.num_layers))


def weights_bytes_per_gpu(spec: ModelSpec, tp: int = 1) -> int:
    """Weight bytes on one GPU: ``ceil(weight_bytes / tp)``."""
    return -(-spec.weight_bytes // tp)


@dataclass(frozen=True)
class MemoryBudget:
    """The start-up memory budget of one GPU.

    Attributes:
        total_memory_bytes: the GPU's memory, bytes.
        gpu_memory_utilization: fraction of it vLLM may use.
        requested_bytes: ``ceil(total x utilization)``.
        weights_bytes: weights on this GPU.
        activation_bytes: peak activation of the profiling run.
        non_torch_bytes: non-torch memory.
        cudagraph_bytes: CUDA-graph memory estimate.
        available_kv_bytes: what is left for the KV cache (never negative).
        tp: tensor-parallel size.
        coefficients_status: ``"prior"``, ``"fitted"`` or ``"logged"`` (when
            the claims came from a log rather than the model).
    """

    total_memory_bytes: int
    gpu_memory_utilization: float
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    available_kv_bytes: int
    tp: int = 1
    coefficients_status: str = "prior"

    @property
    def total_memory_gib(self) -> float:
        """Total GPU memory, GiB."""
        return self.total_memory_bytes / GIB

    @property
    def requested_gib(self) -> float:
        """Memory vLLM may use, GiB."""
        return self.requested_bytes / GIB

    @property
    def weights_gib(self) -> float:
        """Weights per GPU, GiB."""
        return self.weights_bytes / GIB

    @property
    def activation_gib(self) -> float:
        """Peak activation, GiB."""
        return self.activation_bytes / GIB

    @property
    def non_torch_gib(self) -> float:
        """Non-torch memory, GiB."""
        return self.non_torch_bytes / GIB

    @property
    def cudagraph_gib(self) -> float:
        """CUDA-graph memory, GiB."""
        return self.cudagraph_bytes / GIB

    @property
    def available_kv_gib(self) -> float:
        """KV cache budget per GPU, GiB."""
        return self.available_kv_bytes / GIB

    def claims(self) -> dict[str, int]:
        """The four claims by name, bytes."""
        return {
            "weights": self.weights_bytes,
            "peak_activation": self.activation_bytes,
            "non_torch": self.non_torch_bytes,
            "cudagraph": self.cudagraph_bytes,
        }


def check_utilization(gpu_memory_utilization: float) -> None:
    """Raise unless ``0 < u <= 1`` (the range ``CacheConfig`` accepts)."""
    u = gpu_memory_utilization
    if not isinstance(u, (int, float)) or isinstance(u, bool) or not (0 < u <= 1) or math.isnan(u):
        raise ServebookError(
            f"gpu_memory_utilization {u!r} is out of range; use a fraction in (0, 1], e.g. 0.92"
        )


def _left(total: int, u: float, *claims: int) -> tuple[int, int]:
    requested = math.ceil(total * u)
    return requested, requested - sum(claims)


def memory_budget(
    spec: ModelSpec,
    *,
    gpu_memory_bytes: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    tp: int = 1,
    enforce_eager: bool = False,
    coefficients: MemoryCoefficients | None = None,
) -> MemoryBudget:
    """Predict ``Available KV cache memory`` for a model on one GPU of a TP group.

    Raises:
        DoesNotFitError: when the claims exceed the requested memory; the
            message names the smallest tensor-parallel size that leaves room.
        ServebookError: for out-of-range arguments.
    """
    check_utilization(gpu_memory_utilization)
    if not isinstance(gpu_memory_bytes, int) or gpu_memory_bytes <= 0:
        raise ServebookError(f"gpu_memory_bytes {gpu_memory_bytes!r} must be a positive number of bytes")
    for name, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs)):
        if not isinstance(v, int) or v < 1:
            raise ServebookError(f"{name} {v!r} is not allowed; use a positive integer")
    if not isinstance(tp, int) or tp < 1:
        raise ServebookError(f"tensor parallel size {tp!r} is not allowed; use an integer >= 1")
    c = coefficients or load_coefficients()

    def claims_for(t: int) -> tuple[int, int, int, int]:
        return (
            weights_bytes_per_gpu(spec, t),
            peak_activation_bytes(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=t, coefficients=c),
            non_torch_bytes(t, c),
            cudagraph_bytes(spec, enforce_eager=enforce_eager, coefficients=c),
        )

    w, a, n, g = claims_for(tp)
    requested, left = _left(gpu_memory_bytes, gpu_memory_utilization, w, a, n, g)
    if left <= 0:
        raise DoesNotFitError(_does_not_fit_message(spec, gpu_memory_bytes, gpu_memory_utilization, tp, w, a, n, g, claims_for))
    return MemoryBudget(
        total_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        weights_bytes=w,
        activation_bytes=a,
        non_torch_bytes=n,
        cudagraph_bytes=g,
        available_kv_bytes=left,
        tp=tp,
        coefficients_status=c.status,
    )


def smallest_tp_that_fits(spec: ModelSpec, gpu_memory_bytes: int, gpu_memory_utilization: float, claims_for) -> int | None:
    """Smallest valid TP size (of :data:`TP_CANDIDATES`) that leaves KV memory, or None."""
    for t in TP_CANDIDATES:
        if not tp_splits_heads(spec, t):
            continue
        _, left = _left(gpu_memory_bytes, gpu_memory_utilization, *claims_for(t))
        if left > 0:
            return t
    return None


def _does_not_fit_message(spec, total, u, tp, w, a, n, g, claims_for) -> str:
    need = (w + a + n + g) / GIB
    have = math.ceil(total * u) / GIB
    best = smallest_tp_that_fits(spec, total, u, claims_for)
    span = " (more than one 8-GPU node)" if best is not None and best > 8 else ""
    advice = (
        f"use --tensor-parallel-size {best}{span} (the smallest that leaves room for a KV cache)"
        if best is not None
        else "no tensor-parallel size up to 64 fits: use a GPU with more memory or a quantized checkpoint"
    )
    return (
        f"{spec.name} does not fit at TP={tp}: weights {w / GIB:.2f} GiB + activation {a / GIB:.2f} GiB "
        f"+ non-torch {n / GIB:.2f} GiB + CUDA graphs {g / GIB:.2f} GiB = {need:.2f} GiB per GPU, "
        f"but only {have:.2f} GiB is requested ({u} x {total / GIB:.2f} GiB); {advice}"
    )


@dataclass(frozen=True)
class CalibrationRecord:
    """One engine start-up, reduced to what :func:`calibrate` needs.

    Attributes:
        name: where it came from (fixture folder name).
        spec: the model.
        max_num_batched_tokens / max_num_seqs / tp: the engine's settings.
        peak_activation_bytes: the torch peak (0.26: ``B GiB for peak
            activation``; 0.27.1: that figure minus the CUDA-graph estimate).
        non_torch_bytes: non-torch memory (0.26 prints it; 0.27.1: consumed
            minus weights), or None.
        cudagraph_bytes: the CUDA-graph estimate, or None (eager runs).
    """

    name: str
    spec: ModelSpec
    max_num_batched_tokens: int
    max_num_seqs: int
    tp: int
    peak_activation_bytes: float
    non_torch_bytes: float | None = None
    cudagraph_bytes: float | None = None


def _nnls(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Non-negative least squares with columns scaled to unit norm."""
    import numpy as np
    from scipy.optimize import nnls

    a = np.asarray(rows, dtype=float)
    b = np.asarray(y, dtype=float)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(a / scale, b)
    return list(coef / scale)


def calibrate(
    records: Iterable[CalibrationRecord],
    *,
    prior: MemoryCoefficients | None = None,
    vllm_version: str | None = None,
    gpu: str | None = None,
) -> MemoryCoefficients:
    """Fit the activation, non-torch and CUDA-graph models to recorded start-ups.

    Activation: non-negative least squares of the peak on
    :func:`activation_features` (coefficients cannot go negative: they are
    copies of tensors). Non-torch: the mean per class (TP = 1, TP > 1).
    CUDA graphs: non-negative least squares on ``[1, num_layers]``. A part with
    no data keeps the ``prior`` value (default: the shipped file).

    Raises:
        ServebookError: with no records, or fewer records than activation
            features with distinct settings (the fit would be underdetermined).
    """
    recs = list(records)
    base = prior or load_coefficients()
    if not recs:
        raise ServebookError("calibrate() needs at least one start-up record")
    rows = [
        [activation_features(r.spec, max_num_batched_tokens=r.max_num_batched_tokens, max_num_seqs=r.max_num_seqs, tp=r.tp)[k] for k in ACTIVATION_FEATURES]
        for r in recs
    ]
    if len({tuple(row) for row in rows}) < len(ACTIVATION_FEATURES):
        raise ServebookError(
            f"calibrate() needs start-ups with at least {len(ACTIVATION_FEATURES)} distinct "
            "model/max_num_batched_tokens/max_num_seqs settings to fit the activation model; "
            f"got {len({tuple(row) for row in rows})}"
        )
    act = dict(zip(ACTIVATION_FEATURES, _nnls(rows, [r.peak_activation_bytes for r in recs])))

    nt1 = [r.non_torch_bytes for r in recs if r.non_torch_bytes is not None and r.tp == 1]
    ntn = [r.non_torch_bytes for r in recs if r.non_torch_bytes is not None and r.tp > 1]
    cg = [r for r in recs if r.cudagraph_bytes is not None]
    cg_const, cg_layer = base.cudagraph_constant_bytes, base.cudagraph_per_layer_bytes
    if len({r.spec.num_layers for r in cg}) >= 2:
        cg_const, cg_layer = _nnls([[1.0, float(r.spec.num_layers)] for r in cg], [r.cudagraph_bytes for r in cg])
    elif cg:
        cg_const, cg_layer = sum(r.cudagraph_bytes for r in cg) / len(cg), 0.0
    return MemoryCoefficients(
        activation=act,
        non_torch_tp1_bytes=sum(nt1) / len(nt1) if nt1 else base.non_torch_tp1_bytes,
        non_torch_tp_gt1_bytes=sum(ntn) / len(ntn) if ntn else base.non_torch_tp_gt1_bytes,
        cudagraph_constant_bytes=cg_const,
        cudagraph_per_layer_bytes=cg_layer,
        status="fitted",
        fitted_on=tuple(r.name for r in recs),
        vllm_version=vllm_version,
        gpu=gpu,
    )


def record_from_log(
    name: str,
    spec: ModelSpec,
    log,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int = 1,
) -> CalibrationRecord:
    """Turn a parsed GPU start-up log (:class:`servebook.startup_log.StartupLog`) into a record.

    0.26.0 logs give the four claims directly. 0.27.1 logs give "consumed
    (weights + non-torch)" and a peak that includes the CUDA-graph estimate;
    both are separated here using ``Model loading took`` and the
    ``CUDA graph pool memory ... (estimated)`` line.

    Raises:
        ServebookError: when the log lacks the ``Actual usage is ...`` line
            (CPU logs, or an engine that did not finish starting).
    """
    if log.peak_activation_gib is None:
        raise ServebookError(
            f"{name}: the log has no 'Actual usage is ...' line (CPU engine or failed start); "
            "only GPU start-up logs can calibrate the memory model"
        )
    cg_est = log.cudagraph_estimated_gib
    if log.weights_gib is not None:  # 0.26.0 format
        peak = log.peak_activation_gib
        non_torch = log.non_torch_gib
    else:  # 0.27.1 format
        peak = log.peak_activation_gib - (cg_est or 0.0)
        non_torch = None
        if log.consumed_gib is not None and log.model_loading_gib is not None:
            non_torch = max(0.0, log.consumed_gib - log.model_loading_gib)
    return CalibrationRecord(
        name=name,
        spec=spec,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        tp=tp,
        peak_activation_bytes=max(0.0, peak) * GIB,
        non_torch_bytes=None if non_torch is None else non_torch * GIB,
        cudagraph_bytes=None if cg_est is None else cg_est * GIB,
    )


def budget_from_log(log, *, tp: int = 1) -> MemoryBudget:
    """The four claims and the KV budget exactly as a GPU start-up log states them.

    Raises:
        ServebookError: when the log lacks the figures (CPU logs).
    """
    if log.total_memory_gib is None or log.gpu_memory_utilization is None or log.available_kv_cache_gib is None:
        raise ServebookError("the log lacks 'Free memory on device ...' or 'Available KV cache memory'; need a GPU start-up log")
    weights = log.weights_gib if log.weights_gib is not None else (log.model_loading_gib or 0.0)
    if log.non_torch_gib is not None:
        non_torch = log.non_torch_gib
    elif log.consumed_gib is not None:
        non_torch = max(0.0, log.consumed_gib - weights)
    else:
        non_torch = 0.0
    cg = log.cudagraph_estimated_gib or 0.0
    peak = (log.peak_activation_gib or 0.0) - (cg if log.weights_gib is None else 0.0)
    return MemoryBudget(
        total_memory_bytes=round(log.total_memory_gib * GIB),
        gpu_memory_utilization=log.gpu_memory_utilization,
        requested_bytes=round((log.requested_memory_gib or 0.0) * GIB),
        weights_bytes=round(weights * GIB),
        activation_bytes=round(max(0.0, peak) * GIB),
        non_torch_bytes=round(non_torch * GIB),
        cudagraph_bytes=round(cg * GIB),
        available_kv_bytes=max(0, round(log.available_kv_cache_gib * GIB)),
        tp=tp,
        coefficients_status="logged",
    )


def records_from_fixtures(root: str | Path) -> list[CalibrationRecord]:
    """Calibration records from recorded GPU start-ups laid out as ``<root>/<name>/``.

    Each folder holds ``config.json``, ``flags.json`` (``engine_kwargs``,
    ``device``, ``usage_context``, optionally ``gpu_total_memory_bytes``) and
    ``startup.log`` (see ``tests/fixtures/startup_logs/README.md``). CPU folders
    and logs without the ``Actual usage is ...`` sentence are skipped. Settings
    the engine was not given explicitly take vLLM 0.27.1's defaults
    (:func:`vllm_batch_defaults`; the engine caps ``max_num_seqs`` at
    ``max_num_batched_tokens``).
    """
    from servebook.hf_config import load_model_spec
    from servebook.startup_log import read_startup_log

    records = []
    for folder in sorted(Path(root).iterdir()):
        flags_path = folder / "flags.json"
        if not flags_path.is_file() or not (folder / "startup.log").is_file():
            continue
        flags = json.loads(flags_path.read_text())
        if flags.get("device", "cpu") == "cpu":
            continue
        log = read_startup_log(folder / "startup.log")
        if log.peak_activation_gib is None:
            continue
        kw = flags.get("engine_kwargs", {})
        total = flags.get("gpu_total_memory_bytes") or (
            round(log.total_memory_gib * GIB) if log.total_memory_gib else None
        )
        max_model_len = kw.get("max_model_len") or log.max_model_len
        default_tokens, default_seqs = vllm_batch_defaults(
            total, str(flags.get("device")), usage_context=flags.get("usage_context", "LLM_CLASS"),
            max_model_len=max_model_len,
        )
        tokens = kw.get("max_num_batched_tokens") or log.max_num_batched_tokens or default_tokens
        seqs = kw.get("max_num_seqs") or min(default_seqs, tokens)
        records.append(record_from_log(
            folder.name, load_model_spec(folder / "config.json"), log,
            max_num_batched_tokens=tokens, max_num_seqs=seqs, tp=kw.get("tensor_parallel_size", 1),
        ))
    return records


def calibrate_from_fixtures(root: str | Path, *, write_to: str | Path | None = None) -> MemoryCoefficients:
    """Fit coefficients on every GPU fixture under ``root``; optionally write them as JSON.

    The fitted file records the fixture names, the vLLM version(s) and GPU(s)
    of the logs, so the book can say what its memory figures rest on.
    """
    recs = records_from_fixtures(root)
    versions, gpus = set(), set()
    for name in (r.name for r in recs):
        flags = json.loads((Path(root) / name / "flags.json").read_text())
        versions.add(str(flags.get("vllm_version")))
        gpus.add(str(flags.get("device")))
    fitted = calibrate(recs, vllm_version=", ".join(sorted(versions)), gpu=", ".join(sorted(gpus)))
    if write_to is not None:
        write_coefficients(fitted, write_to)
    return fitted
