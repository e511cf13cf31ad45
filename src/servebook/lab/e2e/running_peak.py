"""A recorded engine's peak of running requests against the two concurrency figures.

An end-to-end job (:mod:`servebook.lab.e2e.job`, schema ``servebook.e2e/1``) submits every
request at once and records how many ran together. This module sets that measurement beside
what the library predicts for the same engine: the start-up log's admission bound
(:attr:`servebook.kv_cache.Capacity.max_concurrency`) and the run-time figure
(:func:`servebook.kv_cache.running_concurrency`), both computed from the model config the engine
loaded and the KV memory it logged (``Available KV cache memory``), so the only thing compared is
the rule, not a memory estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import ServebookError
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity, running_concurrency

GIB = 2**30


@dataclass(frozen=True)
class RunningPeak:
    """One job's measured peak beside both predictions (requests, blocks, tokens as named)."""

    model_id: str
    job: str
    request_tokens: int           #: prompt + output tokens of each request (the job's fixed lengths)
    requests: int                 #: requests submitted at once
    logged_gpu_blocks: int        #: the engine's KV pool, blocks (start-up log)
    predicted_gpu_blocks: int     #: the library's pool for the logged KV memory, blocks
    max_model_len: int            #: the engine's ``--max-model-len``, tokens
    logged_admission: float       #: ``Maximum concurrency for max_model_len tokens`` as logged
    predicted_admission: float    #: the same figure as the library computes it
    predicted_running: int        #: requests of ``request_tokens`` that run at once (run-time figure)
    measured_running: int         #: most requests decoding at once, from their own timestamps
    preemptions: float            #: the engine's preemption counter over the job


def running_peak(doc: dict, job_name: str) -> RunningPeak:
    """The measured peak of job ``job_name`` in a recorded ``servebook.e2e/1`` document, with both figures.

    The job must have fixed lengths (``input_cv`` and ``output_cv`` 0), so every request is
    ``input_mean + output_mean`` tokens. Raises :class:`ServebookError` naming the job when it is
    missing, was skipped, or has varying lengths.
    """
    jobs = {j["name"]: j for j in doc["jobs"]}
    if job_name not in jobs:
        raise ServebookError(f"{doc['model_id']} has no job {job_name!r}; it has {', '.join(jobs) or 'none'}")
    job = jobs[job_name]
    if "skipped" in job:
        raise ServebookError(f"{doc['model_id']} job {job_name!r} was not measured: {job['skipped']}")
    shape = job["shape"]
    if shape["input_cv"] or shape["output_cv"]:
        raise ServebookError(f"job {job_name!r} has varying lengths (cv {shape['input_cv']}, {shape['output_cv']}); "
                             "a peak is compared with one request length: use a job of fixed lengths")
    request_tokens = int(shape["input_mean"]) + int(shape["output_mean"])
    args, parsed = doc["engine_args"], doc["startup"]["parsed"]
    cap = capacity(load_model_spec(doc["config"]), int(parsed["available_kv_cache_gib"] * GIB),
                   max_model_len=args["max_model_len"], max_num_batched_tokens=args["max_num_batched_tokens"],
                   async_scheduling=args.get("async_scheduling"))
    run = running_concurrency(cap, request_tokens)
    return RunningPeak(model_id=doc["model_id"], job=job_name, request_tokens=request_tokens, requests=job["requests"],
                       logged_gpu_blocks=doc["startup"]["num_gpu_blocks"], predicted_gpu_blocks=cap.num_gpu_blocks,
                       max_model_len=args["max_model_len"], logged_admission=parsed["max_concurrency"], predicted_admission=cap.max_concurrency,
                       predicted_running=run.max_running, measured_running=job["peak_decoding"],
                       preemptions=job["counters"]["preemptions"])
