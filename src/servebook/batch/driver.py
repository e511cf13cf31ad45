"""The resumable offline driver: validate, order, run chunk by chunk, make each chunk durable.

:func:`run_batch` works with any object that has the :class:`Engine` shape: the real
one is :class:`servebook.batch.vllm_engine.VllmEngine` (vLLM's ``LLM`` class; it needs
the vLLM environment), an HTTP one is :class:`servebook.batch.http_engine.HttpEngine`
(the lab compares them), and the tests use a fake. The driver itself imports no vLLM.

Order of work, each step restartable:

1. Every input problem (bad JSON, missing or duplicate id, prompt too long for the
   engine's ``max_model_len``) is reported with its line number. With problems the
   driver stops before generating anything, unless ``skip_invalid``: then the problems
   go to ``<output>.rejected.jsonl`` and the valid requests run.
2. The submission order (:func:`servebook.batch.ordering.submission_order`) and the chunk
   boundaries are fixed functions of the input, so a restart recomputes the same chunks.
3. The output is repaired (a crash's torn tail is cut) and its done ids are read.
4. Each chunk's not-yet-done requests go to the engine in one call; the results are
   appended and fsync'd before the next chunk starts. A kill loses at most the chunk in
   flight, and a finished request is never run twice.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from servebook.batch.ordering import chunks, order_by_keys, prefix_key
from servebook.batch.requests import (BatchRequest, InputProblem, check_prompt_lengths,
                                      format_problems)
from servebook.batch.store import ResultStore
from servebook.errors import ServebookError


class Engine(Protocol):
    """What the driver needs from an engine."""

    max_model_len: int

    def prompt_token_ids(self, request: BatchRequest) -> list[int]:
        """The prompt's token ids (text prompts tokenized as the engine would)."""

    def generate(self, requests: Sequence[BatchRequest], token_ids: Sequence[Sequence[int]]) -> list[dict]:
        """One result record per request, same order: at least ``id``, ``token_ids``,
        ``text``, ``finish_reason``, ``prompt_tokens``."""


@dataclass
class BatchSummary:
    """What one driver run did. Counts are requests; ``output_tokens`` counts this run only."""

    total: int
    already_done: int
    ran: int
    rejected: int
    chunks_run: int
    repaired_bytes: int
    output_tokens: int
    elapsed_s: float
    unknown_done_ids: int = 0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class OrderOptions:
    """The 6.23 tactics: group by shared prefix, sort by length (or shuffle, for the lab)."""

    group_by_prefix: bool = True
    sort_by_length: bool = True
    min_shared_tokens: int = 16
    shuffle_seed: int | None = None


def rejected_path(output: str | Path) -> Path:
    """Where ``skip_invalid`` writes the problems: ``<output>.rejected.jsonl``."""
    output = Path(output)
    return output.with_name(output.name + ".rejected.jsonl")


def write_rejected(output: Path, problems: Sequence[InputProblem]) -> None:
    target = rejected_path(output)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for p in sorted(problems, key=lambda p: p.line):
            handle.write(json.dumps(p.to_json()) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)


