"""Synthetic offline workloads as token ids: shared prefixes, spread-out lengths.

For the fault tests and lab L8 (no data set is downloaded). A workload has
``num_prefixes`` shared "system prompts" of ``prefix_tokens`` tokens; each request is one
of them (chosen at random) followed by a unique tail whose length is drawn uniformly from
``tail_tokens`` (inclusive range). Token ids are drawn from ``[first_token, vocab_size)``
to stay clear of special tokens. Output lengths (``max_tokens``) are drawn from
``output_tokens``. Everything is seeded.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WorkloadSpec:
    """Shape of a synthetic workload (all lengths in tokens)."""

    num_requests: int = 48
    num_prefixes: int = 4
    prefix_tokens: int = 32
    tail_tokens: tuple[int, int] = (4, 60)
    output_tokens: tuple[int, int] = (4, 16)
    vocab_size: int = 512
    first_token: int = 10
    seed: int = 0


def make_requests(spec: WorkloadSpec, *, sampling: dict | None = None, id_prefix: str = "r") -> list[dict]:
    """Request dicts in the driver's JSONL shape (``prompt_token_ids``), in a seeded random order."""
    rng = random.Random(spec.seed)
    tok = lambda: rng.randrange(spec.first_token, spec.vocab_size)  # noqa: E731
    prefixes = [[tok() for _ in range(spec.prefix_tokens)] for _ in range(spec.num_prefixes)]
    out = []
    for i in range(spec.num_requests):
        tail = [tok() for _ in range(rng.randint(*spec.tail_tokens))]
        req = {"id": f"{id_prefix}{i:06d}", "prompt_token_ids": rng.choice(prefixes) + tail,
               "max_tokens": rng.randint(*spec.output_tokens)}
        if sampling is not None:
            req["sampling"] = dict(sampling)
        out.append(req)
    return out


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    """Write dicts one per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path
