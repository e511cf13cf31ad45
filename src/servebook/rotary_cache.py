"""The rotary cos/sin caches vLLM keeps on every GPU beside the weights (bytes).

vLLM builds one rotary embedding per distinct (head size, rotary size, positions, rope parameters)
and caches them (``get_rope``'s ``_ROPE_DICT``, vLLM 0.26.0 to 0.32.0), so a model holds one
cache per *kind* of layer, not per layer. Each registers a non-persistent buffer
``cos_sin_cache`` of ``positions x rotary_dim`` values in the model's dtype
(``RotaryEmbedding.__init__`` in ``model_executor/layers/rotary_embedding/base.py``), allocated
while the model loads, so ``Model loading took X GiB`` counts it. Positions per scaling type:

* ``linear``: ``max_position_embeddings x factor`` (``LinearScalingRotaryEmbedding``);
* ``yarn``, ``deepseek_yarn``: ``original_max_position_embeddings x factor``;
* every other type (default, llama3, dynamic, Gemma 4's proportional): ``max_position_embeddings``.

Rotary size: ``head_dim x partial_rotary_factor``; Gemma 4's proportional rope caches the whole
head (``Gemma4RotaryEmbedding`` passes ``rotary_dim = head_size``); MLA layers rotate
``qk_rope_head_dim``. Small for most models (Llama-3.1-8B: 32 MiB); large where a long context is
stretched linearly (Gemma 3's global layers: 131,072 x 8 positions x 128 x 2 bytes = 256 MiB) or
heads are wide (Gemma 4 31B: 384 MiB). Every TP rank holds the whole cache.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

#: Positions in the cache of a Gemma 3 text config that omits ``max_position_embeddings``
#: (transformers' ``Gemma3TextConfig`` default, which vLLM then reads).
GEMMA3_DEFAULT_POSITIONS = 131_072


def _positions(params: Mapping, max_positions: int) -> int:
    kind = params.get("rope_type", params.get("type", "default"))
    factor = float(params.get("factor", 1.0) or 1.0)
    if kind == "linear":
        return int(max_positions * factor)
    if kind in ("yarn", "deepseek_yarn") and params.get("original_max_position_embeddings"):
        return int(params["original_max_position_embeddings"] * factor)
    return max_positions


def _rotary_dim(params: Mapping, head_dim: int, text: Mapping) -> int:
    if params.get("rope_type") == "proportional":
        return head_dim
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0)) or 1.0
    return int(head_dim * float(factor))


def _params_for(text: Mapping, layer_type: str) -> dict:
    """The rope parameters of one layer type, from a transformers v5 ``rope_parameters`` (possibly
    per layer type) or a v4 ``rope_scaling`` + ``rope_theta``; Gemma 3's sliding layers use the
    plain rope of ``rope_local_base_freq`` (vLLM's ``Gemma3Attention``)."""
    rp = text.get("rope_parameters")
    if isinstance(rp, Mapping) and layer_type in rp and isinstance(rp[layer_type], Mapping):
        return dict(rp[layer_type])
    if layer_type == "sliding_attention" and ("rope_local_base_freq" in text
                                              or text.get("model_type") == "gemma3_text"):
        return {"rope_type": "default", "rope_theta": text.get("rope_local_base_freq", 10_000.0)}
    if isinstance(rp, Mapping) and not any(isinstance(v, Mapping) for v in rp.values()):
        return dict(rp)
    scaling = text.get("rope_scaling")
    return dict(scaling) if isinstance(scaling, Mapping) else {"rope_type": "default"}


def rotary_cache_bytes(text: Mapping, layer_heads: list[tuple[str, int]], *, dtype_bytes: int,
                       mla_rope_dim: int | None = None) -> int:
    """Bytes of the rotary caches of a model (one per distinct kind of layer).

    Args:
        text: the (text) config.json.
        layer_heads: ``(layer_type, head_dim)`` per decoder layer, ``layer_type`` as in
            ``layer_types`` (``"full_attention"`` / ``"sliding_attention"``).
        dtype_bytes: bytes per value of the model's dtype (2 for bf16).
        mla_rope_dim: ``qk_rope_head_dim`` for MLA models (their only rotated dims), else None.
    """
    max_positions = int(text.get("max_position_embeddings") or GEMMA3_DEFAULT_POSITIONS)
    caches = {}
    for layer_type, head_dim in layer_heads:
        params = _params_for(text, layer_type)
        rotary = mla_rope_dim if mla_rope_dim else _rotary_dim(params, head_dim, text)
        positions = _positions(params, max_positions)
        key = (head_dim, rotary, positions, json.dumps(params, sort_keys=True, default=str))
        caches[key] = positions * rotary * dtype_bytes
    return sum(caches.values())
