"""Prefix caching: a shared-prefix workload as token ids, and the hit count vLLM 0.27.1 should report.

**Workload.** :class:`PrefixWorkload` builds prompts of up to three parts: a system prompt
every request shares, one of ``num_documents`` shared documents (the RAG shape; 0 for none),
and a suffix of its own. Token ids are drawn from ``[first_token, vocab_size)``; every
document and every suffix starts with a token no other one starts with, so two prompts share
exactly the parts they are meant to share (nothing more by chance).

**Rule being predicted** (``vllm/v1/core/kv_cache_manager.py`` and ``kv_cache_utils.py``):

* only *full* blocks are hashed (``block_size`` tokens each, 16 on CUDA and 128 on CPU by
  default); each block's hash chains its parent's, so a block hits only if every block
  before it hits too;
* the lookup is capped at ``prompt_tokens - 1`` tokens (``max_cache_hit_length``): a
  fully cached prompt recomputes at least its last token, in practice its last block;
* blocks are cached as soon as they are scheduled (``allocate_slots`` caches up to the
  scheduled tokens), so a request admitted after the first one that carries a prefix hits
  it even when both run in the same step;
* the counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` grow at admission
  by the prompt's tokens and its hit tokens (``Scheduler`` calls
  ``record_prefix_cache_stats``; re-admitted preempted requests are kept out of them), and
  stay at 0 when caching is off.

:func:`predict_prefix_cache` applies that rule to prompts in admission order, with an
unlimited cache or with a pool of ``pool_blocks`` blocks evicted least-recently-used first
(requests one at a time, freed tail block first as ``KVCacheManager.free`` does; a block
that holds no full block's hash goes to the front of the free queue, ``BlockPool.free_blocks``).
"""
from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from servebook.lab.errors import LabError


