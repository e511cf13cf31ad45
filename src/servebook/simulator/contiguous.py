"""Contiguous KV allocation: one reserved stretch of slots per request.

This is the pre-vLLM way (Orca, FasterTransformer as described by Kwon et al.,
SOSP 2023, section 3): a request gets one contiguous range of KV slots sized for
the most it might ever need, found by first fit in a linear address space of
``capacity_tokens`` slots. Three sources of waste follow: slots reserved for
tokens not generated yet (or never), the gap between the reservation and the
real length, and holes between ranges too small for the next request
(external fragmentation).
"""
from __future__ import annotations

from servebook.errors import ServebookError


def reservation_tokens(total_tokens: int, max_model_len: int, reservation: str) -> int:
    """Slots reserved for a request of ``total_tokens`` (prompt + output) tokens.

    ``max``: ``max_model_len`` (the output length is unknown in advance);
    ``pow2``: the next power of two >= total, at most ``max_model_len``;
    ``oracle``: exactly ``total_tokens`` (the best a contiguous scheme can do).
    """
    if reservation == "max":
        return max_model_len
    if reservation == "pow2":
        return min(1 << (total_tokens - 1).bit_length(), max_model_len)
    if reservation == "oracle":
        return total_tokens
    raise ServebookError(f"unknown reservation {reservation!r}; choose max, pow2 or oracle")


class ContiguousAllocator:
    """First-fit allocator over ``capacity_tokens`` slots.

    ``ranges`` maps an owner to its ``(start, length)`` in slots.
    """

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.ranges: dict[str, tuple[int, int]] = {}
        self._sorted: list[tuple[int, int, str]] = []  # (start, length, owner), by start
        self.reserved_tokens = 0  #: slots held by some request

    def allocate(self, owner: str, length: int) -> int | None:
        """Reserve ``length`` slots at the first hole that fits; returns the start or None."""
        cursor = 0
        for index, (start, used, _) in enumerate(self._sorted):
            if start - cursor >= length:
                self._sorted.insert(index, (cursor, length, owner))
                self.ranges[owner] = (cursor, length)
                self.reserved_tokens += length
                return cursor
            cursor = start + used
        if self.capacity_tokens - cursor >= length:
            self._sorted.append((cursor, length, owner))
            self.ranges[owner] = (cursor, length)
            self.reserved_tokens += length
            return cursor
        return None

    def release(self, owner: str) -> None:
        """Give back the range held by ``owner``."""
        start, length = self.ranges.pop(owner)
        self._sorted.remove((start, length, owner))
        self.reserved_tokens -= length

    def largest_hole(self) -> int:
        """Longest run of free slots: the biggest reservation that fits now."""
        best, cursor = 0, 0
        for start, used, _ in self._sorted:
            best = max(best, start - cursor)
            cursor = start + used
        return max(best, self.capacity_tokens - cursor)
