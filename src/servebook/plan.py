"""The deployment plan: memory budget, KV capacity and recommended flags for one deployment.

:func:`make_plan` predicts the four start-up claims (:mod:`servebook.memory`),
the KV cache the rest buys (:mod:`servebook.kv_cache`), and the flags to serve
with. ``available_kv_gib`` skips the budget and starts from a logged
``Available KV cache memory`` figure instead. ``servebook plan`` (the CLI) is a
thin front end over this module.

Defaults are vLLM 0.27.1's for ``vllm serve`` (usage context
``OPENAI_API_SERVER``, ``EngineArgs.get_batch_defaults`` in
``engine/arg_utils.py``): on GPUs with at least 70 GiB that are not A100s,
``max_num_batched_tokens`` 8192 and ``max_num_seqs`` 1024; otherwise 2048 and
256; both capped at ``max_num_seqs x max_model_len``. ``gpu_memory_utilization``
defaults to 0.92 (``config/cache.py``); the block size to 16 on CUDA.

**Two concurrency figures.** The start-up log's ``Maximum concurrency for N tokens
per request`` (:attr:`Capacity.max_concurrency`, kept exact because tests check it
against engine logs) is an *admission* bound: it books each sliding-window group at
``min(window - 1 + in-flight tokens, max_model_len)``. What runs is the *run-time*
figure, :func:`servebook.kv_cache.running_concurrency`, for requests of
``request_tokens`` (default ``max_model_len``): running sliding groups hold about
``window / block_size + 1`` blocks. For full-attention models the two agree; for
Gemma-style hybrids the run-time figure is several times larger.

**Recommended ``--max-num-seqs``.** 85% of the run-time figure, rounded down,
never below 1, never above the figure itself, and never above vLLM's default
``max_num_seqs`` (the peak-activation claim was sized for that many sampled rows).
The 15% headroom covers what the figure does not: a new request needs free
blocks for its whole prompt in every group before its prefill frees the
sliding ones, and a prefill chunk holds ``window + chunk`` tokens until it is
processed. vLLM admits on free blocks and preempts when a running request
cannot grow: watch ``vllm:kv_cache_usage_perc`` and ``vllm:num_preemptions``.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from servebook.errors import DoesNotFitError, ServebookError
from servebook.vllm_rules.release import PINNED_VLLM
from servebook.kv_cache import (
    Capacity,
    RunningConcurrency,
    capacity,
    kv_cache_layout,
    running_concurrency,
)
from servebook.memory import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    GIB,
    MemoryBudget,
    check_utilization,
    load_coefficients,
    memory_budget,
    vllm_batch_defaults,
    weights_bytes_per_gpu,
)
from servebook.hf_config import spec_quantization
from servebook.lora import LoraSettings, lora_activation_bytes, lora_weights_bytes
from servebook.model_spec import ModelSpec
from servebook.quant_schemes import KernelChoice, check_loads, kernel_on
from servebook.shipped import MODELS_DIR
from servebook.vllm_rules import check_batch_budget, check_tp_size, cudagraph_max_tokens, rule_release

#: The GPU assumed when ``--gpu`` is not given: the card the book's labs run on.
DEFAULT_GPU = "H200"
#: Fraction of the run-time KV concurrency recommended for ``--max-num-seqs`` (see module docstring).
MAX_NUM_SEQS_FRACTION = 0.85
KV_CACHE_DTYPES = ("auto", "fp8")
#: How the engine is started, which sets vLLM's batch defaults: ``serve`` (``vllm serve``, usage
#: context ``OPENAI_API_SERVER``) or ``offline`` (the ``LLM`` class, ``LLM_CLASS``).
USAGE_CONTEXT_FLAGS = {"serve": "OPENAI_API_SERVER", "offline": "LLM_CLASS"}
#: The metrics to watch after setting ``--max-num-seqs`` (vllm_claims.toml checks both names).
WATCH_METRICS = ("vllm:kv_cache_usage_perc", "vllm:num_preemptions")
#: One line on why the two concurrency figures differ.
FIGURES_NOTE = ("the log's figure books each sliding-window group at window - 1 + in-flight tokens (admission); "
                "running requests hold about window/block_size + 1 blocks there (blocks that left the window are freed)")


@dataclass(frozen=True)
class Plan:
    """Everything ``servebook plan`` prints."""

    spec: ModelSpec
    model_ref: str
    gpu_name: str | None
    gpu_memory_bytes: int | None
    tp: int
    max_model_len: int
    max_num_batched_tokens: int
    default_max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    block_size: int | None
    budget: MemoryBudget | None
    available_kv_bytes: int
    capacity: Capacity
    running: RunningConcurrency
    recommended_max_num_seqs: int
    coefficients_summary: str = ""
    #: ``serve`` or ``offline`` (:data:`USAGE_CONTEXT_FLAGS`): which of vLLM's batch defaults apply.
    usage_context: str = "serve"
    #: the engine's ``--max-num-seqs``: the one given, else vLLM's default for the usage context
    #: and GPU (at most ``max_num_batched_tokens``, which vLLM requires). Sequences.
    max_num_seqs: int = 0
    #: the largest step captured as a CUDA graph when given (tokens); None: vLLM's rule.
    cudagraph_max_tokens_given: int | None = None
    #: whether the KV budget was given (``available_kv_gib``) rather than computed.
    kv_budget_given: bool = False
    #: the LoRA flags (``--enable-lora`` and its sizes), None without adapters.
    lora: LoraSettings | None = None
    #: the kernel the GPU runs a quantized checkpoint with (None for 16-bit weights).
    kernel: KernelChoice | None = None
    #: the vLLM release whose rules the plan follows (``--vllm-version``; default :data:`PINNED_VLLM`).
    vllm_version: str = PINNED_VLLM

    # -- what the other models read --------------------------------------------------------
    @property
    def tokens_per_block(self) -> int:
        """The engine's block size after grouping, tokens."""
        return self.capacity.block_size

    @property
    def usable_blocks(self) -> int:
        """Block ids requests can hold (``num_gpu_blocks`` less the null block)."""
        return self.running.usable_blocks

    def cudagraph_max_tokens(self, num_speculative_tokens: int = 0) -> int:
        """The largest step (tokens) replayed as a CUDA graph: the one given, else vLLM's rule for
        this plan's ``max_num_seqs`` and token budget (:func:`servebook.vllm_rules.cudagraph_max_tokens`)."""
        if self.cudagraph_max_tokens_given is not None:
            return self.cudagraph_max_tokens_given
        from servebook.hardware import get_gpu

        capability = get_gpu(self.gpu_name).compute_capability if self.gpu_name else ""
        return cudagraph_max_tokens(self.max_num_seqs, self.max_num_batched_tokens,
                                    num_speculative_tokens=num_speculative_tokens,
                                    architecture=self.spec.architecture, compute_capability=capability,
                                    vllm_version=self.vllm_version)

    def pool_groups(self) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """``(block size of each full-attention group, (window, block size) of each sliding group)``:
        the KV cache groups as the scheduler simulator's pool counts them
        (:func:`servebook.simulator.config.scheduler_config`), tokens. A uniform-type layout (one
        block table for all layers) is one full group of the pool's block size."""
        layout = self.capacity.layout
        if layout.uniform_type:
            return (layout.block_size,), ()
        full, sliding = [], []
        for g in layout.groups:
            if g.kind == "sliding":
                sliding.append((int(g.spec.sliding_window), int(g.spec.block_size)))
            else:
                full.append(int(g.spec.block_size))
        return tuple(full), tuple(sliding)

    @property
    def request_tokens(self) -> int:
        """Tokens per request (prompt + output) the run-time figure is for."""
        return self.running.request_tokens

    def serve_command(self) -> str:
        """A ``vllm serve`` command line with the flags this plan used (real 0.27.1 flags)."""
        args = [
            "vllm", "serve", self.model_ref,
            "--tensor-parallel-size", str(self.tp),
            "--max-model-len", str(self.max_model_len),
            "--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}",
            "--max-num-batched-tokens", str(self.max_num_batched_tokens),
            "--max-num-seqs", str(self.recommended_max_num_seqs),
        ]
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        if self.lora is not None:
            args += self.lora.flags()
        return shlex.join(args)

    def to_dict(self) -> dict:
        cap = self.capacity
        b = self.budget
        return {
            "model": self.spec.name,
            "vllm_rules": self.vllm_version,
            "usage_context": self.usage_context,
            "gpu": self.gpu_name,
            "gpu_memory_gib": None if self.gpu_memory_bytes is None else self.gpu_memory_bytes / GIB,
            "tp": self.tp,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "block_size": cap.block_size,
            "kv_bytes_per_token": cap.layout.kv_bytes_per_token,
            "weights_gib": weights_bytes_per_gpu(self.spec, self.tp) / GIB,
            "quantization": None if (q := spec_quantization(self.spec)) is None else q.name,
            "quant_kernel": None if self.kernel is None else self.kernel.kernel,
            "quant_kernel_note": None if self.kernel is None else (self.kernel.note or None),
            "lora_gib": None if b is None else b.lora_gib,
            "activation_gib": None if b is None else b.activation_gib,
            "non_torch_gib": None if b is None else b.non_torch_gib,
            "cudagraph_gib": None if b is None else b.cudagraph_gib,
            "budget_source": "logged (--available-kv-gib)" if b is None else f"model, coefficients {self.coefficients_summary}",
            "coefficients_status": self.coefficients_summary,
            "available_kv_gib": self.available_kv_bytes / GIB,
            "num_gpu_blocks": cap.num_gpu_blocks,
            "kv_cache_tokens": cap.kv_cache_tokens,
            "max_concurrency": cap.max_concurrency,
            "admission_blocks_per_request": cap.blocks_per_request,
            "request_tokens": self.request_tokens,
            "running_blocks_per_request": self.running.blocks_per_request,
            "usable_gpu_blocks": self.running.usable_blocks,
            "running_concurrency": self.running.max_running,
            "admission_blocks_for_request_tokens": self.running.admission_blocks,
            "concurrency_note": FIGURES_NOTE,
            "kv_cache_groups": len(cap.layout.groups),
            "padding_layers": cap.padding_layers,
            "padding_waste_pct": cap.padding_waste_pct,
            "recommended_max_num_seqs": self.recommended_max_num_seqs,
            "watch_metrics": list(WATCH_METRICS),
            "vllm_serve_command": self.serve_command(),
        }


