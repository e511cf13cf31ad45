"""LoRA adapters in the memory budget: what ``--enable-lora`` reserves on each GPU.

vLLM (``vllm/lora/``; read in 0.27.1, re-read in 0.32.0 and 0.34.0: every rule below is the same
in the three, and ``vllm_claims.toml`` quotes each so the drift check sees it move) wraps every
module adapters may touch when it loads the model
(``LoRAModelManager._create_lora_modules``: every linear layer, the input embedding and the
LM head's logits processor) and gives each wrapper zero-filled *stacked* tensors with one slot
per ``--max-loras`` adapter at ``--max-lora-rank`` (``create_lora_weights`` of
``lora/layers/base_linear.py``, ``column_parallel_linear.py``, ``vocab_parallel_embedding.py``
(``vocal_parallel_embedding.py`` in 0.27.1), ``logits_processor.py``), in the model's dtype (``--lora-dtype auto``). Per projection with
``s`` output slices (3 for ``qkv_proj``, 2 for ``gate_up_proj``), ``L`` slots and rank ``r``::

    A: s x L x r x in_features        B: L x r x sum(out_features)

per GPU: column-parallel layers shard their outputs (B) by TP, row-parallel layers
(``o_proj``, ``down_proj``) their inputs (A); ``--fully-sharded-loras`` (not modelled) would
shard the rest. Embedding: ``L x r x (vocab + hidden)``; logits processor:
``L x r x (hidden + vocab)``. These are allocated inside the engine's model-loading measurement,
so they add to ``Model loading took`` (the weights claim) of both model runners.

The profiling run activates ``--max-loras`` dummy adapters of rank ``min(max_lora_rank, 8)``
(``maybe_setup_dummy_loras``, ``v1/worker/lora_model_runner_mixin.py``), and every wrapped
projection's shrink step writes a float32 buffer of ``tokens x slices x max_lora_rank``
(``punica_gpu.py``); :func:`lora_activation_bytes` adds the widest such buffer to the peak.
The punica token-to-adapter maps (a few int32/int64 vectors of ``max_num_batched_tokens``)
are under 1 MiB and left out. ``--max-cpu-loras`` adapters are cached in host memory: they
never enter the GPU budget.

Modelled: decoder models with grouped-query attention (Llama, Mistral, Qwen, Gemma). Not
modelled (refused with :class:`~servebook.errors.ServebookError`): LoRA on MoE experts and on
multi-head latent attention. Units: bytes; ranks and slots are counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.model_spec import ModelSpec

#: ``MaxLoRARanks`` of ``vllm/config/lora.py`` (0.27.1 to 0.34.0): the ranks ``--max-lora-rank`` accepts.
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's defaults (``LoRAConfig``): one adapter slot of rank 16; ``max_cpu_loras`` = ``max_loras``.
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK = 16
#: Rank of the dummy adapters of the profiling run: ``min(max_lora_rank, 8)``.
WARMUP_RANK = 8
#: LoRA stacks are in the model's dtype (16-bit).
_LORA_DTYPE_BYTES = 2
#: Bytes of one float32 element of the shrink buffer.
_FP32 = 4


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA flags of one deployment (``--enable-lora`` is implied by having settings).

    Attributes:
        max_loras: adapters one batch may mix (``--max-loras``), slots on the GPU.
        max_lora_rank: the largest adapter rank served (``--max-lora-rank``).
        max_cpu_loras: adapters cached in host memory (``--max-cpu-loras``); None: ``max_loras``.
    """

    max_loras: int = DEFAULT_MAX_LORAS
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        check_lora_settings(self.max_loras, self.max_lora_rank, self.max_cpu_loras)

    @property
    def cpu_loras(self) -> int:
        """Adapters kept in host memory (``max_cpu_loras``, else ``max_loras``, as vLLM sets it)."""
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    def flags(self) -> list[str]:
        """The ``vllm serve`` flags (``--max-cpu-loras`` only when given)."""
        out = ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]
        if self.max_cpu_loras is not None:
            out += ["--max-cpu-loras", str(self.max_cpu_loras)]
        return out


