"""Scheduler settings, named after the vLLM engine arguments they stand for."""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError

#: Allocation/batching policies the simulator knows.
POLICIES = ("paged", "contiguous", "static")
#: How much a contiguous allocator reserves per request (Kwon et al. 2023, Fig. 2's Orca variants):
#: ``max`` = max_model_len, ``pow2`` = next power of two >= prompt+output, ``oracle`` = prompt+output.
RESERVATIONS = ("max", "pow2", "oracle")


@dataclass(frozen=True)
class SchedulerConfig:
    """What the simulated engine is allowed to do.

    Attributes:
        num_blocks: usable KV blocks (vLLM's ``num_gpu_blocks`` − 1; vLLM keeps
            one null block). Capacity in tokens is ``num_blocks * block_size``.
        block_size: tokens per KV block (``--block-size``; 16 on CUDA, 128 on CPU).
        max_num_seqs: most requests in the running queue (``--max-num-seqs``).
        max_num_batched_tokens: token budget of one step (``--max-num-batched-tokens``).
        max_model_len: longest prompt + output in tokens (``--max-model-len``).
        long_prefill_token_threshold: cap on one request's tokens per step;
            0 = no cap (``--long-prefill-token-threshold``, default 0).
        enable_chunked_prefill: let a prompt be split across steps.
        enable_prefix_caching: reuse full blocks whose tokens match.
        reserve_full_prompt: admit a waiting request only if blocks for its whole
            prompt are free (vLLM 0.27.1 ``scheduler_reserve_full_isl``, default True).
        watermark: fraction of blocks kept free when admitting (vLLM ``watermark``, default 0).
        policy: ``paged`` (vLLM), ``contiguous`` (continuous batching, worst-case
            contiguous reservation) or ``static`` (a batch runs until its longest
            member is done, with contiguous reservation).
        reservation: for ``contiguous``/``static``: one of :data:`RESERVATIONS`.
    """

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    reserve_full_prompt: bool = True
    watermark: float = 0.0
    policy: str = "paged"
    reservation: str = "max"

    def __post_init__(self) -> None:
        positive = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ServebookError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.long_prefill_token_threshold < 0:
            raise ServebookError("long_prefill_token_threshold must be >= 0 (0 turns the cap off)")
        if not 0.0 <= self.watermark < 1.0:
            raise ServebookError(f"watermark is {self.watermark}; give a fraction in [0, 1)")
        if self.policy not in POLICIES:
            raise ServebookError(f"unknown policy {self.policy!r}; choose one of {POLICIES}")
        if self.reservation not in RESERVATIONS:
            raise ServebookError(f"unknown reservation {self.reservation!r}; choose one of {RESERVATIONS}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ServebookError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), as vLLM requires; raise it or enable chunking"
            )

    @property
    def capacity_tokens(self) -> int:
        """KV slots in the pool: ``num_blocks * block_size`` tokens."""
        return self.num_blocks * self.block_size

    @property
    def watermark_blocks(self) -> int:
        """Blocks the watermark keeps free (vLLM: ``int(watermark * num_blocks)``)."""
        return int(self.watermark * self.num_blocks)
