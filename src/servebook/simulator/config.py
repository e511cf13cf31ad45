"""Scheduler settings, named after the vLLM engine arguments they stand for."""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.vllm_rules import (CUDA_DEFAULT_BLOCK_SIZE, SMALL_GPU_BATCH_DEFAULTS, sliding_window_hold_tokens,
                                  sliding_window_running_blocks)

_DEFAULT_TOKENS, _DEFAULT_SEQS = SMALL_GPU_BATCH_DEFAULTS["LLM_CLASS"]
#: ``max_model_len`` of the toy engine (no model, so no ``max_position_embeddings`` to default to), tokens.
TOY_MAX_MODEL_LEN = 2048

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
        full_groups: KV cache groups of full-attention (or MLA) layers; each holds one block per
            ``block_size`` tokens of a request (vLLM's ``FullAttentionManager``).
        sliding_windows: one window (tokens) per sliding-window KV cache group. Empty for a model
            without sliding layers: then the pool is the classic one-block-per-``block_size``-tokens
            pool. Otherwise a request holds, per sliding group, only the blocks its window still
            covers (``SlidingWindowManager.remove_skipped_blocks``; the run-time rule of
            :func:`servebook.vllm_rules.sliding_window_running_blocks`), and must find free blocks
            for its whole prompt in every group at admission, capped at the group's admission
            bound (:func:`servebook.vllm_rules.sliding_window_hold_tokens`). ``num_blocks`` then
            counts block ids of the shared pool (one id = one block of every layer of one group),
            as vLLM's ``num_gpu_blocks`` does. :func:`scheduler_config` fills
            both from the model's KV layout.

    Defaults (no GPU, no model: the toy engine of the mechanism pages) are vLLM's ``LLM``-class
    batch defaults on a GPU below 70 GiB (:data:`servebook.vllm_rules.SMALL_GPU_BATCH_DEFAULTS`);
    a deployment's own values come from :class:`servebook.plan.Plan`.
    """

    num_blocks: int
    block_size: int = CUDA_DEFAULT_BLOCK_SIZE
    max_num_seqs: int = _DEFAULT_SEQS
    max_num_batched_tokens: int = _DEFAULT_TOKENS
    max_model_len: int = TOY_MAX_MODEL_LEN
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    reserve_full_prompt: bool = True
    watermark: float = 0.0
    policy: str = "paged"
    reservation: str = "max"
    full_groups: int = 1
    sliding_windows: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        positive = ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len")
        for name in positive:
            if getattr(self, name) < 1:
                raise ServebookError(f"{name} is {getattr(self, name)}; it must be at least 1")
        if self.long_prefill_token_threshold < 0:
            raise ServebookError("long_prefill_token_threshold must be >= 0 (0 turns the cap off)")
        if not 0.0 <= self.watermark < 1.0:
            raise ServebookError(f"watermark is {self.watermark}; give a fraction in [0, 1)")
        if self.full_groups < 0 or any(w < 1 for w in self.sliding_windows) or (
                self.full_groups + len(self.sliding_windows) < 1):
            raise ServebookError("the KV pool needs at least one group: full_groups >= 0 and sliding windows >= 1 "
                                 "token, not both empty")
        if self.sliding_windows and self.policy != "paged":
            raise ServebookError(f"policy {self.policy!r} reserves contiguous memory per request and does not model "
                                 "sliding-window groups; use policy 'paged' for a sliding-window model")
        if self.sliding_windows and self.enable_prefix_caching:
            raise ServebookError("prefix caching is not simulated for sliding-window models (its hits depend on "
                                 "which blocks each window still holds); set enable_prefix_caching=False")
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

    @property
    def grouped(self) -> bool:
        """Whether the pool has sliding-window groups (blocks counted per group, not per token)."""
        return bool(self.sliding_windows)

    def running_blocks(self, end_tokens: int, new_tokens: int) -> int:
        """Block ids one request holds once ``end_tokens`` tokens have slots, ``new_tokens`` of them
        scheduled in this step: ``cdiv(end, block_size)`` per full group, and per sliding group the
        smaller of that and :func:`~servebook.vllm_rules.sliding_window_running_blocks` (``new_tokens``
        unsettled). The classic pool (no sliding group) is ``cdiv(end, block_size)``."""
        own = -(-end_tokens // self.block_size)
        total = self.full_groups * own
        for w in self.sliding_windows:
            cap = sliding_window_running_blocks(w, self.block_size, max(new_tokens, 1))
            total += own if own < cap else cap
        return total

    def admission_blocks(self, prompt_tokens: int) -> int:
        """Free block ids a waiting request of ``prompt_tokens`` needs to be admitted: its whole prompt
        in every group, a sliding group capped at its admission bound (``window - 1`` plus the step's
        tokens in flight, :func:`~servebook.vllm_rules.sliding_window_hold_tokens`, plus one block)."""
        own = -(-prompt_tokens // self.block_size)
        total = self.full_groups * own
        for w in self.sliding_windows:
            held = min(sliding_window_hold_tokens(w, self.max_num_batched_tokens), self.max_model_len)
            cap = -(-held // self.block_size) + 1
            total += own if own < cap else cap
        return total

    def decode_block_increment(self, block_index: int) -> int:
        """Block ids a plain decoder takes when its context enters token block ``block_index``
        (1-based): one per full group, and one per sliding group whose run-time hold still grows."""
        grows = 0
        for w in self.sliding_windows:
            if block_index <= sliding_window_running_blocks(w, self.block_size, 1):
                grows += 1
        return self.full_groups + grows


def scheduler_config(plan, **overrides) -> SchedulerConfig:
    """The simulated engine of a deployment: its KV pool (usable blocks, block size, groups) and batch
    limits, all from ``plan`` (:class:`servebook.plan.Plan`, the one description of a deployment).

    ``overrides`` replace fields (e.g. ``enable_prefix_caching``, ``max_model_len``, ``policy``).
    Prefix caching is off for sliding-window models (not simulated there).
    """
    full, windows = plan.pool_groups()
    fields = dict(num_blocks=plan.usable_blocks, block_size=plan.tokens_per_block, max_num_seqs=plan.max_num_seqs,
                  max_num_batched_tokens=plan.max_num_batched_tokens, max_model_len=plan.max_model_len,
                  full_groups=full, sliding_windows=windows)
    fields.update(overrides)
    if fields["sliding_windows"]:
        fields["enable_prefix_caching"] = False
    return SchedulerConfig(**fields)
