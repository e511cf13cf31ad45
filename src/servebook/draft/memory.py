"""The draft chapter's memory arithmetic (section 6.5, ``report()``), kept to show where it goes wrong.

The user's draft sized Gemma 4 on an "H100 96 GB" with assumed shapes (31B: 48
full-attention layers x 8 KV heads x head_dim 128; 26B-A4B: 40 such layers),
``96 GiB x 0.92 - weights - 3 GiB`` of KV budget per GPU, and, with tensor
parallelism, an *aggregate* budget ``96 x 0.92 x tp - weights - 3 x tp``
divided by the *unsharded* KV bytes per token. This module reproduces those
numbers exactly as the draft computed them, so the book can print the draft's
figure beside the one :mod:`servebook.memory` and :mod:`servebook.kv_cache`
compute from the real ``config.json`` files. Nothing else should call it.

Units: GiB are ``2**30`` bytes, as in the draft (``GIB = 1024 ** 3``).
"""
from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class DraftShape:
    """A model as the draft assumed it (``ModelShape`` in the draft's code).

    Attributes:
        name: the draft's label.
        total_params_b: parameters, billions (weights are ``x 2`` bytes).
        layers / kv_heads / head_dim: every layer full attention with these.
        reference_id: the servebook reference config of the real model.
    """

    name: str
    total_params_b: float
    layers: int
    kv_heads: int
    head_dim: int
    reference_id: str

    def weight_bytes(self) -> int:
        """``total_params_b x 1e9 x 2`` bytes (bf16), as the draft."""
        return int(self.total_params_b * 1e9 * 2)

    def kv_bytes_per_token(self, bytes_per_elem: int = 2) -> int:
        """``2 x layers x kv_heads x head_dim x bytes``, as the draft (no TP split)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_elem


GEMMA4_31B = DraftShape("Gemma 4 31B (dense)", 31.0, 48, 8, 128, "gemma-4-31b")
GEMMA4_26B = DraftShape("Gemma 4 26B-A4B (MoE)", 26.0, 40, 8, 128, "gemma-4-26b-a4b")
DRAFT_SHAPES = (GEMMA4_31B, GEMMA4_26B)

#: The draft's card and constants: "H100 96 GB", utilisation 0.92, 3 GiB overhead per GPU.
DRAFT_GPU_GIB = 96
DRAFT_UTILIZATION = 0.92
DRAFT_OVERHEAD_GIB = 3.0


def draft_kv_budget_gib(shape: DraftShape, tp: int = 1) -> float:
    """KV budget the draft's ``report()`` prints (aggregate over ``tp`` GPUs), GiB."""
    weights = shape.weight_bytes() / GIB
    if tp == 1:
        return DRAFT_GPU_GIB * DRAFT_UTILIZATION - weights - DRAFT_OVERHEAD_GIB
    return DRAFT_GPU_GIB * DRAFT_UTILIZATION * tp - weights - DRAFT_OVERHEAD_GIB * tp


def draft_concurrency(shape: DraftShape, context_tokens: int, tp: int = 1, kv_bytes_per_elem: int = 2) -> float:
    """Sequences of ``context_tokens`` the draft says fit: budget / (KV bytes per token x context)."""
    return draft_kv_budget_gib(shape, tp) * GIB / (shape.kv_bytes_per_token(kv_bytes_per_elem) * context_tokens)


@dataclass(frozen=True)
class DraftDeployment:
    """A ``vllm serve`` command from the draft (sections 6.20 and 6.21)."""

    section: str
    reference_id: str
    tp: int
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    budget_tokens: int


DRAFT_DEPLOYMENTS = (
    DraftDeployment("6.20", "gemma-4-26b-a4b", 4, 16384, 108, 0.92, "auto", 15_000),
    DraftDeployment("6.21", "gemma-4-26b-a4b", 4, 32768, 54, 0.94, "fp8", 30_000),
)
