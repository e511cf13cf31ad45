"""KV-cache pages, blocks and capacity, computed the way vLLM 0.27.1 does.

The engine turns "bytes left for the KV cache" into a number of blocks and
prints two lines at start-up::

    GPU KV cache size: 682,625 tokens
    Maximum concurrency for 2,000 tokens per request: 341.31x

This module reproduces that arithmetic from a :class:`~servebook.model_spec.ModelSpec`.
Every rule below mirrors a function of the pinned release (file and function
named in each docstring; paths are relative to the ``vllm`` package). The
arithmetic is integer and exact: given the engine's own available-memory
figure, :func:`capacity` gives the engine's block count, token count and
concurrency, not an approximation of them.

The steps, in the order the engine takes them:

1. One cache spec per decoder layer that owns a cache
   (``Attention.get_kv_cache_spec`` in
   ``model_executor/layers/attention/attention.py``):

   * full attention: page = ``block_size x kv_heads x (head_dim + v_head_dim) x dtype bytes``
     (``FullAttentionSpec.real_page_size_bytes``, ``v1/kv_cache_interface.py``);
   * sliding window: the same page formula, but the layer picks the *smallest
     kernel block size* of its backend (16 for FLASH_ATTN, TRITON_ATTN and
     CPU_ATTN), not ``--block-size`` (``_largest_kernel_block_within``);
   * MLA: one latent of ``kv_lora_rank + qk_rope_head_dim`` per token, no K/V
     split and a single "head" (``MLAAttentionSpec.real_page_size_bytes``).

   KV heads per GPU are ``max(1, kv_heads // tp)``: sharded, or replicated when
   ``tp`` exceeds the KV heads (``ModelConfig.get_num_kv_heads`` in
   ``config/model.py``). MLA keeps one latent per token on every rank.
   The defaults and rules named here live in :mod:`servebook.vllm_rules`.
2. Page sizes are unified by enlarging the block size of layers with smaller
   pages (``unify_kv_cache_spec_page_size``, ``v1/core/kv_cache_utils.py``); a page
   the largest is not a whole multiple of is padded to it from 0.32.0 on and
   refused in 0.26.0 (:func:`servebook.vllm_rules.pads_undivided_pages`).
3. Layers are grouped (``get_kv_cache_groups``): identical specs form one
   group; otherwise layers of each kind are split into groups of equal size,
   padding the last group of a kind and warning
   ``Add N padding layers, may waste at most P% KV cache memory``
   (``_get_kv_cache_groups_uniform_page_size``).
4. ``num_blocks = available // page_size // group_size``
   (``get_num_blocks`` via ``get_kv_cache_config_from_groups``).
5. A request of ``max_model_len`` tokens needs, summed over groups, the blocks
   its spec can hold at most (``get_max_concurrency_for_kv_cache_config``):
   ``cdiv(max_model_len, block_size)`` for full attention and MLA, and
   ``cdiv(min(window - 1 + in_flight, max_model_len), block_size) + 1`` for
   sliding windows, where ``in_flight = max_concurrent_batches x
   max_num_batched_tokens`` (2 batches with async scheduling, else 1;
   ``VllmConfig.max_in_flight_tokens`` in ``config/vllm.py`` and
   ``SlidingWindowSpec.max_admission_blocks_per_request``).
6. ``max_concurrency = num_blocks / blocks_per_request`` and the logged
   ``GPU KV cache size`` is ``int(max_concurrency x max_model_len)``
   (``get_kv_cache_capacity``). For a pure full-attention model this is close
   to ``num_blocks x block_size``; for hybrid or sliding-window models it is the
   context the pool serves at peak, not the number of physical token slots.
7. That concurrency is an *admission* bound. While requests run, sliding-window
   groups free the blocks that left the window (``remove_skipped_blocks``), so
   each holds about ``window / block_size + 1`` blocks per request, not its
   booked ``window - 1 + in-flight`` tokens: :func:`running_concurrency` gives
   how many requests of a given length actually run at once (several times the
   logged figure for Gemma-style hybrids; the same for full attention).

vLLM 0.26.0 computes the same numbers (its ``get_max_concurrency_for_kv_cache_config``
divides summed bytes by the page size; each group's maximum is a whole number
of pages, so the quotient is identical).

Units: ``*_bytes`` are bytes, ``*_tokens`` tokens; all figures are per GPU
(per tensor-parallel rank) unless a name says otherwise.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from servebook.errors import DoesNotFitError, ServebookError
from servebook.model_spec import AttentionLayer, ModelSpec
from servebook.reductions import dot

from servebook.vllm_rules.cache import (
    Device,
    check_block_size,
    default_block_size,
    kv_dtype_bytes,
    pads_undivided_pages,
    sliding_block_size,
    sliding_window_hold_tokens,
    sliding_window_running_blocks,
)
from servebook.vllm_rules.parallel import check_tp, kv_heads_per_gpu
from servebook.vllm_rules.release import rule_release
from servebook.vllm_rules.scheduler import decode_unsettled_tokens, default_async_scheduling, in_flight_tokens


@dataclass(frozen=True)
class LayerCacheSpec:
    """The cache of one decoder layer on one GPU, as vLLM specifies it.

    Attributes:
        layer_index: decoder layer (0-based).
        kind: ``"full"``, ``"sliding"`` or ``"mla"``.
        block_size: tokens per block for this layer (after page unification).
        kv_heads: KV heads stored on this GPU (1 for MLA).
        head_dim: K head size (MLA: latent width) in elements.
        v_head_dim: V head size in elements (0 for MLA: no separate V).
        dtype_bytes: bytes per cached element.
        sliding_window: window in tokens for sliding layers, else None.
        page_size_padded: bytes of one block when page unification padded it to the largest page
            (:func:`servebook.vllm_rules.pads_undivided_pages`), else None.
    """

    layer_index: int
    kind: str
    block_size: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    dtype_bytes: int
    sliding_window: int | None = None
    page_size_padded: int | None = None

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this layer on this GPU."""
        return self.kv_heads * (self.head_dim + self.v_head_dim) * self.dtype_bytes

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block of this layer (``*Spec.page_size_bytes``; the padded page when padded)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.block_size * self.bytes_per_token

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens may hold in this layer.

        Full/MLA: ``FullAttentionSpec.max_memory_usage_bytes`` / page.
        Sliding: ``SlidingWindowSpec.max_admission_blocks_per_request``: the last
        ``window - 1`` tokens plus everything still in flight, capped at the
        context, plus one block because the window need not start on a block
        boundary.
        """
        if self.kind == "sliding":
            assert self.sliding_window is not None
            held = min(sliding_window_hold_tokens(self.sliding_window, in_flight_tokens), max_model_len)
            return _cdiv(held, self.block_size) + 1
        return _cdiv(max_model_len, self.block_size)

    def running_blocks(self, request_tokens: int, unsettled_tokens: int) -> int:
        """Most blocks one running request of ``request_tokens`` tokens holds in this layer.

        Full/MLA: every token stays, ``cdiv(request_tokens, block_size)``. Sliding: blocks
        that left the window are freed (:func:`~servebook.vllm_rules.cache.sliding_window_running_blocks`),
        so at most ``cdiv(window + unsettled - 2, block_size) + 1``, and never more than
        the request's own ``cdiv(request_tokens, block_size)``.
        """
        own = _cdiv(request_tokens, self.block_size)
        if self.kind == "sliding":
            assert self.sliding_window is not None
            return min(own, sliding_window_running_blocks(self.sliding_window, self.block_size, unsettled_tokens))
        return own

    def _key(self) -> tuple:
        """Everything that makes two layer specs equal in vLLM (not the index)."""
        return (
            self.kind,
            self.block_size,
            self.kv_heads,
            self.head_dim,
            self.v_head_dim,
            self.dtype_bytes,
            self.sliding_window,
            self.page_size_padded,
        )


@dataclass(frozen=True)
class CacheGroup:
    """A KV cache group: layers sharing one block table.

    Attributes:
        kind: attention kind of every layer in the group.
        layer_indices: the real decoder layers in the group.
        num_padding_layers: empty slots added so every group has
            ``group_size`` layers (vLLM's padding layers).
        spec: the (shared) cache spec of the group's layers.
    """

    kind: str
    layer_indices: tuple[int, ...]
    num_padding_layers: int
    spec: LayerCacheSpec


class PaddingSummary:
    """Totals of vLLM's ``Add N padding layers, may waste at most P% KV cache memory`` warnings.

    For a class with ``padding_warnings``: ``(padding layers, waste %)`` per warning, as
    predicted (:class:`KVCacheLayout`) or as logged (:class:`servebook.startup_log.StartupLog`).
    """

    padding_warnings: tuple[tuple[int, float], ...]

    @property
    def padding_layers(self) -> int:
        """Padding layers added in total (0 when the warning is not printed)."""
        return sum(n for n, _ in self.padding_warnings)

    @property
    def padding_waste_pct(self) -> float:
        """The largest "may waste at most P%" figure the engine warns about (0.0 if none)."""
        return max((p for _, p in self.padding_warnings), default=0.0)


@dataclass(frozen=True)
class KVCacheLayout(PaddingSummary):
    """How vLLM lays out the KV cache of a model on one GPU.

    Attributes:
        layers: one spec per cache-owning decoder layer (after unification).
        groups: the KV cache groups.
        group_size: layers per group; the number of shared cache tensors.
        page_size_bytes: bytes of one block of one layer (uniform after
            unification), or for the single-group mixed-shape case the sum of
            all layers' pages.
        uniform_type: True for vLLM's ``UniformTypeKVCacheSpecs`` case (all
            layers need the same slots but have different shapes); blocks then
            cost the sum of every layer's page.
        padding_warnings: ``(padding layers, waste %)`` per attention kind that
            needed padding, as the engine's warning prints them.
        tp: tensor-parallel size the layout is for.
        kv_cache_dtype: the ``--kv-cache-dtype`` value.
    """

    layers: tuple[LayerCacheSpec, ...]
    groups: tuple[CacheGroup, ...]
    group_size: int
    page_size_bytes: int
    uniform_type: bool
    padding_warnings: tuple[tuple[int, float], ...]
    tp: int
    kv_cache_dtype: str

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across all shared tensors (the divisor of ``num_blocks``)."""
        if self.uniform_type:
            return self.page_size_bytes
        return self.page_size_bytes * self.group_size

    @property
    def block_size(self) -> int:
        """The engine's block size after grouping: the smallest group block size.

        ``EngineCore._initialize_kv_caches`` sets ``cache_config.block_size`` to
        this (``v1/engine/core.py``).
        """
        return min(g.spec.block_size for g in self.groups)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token occupies on one GPU summed over cache-owning layers.

        This is the full-context figure: it ignores what sliding windows save
        and what padding wastes; :func:`capacity` accounts for both.
        """
        return sum(layer.bytes_per_token for layer in self.layers)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """Block ids one request of ``max_model_len`` tokens may hold, all groups together."""
        if self.uniform_type:
            return max(l.blocks_per_request(max_model_len, in_flight_tokens) for l in self.layers)
        return sum(g.spec.blocks_per_request(max_model_len, in_flight_tokens) for g in self.groups)

    def admission_blocks(self, prompt_tokens: int, max_model_len: int, in_flight_tokens: int) -> int:
        """Free block ids admitting a request of ``prompt_tokens`` needs, all groups together.

        ``full_sequence_must_fit`` (vLLM's default ``scheduler_reserve_full_isl``): blocks for the
        whole prompt in every group, a sliding group capped at its admission bound
        (:meth:`LayerCacheSpec.blocks_per_request`): its prefill has not yet freed anything.
        """
        def group(spec: LayerCacheSpec) -> int:
            return min(_cdiv(prompt_tokens, spec.block_size), spec.blocks_per_request(max_model_len, in_flight_tokens))

        if self.uniform_type:
            return max(group(l) for l in self.layers)
        return sum(group(g.spec) for g in self.groups)

    def running_blocks_per_request(self, request_tokens: int, unsettled_tokens: int) -> int:
        """Block ids one running request of ``request_tokens`` tokens holds at most, all groups together.

        The run-time counterpart of :meth:`blocks_per_request` (same grouping; each group's
        hold from :meth:`LayerCacheSpec.running_blocks`).
        """
        if self.uniform_type:
            return max(l.running_blocks(request_tokens, unsettled_tokens) for l in self.layers)
        return sum(g.spec.running_blocks(request_tokens, unsettled_tokens) for g in self.groups)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _layer_spec(
    index: int, layer: AttentionLayer, *, block_size: int, dtype_bytes: int, tp: int, sliding_block: int
) -> LayerCacheSpec:
    if layer.kind == "mla":
        # MLAAttentionSpec: one latent, no V, one "head"; replicated on every rank.
        return LayerCacheSpec(index, "mla", block_size, 1, layer.head_dim, 0, dtype_bytes)
    kv_heads = kv_heads_per_gpu(layer, tp)
    # vLLM caches a V slot even when a model shares K and V (Gemma 4 global
    # layers load K weights into both slots), so v_head_dim 0 means "same as K".
    v_dim = layer.v_head_dim or layer.head_dim
    if layer.kind == "sliding":
        if not layer.sliding_window or layer.sliding_window < 1:
            raise ServebookError(
                f"layer {index} is 'sliding' but has no positive sliding_window; fix the config"
            )
        return LayerCacheSpec(
            index, "sliding", sliding_block, kv_heads, layer.head_dim, v_dim,
            dtype_bytes, layer.sliding_window,
        )
    if layer.kind == "full":
        return LayerCacheSpec(index, "full", block_size, kv_heads, layer.head_dim, v_dim, dtype_bytes)
    raise ServebookError(f"layer {index} has unknown attention kind {layer.kind!r}")


def _unify_page_sizes(layers: Sequence[LayerCacheSpec], vllm_version: str | None = None) -> list[LayerCacheSpec]:
    """``unify_kv_cache_spec_page_size``: scale smaller pages up by whole ratios; where the ratio is not
    whole, pad the page to the largest (0.32.0 on, non-MLA: :func:`servebook.vllm_rules.pads_undivided_pages`)."""
    pages = {l.page_size_bytes for l in layers}
    if len(pages) <= 1:
        return list(layers)
    largest = max(pages)
    out = []
    for l in layers:
        if l.page_size_bytes == largest:
            out.append(l)
        elif largest % l.page_size_bytes == 0:
            ratio = largest // l.page_size_bytes
            out.append(_replace_block_size(l, l.block_size * ratio))
        elif l.kind != "mla" and pads_undivided_pages(vllm_version):
            out.append(replace(l, page_size_padded=largest))
        else:
            release = rule_release(vllm_version)
            why = ("vLLM pads no MLA page" if l.kind == "mla" else
                   f"vLLM {release} pads such a page only on a num-blocks-first backend, not FLASH_ATTN")
            raise ServebookError(
                f"layer {l.layer_index}: its KV page ({l.page_size_bytes} bytes) does not divide "
                f"the largest page ({largest} bytes) and {why}: the engine cannot start; try another "
                "--block-size or --kv-cache-dtype"
            )
    return out


def _replace_block_size(l: LayerCacheSpec, block_size: int) -> LayerCacheSpec:
    return LayerCacheSpec(
        l.layer_index, l.kind, block_size, l.kv_heads, l.head_dim, l.v_head_dim,
        l.dtype_bytes, l.sliding_window,
    )


def layer_cache_specs(
    spec: ModelSpec,
    *,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    device: Device = "cuda",
    vllm_version: str | None = None,
) -> list[LayerCacheSpec]:
    """Per-layer cache specs on one GPU, before page unification and grouping.

    What each attention layer's ``get_kv_cache_spec`` returns
    (``model_executor/layers/attention/attention.py``; MLA layers in
    ``mla_attention.py``): layers that reuse another layer's cache are left out. Sliding-window
    layers get :func:`servebook.vllm_rules.sliding_block_size` for ``vllm_version``
    (None: the pinned release), the one rule here that differs between releases.
    """
    bs = default_block_size(device) if block_size is None else block_size
    check_block_size(bs)
    check_tp(spec, tp)
    dtype_bytes = kv_dtype_bytes(kv_cache_dtype)
    sliding_block = sliding_block_size(bs, device, vllm_version)
    layers = [
        _layer_spec(i, layer, block_size=bs, dtype_bytes=dtype_bytes, tp=tp, sliding_block=sliding_block)
        for i, layer in enumerate(spec.layers)
        if layer.owns_cache
    ]
    if not layers:
        raise ServebookError(f"{spec.name} has no layer that owns a KV cache; nothing to size")
    return layers


def kv_cache_layout(
    spec: ModelSpec,
    *,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    device: Device = "cuda",
    vllm_version: str | None = None,
) -> KVCacheLayout:
    """Group a model's layers into KV cache groups as vLLM does.

    Args:
        spec: the model.
        block_size: ``--block-size`` in tokens; None for the device default
            (:func:`default_block_size`).
        kv_cache_dtype: ``--kv-cache-dtype`` (``"auto"``, ``"fp8"``, ...).
        tp: tensor-parallel size (KV heads per GPU = ``max(1, heads // tp)``).
        device: ``"cuda"`` or ``"cpu"`` (the default block size and the kernel's block multiple differ).
        vllm_version: the release whose rules apply (None: the pinned release; see
            :func:`servebook.vllm_rules.sliding_block_size`).

    Mirrors ``get_kv_cache_groups`` (``v1/core/kv_cache_utils.py``): the
    uniform case (every layer identical) gives one group of all layers; the
    same-slots case (all full attention, shapes differ) gives one group whose
    block costs the sum of pages (``UniformTypeKVCacheSpecs``); otherwise pages
    are unified and layers split into equal-size groups with padding
    (``_get_kv_cache_groups_uniform_page_size``).
    """
    layers = layer_cache_specs(spec, block_size=block_size, kv_cache_dtype=kv_cache_dtype, tp=tp, device=device,
                               vllm_version=vllm_version)
    common = dict(tp=tp, kv_cache_dtype=kv_cache_dtype)
    # 1. Every layer identical (is_kv_cache_spec_uniform): one group.
    if len({l._key() for l in layers}) == 1:
        group = CacheGroup(layers[0].kind, tuple(l.layer_index for l in layers), 0, layers[0])
        return KVCacheLayout(
            tuple(layers), (group,), len(layers), layers[0].page_size_bytes, False, (), **common
        )
    # 2. Same kind and block size, shapes differ (UniformTypeKVCacheSpecs.from_specs):
    #    all full-attention-like layers, or all sliding layers with one window.
    kinds = {("full" if l.kind in ("full", "mla") else l.kind, l.sliding_window) for l in layers}
    if len(kinds) == 1 and len({l.block_size for l in layers}) == 1:
        group = CacheGroup(layers[0].kind, tuple(l.layer_index for l in layers), 0, layers[0])
        page_sum = sum(l.page_size_bytes for l in layers)
        return KVCacheLayout(tuple(layers), (group,), 1, page_sum, True, (), **common)
    # 3. Hybrid: unify pages, bucket identical specs, split into equal groups.
    layers = _unify_page_sizes(layers, vllm_version)
    buckets: dict[tuple, list[LayerCacheSpec]] = {}
    for l in layers:
        buckets.setdefault(l._key(), []).append(l)
    sizes = [len(b) for b in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * 1.5:
        group_size = max(sizes)
    groups: list[CacheGroup] = []
    warnings: list[tuple[int, float]] = []
    for members in buckets.values():
        padding = group_size - len(members) % group_size
        if padding != group_size:
            warnings.append((padding, round(padding / len(members) * 100, 2)))
        n_groups = _cdiv(len(members), group_size)
        for i in range(n_groups):
            chunk = members[i::n_groups]
            groups.append(
                CacheGroup(
                    chunk[0].kind,
                    tuple(l.layer_index for l in chunk),
                    group_size - len(chunk),
                    chunk[0],
                )
            )
    return KVCacheLayout(
        tuple(layers), tuple(groups), group_size, layers[0].page_size_bytes, False,
        tuple(warnings), **common,
    )


@dataclass(frozen=True)
class Capacity:
    """What the engine logs about its KV cache, predicted.

    Attributes:
        num_gpu_blocks: block ids in the pool (per GPU; all ranks agree).
        kv_cache_tokens: the ``GPU KV cache size: N tokens`` figure,
            ``int(max_concurrency x max_model_len)``.
        max_concurrency: the ``Maximum concurrency for M tokens per request``
            figure (unrounded; the log shows two decimals).
        blocks_per_request: block ids one ``max_model_len`` request may hold.
        max_model_len: context length the figures are for, tokens.
        in_flight_tokens: tokens the engine reserves as in flight for sliding
            windows (``max_concurrent_batches x max_num_batched_tokens``).
        available_kv_bytes: the budget the blocks were carved from, bytes per GPU.
        layout: the grouping behind the numbers.
        async_scheduling: whether the engine schedules asynchronously (two batches in flight).
    """

    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    blocks_per_request: int
    max_model_len: int
    in_flight_tokens: int
    available_kv_bytes: int
    layout: KVCacheLayout
    async_scheduling: bool = False

    @property
    def padding_layers(self) -> int:
        """Padding layers vLLM adds (see :attr:`KVCacheLayout.padding_layers`)."""
        return self.layout.padding_layers

    @property
    def padding_waste_pct(self) -> float:
        """Worst-case padding waste the engine warns about, percent."""
        return self.layout.padding_waste_pct

    @property
    def block_size(self) -> int:
        """Engine block size after grouping, tokens."""
        return self.layout.block_size

    @property
    def used_kv_bytes(self) -> int:
        """Bytes the allocated blocks occupy (at most ``available_kv_bytes``)."""
        return self.num_gpu_blocks * self.layout.bytes_per_block


#: Blocks of the pool no request ever holds: ``BlockPool.__init__`` takes the first free block
#: as its ``null_block`` (``v1/core/block_pool.py``).
NULL_BLOCKS = 1


def usable_kv_blocks(num_gpu_blocks: int) -> int:
    """Blocks requests can hold out of the engine's ``num_gpu_blocks``: all but the null block.

    The scheduler simulator's ``num_blocks``; a pool of ``n`` usable blocks is
    ``num_gpu_blocks = n + NULL_BLOCKS``.
    """
    if not isinstance(num_gpu_blocks, int) or num_gpu_blocks <= NULL_BLOCKS:
        raise ServebookError(f"num_gpu_blocks {num_gpu_blocks!r} leaves no block for requests after vLLM's "
                             f"null block; use at least {NULL_BLOCKS + 1}")
    return num_gpu_blocks - NULL_BLOCKS


def requests_that_fit(blocks: int, tokens_per_request: int, block_size: int) -> int:
    """Requests of ``tokens_per_request`` tokens whose blocks are all resident in ``blocks`` at once.

    Each holds ``cdiv(tokens_per_request, block_size)`` blocks (a partly filled last block is
    still a whole block); ``blocks // that`` of them fit. Above this many running requests a
    full-attention pool must preempt before they all finish.
    """
    for name, value in (("blocks", blocks), ("tokens_per_request", tokens_per_request), ("block_size", block_size)):
        if not isinstance(value, int) or value < 1:
            raise ServebookError(f"{name} {value!r} is not allowed; blocks, tokens per request and block size "
                                 "must be integers >= 1")
    return blocks // _cdiv(tokens_per_request, block_size)


def min_kv_bytes_for_one_request(layout: KVCacheLayout, max_model_len: int, in_flight_tokens: int) -> int:
    """KV bytes per GPU needed to admit one request of ``max_model_len`` tokens.

    Mirrors ``_max_memory_usage_bytes_from_groups`` (``v1/core/kv_cache_utils.py``),
    which the engine checks before allocating and which counts padding slots.
    """
    if layout.uniform_type:
        return sum(
            l.blocks_per_request(max_model_len, in_flight_tokens) * l.page_size_bytes
            for l in layout.layers
        )
    return layout.bytes_per_block * layout.blocks_per_request(max_model_len, in_flight_tokens)


def max_model_len_that_fits(layout: KVCacheLayout, available_kv_bytes: int, in_flight_tokens: int, upper: int) -> int:
    """Longest context (<= ``upper``) whose one request fits; 0 if none.

    The binary search of ``_estimate_max_model_len_from_groups``.
    """
    lo, hi, best = 1, upper, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if min_kv_bytes_for_one_request(layout, mid, in_flight_tokens) <= available_kv_bytes:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def capacity(
    spec: ModelSpec,
    available_kv_bytes: int,
    *,
    max_model_len: int,
    max_num_batched_tokens: int,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    tp: int = 1,
    device: Device = "cuda",
    async_scheduling: bool | None = None,
    vllm_version: str | None = None,
) -> Capacity:
    """Blocks, logged KV cache tokens and concurrency for a KV budget.

    Args:
        spec: the model.
        available_kv_bytes: bytes per GPU left for the KV cache (the engine's
            ``Available KV cache memory``, or on CPU ``VLLM_CPU_KVCACHE_SPACE`` GiB).
        max_model_len: ``--max-model-len`` in tokens.
        max_num_batched_tokens: ``--max-num-batched-tokens`` (tokens per step).
        block_size: ``--block-size``; None for the device default.
        kv_cache_dtype: ``--kv-cache-dtype``.
        tp: tensor-parallel size.
        device: ``"cuda"`` or ``"cpu"``.
        async_scheduling: None for vLLM's default (on for CUDA, off on CPU);
            it doubles the in-flight tokens a sliding window reserves.
        vllm_version: the release whose rules apply (None: the pinned release).

    Raises:
        DoesNotFitError: when the budget cannot hold one ``max_model_len``
            request (the engine refuses to start; the message gives the longest
            context that fits, as the engine's does).
        ServebookError: for out-of-range arguments.
    """
    for name, value in (("max_model_len", max_model_len), ("max_num_batched_tokens", max_num_batched_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ServebookError(f"{name} {value!r} is not allowed; use a positive number of tokens")
    if available_kv_bytes is None or available_kv_bytes <= 0:
        raise DoesNotFitError(
            "no memory is left for the KV cache; raise --gpu-memory-utilization, use more "
            "GPUs (--tp) or a smaller model"
        )
    layout = kv_cache_layout(spec, block_size=block_size, kv_cache_dtype=kv_cache_dtype, tp=tp, device=device,
                             vllm_version=vllm_version)
    if async_scheduling is None:
        async_scheduling = default_async_scheduling(device)
    in_flight = in_flight_tokens(max_num_batched_tokens, async_scheduling)
    available = int(available_kv_bytes)
    needed = min_kv_bytes_for_one_request(layout, max_model_len, in_flight)
    if needed > available:
        longest = max_model_len_that_fits(layout, available, in_flight, max_model_len)
        hint = f"; the longest context that fits is {longest} tokens" if longest else ""
        error = DoesNotFitError(
            f"one request of {max_model_len} tokens needs {needed / 2**30:.2f} GiB of KV cache "
            f"per GPU but only {available / 2**30:.2f} GiB is available{hint}. Lower "
            "--max-model-len, raise --gpu-memory-utilization, use --kv-cache-dtype fp8 or more GPUs (--tp)"
        )
        error.longest_context_tokens = longest  # what a caller may retry with (0: none)
        raise error
    num_blocks = available // layout.bytes_per_block
    per_request = layout.blocks_per_request(max_model_len, in_flight)
    concurrency = num_blocks / per_request
    return Capacity(
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=int(concurrency * max_model_len),
        max_concurrency=concurrency,
        blocks_per_request=per_request,
        max_model_len=max_model_len,
        in_flight_tokens=in_flight,
        available_kv_bytes=available,
        layout=layout,
        async_scheduling=async_scheduling,
    )


@dataclass(frozen=True)
class RunningConcurrency:
    """How many requests of one length the KV pool keeps running at once (the run-time figure).

    Attributes:
        request_tokens: tokens per request (prompt + output), the length the figure is for.
        blocks_per_request: block ids one such request holds at most while it runs, all
            groups together (:meth:`KVCacheLayout.running_blocks_per_request`).
        usable_blocks: blocks requests can hold (:func:`usable_kv_blocks`).
        unsettled_tokens: tokens per request past its processed prefix at a decode step
            (:func:`~servebook.vllm_rules.scheduler.decode_unsettled_tokens`).
        max_running: ``usable_blocks // blocks_per_request``: requests that run together
            without preemption, all at their longest.
        admission_blocks: free block ids admitting one such request needs
            (:meth:`KVCacheLayout.admission_blocks`); above ``blocks_per_request`` only for
            sliding-window models, where it costs a request or a few (see below).
    """

    request_tokens: int
    blocks_per_request: int
    usable_blocks: int
    unsettled_tokens: int
    max_running: int
    admission_blocks: int = 0


def running_concurrency(cap: Capacity, request_tokens: int, prompt_tokens: int | None = None) -> RunningConcurrency:
    """Requests of ``request_tokens`` tokens that can run at once in ``cap``'s pool (run-time figure).

    The start-up log's ``Maximum concurrency`` (:attr:`Capacity.max_concurrency`) is an
    admission bound: it books every sliding-window group at ``min(window - 1 + in-flight
    tokens, max_model_len)`` (``SlidingWindowSpec.max_admission_blocks_per_request``,
    ``get_max_concurrency_for_kv_cache_config`` in ``v1/core/kv_cache_utils.py``). While a
    request runs, ``SlidingWindowManager.remove_skipped_blocks``
    (``v1/core/single_type_kv_cache_manager.py``) frees the blocks that left the window, so
    a sliding group holds about ``window / block_size + 1`` blocks
    (:meth:`KVCacheLayout.running_blocks_per_request`) while full-attention groups hold
    ``cdiv(tokens, block_size)``. This counts a request at its longest (its last decode step).

    Two things the figure leaves out, both of which make the measured peak a little lower:
    admitting a new request needs free blocks for its whole prompt (``prompt_tokens``, default
    ``request_tokens``; reported as ``admission_blocks``) in every group, sliding ones included,
    capped at the admission bound (``KVCacheManager.allocate_slots`` with
    ``full_sequence_must_fit``, the default ``scheduler_reserve_full_isl``), and a prefill chunk
    holds ``window + chunk`` tokens' blocks until the step is processed. Both are in the
    scheduler simulator (:func:`servebook.simulator.config.scheduler_config`). On the H200, Gemma 3
    27B ran the figure or one fewer (labs/results, issue 20's records). For a pure
    full-attention model the two figures agree at ``max_model_len`` up to the null block.

    Raises:
        ServebookError: ``request_tokens`` not in ``[1, max_model_len]``.
        DoesNotFitError: not one such request fits the pool.
    """
    if isinstance(request_tokens, bool) or not isinstance(request_tokens, int) or request_tokens < 1:
        raise ServebookError(f"request tokens {request_tokens!r} is not allowed; use a positive number of "
                             "tokens (prompt + output)")
    if request_tokens > cap.max_model_len:
        raise ServebookError(f"request tokens {request_tokens} exceed max_model_len {cap.max_model_len}: vLLM "
                             f"rejects such a request; use at most {cap.max_model_len} or raise --max-model-len")
    prompt = request_tokens if prompt_tokens is None else prompt_tokens
    if isinstance(prompt, bool) or not isinstance(prompt, int) or not 1 <= prompt <= request_tokens:
        raise ServebookError(f"prompt tokens {prompt!r} is not allowed; use a number of tokens in [1, "
                             f"{request_tokens}] (the request's prompt, at most its prompt + output)")
    unsettled = decode_unsettled_tokens(cap.async_scheduling)
    per_request = cap.layout.running_blocks_per_request(request_tokens, unsettled)
    usable = usable_kv_blocks(cap.num_gpu_blocks)
    admission = cap.layout.admission_blocks(prompt, cap.max_model_len, cap.in_flight_tokens)
    running = usable // per_request
    if running < 1:
        error = DoesNotFitError(f"one running request of {request_tokens} tokens holds {per_request} blocks but the "
                                f"pool has {usable}; shorten the requests or give the KV cache more memory")
        lo, hi = 0, request_tokens - 1  # the longest request that does run, for a caller to retry with
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cap.layout.running_blocks_per_request(mid, unsettled) <= usable:
                lo = mid
            else:
                hi = mid - 1
        error.longest_context_tokens = lo
        raise error
    return RunningConcurrency(request_tokens=request_tokens, blocks_per_request=per_request, usable_blocks=usable,
                              unsettled_tokens=unsettled, max_running=running, admission_blocks=admission)


def _bytes_per_token_by_window(layout: KVCacheLayout) -> dict:
    """``{window or None: bytes per token}`` over the layout's cache-owning layers, in layer order
    (None: full attention and MLA). Bytes per token per GPU."""
    per_group: dict = {}
    for layer in layout.layers:
        per_group[layer.sliding_window] = per_group.get(layer.sliding_window, 0) + layer.bytes_per_token
    return per_group


def _sliding_running_hold_tokens(layout: KVCacheLayout, window: int, unsettled_tokens: int) -> int:
    """Token slots a sliding layer of ``window`` holds for one running request: the run-time rule
    (:func:`~servebook.vllm_rules.sliding_window_running_blocks`) in whole blocks."""
    block = next(l.block_size for l in layout.layers if l.sliding_window == window)
    return sliding_window_running_blocks(window, block, unsettled_tokens) * block


def mean_running_bytes(layout: KVCacheLayout, contexts: Sequence[float], weights: Sequence[float], *,
                       unsettled_tokens: int) -> float:
    """KV bytes per GPU one running request holds on average over a length distribution.

    ``contexts``: tokens in a running request's cache at sample moments, ``weights`` their time
    weights (summing to 1). Full-attention and MLA layers hold every token; a sliding layer holds
    at most its run-time window (:func:`~servebook.vllm_rules.sliding_window_running_blocks` with
    ``unsettled_tokens``, blocks that left the window being freed). Block rounding of full
    layers is ignored (a time average over a distribution); :func:`running_concurrency` counts
    whole blocks for one length. ``servebook.perf.fleet`` sizes its batch with this.
    """
    total = 0.0
    for window, bytes_per_token in _bytes_per_token_by_window(layout).items():
        if window is None:
            held = contexts
        else:
            cap = float(_sliding_running_hold_tokens(layout, window, unsettled_tokens))
            held = [c if c <= cap else cap for c in contexts]
        total += dot(weights, held) * bytes_per_token
    return total


def admission_bytes(layout: KVCacheLayout, request_tokens: float, *, in_flight_tokens: int) -> float:
    """KV bytes per GPU that admitting one request of ``request_tokens`` may book: every token in
    full-attention layers, ``min(tokens, window - 1 + in-flight tokens)`` in sliding ones (the
    admission bound, :func:`~servebook.vllm_rules.sliding_window_hold_tokens`). No block rounding."""
    total = 0.0
    for window, bytes_per_token in _bytes_per_token_by_window(layout).items():
        held = request_tokens if window is None else min(request_tokens,
                                                          sliding_window_hold_tokens(window, in_flight_tokens))
        total += held * bytes_per_token
    return total
