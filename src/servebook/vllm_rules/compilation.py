"""CUDA-graph capture (vLLM 0.27.1 ``config/vllm.py``, ``config/compilation.py``).

Units: tokens per engine step.
"""
from __future__ import annotations

#: The cap on vLLM 0.27.1's default largest CUDA-graph capture size, tokens: reached when
#: ``max_num_seqs`` >= 256 (``VllmConfig._set_cudagraph_sizes``:
#: ``min(max_num_seqs x (1 + drafts) x 2, 512, max_num_batched_tokens)``).
DEFAULT_CUDAGRAPH_MAX_TOKENS = 512


def cudagraph_max_tokens(max_num_seqs: int, max_num_batched_tokens: int, *, enforce_eager: bool = False,
                         num_speculative_tokens: int = 0) -> int:
    """Largest step (tokens) vLLM replays as a CUDA graph; bigger steps run eagerly (0 with enforce_eager)."""
    if enforce_eager:
        return 0
    return min(max_num_seqs * (1 + num_speculative_tokens) * 2, DEFAULT_CUDAGRAPH_MAX_TOKENS, max_num_batched_tokens)
