"""Tensor-parallel rules (vLLM 0.27.1 and 0.32.0 ``config/model.py``, ``config/parallel.py``, the attention modules).

Units: ``tp`` is GPUs per replica; heads are counts.
"""
from __future__ import annotations

from servebook.errors import ServebookError
from servebook.model_spec import AttentionLayer, ModelSpec

#: Tensor-parallel sizes offered when one is refused.
TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)


def tp_splits_heads(spec: ModelSpec, tp: int) -> bool:
    """True when vLLM accepts tensor-parallel size ``tp`` for this model (see :func:`check_tp`)."""
    if spec.num_attention_heads % tp:
        return False
    for layer in spec.layers:
        if layer.kind == "mla" or not layer.owns_cache:
            continue
        h = layer.num_kv_heads
        if h >= tp and h % tp:
            return False
        if h < tp and tp % h:
            return False
    return True


def check_tp_size(tp: int) -> None:
    """Raise unless ``tp`` is a whole number of GPUs, at least 1 (before any model is read)."""
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ServebookError(f"--tp {tp} is not allowed: it is the tensor-parallel size and must be >= 1")


def check_tp(spec: ModelSpec, tp: int) -> None:
    """Raise unless ``tp`` splits the model's heads the way vLLM requires.

    vLLM needs the query heads divisible by ``tp``
    (``ModelConfig.verify_with_parallel_config``) and, per layer, either the KV
    heads divisible by ``tp`` or ``tp`` divisible by the KV heads (replication),
    as the attention modules assert (e.g. ``LlamaAttention.__init__``).
    The one message every command prints for this mistake.
    """
    check_tp_size(tp)
    if tp_splits_heads(spec, tp):
        return
    valid = [t for t in TP_CHOICES if tp_splits_heads(spec, t)]
    heads = spec.num_attention_heads
    if heads % tp:
        why = f"does not divide {spec.name}'s {heads} attention heads"
    else:
        kv = sorted({l.num_kv_heads for l in spec.layers if l.kind != "mla" and l.owns_cache})
        why = f"neither divides nor is a multiple of {spec.name}'s KV heads ({', '.join(map(str, kv))} per layer)"
    raise ServebookError(f"tensor parallel size {tp} {why}; use one of {valid} for --tp")


def kv_heads_per_gpu(layer: AttentionLayer, tp: int) -> int:
    """KV heads one TP rank holds for ``layer``: ``max(1, num_kv_heads // tp)``.

    Sharded when ``tp`` divides them, replicated when ``tp`` exceeds them
    (``ModelConfig.get_num_kv_heads`` in ``config/model.py``). An MLA layer keeps
    one latent "head" per token on every rank (``MLAAttentionSpec``): 1.
    """
    if layer.kind == "mla":
        return 1
    return max(1, layer.num_kv_heads // tp)
