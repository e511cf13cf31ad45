"""Data parallelism past one machine: N independent replicas, each with its own shard.

A request belongs to shard ``sha256(id) mod N``: a pure function of the id, so every
replica computes the same partition without talking to the others, a restarted replica
finds the same requests, and the shards are disjoint and cover the input. Each replica
runs the ordinary resumable driver on its shard with its own output file;
:func:`merge_results` joins the outputs and checks that every request has exactly one
result.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from servebook.batch.requests import BatchRequest
from servebook.batch.store import read_results
from servebook.errors import ServebookError


def shard_of(request_id: str, num_shards: int) -> int:
    """The shard (0..num_shards-1) that owns ``request_id``."""
    if num_shards < 1:
        raise ServebookError(f"num_shards must be >= 1, got {num_shards}")
    digest = hashlib.sha256(str(request_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards


def parse_shard(spec: str) -> tuple[int, int]:
    """``"i/N"`` -> (i, N) with 0 <= i < N (e.g. ``--shard 2/8``)."""
    try:
        index_text, count_text = spec.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ServebookError(f"--shard must look like i/N (for example 0/4), got {spec!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ServebookError(f"--shard {spec}: need 0 <= i < N")
    return index, count


class _Subset(Sequence[BatchRequest]):
    """Some positions of a request sequence, read through to it (no copy of the prompts)."""

    def __init__(self, source: Sequence[BatchRequest], positions: list[int]):
        self.source, self.positions = source, positions

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return self.source[self.positions[index]]


def select_shard(requests: Sequence[BatchRequest], index: int, num_shards: int) -> Sequence[BatchRequest]:
    """The requests shard ``index`` of ``num_shards`` owns, in input order.

    A :class:`~servebook.batch.requests.JsonlRequests` stays on disk (its ``ids`` are used);
    the result is a read-through view, not a copy.
    """
    ids = getattr(requests, "ids", None)
    if ids is None:
        ids = [r.id for r in requests]
    return _Subset(requests, [k for k, rid in enumerate(ids) if shard_of(rid, num_shards) == index])


def write_shards(input_path: str | Path, out_dir: str | Path, num_shards: int) -> list[Path]:
    """Split a JSONL file into ``shard-IIIII-of-NNNNN.jsonl`` files by :func:`shard_of`.

    Lines are copied byte for byte (blank lines dropped); a line without a readable id
    goes to shard 0 so that replica's validation reports it with its line number there.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"shard-{i:05d}-of-{num_shards:05d}.jsonl" for i in range(num_shards)]
    handles = [open(p, "w", encoding="utf-8") for p in paths]
    try:
        with open(input_path, encoding="utf-8") as src:
            for text in src:
                if not text.strip():
                    continue
                try:
                    rid = json.loads(text).get("id")
                except (json.JSONDecodeError, AttributeError):
                    rid = None
                target = 0 if rid is None else shard_of(str(rid), num_shards)
                handles[target].write(text if text.endswith("\n") else text + "\n")
    finally:
        for h in handles:
            h.close()
    return paths


def merge_results(outputs: Sequence[str | Path], expected_ids: Sequence[str] | None = None) -> dict[str, dict]:
    """All records of several replicas' outputs by id.

    Raises ServebookError when an id appears in two outputs or, given ``expected_ids``,
    when some are missing (the message names a few and says which replica to resume).
    """
    merged: dict[str, dict] = {}
    owner: dict[str, Path] = {}
    for out in outputs:
        for rid, rec in read_results(out).items():
            if rid in merged:
                raise ServebookError(f"id {rid!r} has results in both {owner[rid]} and {out}; "
                                     "replicas must run disjoint shards (same N, different i)")
            merged[rid], owner[rid] = rec, Path(out)
    if expected_ids is not None:
        missing = [i for i in expected_ids if i not in merged]
        if missing:
            raise ServebookError(f"{len(missing)} requests have no result (e.g. {missing[:5]}); "
                                 "resume the replicas whose shards hold them")
    return merged
