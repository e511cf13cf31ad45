"""The vLLM releases servebook describes: the one home of each version string.

The package face re-exports both (``from servebook import PINNED_VLLM``); modules of the library
import them from here, never from the package face.
"""
from __future__ import annotations

#: The vLLM release the chapter describes; drift tests check against it.
PINNED_VLLM = "0.32.0"
#: The vLLM release that runs on the lent GPU (recorded GPU results say so).
GPU_LAB_VLLM = "0.26.0"