class Progress:
    """A progress bar (tqdm when installed) with request throughput, ETA and output tokens/s."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.enabled = enabled
        self.total, self.count, self.initial = total, initial, initial
        self.start = time.monotonic()
        self.tokens = 0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, unit="req", desc="batch",
                                file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
            except ImportError:
                self.bar = None

    def update(self, requests: int, output_tokens: int) -> None:
        self.count += requests
        self.tokens += output_tokens
        if not self.enabled:
            return
        elapsed = max(time.monotonic() - self.start, 1e-9)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.tokens / elapsed:.1f} out tok/s", refresh=False)
            self.bar.update(requests)
        else:
            rate = (self.count - self.initial) / elapsed
            left = self.total - self.count
            eta = left / rate if rate > 0 else float("inf")
            print(f"batch {self.count}/{self.total} {rate:.2f} req/s {self.tokens / elapsed:.1f} out tok/s "
                  f"ETA {eta:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def plan_chunks(requests: Sequence[BatchRequest], token_ids: Sequence[Sequence[int]], chunk_size: int,
                order: OrderOptions = OrderOptions()) -> list[list[int]]:
    """Indices of ``requests`` in submission order, cut into chunks of ``chunk_size``."""
    keys = [prefix_key(t, order.min_shared_tokens) for t in token_ids]
    return _plan([len(t) for t in token_ids], keys, [r.id for r in requests], chunk_size, order)


def _plan(lengths, keys, ids, chunk_size: int, order: OrderOptions) -> list[list[int]]:
    idx = order_by_keys(lengths, keys, ids, group_by_prefix=order.group_by_prefix,
                        sort_by_length=order.sort_by_length, shuffle_seed=order.shuffle_seed)
    return chunks(idx, chunk_size)


def run_batch(requests: Sequence[BatchRequest], problems: Sequence[InputProblem], output: str | Path,
              engine: Engine, *, chunk_size: int = 1024, order: OrderOptions = OrderOptions(),
              skip_invalid: bool = False, progress: bool = True,
              on_chunk: Callable[[int, int], None] | None = None) -> BatchSummary:
    """Run every valid request once, appending results durably to ``output`` (JSONL).

    ``requests`` may be a list or a :class:`servebook.batch.requests.JsonlRequests` (read on
    demand): the plan keeps only each prompt's length and prefix key, and a chunk's prompts
    are read and tokenized again when the chunk runs, so memory does not grow with the
    prompts. ``chunk_size`` requests go to the engine per call (the unit of durability: a
    crash loses at most one chunk's work). ``on_chunk(chunk_index, records_written)`` is
    called after each chunk is on disk. Raises ServebookError listing the problems (with
    line numbers) when there are any and ``skip_invalid`` is False.
    """
    started = time.monotonic()
    output = Path(output)
    positions: list[int] = []          # index into `requests` of each request that can run
    lengths: list[int] = []
    keys: list[bytes | None] = []
    ids: list[str] = []
    too_long: list[InputProblem] = []
    for pos in range(len(requests)):
        req = requests[pos]
        tokens = engine.prompt_token_ids(req)
        _, problem = check_prompt_lengths([req], lambda r: len(tokens), engine.max_model_len)
        if problem:
            too_long.extend(problem)
            continue
        positions.append(pos)
        lengths.append(len(tokens))
        keys.append(prefix_key(tokens, order.min_shared_tokens))
        ids.append(req.id)
    all_problems = sorted([*problems, *too_long], key=lambda p: p.line)
    if all_problems and not skip_invalid:
        raise ServebookError(f"{len(all_problems)} input lines cannot run; fix them or pass --skip-invalid "
                             f"(they then go to {rejected_path(output).name}):\n" + format_problems(all_problems))
    if skip_invalid:
        write_rejected(output, all_problems)
    plan = _plan(lengths, keys, ids, chunk_size, order)

    with ResultStore(output) as store:
        done = set(store.done)
        input_ids = set(ids)
        already = len(done & input_ids)
        bar = Progress(len(ids), already, progress)
        ran = chunks_run = out_tokens = 0
        try:
            for number, chunk in enumerate(plan):
                todo = [j for j in chunk if ids[j] not in done]
                if not todo:
                    continue
                batch = [requests[positions[j]] for j in todo]
                records = engine.generate(batch, [engine.prompt_token_ids(r) for r in batch])
                if [str(r["id"]) for r in records] != [ids[j] for j in todo]:
                    raise ServebookError("the engine returned results for other requests than it was given; "
                                         "check the Engine implementation")
                store.append(records)
                done.update(ids[j] for j in todo)
                tokens = sum(len(r.get("token_ids", ())) for r in records)
                ran, chunks_run, out_tokens = ran + len(todo), chunks_run + 1, out_tokens + tokens
                bar.update(len(todo), tokens)
                if on_chunk is not None:
                    on_chunk(number, len(records))
        finally:
            bar.close()
        repaired = store.repair.removed_bytes if store.repair else 0
        unknown = len(set(store.done) - input_ids)
    return BatchSummary(total=len(ids), already_done=already, ran=ran, rejected=len(all_problems),
                        chunks_run=chunks_run, repaired_bytes=repaired, output_tokens=out_tokens,
                        elapsed_s=time.monotonic() - started, unknown_done_ids=unknown)
