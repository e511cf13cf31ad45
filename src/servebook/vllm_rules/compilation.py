"""CUDA-graph capture (vLLM 0.27.1 ``config/vllm.py``, ``config/compilation.py``).

Units: tokens per engine step.
"""
from __future__ import annotations

#: The cap on vLLM 0.27.1's default largest CUDA-graph capture size, tokens: reached when
#: ``max_num_seqs`` >= 256 (``VllmConfig._set_cudagraph_sizes``:
#: ``min(max_num_seqs x (1 + drafts) x 2, 512, max_num_batched_tokens)``).
DEFAULT_CUDAGRAPH_MAX_TOKENS = 512

#: Architectures whose vLLM model config raises the largest capture size when the user set none,
#: tokens (``model_executor/models/config.py``: ``GptOssForCausalLMConfig.verify_and_update_config``
#: sets ``max_cudagraph_capture_size = 1024``; the H200 engine log of gpt-oss-20b lists sizes to 1,024).
ARCHITECTURE_CUDAGRAPH_MAX_TOKENS = {"GptOssForCausalLM": 1024}


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int, *, enforce_eager: bool = False,
                         num_speculative_tokens: int = 0, architecture: str | None = None) -> int:
    """Largest step (tokens) vLLM replays as a CUDA graph; bigger steps run eagerly (0 with enforce_eager).

    ``architecture`` (config.json's ``architectures[0]``): a model whose vLLM config sets its own
    largest capture size (:data:`ARCHITECTURE_CUDAGRAPH_MAX_TOKENS`) gets that, capped by
    ``max_num_batched_tokens`` as vLLM caps it.
    """
    if enforce_eager:
        return 0
    if architecture in ARCHITECTURE_CUDAGRAPH_MAX_TOKENS:
        return min(ARCHITECTURE_CUDAGRAPH_MAX_TOKENS[architecture], max_num_batched_tokens)
    return min(max_num_seqs * (1 + num_speculative_tokens) * 2, DEFAULT_CUDAGRAPH_MAX_TOKENS, max_num_batched_tokens)
