"""CUDA-graph capture (vLLM ``config/vllm.py``, ``config/compilation.py``), per release where it differs.

Units: tokens per engine step.
"""
from __future__ import annotations

from servebook.vllm_rules.release import rule_release

#: The cap on vLLM's default largest CUDA-graph capture size, tokens: reached when
#: ``max_num_seqs`` >= 256 (``VllmConfig._set_cudagraph_sizes``:
#: ``min(max_num_seqs x (1 + drafts) x 2, 512, max_num_batched_tokens)``). 0.26.0 and 0.27.1 on every
#: GPU; 0.32.0 on every GPU but data-center Blackwell (:data:`BLACKWELL_CUDAGRAPH_MAX_TOKENS`).
DEFAULT_CUDAGRAPH_MAX_TOKENS = 512
#: 0.32.0's cap on GPUs of compute capability family 10 (B200, GB200: ``current_platform.
#: is_device_capability_family(100)`` in ``VllmConfig._set_cudagraph_sizes``), tokens.
BLACKWELL_CUDAGRAPH_MAX_TOKENS = 1024


def default_cudagraph_cap(compute_capability: str = "", vllm_version: str | None = None) -> int:
    """The cap (tokens) of the default largest capture size for a GPU of ``compute_capability``
    (``"major.minor"``; empty: unknown, taken as not Blackwell) under ``vllm_version`` (None: pinned)."""
    if rule_release(vllm_version) != "0.26.0" and compute_capability.split(".")[0] == "10":
        return BLACKWELL_CUDAGRAPH_MAX_TOKENS
    return DEFAULT_CUDAGRAPH_MAX_TOKENS

#: Architectures whose vLLM model config raises the largest capture size when the user set none,
#: tokens (``model_executor/models/config.py``: ``GptOssForCausalLMConfig.verify_and_update_config``
#: sets ``max_cudagraph_capture_size = 1024``; the H200 engine log of gpt-oss-20b lists sizes to 1,024).
ARCHITECTURE_CUDAGRAPH_MAX_TOKENS = {"GptOssForCausalLM": 1024}


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int, *, enforce_eager: bool = False,
                         num_speculative_tokens: int = 0, architecture: str | None = None,
                         compute_capability: str = "", vllm_version: str | None = None) -> int:
    """Largest step (tokens) vLLM replays as a CUDA graph; bigger steps run eagerly (0 with enforce_eager).

    ``architecture`` (config.json's ``architectures[0]``): a model whose vLLM config sets its own
    largest capture size (:data:`ARCHITECTURE_CUDAGRAPH_MAX_TOKENS`) gets that, capped by
    ``max_num_batched_tokens`` as vLLM caps it. ``compute_capability`` and ``vllm_version`` pick the
    default cap (:func:`default_cudagraph_cap`: 1024 on Blackwell from 0.32.0, else 512).
    """
    if enforce_eager:
        return 0
    if architecture in ARCHITECTURE_CUDAGRAPH_MAX_TOKENS:
        return min(ARCHITECTURE_CUDAGRAPH_MAX_TOKENS[architecture], max_num_batched_tokens)
    return min(max_num_seqs * (1 + num_speculative_tokens) * 2, default_cudagraph_cap(compute_capability, vllm_version),
               max_num_batched_tokens)