def recommended_max_num_seqs(running_concurrency: float, max_num_seqs: int) -> int:
    """85% of the run-time concurrency (requests), at least 1, at most that figure and the engine's
    ``max_num_seqs`` (vLLM's default unless given; never above the token budget)."""
    ceiling = math.floor(running_concurrency)
    if ceiling < 1:
        raise ServebookError("the KV cache cannot hold one running request; lower --max-model-len or --request-tokens")
    return max(1, min(math.floor(MAX_NUM_SEQS_FRACTION * running_concurrency), ceiling, max_num_seqs))


def _resolve_gpu(name: str) -> tuple[str, int]:
    try:
        from servebook.hardware import get_gpu
    except ImportError:  # pragma: no cover - the catalogue ships with the package
        raise ServebookError("the GPU catalogue (servebook.hardware) is not available; pass --available-kv-gib") from None
    gpu = get_gpu(name)
    return getattr(gpu, "name", name), int(gpu.memory_bytes)


def _hub_repo(reference_id: str) -> str | None:
    """The Hub repo of a shipped reference config (``data/models/SOURCES.md``), or None."""
    sources = MODELS_DIR / "SOURCES.md"
    try:
        for line in sources.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0] == reference_id and re.fullmatch(r"[\w.-]+/[\w.-]+", cells[1]):
                return cells[1]
    except OSError:
        pass
    return None


