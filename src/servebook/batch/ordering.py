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


def submission_order(token_ids: Sequence[Sequence[int]], ids: Sequence[str], *,
                     group_by_prefix: bool = True, sort_by_length: bool = True,
                     min_shared_tokens: int = 16, shuffle_seed: int | None = None) -> list[int]:
    """Indices of the requests in the order the driver submits them.

    ``group_by_prefix`` and ``sort_by_length`` switch the two tactics on or off (the lab
    compares them). With both off the order is the input order, or a seeded shuffle when
    ``shuffle_seed`` is given.
    """
    n = len(ids)
    if len(token_ids) != n:
        raise ValueError("token_ids and ids must have the same length")
    length = lambda i: (len(token_ids[i]), ids[i])  # noqa: E731
    if group_by_prefix:
        groups = prefix_groups(token_ids, ids, min_shared_tokens)
        if sort_by_length:
            groups = [sorted(g, key=length) for g in groups]
            groups.sort(key=lambda g: length(g[0]))
        return [i for g in groups for i in g]
    order = list(range(n))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    if sort_by_length:
        order.sort(key=length)
    return order


def chunks(items: Sequence[T], chunk_size: int) -> list[list[T]]:
    """Consecutive chunks of at most ``chunk_size`` items (the unit the driver makes durable)."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    return [list(items[i:i + chunk_size]) for i in range(0, len(items), chunk_size)]
