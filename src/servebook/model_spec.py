"""What the book needs to know about a model, independent of where it came from.

A :class:`ModelSpec` is built from a Hugging Face ``config.json`` by
:func:`servebook.hf_config.load_model_spec`. Every other module (memory budget,
engine capacity, step-time model, simulator) reads only these dataclasses, so a
new architecture is supported by teaching the loader, not by editing the models.

Units: counts are plain integers; sizes in bytes say so in their name
(``*_bytes``); token counts say ``tokens``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AttentionKind = Literal["full", "sliding", "mla"]


@dataclass(frozen=True)
class AttentionLayer:
    """The KV-cache-relevant shape of one decoder layer's attention.

    Attributes:
        kind: ``"full"`` (every past token kept), ``"sliding"`` (only the last
            ``sliding_window`` tokens are attended) or ``"mla"`` (multi-head
            latent attention: one compressed latent per token, no K/V split).
        num_kv_heads: K/V heads of this layer before tensor parallelism
            (``num_key_value_heads``; 1 for MLA).
        head_dim: size of one K head in elements. For MLA: ``kv_lora_rank +
            qk_rope_head_dim`` (the cached latent width).
        v_head_dim: size of one V head in elements; 0 when no separate V is
            cached (MLA, or K=V shared as in Gemma 4's global layers).
        sliding_window: window in tokens for ``"sliding"`` layers, else None.
        kv_source_layer: index of an earlier layer whose cache this layer
            reuses (cross-layer KV sharing); None when it owns its cache.
    """

    kind: AttentionKind
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    sliding_window: int | None = None
    kv_source_layer: int | None = None

    @property
    def owns_cache(self) -> bool:
        """True when this layer allocates its own KV cache."""
        return self.kv_source_layer is None

    def kv_elements_per_token(self) -> int:
        """Cached elements per token in this layer (all heads, K plus V), before TP."""
        if self.kind == "mla":
            return self.head_dim
        return self.num_kv_heads * (self.head_dim + self.v_head_dim)


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts shape (per MoE layer).

    Attributes:
        num_experts: routed experts per MoE layer.
        experts_per_token: routed experts each token activates (top-k).
        expert_intermediate_size: FFN width of one routed expert.
        num_shared_experts: always-active experts (DeepSeek style); 0 if none.
        shared_intermediate_size: FFN width of the shared expert(s) block, 0 if none.
        moe_layer_indices: which decoder layers are MoE (others are dense MLPs).
        params_per_expert: parameters of one routed expert (all its matrices).
        bytes_per_param: bytes per routed-expert weight as the engine loads them (2 for bf16, 17/32
            for MXFP4 values + scales); None: the model's average (``weight_bytes / params.total``).
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_shared_experts: int
    shared_intermediate_size: int
    moe_layer_indices: tuple[int, ...]
    params_per_expert: int
    bytes_per_param: float | None = None


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts computed from the config's shapes.

    Attributes:
        total: every parameter the checkpoint holds (all experts, embeddings, head).
        active: parameters used per token (top-k experts only).
        embedding: input embedding parameters.
        lm_head: output projection parameters (0 when tied to the embedding).
        attention: all attention projections, all layers.
        mlp_dense: dense MLPs (non-MoE layers) plus shared experts.
        experts: all routed experts, all MoE layers.
        norms_and_other: norms, router gates, biases and the rest.
        engine_only: parameters the engine allocates and multiplies by every token beyond the
            checkpoint's (Gemma 4's V projection on its K=V layers, filled with the K weights);
            in none of the counts above.
    """

    total: int
    active: int
    embedding: int
    lm_head: int
    attention: int
    mlp_dense: int
    experts: int
    norms_and_other: int
    engine_only: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only model as the serving calculators see it.

    Attributes:
        name: human-readable name (the reference file's stem or the config's name).
        architecture: ``architectures[0]`` from config.json.
        hidden_size: model width (``hidden_size``).
        num_attention_heads: query heads (not KV heads).
        vocab_size: vocabulary size.
        max_position_embeddings: longest context the checkpoint supports, tokens.
        layers: one :class:`AttentionLayer` per decoder layer, in order.
        params: parameter counts from the shapes.
        weight_bytes_per_param: bytes per weight as stored/served (2 for bf16);
            for mixed formats (MXFP4 experts) see ``weight_bytes``.
        weight_bytes: bytes of all weights as loaded by the engine.
        buffer_bytes: bytes of the other tensors the engine allocates while loading, on every GPU
            (the rotary cos/sin caches: :mod:`servebook.rotary_cache`).
        moe: MoE shape, or None for dense models.
        tie_word_embeddings: True when the LM head shares the embedding matrix.
        intermediate_size: dense MLP width (0 if every layer is MoE).
        torch_dtype: the config's dtype string (e.g. ``"bfloat16"``).
        source: where the spec came from (path or ``"dict"``).
        raw: the original config dict (read-only use).
    """

    name: str
    architecture: str
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    max_position_embeddings: int
    layers: tuple[AttentionLayer, ...]
    params: ParamCount
    weight_bytes: int
    moe: MoESpec | None = None
    buffer_bytes: int = 0
    tie_word_embeddings: bool = False
    intermediate_size: int = 0
    torch_dtype: str = "bfloat16"
    source: str = "dict"
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        """Decoder layers."""
        return len(self.layers)

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.moe is not None

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        """Naive KV bytes per token summed over cache-owning layers, before TP.

        This is the textbook number (2 x layers x kv_heads x head_dim x bytes
        for a plain GQA model). It ignores sliding windows, block padding and
        TP replication; :mod:`servebook.kv_cache` models those.
        """
        return sum(l.kv_elements_per_token() for l in self.layers if l.owns_cache) * kv_dtype_bytes