def _model_ref(config: str, spec: ModelSpec) -> str:
    """What to put after ``vllm serve``.

    A reference id, or a path to one of the shipped reference configs
    (``data/models/<id>.json``): its Hub repo. A ``config.json`` or a model
    directory: that directory (vLLM loads a directory or a Hub id, never a
    bare JSON file). Any other JSON file: a ``MODEL_DIR`` placeholder.
    """
    path = Path(config)
    if path.is_dir():
        return str(path)
    if path.is_file():
        models = MODELS_DIR
        if path.resolve().parent == models.resolve() and (repo := _hub_repo(path.stem)):
            return repo
        return str(path.parent) if path.name == "config.json" else "MODEL_DIR"
    return _hub_repo(config) or config


#: hf_config names one missing field at a time ("... lacks 'X'; add it (an integer) ...").
_LACKS = re.compile(r"lacks '([^']+)'; add it \(an integer\)")


def _load_spec(config: str) -> ModelSpec:
    """Load the model; a config that lacks several fields names all of them at once.

    ``servebook.hf_config`` stops at the first missing field. For a JSON file,
    this asks it again with each reported field filled by a placeholder, to
    collect the full list the reader must add (at most 32 rounds).
    """
    from servebook.errors import ConfigError
    from servebook.hf_config import load_model_spec

    try:
        return load_model_spec(config)
    except ConfigError as first:
        m = _LACKS.search(str(first))
        path = Path(config)
        cfg_path = path / "config.json" if path.is_dir() else path
        if m is None or not cfg_path.is_file():
            raise
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            raise first from None
        missing = []
        while m is not None and len(missing) < 32 and m.group(1) not in missing:
            missing.append(m.group(1))
            cfg[m.group(1)] = 1
            try:
                load_model_spec(cfg)
                m = None
            except ConfigError as exc:
                m = _LACKS.search(str(exc))
        raise ConfigError(
            f"{cfg_path} lacks {', '.join(repr(k) for k in missing)}; add "
            f"{'them' if len(missing) > 1 else 'it'} (integers) — copy the model's published config.json "
            "rather than writing one by hand"
        ) from None


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ServebookError(f"--{name} {value} is out of range; use a positive integer")


