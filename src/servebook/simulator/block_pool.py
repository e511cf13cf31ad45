"""A paged KV block pool with prefix caching, following vLLM 0.27.1's rules.

Rules mirrored (source: ``vllm/v1/core/block_pool.py`` and
``vllm/v1/core/kv_cache_utils.py`` of vllm 0.27.1):

* Free blocks wait in one queue ordered by eviction priority
  (``FreeKVCacheBlockQueue``); new blocks are taken from its head
  (``BlockPool.get_new_blocks``).
* Only *full* blocks get a hash (``BlockPool.cache_full_blocks``). A block whose
  hash is known stays findable after its request frees it, until the block is
  taken again from the free queue for someone else; then its hash is dropped
  (``_maybe_evict_cached_block``). That is the eviction of the prefix cache.
* A request frees its blocks tail first (``SingleTypeKVCacheManager.free`` passes
  ``reversed(blocks)``). Freed blocks without a hash go to the *front* of the
  queue (evicted first), hashed ones to the back (``BlockPool.free_blocks``), so
  the prefix cache behaves as an LRU list whose oldest, deepest blocks go first.
* A prefix-cache hit on a block that sits in the free queue takes it out of the
  queue and raises its reference count (``BlockPool.touch``); shared blocks have
  ``ref_cnt`` > 1 and return to the queue only when the last user frees them.
* vLLM keeps one extra "null" block out of the pool; ``num_blocks`` here counts
  only the usable blocks (vLLM's ``num_gpu_blocks`` − 1).

Block hashes are chained in vLLM (each includes its parent's hash). Here a block's
key is ``(prefix_id, index)`` when the block lies wholly inside a shared prefix
and ``(request_id, index)`` otherwise, which gives the same equality.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from servebook.errors import ServebookError


class BlockPool:
    """``num_blocks`` KV blocks, a free queue, reference counts and a hash index.

    Args:
        num_blocks: usable blocks (vLLM ``num_gpu_blocks`` − 1).
        enable_caching: keep hashes of full blocks for prefix caching.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ServebookError(f"num_blocks is {num_blocks}; the KV pool needs at least 1 block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_key: list[Hashable | None] = [None] * num_blocks
        self.cached: dict[Hashable, int] = {}
        # Insertion order is eviction order: first key = head of the queue.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.evictions = 0

    # -- queries -------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks in the free queue, including cached blocks nobody uses."""
        return len(self.free_queue)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a findable prefix (reusable on a hit)."""
        return sum(1 for b in self.free_queue if self.block_key[b] is not None)

    def lookup(self, keys: Sequence[Hashable]) -> list[int]:
        """Blocks of the longest run of ``keys`` that are cached, from the first key on."""
        hits = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    # -- mutations -----------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their hashes."""
        if n > len(self.free_queue):
            raise ServebookError(f"asked for {n} blocks with only {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=False)
            key = self.block_key[block]
            if key is not None:
                if self.cached.get(key) == block:
                    del self.cached[key]
                self.block_key[block] = None
                self.evictions += 1
            self.ref_cnt[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        """Share cached ``blocks`` with one more request (prefix-cache hit)."""
        for block in blocks:
            if self.ref_cnt[block] == 0:
                del self.free_queue[block]
            self.ref_cnt[block] += 1

    def cache(self, block: int, key: Hashable) -> None:
        """Record that full ``block`` holds the tokens named by ``key``."""
        if not self.enable_caching or self.block_key[block] is not None:
            return
        self.block_key[block] = key
        self.cached.setdefault(key, block)

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's ``blocks`` (given head first); they are freed tail first."""
        unhashed, hashed = [], []
        for block in reversed(blocks):
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                if self.block_key[block] is None and self.enable_caching:
                    unhashed.append(block)
                else:
                    hashed.append(block)
        for block in reversed(unhashed):
            self.free_queue[block] = None
            self.free_queue.move_to_end(block, last=False)
        for block in hashed:
            self.free_queue[block] = None
