"""Scheduler settings, named after the vLLM engine arguments they stand for."""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.vllm_rules import (CUDA_DEFAULT_BLOCK_SIZE, PINNED_VLLM, SMALL_GPU_BATCH_DEFAULTS, rule_release,
                                  sliding_window_hold_tokens,
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
        full_block_sizes, sliding_block_sizes: tokens per block of each group, in the order above,
            where a group's differs from ``block_size`` (vLLM unifies page sizes by giving layers of
            larger heads larger blocks: Gemma 4's full-attention group holds 32 tokens a block beside
            16 in its sliding groups); each a multiple of ``block_size``. Empty: ``block_size`` for all.
        vllm_version: the release whose scheduler rules apply where releases differ (the long-prefill
            cap on a lone request: :func:`servebook.vllm_rules.effective_long_prefill_threshold`);
            default the pinned release, a deployment's from its plan.

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
    full_block_sizes: tuple[int, ...] = ()
    sliding_block_sizes: tuple[int, ...] = ()
    vllm_version: str = PINNED_VLLM

    def __post_init__(self) -> None:
        rule_release(self.vllm_version)
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
        for name, sizes, count in (("full_block_sizes", self.full_block_sizes, self.full_groups),
                                   ("sliding_block_sizes", self.sliding_block_sizes, len(self.sliding_windows))):
            if sizes and (len(sizes) != count or any(b < 1 or b % self.block_size for b in sizes)):
                raise ServebookError(f"{name} {sizes} must give one block size per group ({count}), each a multiple "
                                     f"of block_size {self.block_size}")
        if self.grouped and self.policy != "paged":
            raise ServebookError(f"policy {self.policy!r} reserves contiguous memory per request and does not model "
                                 "sliding-window groups; use policy 'paged' for a sliding-window model")
        if self.grouped and self.enable_prefix_caching:
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
        """Whether blocks are counted per KV group (sliding-window groups, or groups whose block size is
        not the pool's), not one per ``block_size`` tokens."""
        return bool(self.sliding_windows) or any(b != self.block_size for b in self.full_block_sizes)

    def _full_sizes(self) -> tuple[int, ...]:
        return self.full_block_sizes or (self.block_size,) * self.full_groups

    def _sliding_sizes(self) -> tuple[int, ...]:
        return self.sliding_block_sizes or (self.block_size,) * len(self.sliding_windows)

    def running_blocks(self, end_tokens: int, new_tokens: int) -> int:
        """Block ids one request holds once ``end_tokens`` tokens have slots, ``new_tokens`` of them
        scheduled in this step: ``cdiv(end, group block size)`` per full group, and per sliding group the
        smaller of that and :func:`~servebook.vllm_rules.sliding_window_running_blocks` (``new_tokens``
        unsettled). The classic pool (one full group) is ``cdiv(end, block_size)``."""
        total = 0
        for b in self._full_sizes():
            total += -(-end_tokens // b)
        for w, b in zip(self.sliding_windows, self._sliding_sizes()):
            own = -(-end_tokens // b)
            cap = sliding_window_running_blocks(w, b, max(new_tokens, 1))
            total += own if own < cap else cap
        return total

    def admission_blocks(self, prompt_tokens: int) -> int:
        """Free block ids a waiting request of ``prompt_tokens`` needs to be admitted: its whole prompt
        in every group, a sliding group capped at its admission bound (``window - 1`` plus the step's
        tokens in flight, :func:`~servebook.vllm_rules.sliding_window_hold_tokens`, plus one block)."""
        total = 0
        for b in self._full_sizes():
            total += -(-prompt_tokens // b)
        for w, b in zip(self.sliding_windows, self._sliding_sizes()):
            own = -(-prompt_tokens // b)
            held = min(sliding_window_hold_tokens(w, self.max_num_batched_tokens), self.max_model_len)
            cap = -(-held // b) + 1
            total += own if own < cap else cap
        return total

    def decode_block_increment(self, block_index: int) -> int:
        """Block ids a plain decoder takes when its context enters token block ``block_index`` (1-based,
        in ``block_size`` tokens): what :meth:`running_blocks` of a decode step gains at that token, one
        per full group whose own block starts there, and per sliding group whose hold still grows."""
        first = (block_index - 1) * self.block_size + 1
        return self.running_blocks(first, 1) - self.running_blocks(first - 1, 1)


def scheduler_config(plan, **overrides) -> SchedulerConfig:
    """The simulated engine of a deployment: its KV pool (usable blocks, block size, groups) and batch
    limits, all from ``plan`` (:class:`servebook.plan.Plan`, the one description of a deployment).

    ``overrides`` replace fields (e.g. ``enable_prefix_caching``, ``max_model_len``, ``policy``).
    Prefix caching is off for sliding-window models (not simulated there).
    """
    full, sliding = plan.pool_groups()
    block = plan.tokens_per_block
    fields = dict(num_blocks=plan.usable_blocks, block_size=block, max_num_seqs=plan.max_num_seqs,
                  max_num_batched_tokens=plan.max_num_batched_tokens, max_model_len=plan.max_model_len,
                  full_groups=len(full), sliding_windows=tuple(w for w, _ in sliding),
                  full_block_sizes=full if any(b != block for b in full) else (),
                  sliding_block_sizes=tuple(b for _, b in sliding) if any(b != block for _, b in sliding) else (),
                  vllm_version=plan.vllm_version)
    fields.update(overrides)
    if fields["sliding_windows"] or fields["full_block_sizes"] or fields["sliding_block_sizes"]:
        fields["enable_prefix_caching"] = False
    return SchedulerConfig(**fields)
