"""Quantized checkpoints: which settings a release loads, where releases differ.

The per-scheme facts every release shares (bits, scales, zero points, compute capabilities, kernels)
are data, ``servebook/data/quant_schemes.toml``; this module holds the rule that changed between the
releases servebook keys rules by (:data:`~servebook.vllm_rules.release.RULE_RELEASES`).

Activation ordering with more than one group (GPTQ ``desc_act: true``, compressed-tensors
``actorder: "group"`` or ``"dynamic"``), paths relative to the ``vllm`` package:

* 0.26.0 (0.27.1 alike): loads. Marlin sorts the act-order index ``g_idx`` and keeps it and its sort
  indices, one int32 each per input feature of each fused layer
  (``model_executor/kernels/linear/mixed_precision/marlin.py``, ``marlin_sort_g_idx``).
* 0.32.0: refused while the config is read: GPTQ in
  ``model_executor/layers/quantization/utils/gptq_utils.py`` (``normalize_and_validate_gptq_desc_act``:
  "GPTQ group activation ordering (desc_act=True) is no longer supported"), compressed-tensors in
  ``model_executor/layers/quantization/compressed_tensors/compressed_tensors.py``. With one group per
  row (``group_size: -1``) the ordering is a no-op and both releases load it. 0.34.0's source refuses
  it the same way (the drift claims quote both refusals).
"""
from __future__ import annotations

from servebook.vllm_rules.release import rule_release


def act_order_loads(vllm_version: str | None = None) -> bool:
    """Whether ``vllm_version`` (None: the pinned release) loads a checkpoint with group activation
    ordering (GPTQ ``desc_act``, compressed-tensors ``actorder`` group/dynamic, more than one group)."""
    return rule_release(vllm_version) == "0.26.0"
