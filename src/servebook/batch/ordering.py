"""Submission order for an offline job: group shared prefixes together, then sort by length.

Two tactics of section 6.23, as pure functions of the prompts' token ids:

* **Prefix grouping.** Sorting prompts by their token ids puts prompts that share a
  prefix next to each other; consecutive prompts that share at least
  ``min_shared_tokens`` leading tokens form one group. vLLM's prefix cache reuses whole
  KV blocks only (16 tokens on CUDA, 128 on CPU), so a shared prefix shorter than a block
  saves nothing; pass the engine's block size.
* **Length sorting.** Within a group, prompts run shortest first (ties by id), and groups
  run in order of their shortest prompt, so the requests that share an engine step have
  similar lengths.

The order is a deterministic function of the token ids and the request ids, so a
resumed run recomputes exactly the same order and the same chunk boundaries.
"""
from __future__ import annotations

import hashlib
import random
from typing import Sequence, TypeVar

T = TypeVar("T")


def shared_prefix_tokens(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_groups(token_ids: Sequence[Sequence[int]], ids: Sequence[str], min_shared_tokens: int
                  ) -> list[list[int]]:
    """Indices grouped so that each group's prompts share >= ``min_shared_tokens`` leading tokens
    with the previous prompt of the group (prompts in lexicographic token order)."""
    order = sorted(range(len(ids)), key=lambda i: (tuple(token_ids[i]), ids[i]))
    groups: list[list[int]] = []
    for i in order:
        if groups and shared_prefix_tokens(token_ids[groups[-1][-1]], token_ids[i]) >= min_shared_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def prefix_key(token_ids: Sequence[int], min_shared_tokens: int) -> bytes | None:
    """A digest of the first ``min_shared_tokens`` tokens; None for a shorter prompt.

    Two prompts share at least ``min_shared_tokens`` leading tokens exactly when their
    keys are equal, which is what :func:`prefix_groups` finds by sorting; the key lets
    the driver plan ten million requests without keeping their token ids.
    """
    if len(token_ids) < min_shared_tokens or min_shared_tokens < 1:
        return None
    head = ",".join(map(str, token_ids[:min_shared_tokens])).encode()
    return hashlib.blake2b(head, digest_size=16).digest()


def order_by_keys(lengths: Sequence[int], keys: Sequence[bytes | None], ids: Sequence[str], *,
                  group_by_prefix: bool = True, sort_by_length: bool = True,
                  shuffle_seed: int | None = None) -> list[int]:
    """Indices in submission order from prompt lengths (tokens) and prefix keys.

    ``group_by_prefix``: requests with the same key form a group (a None key is a group of
    its own); with ``sort_by_length`` each group runs shortest first (ties by id) and
    groups run in order of their shortest prompt. Without grouping: length order, the
    input order, or a seeded shuffle (``shuffle_seed``) when length sorting is off too.
    """
    n = len(ids)
    if not len(lengths) == len(keys) == n:
        raise ValueError("lengths, keys and ids must have the same length")
    length = lambda i: (lengths[i], ids[i])  # noqa: E731
    if group_by_prefix:
        groups: dict = {}
        for i in range(n):
            groups.setdefault(keys[i] if keys[i] is not None else ("solo", i), []).append(i)
        members = list(groups.values())
        if sort_by_length:
            members = [sorted(g, key=length) for g in members]
            members.sort(key=lambda g: length(g[0]))
        return [i for g in members for i in g]
    order = list(range(n))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    if sort_by_length:
        order.sort(key=length)
    return order


def submission_order(token_ids: Sequence[Sequence[int]], ids: Sequence[str], *,
                     group_by_prefix: bool = True, sort_by_length: bool = True,
                     min_shared_tokens: int = 16, shuffle_seed: int | None = None) -> list[int]:
    """Indices of the requests in the order the driver submits them (see :func:`order_by_keys`)."""
    if len(token_ids) != len(ids):
        raise ValueError("token_ids and ids must have the same length")
    return order_by_keys([len(t) for t in token_ids], [prefix_key(t, min_shared_tokens) for t in token_ids], ids,
                         group_by_prefix=group_by_prefix, sort_by_length=sort_by_length, shuffle_seed=shuffle_seed)


def chunks(items: Sequence[T], chunk_size: int) -> list[list[T]]:
    """Consecutive chunks of at most ``chunk_size`` items (the unit the driver makes durable)."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    return [list(items[i:i + chunk_size]) for i in range(0, len(items), chunk_size)]