def make_plan(
    config: str | ModelSpec,
    *,
    gpu: str | None = None,
    tp: int = 1,
    max_model_len: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    max_num_batched_tokens: int | None = None,
    available_kv_gib: float | None = None,
    request_tokens: int | None = None,
    prompt_tokens: int | None = None,
    max_num_seqs: int | None = None,
    usage_context: str = "serve",
    cudagraph_max_tokens: int | None = None,
    lora: LoraSettings | None = None,
    vllm_version: str | None = None,
) -> Plan:
    """Compute a :class:`Plan`: the one description of a deployment every model prices.

    Every engine default is resolved here, once, by vLLM's rule (:mod:`servebook.vllm_rules`)
    for the usage context: ``serve`` (``vllm serve``) or ``offline`` (the ``LLM`` class, whose
    batch defaults are larger). ``config``: a reference id, a config.json path or model
    directory, or a :class:`~servebook.model_spec.ModelSpec`. ``request_tokens``: prompt +
    output tokens of the requests the run-time concurrency is for (default ``max_model_len``);
    at most ``max_model_len``; ``prompt_tokens``: their prompt (default: all of it), which
    admission must find free blocks for. ``max_num_seqs``: the engine's ``--max-num-seqs`` (default
    vLLM's, capped at the token budget). ``cudagraph_max_tokens``: the largest CUDA-graph step
    when not vLLM's (tokens). ``lora``: ``--enable-lora`` with its slots and rank
    (:mod:`servebook.lora`): their stacked tensors join the weights claim and their buffers the
    profiling peak. A quantized checkpoint is checked against the GPU's compute capability
    (:func:`servebook.quant_schemes.kernel_on`; a GPU that cannot run it is an error) and against
    the release (:func:`servebook.quant_schemes.check_loads`: group activation ordering loads on
    0.26.0 only). ``vllm_version``: the release whose rules apply where releases differ
    (:data:`servebook.vllm_rules.RULE_RELEASES`; None: the newest checked, :data:`PINNED_VLLM`).
    """
    rule_release(vllm_version)  # a release servebook has not read is refused before any work
    vllm_version = vllm_version or PINNED_VLLM
    if usage_context not in USAGE_CONTEXT_FLAGS:
        raise ServebookError(f"--usage-context {usage_context!r} is not known; use one of "
                             f"{', '.join(USAGE_CONTEXT_FLAGS)} (serve = vllm serve, offline = the LLM class)")
    _positive("max-num-seqs", max_num_seqs)
    _positive("cudagraph-max-tokens", cudagraph_max_tokens)
    check_utilization(gpu_memory_utilization)
    check_tp_size(tp)
    _positive("max-model-len", max_model_len)
    _positive("max-num-batched-tokens", max_num_batched_tokens)
    if request_tokens is not None and (isinstance(request_tokens, bool) or not isinstance(request_tokens, int)
                                       or request_tokens < 1):
        raise ServebookError(f"--request-tokens {request_tokens!r} is out of range; use a positive number of "
                             "tokens (prompt + output), at most --max-model-len")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ServebookError(f"--kv-cache-dtype {kv_cache_dtype!r} is not supported; use one of {', '.join(KV_CACHE_DTYPES)}")
    if available_kv_gib is not None and not (available_kv_gib > 0 and math.isfinite(available_kv_gib)):
        raise ServebookError(f"--available-kv-gib {available_kv_gib} is out of range; use a positive number of GiB")
    spec = config if isinstance(config, ModelSpec) else _load_spec(config)
    if max_model_len is None:
        max_model_len = spec.max_position_embeddings
        if max_model_len < 1:
            raise ServebookError(f"{spec.name} has no max_position_embeddings; pass --max-model-len")
    elif spec.max_position_embeddings and max_model_len > spec.max_position_embeddings:
        raise ServebookError(
            f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings "
            f"({spec.max_position_embeddings}); use a value in [1, {spec.max_position_embeddings}]"
        )
    if request_tokens is not None and request_tokens > max_model_len:
        raise ServebookError(f"--request-tokens {request_tokens} exceeds --max-model-len {max_model_len}: vLLM "
                             f"rejects longer requests; use at most {max_model_len} or raise --max-model-len")
    # Validate shape choices (block size, TP, dtype) before any memory arithmetic.
    kv_cache_layout(spec, block_size=block_size, kv_cache_dtype=kv_cache_dtype, tp=tp, vllm_version=vllm_version)

    # The GPU sets vLLM's batch defaults even when the KV budget comes from a log.
    gpu_name, gpu_bytes = _resolve_gpu(gpu or DEFAULT_GPU)
    quantization = spec_quantization(spec)
    if quantization is not None:
        check_loads(quantization, vllm_version)  # a setting this release refuses (desc_act from 0.32.0 on)
    kernel = None if quantization is None else kernel_on(quantization, gpu_name)
    if lora is not None and not isinstance(lora, LoraSettings):
        raise ServebookError(f"lora must be LoraSettings, got {type(lora).__name__}")
    default_tokens, default_seqs = vllm_batch_defaults(gpu_bytes, gpu_name, max_model_len=max_model_len,
                                                       usage_context=USAGE_CONTEXT_FLAGS[usage_context])
    tokens = max_num_batched_tokens or default_tokens
    if max_num_seqs is None:
        max_num_seqs = min(default_seqs, tokens)  # vLLM refuses a budget below max_num_seqs
    else:
        check_batch_budget(tokens, max_num_seqs)

    budget = None
    if available_kv_gib is not None:
        available = round(available_kv_gib * GIB)
    else:
        budget = memory_budget(
            spec,
            gpu_memory_bytes=gpu_bytes,
            max_num_batched_tokens=tokens,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            tp=tp,
            lora_weights_for=None if lora is None else (lambda t: lora_weights_bytes(spec, lora, t)),
            lora_activation_bytes=0 if lora is None else lora_activation_bytes(spec, lora, tokens),
        )
        available = budget.available_kv_bytes
    cap = capacity(
        spec, available, max_model_len=max_model_len, max_num_batched_tokens=tokens,
        block_size=block_size, kv_cache_dtype=kv_cache_dtype, tp=tp, device="cuda", vllm_version=vllm_version,
    )
    running = running_concurrency(cap, max_model_len if request_tokens is None else request_tokens, prompt_tokens)
    return Plan(
        spec=spec,
        model_ref=spec.name if isinstance(config, ModelSpec) else _model_ref(config, spec),
        gpu_name=gpu_name,
        gpu_memory_bytes=gpu_bytes,
        tp=tp,
        max_model_len=max_model_len,
        max_num_batched_tokens=tokens,
        default_max_num_seqs=default_seqs,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        budget=budget,
        available_kv_bytes=available,
        capacity=cap,
        running=running,
        recommended_max_num_seqs=recommended_max_num_seqs(running.max_running, max_num_seqs),
        coefficients_summary=load_coefficients().summary,
        usage_context=usage_context,
        max_num_seqs=max_num_seqs,
        cudagraph_max_tokens_given=cudagraph_max_tokens,
        kv_budget_given=available_kv_gib is not None,
        lora=lora,
        kernel=kernel,
        vllm_version=vllm_version,
    )




def make_plan_that_fits(config: str | ModelSpec, *, max_model_len: int | None = None, **engine) -> tuple[Plan, bool]:
    """:func:`make_plan`, and whether ``max_model_len`` had to be lowered to fit.

    vLLM refuses to start when one request of ``max_model_len`` tokens (default: the model's
    context) does not fit the KV cache. A batch job or a single-step question does not need the
    full context: when ``max_model_len`` is not given and the model's does not fit, the plan
    takes the longest context that does (the flag a reader must then pass), and says so with
    ``True``. A given ``max_model_len`` that does not fit stays an error.
    """
    try:
        return make_plan(config, max_model_len=max_model_len, **engine), False
    except DoesNotFitError as exc:
        if max_model_len is not None or not getattr(exc, "longest_context_tokens", 0):
            raise
        first, longest = exc, exc.longest_context_tokens
    # Each refusal names the longest context it would take: vLLM's start-up check (bytes), then the
    # run-time figure (which also keeps the null block out of the pool). Two retries at most.
    for _ in range(2):
        try:
            return make_plan(config, max_model_len=longest, **engine), True
        except DoesNotFitError as exc:
            longest = getattr(exc, "longest_context_tokens", 0)
            if not longest:
                break
    raise first