@dataclass(frozen=True)
class PrefixWorkload:
    """Shape of a shared-prefix workload (lengths in tokens).

    Prompt ``i`` = system prompt + document ``i % num_documents`` (when there are documents)
    + a suffix of its own. ``output_tokens`` is what each request generates (``max_tokens``
    with ``ignore_eos``).
    """

    num_requests: int
    system_prompt_tokens: int
    suffix_tokens: int
    output_tokens: int
    num_documents: int = 0
    document_tokens: int = 0
    vocab_size: int = 512
    first_token: int = 10
    seed: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Tokens in every prompt."""
        return self.system_prompt_tokens + (self.document_tokens if self.num_documents else 0) + self.suffix_tokens

    def check(self) -> None:
        """Raise :class:`LabError` (saying what to change) for a shape that cannot be built."""
        if self.num_requests < 1:
            raise LabError(f"num_requests is {self.num_requests}; use at least 1")
        if self.suffix_tokens < 1:
            raise LabError("suffix_tokens must be >= 1: every request needs a token of its own")
        if min(self.system_prompt_tokens, self.document_tokens, self.output_tokens, self.num_documents) < 0:
            raise LabError("lengths and counts must not be negative")
        if self.num_documents and self.document_tokens < 1:
            raise LabError("num_documents > 0 needs document_tokens >= 1")
        distinct = self.vocab_size - self.first_token
        if self.num_requests + self.num_documents > distinct:
            raise LabError(f"{self.num_requests} suffixes and {self.num_documents} documents need as many distinct "
                           f"first tokens, but token ids [{self.first_token}, {self.vocab_size}) hold only {distinct}; "
                           "use fewer requests or a larger vocab_size")


def build_prompts(workload: PrefixWorkload) -> list[list[int]]:
    """The prompts as token ids, request ``i`` at index ``i`` (seeded, deterministic)."""
    w = workload
    w.check()
    rng = random.Random(w.seed)
    ids = range(w.first_token, w.vocab_size)
    tok = lambda: rng.randrange(w.first_token, w.vocab_size)  # noqa: E731
    heads = rng.sample(ids, w.num_requests + w.num_documents)   # distinct first tokens
    system = [tok() for _ in range(w.system_prompt_tokens)]
    documents = [[heads[w.num_requests + d]] + [tok() for _ in range(w.document_tokens - 1)]
                 for d in range(w.num_documents)]
    prompts = []
    for i in range(w.num_requests):
        doc = documents[i % w.num_documents] if w.num_documents else []
        prompts.append(system + doc + [heads[i]] + [tok() for _ in range(w.suffix_tokens - 1)])
    return prompts


def block_keys(tokens: Sequence[int], block_size: int) -> list[bytes]:
    """One key per *full* block of ``tokens``; key ``j`` depends on tokens ``0 .. (j+1)*block_size - 1``
    (the chaining of vLLM's block hashes: equal keys mean equal prefixes)."""
    if block_size < 1:
        raise LabError(f"block_size is {block_size}; use the engine's KV block size (16 on CUDA, 128 on CPU)")
    keys, parent = [], b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = ",".join(map(str, tokens[start:start + block_size])).encode()
        parent = hashlib.blake2b(parent + b"|" + block, digest_size=16).digest()
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class PrefixCachePrediction:
    """What the prefix cache should do for a list of prompts (tokens)."""

    block_size: int
    hit_tokens_per_request: tuple[int, ...]
    query_tokens: int           # the growth of vllm:prefix_cache_queries (prompt tokens looked up)
    hit_tokens: int             # the growth of vllm:prefix_cache_hits
    pool_blocks: int | None     # None: unlimited cache

    @property
    def hit_rate(self) -> float:
        """hits / queries (0 when nothing was queried)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def prefill_tokens_computed(self) -> int:
        """Prompt tokens the engine still computes (queries - hits)."""
        return self.query_tokens - self.hit_tokens


def predict_prefix_cache(prompts: Sequence[Sequence[int]], block_size: int, *, output_tokens: int = 1,
                         pool_blocks: int | None = None) -> PrefixCachePrediction:
    """Hit tokens of each prompt, admitted in the order given (see the module docstring for the rule).

    ``pool_blocks`` None: an unlimited cache (nothing is ever evicted; the result then does not
    depend on how many requests run at once). Otherwise the pool's free blocks (KV blocks less
    vLLM's one null block), requests run one at a time, each holding
    ``ceil((prompt + output_tokens - 1) / block_size)`` blocks (the last sampled token is never
    written), then freeing them tail first (a partly filled block first of all); new blocks
    evict the least recently freed.
    Raises :class:`LabError` when one request does not fit the pool.
    """
    hits_per_request: list[int] = []
    cached: dict[bytes, int] = {}                    # block key -> block id holding it
    key_of: dict[int, bytes] = {}                    # block id -> key it holds
    free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(pool_blocks or 0))
    for number, prompt in enumerate(prompts):
        keys = block_keys(prompt, block_size)
        max_hit_blocks = (len(prompt) - 1) // block_size
        hit_blocks = 0
        while hit_blocks < min(len(keys), max_hit_blocks) and keys[hit_blocks] in cached:
            hit_blocks += 1
        hits_per_request.append(hit_blocks * block_size)
        if pool_blocks is None:
            cached.update((k, 0) for k in keys)
            continue
        held = [cached[k] for k in keys[:hit_blocks]]
        for b in held:
            free.pop(b, None)                        # touched: in use, not evictable
        written = len(prompt) + max(output_tokens, 1) - 1
        need = -(-written // block_size) - hit_blocks
        if need > len(free):
            raise LabError(f"request {number} needs {need + hit_blocks} blocks but the pool has {pool_blocks}; "
                           "raise pool_blocks or shorten the prompts")
        for _ in range(need):
            b, _ = free.popitem(last=False)          # least recently freed first
            old = key_of.pop(b, None)
            if old is not None and cached.get(old) == b:
                del cached[old]                      # evicted
            held.append(b)
        for j in range(hit_blocks, written // block_size):   # new full blocks become cached
            key = keys[j] if j < len(keys) else hashlib.blake2b(b"output|%d|%d" % (number, j)).digest()
            cached[key], key_of[held[j]] = held[j], key
        freed = list(reversed(held))                 # KVCacheManager.free: tail block first
        for b in freed:
            if b in key_of:
                free[b] = None                       # cached blocks join the LRU tail
        for b in reversed([b for b in freed if b not in key_of]):
            free[b] = None                           # blocks without a hash go to the front:
            free.move_to_end(b, last=False)          # reused before any cached block
    return PrefixCachePrediction(block_size=block_size, hit_tokens_per_request=tuple(hits_per_request),
                                 query_tokens=sum(len(p) for p in prompts), hit_tokens=sum(hits_per_request),
                                 pool_blocks=pool_blocks)


def shared_prefix_hit_tokens(workload: PrefixWorkload, block_size: int) -> int:
    """Closed form of the unlimited-cache hit tokens of :func:`build_prompts`' prompts.

    The first request hits nothing. The first request of each further document shares the
    system prompt only: ``floor(system / block) * block`` tokens. Every other request shares
    system prompt + its document: ``floor((system + document) / block) * block`` tokens.
    (The suffix is at least one token, so the ``prompt - 1`` cap never bites.)
    """
    w, b = workload, block_size
    shared = w.system_prompt_tokens + (w.document_tokens if w.num_documents else 0)
    firsts = min(w.num_documents, w.num_requests) if w.num_documents else 1   # requests opening a new prefix
    return (firsts - 1) * (w.system_prompt_tokens // b) * b + (w.num_requests - firsts) * (shared // b) * b


def offline_requests(prompts: Sequence[Sequence[int]], max_tokens: int, *, id_prefix: str = "p"):
    """The prompts as the batch driver's requests (:class:`servebook.batch.requests.BatchRequest`):
    ids ``<id_prefix>000000``..., greedy, ``ignore_eos`` so each generates exactly ``max_tokens``."""
    from servebook.batch.requests import BatchRequest

    return [BatchRequest(id=f"{id_prefix}{i:06d}", line=i + 1, max_tokens=max_tokens, prompt_token_ids=tuple(p),
                         sampling={"temperature": 0, "ignore_eos": True}) for i, p in enumerate(prompts)]