def check_lora_settings(max_loras: object, max_lora_rank: object, max_cpu_loras: object = None) -> None:
    """Refuse what vLLM's ``LoRAConfig`` refuses (0.27.1 to 0.34.0 alike), saying what to pass instead."""
    for name, v in (("max-loras", max_loras), ("max-cpu-loras", max_cpu_loras)):
        if v is None and name == "max-cpu-loras":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ServebookError(f"--{name} {v!r} is out of range; use a positive integer (adapters)")
    if max_lora_rank not in MAX_LORA_RANKS or isinstance(max_lora_rank, bool):
        raise ServebookError(f"--max-lora-rank {max_lora_rank!r} is not accepted by vLLM; use one of "
                             f"{', '.join(map(str, MAX_LORA_RANKS))} (at least the largest adapter's rank)")
    if max_cpu_loras is not None and max_cpu_loras < max_loras:
        raise ServebookError(f"--max-cpu-loras {max_cpu_loras} is below --max-loras {max_loras}; vLLM requires "
                             f"max_cpu_loras >= max_loras: pass --max-cpu-loras {max_loras} or more")


@dataclass(frozen=True)
class _Projection:
    """One LoRA-wrapped projection of a decoder layer: input features, output slices, TP split."""

    in_features: int
    out_slices: tuple[int, ...]
    row_parallel: bool


def _projections(spec: ModelSpec, layer_index: int) -> list[_Projection]:
    layer = spec.layers[layer_index]
    if layer.kind == "mla":
        raise ServebookError(f"LoRA on {spec.name} (multi-head latent attention) is not modelled; servebook "
                             "sizes LoRA for grouped-query-attention models")
    hidden, q = spec.hidden_size, spec.num_attention_heads * layer.head_dim
    kv = layer.num_kv_heads * layer.head_dim
    attn_out = [q] + ([kv, kv] if layer.owns_cache else [])
    return [
        _Projection(hidden, tuple(attn_out), False),           # qkv_proj (or q_proj on a shared-KV layer)
        _Projection(q, (hidden,), True),                        # o_proj
        _Projection(hidden, (spec.intermediate_size,) * 2, False),  # gate_up_proj
        _Projection(spec.intermediate_size, (hidden,), True),  # down_proj
    ]


def _check_model(spec: ModelSpec) -> None:
    if spec.moe is not None:
        raise ServebookError(f"LoRA on {spec.name} (mixture of experts) is not modelled: vLLM adds per-expert "
                             "LoRA stacks whose size servebook does not compute yet; plan without LoRA flags")
    if spec.intermediate_size <= 0:
        raise ServebookError(f"{spec.name} has no dense MLP width; LoRA sizing needs intermediate_size")


def lora_weights_bytes(spec: ModelSpec, settings: LoraSettings, tp: int = 1) -> int:
    """Bytes of the stacked LoRA tensors on one GPU of a TP group (added to ``Model loading took``)."""
    _check_model(spec)
    slots, rank = settings.max_loras, settings.max_lora_rank
    elements = 0
    for i in range(spec.num_layers):
        for p in _projections(spec, i):
            if p.row_parallel:   # A sharded along its input, B whole
                elements += slots * rank * (-(-p.in_features // tp)) + slots * rank * sum(p.out_slices)
            else:                # A whole per slice, B sharded along the outputs
                elements += len(p.out_slices) * slots * rank * p.in_features
                elements += slots * rank * sum(-(-o // tp) for o in p.out_slices)
    elements += slots * rank * (spec.vocab_size + spec.hidden_size) * 2  # embedding + logits processor
    return elements * _LORA_DTYPE_BYTES


def lora_activation_bytes(spec: ModelSpec, settings: LoraSettings, max_num_batched_tokens: int) -> int:
    """Extra peak of the profiling run with dummy adapters: the widest shrink buffer, bytes.

    ``max_num_batched_tokens x slices x max_lora_rank`` float32 for the projection with the
    most output slices (``qkv_proj``: 3).
    """
    _check_model(spec)
    slices = max(len(p.out_slices) for p in _projections(spec, 0))
    return max_num_batched_tokens * slices * settings.max_lora_rank * _FP32
