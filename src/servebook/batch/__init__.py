"""Resumable offline batch inference (sections 6.22-6.23): the ten-million-request job.

* :mod:`~servebook.batch.requests` — JSONL input, every problem reported with its line number.
* :mod:`~servebook.batch.ordering` — group by shared prefix, then sort by length.
* :mod:`~servebook.batch.store` — fsync'd append-only results; torn-tail repair.
* :mod:`~servebook.batch.driver` — :func:`run_batch`, chunk by chunk, resumable.
* :mod:`~servebook.batch.vllm_engine` / :mod:`~servebook.batch.http_engine` — engines
  (vLLM's ``LLM`` class; a ``vllm serve`` endpoint). vLLM is imported only inside them.
* :mod:`~servebook.batch.shard` — N independent replicas; merge and completeness check.
* :mod:`~servebook.batch.ray_data` — the fleet path on Ray Data's vLLM processor.

Nothing here imports vLLM at module import time, so the book's environment can parse,
validate, shard, merge and repair without it.
"""
from servebook.batch.driver import BatchSummary, OrderOptions, plan_chunks, rejected_path, run_batch
from servebook.batch.ordering import submission_order
from servebook.batch.requests import BatchRequest, InputProblem, parse_request_lines, read_requests
from servebook.batch.shard import merge_results, select_shard, shard_of, write_shards
from servebook.batch.store import ResultStore, read_results, repair_torn_tail

__all__ = [
    "BatchRequest", "BatchSummary", "InputProblem", "OrderOptions", "ResultStore", "merge_results",
    "parse_request_lines", "plan_chunks", "read_requests", "read_results", "rejected_path",
    "repair_torn_tail", "run_batch", "select_shard", "shard_of", "submission_order", "write_shards",
]
