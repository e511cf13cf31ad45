"""The memory budget: what is left for the KV cache after the engine's four claims.

vLLM sizes its KV cache at start-up (``Worker.determine_available_memory`` in
``v1/worker/gpu_worker.py``, 0.26.0 and 0.27.1)::

    requested  = ceil(total GPU memory x gpu_memory_utilization)   (v1/worker/utils.request_memory)
    available  = requested - weights - peak activation - non-torch - CUDA-graph estimate

and prints ``Available KV cache memory: X GiB``. The four claims:

* **weights**: ``Model loading took X GiB`` (per GPU; here ``weight_bytes / tp``
  plus the rotary caches every rank holds, :mod:`servebook.rotary_cache`; it ignores the few
  tensors TP replicates, such as norms);
* **peak activation**: the torch allocator's peak while the engine runs one
  dummy batch of ``max_num_batched_tokens`` tokens and samples
  ``min(max_num_seqs, max_num_batched_tokens)`` rows of logits
  (``profile_run`` and ``_dummy_sampler_run`` of the model runner);
* **non-torch**: memory outside PyTorch's allocator that grew while starting
  (NCCL and custom all-reduce buffers, cuBLAS workspaces);
* **CUDA graphs**: the estimate of ``profile_cudagraph_memory``, subtracted
  only when it is non-zero (see :func:`subtracts_cudagraph_estimate`): with
  CUDA graphs on (no ``--enforce-eager``), ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``
  at its default ``1``, *and* the V1 model runner. The V2 model runner, which
  vLLM 0.26.0 and 0.27.1 pick by default for every non-MoE decoder and a few
  MoE architectures (:data:`V2_RUNNER_MOE_ARCHITECTURES`), returns 0 from
  ``profile_cudagraph_memory``; its graphs are captured *after* the KV cache
  is sized, out of the memory the utilisation fraction leaves unrequested.
  That is vLLM 0.26.0's rule (the release of the H200 logs the coefficients are fitted on), and this
  module keeps it: vLLM 0.32.0 runs nearly every model on the V2 runner and that runner estimates its
  graphs too (tests/engine/test_memory_drift.py reads both facts from the installed 0.32.0), so on
  0.32.0 the budget here leaves out a graph estimate until a 0.32.0 GPU start-up is recorded to fit it.
  Recorded example (H200, 0.26.0): Llama-3.1-8B with graphs logs 108.81 GiB =
  125.82 - 15.0 - 1.78 - 0.22 (no graph term), Qwen3-30B-A3B logs 66.51 GiB =
  125.82 - 56.88 - 1.7 - 0.24 - 0.49 (its ``Estimated CUDA graph memory``).

Weights and the budget are arithmetic. The other three are measured by the
engine, so they are modelled here as functions whose coefficients are
*fitted to recorded start-up logs* (:func:`~servebook.memory_fit.calibrate`) and stored as data in
``data/memory_coefficients.json``.

**The peak activation model** follows what 0.26.0's ``profile_run`` allocates (read in
``v1/worker/gpu_model_runner.py``, ``v1/worker/gpu/model_runner.py``, ``v1/sample/``,
``v1/worker/workspace.py`` and ``fused_moe/modular_kernel.py``). The profiling run is a forward
pass over ``T = max_num_batched_tokens`` tokens followed by a sampler run over
``S = min(max_num_seqs, T)`` rows; the torch peak is the largest of three phases (a dense decoder
layer, a fused-MoE layer, the sampler), each with what is still allocated at that point::

    peak = c0 + max(forward_dense, forward_moe, sampler)
    forward_dense = c_hidden x T x hidden x 2 + c_mlp x T x dense_mlp_bytes
    forward_moe   = c_ws x WS + c_hidden x T x hidden x 2 + c_mlp x T x moe_transient_bytes
    sampler       = c_ws x WS + c_sampler x sampler_phase_bytes

* ``WS`` (:func:`moe_workspace_bytes`): the fused-MoE workspace. With a modular fused-MoE kernel
  (``TritonExperts``, what 0.26.0 picks for 16-bit experts on Hopper) the intermediate caches come
  from the worker's ``WorkspaceManager``, which grows once and keeps the buffer, so it is still
  allocated when the sampler runs. The monolithic MXFP4 kernel of gpt-oss
  (``OAITritonMxfp4ExpertsMonolithic``) allocates inside the kernel: no ``WS``, its caches are
  part of ``forward``.
* ``forward_dense`` / ``forward_moe``: copies of the hidden states and of the layer's transient MLP
  tensors (:func:`mlp_bytes_per_token` is the wider of the two). A dense layer that runs before
  the first MoE layer (DeepSeek-V2's first layer) runs before the workspace exists.
* ``sampler_phase_bytes`` (:func:`sampler_phase_bytes`): what is live while the sampler runs,
  which depends on the model runner. V1 (MoE architectures outside
  :data:`V2_RUNNER_MOE_ARCHITECTURES`, e.g. Qwen3-MoE and gpt-oss) runs the full sampler with
  top-k and top-p on every dummy row: bf16 logits, their float32 copy, the float32 softmax and
  the float32 exponential noise (``S x vocab x (2 + 4 + 4 + 4)`` bytes), plus the Triton
  top-k/top-p kernel's cached ``rows x vocab`` float32 buffer (``rows`` = the GPU's SM count,
  :data:`SAMPLER_TOPK_BUFFER_ROWS`). Its second, seeded warm-up call runs after the first's
  tensors are freed, so the two calls do not add. The V2 runner's dummy batch has no top-k/top-p
  and samples in place: only the bf16 logits (``S x vocab x 2``). Both hold the forward's output
  hidden states (``T x hidden x 2``) meanwhile.

Every coefficient is "how many live copies of that tensor set the peak holds" (non-negative);
``c0`` is bytes. This is why the sampler term cannot be a plain sum over all models: on V1 with
1,024 dummy rows the sampler phase (about 2-2.7 GiB for 150-200k vocabularies) is larger than the
whole forward pass, so gpt-oss's peak is almost flat in ``T``; on V2 it is small and the forward
decides (Gemma's 262k vocabulary adds nothing there). The recorded start-ups ran with
``VLLM_USE_FLASHINFER_SAMPLER=0`` (each log says so), the path modelled here; with FlashInfer's
sampler on (vLLM's default) only the first V1 call changes, the seeded second one takes the same
path. Not modelled: fewer than 8 dummy rows (PyTorch's sort path, at most a few dozen MiB).

**What the shipped coefficients rest on.** ``data/memory_coefficients.json``
says whether they are the first-principles :data:`PRIOR_COEFFICIENTS` or
``fitted``, and on which logs: the fitted file comes from
:func:`~servebook.memory_fit.calibrate_from_fixtures` on the H200 start-up logs recorded with vLLM
**0.26.0** (shipped in ``servebook/data/startup_logs/h200-0.26.0-*``, :data:`servebook.memory_fit.SHIPPED_STARTUP_LOGS`). The budget formula
and the graph rule are the same in 0.27.1 (read in its source); 0.27.1 prints
``C GiB for consumed memory (weights + non-torch)`` and a peak that includes
the graph estimate (:func:`~servebook.memory_fit.record_from_log` separates both), and adds
``KimiK3ForConditionalGeneration`` to the V2 runner's MoE list. The measured
claims themselves (activation peaks of 0.27.1's kernels) have not been
recorded on a GPU with 0.27.1.
The fit leaves out the start-ups declared in ``data/memory_fit_split.toml`` (written before the
refit: Qwen3-30B-A3B and gpt-oss-20b at 4,096 batched tokens), so their errors are out of
sample. Fitted on the H200 logs: about 3.2 copies of the hidden states, 1.1 of the MLP block,
1.2 of the fused-MoE workspace and 1.0 of the sampler tensors, no constant; every recorded
0.26.0 start-up's KV cache within 0.5% except Gemma 3 27B and Gemma 4 31B, whose weights the
config under-counts by 0.43 and 0.73 GiB (``Model loading took``), which the KV cache inherits.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from servebook.errors import DoesNotFitError, ServebookError
from servebook.model_spec import ModelSpec
from servebook.vllm_rules.cache import DEFAULT_GPU_MEMORY_UTILIZATION, check_utilization  # noqa: F401 (re-exported)
from servebook.vllm_rules.parallel import TP_CHOICES, tp_splits_heads
from servebook.vllm_rules.scheduler import vllm_batch_defaults  # noqa: F401 (re-exported)

GIB = 2**30
#: Tensor-parallel sizes tried when looking for the smallest one that fits.
TP_CANDIDATES = TP_CHOICES
#: Activation coefficients, in the order of the fitted coefficient vector (see the module docstring).
ACTIVATION_FEATURES = ("constant_bytes", "hidden", "mlp", "moe_workspace", "sampler")
#: The phases of the profiling run whose peaks are compared (:func:`activation_phases`).
ACTIVATION_PHASES = ("forward_dense", "forward_moe", "sampler")
#: Rows of the Triton top-k/top-p kernel's cached float32 buffer on the V1 sampler: the GPU's SM
#: count (132 on the H100 and H200 the logs were recorded on; other GPUs differ by a few MiB).
SAMPLER_TOPK_BUFFER_ROWS = 132
#: MoE architectures that vLLM 0.26.0 runs on the V2 model runner by default
#: (``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES`` in ``config/vllm.py``; 0.27.1 adds
#: ``KimiK3ForConditionalGeneration``). Every non-MoE decoder uses V2 as well.
V2_RUNNER_MOE_ARCHITECTURES = frozenset({
    "DeepseekV2ForCausalLM",
    "GraniteMoeForCausalLM",
    "InklingForCausalLM",
    "InklingForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
    "LongcatFlashNgramForCausalLM",
    "Qwen2MoeForCausalLM",
})

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
        note: free text stored with the file (what the fit rests on).
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
    note: str = ""

    @property
    def summary(self) -> str:
        """One line for the book: ``fitted on 10 NVIDIA H200 logs (vLLM 0.26.0)`` or ``prior ...``."""
        if self.status == "fitted" and self.fitted_on:
            return f"fitted on {len(self.fitted_on)} {self.gpu} logs (vLLM {self.vllm_version})"
        return "prior (first-principles guesses, not fitted to any log)"

    @property
    def tp_gt1_non_torch_is_prior(self) -> bool:
        """True when the TP > 1 non-torch figure rests on no log (the fit had no TP > 1 start-up)."""
        return self.status != "fitted" or "TP>1 keeps the prior" in self.note

    def to_dict(self) -> dict:
        """The JSON layout of ``data/memory_coefficients.json``."""
        return {
            "_comment": self.note,
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
                note=str(data.get("_comment", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServebookError(
                f"memory coefficients are malformed ({exc!r}); regenerate them with "
                "servebook.memory_fit.calibrate()"
            ) from None


#: First-principles guesses, used where no log constrains a coefficient (and as
#: the starting point of :func:`~servebook.memory_fit.calibrate`): four copies of the hidden states,
#: one of the MLP block (:func:`mlp_bytes_per_token` already counts its three
#: tensors), one fused-MoE workspace and one set of sampler tensors (the source's counts);
#: 0.2 GiB non-torch memory on one GPU and
#: 1 GiB with TP (NCCL and custom all-reduce buffers); 0.1 GiB + 12 MiB per
#: layer of CUDA graphs.
PRIOR_COEFFICIENTS = MemoryCoefficients(
    activation={"constant_bytes": 0.0, "hidden": 4.0, "mlp": 1.0, "moe_workspace": 1.0, "sampler": 1.0},
    non_torch_tp1_bytes=0.2 * GIB,
    non_torch_tp_gt1_bytes=1.0 * GIB,
    cudagraph_constant_bytes=0.1 * GIB,
    cudagraph_per_layer_bytes=12 * 2**20,
    status="prior",
    note="First-principles guesses (servebook.memory.PRIOR_COEFFICIENTS), not fitted to any log.",
)


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




def uses_moe_workspace(spec: ModelSpec) -> bool:
    """Whether the model's fused-MoE layers take their caches from vLLM's persistent workspace.

    True for MoE models whose routed experts are not MXFP4: 0.26.0 runs 16-bit (and FP8) experts
    through a modular kernel (``TritonExperts`` on Hopper, as the Qwen3-MoE and DeepSeek-V2 logs
    say) whose caches come from ``WorkspaceManager`` and stay allocated. MXFP4 experts (gpt-oss)
    run the monolithic ``OAITritonMxfp4ExpertsMonolithic``, which allocates inside the kernel.
    """
    if spec.moe is None:
        return False
    bpp = spec.moe.bytes_per_param
    return bpp is None or bpp >= 1.0


def moe_workspace_bytes(spec: ModelSpec, *, max_num_batched_tokens: int, tp: int = 1) -> float:
    """Bytes of the persistent fused-MoE workspace after a ``T``-token forward, per GPU (bf16).

    ``TritonExperts``' two simultaneous buffers, for ``M = T`` tokens (no chunking in 0.26.0):
    ``M x top_k x max(I, hidden)`` (the gate/up cache, reused for the output) and
    ``M x top_k x max(2 x I, hidden)``, with ``I = expert_intermediate / tp``. 0 for dense
    models and MXFP4 experts (:func:`uses_moe_workspace`).
    """
    if not uses_moe_workspace(spec):
        return 0.0
    moe = spec.moe
    i = moe.expert_intermediate_size / tp
    h = spec.hidden_size
    per_token = moe.experts_per_token * (max(i, h) + max(2 * i, h))
    return float(max_num_batched_tokens * per_token * 2)


def mlp_bytes_per_token(spec: ModelSpec, tp: int = 1) -> float:
    """Transient bytes of the widest MLP block for one token, per GPU (bf16).

    Dense MLP: ``3 x intermediate_size / tp x 2`` (the fused gate+up output,
    ``2 x intermediate``, and the activated half, ``intermediate``). Fused-MoE
    layer: the shared experts' dense term, plus, where the kernel allocates
    its caches itself (MXFP4, :func:`uses_moe_workspace` False),
    ``top_k x (3 x expert_intermediate / tp + hidden) x 2`` (gate+up and
    activation per routed copy of the token, and the per-expert outputs before
    they are summed); with the persistent workspace those caches are
    :func:`moe_workspace_bytes` instead. A model whose every layer is MoE has
    no dense term (its ``intermediate_size`` is not used).
    """
    return max(_mlp_parts(spec, tp))


def sampler_topk_buffer_rows(num_rows: int) -> int:
    """Rows of the V1 Triton top-k/top-p buffer for ``num_rows`` dummy rows (a power of 2, capped at the SM count)."""
    programs = min(SAMPLER_TOPK_BUFFER_ROWS, num_rows)
    return min(1 << max(0, (programs - 1).bit_length()), SAMPLER_TOPK_BUFFER_ROWS)


def sampler_phase_bytes(spec: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1) -> float:
    """Bytes live while the profiling run samples, per GPU (see the module docstring).

    Both runners: the forward's output hidden states ``T x hidden x 2`` and the ``S`` gathered
    rows ``S x hidden x 2``, and the bf16 logits ``S x vocab x 2`` (``S = min(max_num_seqs, T)``).
    V1 runner (:func:`uses_v2_model_runner` False) adds the float32 logits, softmax and
    exponential noise (``S x vocab x 12``) and the Triton top-k/top-p buffer
    (:func:`sampler_topk_buffer_rows` ``x vocab x 4``). The vocabulary is not split by TP
    (vLLM gathers the logits on every rank).
    """
    t = max_num_batched_tokens
    s = min(max_num_seqs, t)
    v = spec.vocab_size
    live = t * spec.hidden_size * 2 + s * spec.hidden_size * 2 + s * v * 2
    if not uses_v2_model_runner(spec):
        live += s * v * 12 + sampler_topk_buffer_rows(s) * v * 4
    return float(live)


def _mlp_parts(spec: ModelSpec, tp: int) -> tuple[float, float]:
    """(dense-layer MLP, MoE-layer transient) bytes per token; see :func:`mlp_bytes_per_token`."""
    dense = 3 * spec.intermediate_size / tp * 2
    if spec.moe is None:
        return dense, 0.0
    moe = spec.moe
    if len(moe.moe_layer_indices) >= spec.num_layers:
        dense = 0.0
    routed = 0.0 if uses_moe_workspace(spec) else moe.experts_per_token * (3 * moe.expert_intermediate_size / tp + spec.hidden_size) * 2
    return dense, routed + 3 * moe.shared_intermediate_size / tp * 2


def activation_phases(
    spec: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1
) -> dict[str, dict[str, float]]:
    """The regressors of the peak-activation model, per phase, in bytes of one copy each.

    ``{phase: {feature: bytes}}`` for each of :data:`ACTIVATION_PHASES`, a value per name in
    :data:`ACTIVATION_FEATURES` (0 where the phase has no such tensor); the peak is the larger
    phase. ``constant_bytes`` is 1 in every phase. ``forward_dense``: a dense decoder layer,
    ``hidden`` (``T x hidden_size x 2``) and ``mlp`` (``T x`` the dense MLP's three tensors);
    it runs before any MoE layer has grown the workspace (DeepSeek's first layers), so no
    ``moe_workspace``. ``forward_moe``: a fused-MoE layer, ``hidden``, ``mlp`` (its transient
    tensors: shared experts, and routed caches where the kernel allocates them itself) and
    ``moe_workspace`` (:func:`moe_workspace_bytes`). ``sampler``: ``moe_workspace`` (still
    allocated) and ``sampler`` (:func:`sampler_phase_bytes`). Dense models have no MoE layer:
    their ``forward_moe`` repeats ``forward_dense``.
    """
    t = max_num_batched_tokens
    ws = moe_workspace_bytes(spec, max_num_batched_tokens=t, tp=tp)
    dense, moe = _mlp_parts(spec, tp)
    hidden = float(t * spec.hidden_size * 2)
    zero = dict.fromkeys(ACTIVATION_FEATURES, 0.0)
    forward_dense = dict(zero, constant_bytes=1.0, hidden=hidden, mlp=float(t * dense))
    forward_moe = forward_dense if spec.moe is None else dict(zero, constant_bytes=1.0, hidden=hidden,
                                                               mlp=float(t * moe), moe_workspace=ws)
    sampler = dict(zero, constant_bytes=1.0, moe_workspace=ws,
                   sampler=sampler_phase_bytes(spec, max_num_batched_tokens=t, max_num_seqs=max_num_seqs, tp=tp))
    return {"forward_dense": forward_dense, "forward_moe": forward_moe, "sampler": sampler}


def activation_features(
    spec: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1,
    coefficients: MemoryCoefficients | None = None,
) -> dict[str, float]:
    """The regressors of the phase that sets the peak under ``coefficients`` (default: shipped).

    See :func:`activation_phases`; ``peak_activation_bytes`` is the dot product of these with
    the coefficients.
    """
    c = coefficients or load_coefficients()
    phases = activation_phases(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=tp)
    return max(phases.values(), key=lambda x: sum(c.activation[k] * x[k] for k in ACTIVATION_FEATURES))


def peak_activation_bytes(
    spec: ModelSpec,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int = 1,
    coefficients: MemoryCoefficients | None = None,
) -> int:
    """Predicted torch peak of the profiling run, bytes per GPU (never negative): the larger phase."""
    c = coefficients or load_coefficients()
    x = activation_features(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=tp,
                            coefficients=c)
    return max(0, round(sum(c.activation[k] * x[k] for k in ACTIVATION_FEATURES)))


def non_torch_bytes(tp: int = 1, coefficients: MemoryCoefficients | None = None) -> int:
    """Predicted non-torch memory per GPU, bytes (more with TP: NCCL buffers)."""
    c = coefficients or load_coefficients()
    return max(0, round(c.non_torch_tp1_bytes if tp == 1 else c.non_torch_tp_gt1_bytes))


def uses_v2_model_runner(spec: ModelSpec) -> bool:
    """Whether vLLM 0.26.0 / 0.27.1 runs this model on the V2 model runner by default (0.32.0: nearly always).

    ``VllmConfig.use_v2_model_runner`` (``config/vllm.py``): a generating
    model uses V2 unless it is MoE and its architecture is not in
    :data:`V2_RUNNER_MOE_ARCHITECTURES`. (``VLLM_USE_V2_MODEL_RUNNER`` forces
    either way; features V2 lacks, such as n-gram speculation, fall back to V1.)
    """
    return spec.moe is None or spec.architecture in V2_RUNNER_MOE_ARCHITECTURES


def subtracts_cudagraph_estimate(spec: ModelSpec, *, enforce_eager: bool = False) -> bool:
    """Whether the engine subtracts a CUDA-graph estimate before sizing the KV cache.

    True only with CUDA graphs on and the V1 model runner
    (:func:`uses_v2_model_runner` is False), with
    ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` (the default in 0.26.0 and
    0.27.1, ``envs.py``). The V2 runner's ``profile_cudagraph_memory``
    returns 0.
    """
    return not enforce_eager and not uses_v2_model_runner(spec)


def cudagraph_bytes(
    spec: ModelSpec, *, enforce_eager: bool = False, coefficients: MemoryCoefficients | None = None
) -> int:
    """CUDA-graph estimate the engine subtracts, bytes per GPU.

    0 with ``--enforce-eager`` and for models on the V2 model runner
    (:func:`subtracts_cudagraph_estimate`); otherwise the fitted
    ``constant + per_layer x num_layers``.
    """
    if not subtracts_cudagraph_estimate(spec, enforce_eager=enforce_eager):
        return 0
    c = coefficients or load_coefficients()
    return max(0, round(c.cudagraph_constant_bytes + c.cudagraph_per_layer_bytes * spec.num_layers))


def weights_bytes_per_gpu(spec: ModelSpec, tp: int = 1) -> int:
    """What ``Model loading took`` on one GPU, bytes: ``ceil(weight_bytes / tp)`` plus the buffers every
    rank holds whole (``spec.buffer_bytes``: the rotary caches)."""
    return -(-spec.weight_bytes // tp) + spec.buffer_bytes


def _in_gib(bytes_field: str, what: str) -> property:
    """A read-only property: the ``bytes_field`` attribute in GiB, documented as ``what``, GiB."""
    return property(lambda self: getattr(self, bytes_field) / GIB, doc=f"{what}, GiB.")


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
        lora_bytes: stacked LoRA tensors on this GPU (``--enable-lora``; part of the
            engine's ``Model loading took``), 0 without LoRA; ``activation_bytes``
            includes the profiling run's LoRA buffers.
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
    lora_bytes: int = 0

    # The budget's byte counts in GiB (float), for tables and figures.
    total_memory_gib = _in_gib("total_memory_bytes", "Total GPU memory")
    requested_gib = _in_gib("requested_bytes", "Memory vLLM may use")
    weights_gib = _in_gib("weights_bytes", "Weights per GPU")
    activation_gib = _in_gib("activation_bytes", "Peak activation")
    non_torch_gib = _in_gib("non_torch_bytes", "Non-torch memory")
    cudagraph_gib = _in_gib("cudagraph_bytes", "CUDA-graph memory")
    available_kv_gib = _in_gib("available_kv_bytes", "KV cache budget per GPU")
    lora_gib = _in_gib("lora_bytes", "LoRA adapter slots per GPU")

    @property
    def model_loading_bytes(self) -> int:
        """What the engine logs as ``Model loading took``: weights plus LoRA slots, bytes."""
        return self.weights_bytes + self.lora_bytes

    def claims(self) -> dict[str, int]:
        """The four claims by name, bytes."""
        return {
            "weights": self.weights_bytes,
            "lora": self.lora_bytes,
            "peak_activation": self.activation_bytes,
            "non_torch": self.non_torch_bytes,
            "cudagraph": self.cudagraph_bytes,
        }


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
    lora_weights_for: Callable[[int], int] | None = None,
    lora_activation_bytes: int = 0,
) -> MemoryBudget:
    """Predict ``Available KV cache memory`` for a model on one GPU of a TP group.

    ``lora_weights_for(tp)``: the LoRA slots' bytes per GPU at a TP size (:mod:`servebook.lora`),
    ``lora_activation_bytes``: their extra peak in the profiling run; both 0 without LoRA.

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

    def lora_for(t: int) -> int:
        return 0 if lora_weights_for is None else int(lora_weights_for(t))

    def claims_for(t: int) -> tuple[int, int, int, int]:
        return (
            weights_bytes_per_gpu(spec, t) + lora_for(t),
            peak_activation_bytes(spec, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=t, coefficients=c)
            + lora_activation_bytes,
            non_torch_bytes(t, c),
            cudagraph_bytes(spec, enforce_eager=enforce_eager, coefficients=c),
        )

    w, a, n, g = claims_for(tp)
    requested, left = _left(gpu_memory_bytes, gpu_memory_utilization, w, a, n, g)
    if left <= 0:
        raise DoesNotFitError(_does_not_fit_message(spec, gpu_memory_bytes, gpu_memory_utilization, tp, w, a, n, g, claims_for,
                                                    lora=lora_weights_for is not None))
    return MemoryBudget(
        total_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        requested_bytes=requested,
        weights_bytes=w - lora_for(tp),
        activation_bytes=a,
        non_torch_bytes=n,
        cudagraph_bytes=g,
        available_kv_bytes=left,
        tp=tp,
        coefficients_status=c.status,
        lora_bytes=lora_for(tp),
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


def _does_not_fit_message(spec, total, u, tp, w, a, n, g, claims_for, lora: bool = False) -> str:
    need = (w + a + n + g) / GIB
    have = math.ceil(total * u) / GIB
    best = smallest_tp_that_fits(spec, total, u, claims_for)
    span = " (more than one 8-GPU node)" if best is not None and best > 8 else ""
    advice = (
        f"use --tp {best}{span} (the smallest tensor-parallel size that leaves room for a KV cache)"
        if best is not None
        else "no tensor-parallel size up to 64 fits: use a GPU with more memory or a quantized checkpoint"
    )
    return (
        f"{spec.name} does not fit at TP={tp}: weights{' and LoRA slots' if lora else ''} {w / GIB:.2f} GiB + activation {a / GIB:.2f} GiB "
        f"+ non-torch {n / GIB:.2f} GiB + CUDA graphs {g / GIB:.2f} GiB = {need:.2f} GiB per GPU, "
        f"but only {have:.2f} GiB is requested ({u} x {total / GIB:.2f} GiB); {advice}"
    )
