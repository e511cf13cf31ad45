"""Engine side of the end-to-end recorder: one ``LLM``, its jobs one after another, the JSON re-saved after each.

Run as ``python -m servebook.lab.e2e.child CASE.json`` in vLLM's Python by
:mod:`servebook.lab.e2e.job`, with stdout and stderr appended to the log file the case names (the
engine's start-up log is read back from there). The case holds the model, its config, the engine
flags, the jobs (shape, requests, seed), the output path and the GPU to predict for. A Gemma 4 text
config first gets the lent image's workaround (:func:`engine_inputs`).

Per job (one ``LLM.generate`` call, every request submitted at once, greedy, ``ignore_eos``) the
document gets: wall time (s); prompt and output tokens asked for and produced; per request the
engine's timestamps (``RequestOutput.metrics``: vLLM 0.26.0 and 0.27.1 ``RequestStateStats``;
whatever fields exist are kept, in seconds after the job's start); the peak number of requests
running at once (from those timestamps and from the engine's step log); the deltas of the engine's
counters (``LLM.get_metrics()``: preemptions, prefix-cache hits and queries, prompt and generation
tokens); every engine step (:mod:`servebook.lab.harness.step_recorder`); and fleet's prediction for the job.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from servebook.lab.harness import deadline, gemma4_compat
from servebook.lab.harness.concurrency import peak_concurrency
from servebook.lab.e2e.plan import Job, job_lengths, predict, token_prompts
from servebook.lab.harness.step_log import STEP_LOG_ENV, step_log_engine_args
from servebook.provenance import config_sha256, device_info, utc_now_iso, vllm_version

SCHEMA = "servebook.e2e/1"
#: Marker the parent writes to the log before starting a model's child; the child's log follows it.
LOG_MARK = "=== servebook e2e model "
#: RequestStateStats fields (engine core time.monotonic, s) in vLLM 0.26.0/0.27.1, and V0 RequestMetrics names.
MONOTONIC_FIELDS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
V0_FIELDS = ("first_scheduled_time", "first_token_time", "last_token_time", "finished_time")
COUNTERS = {"preemptions": "vllm:num_preemptions", "prefix_cache_hits": "vllm:prefix_cache_hits",
            "prefix_cache_queries": "vllm:prefix_cache_queries", "prompt_tokens": "vllm:prompt_tokens",
            "generation_tokens": "vllm:generation_tokens"}
#: A job is started only when fleet's predicted seconds times this (or the ratio measured so far,
#: times 1.3, when larger) plus 10 s fits before the deadline.
PREDICTION_MARGIN = 1.6


def say(msg: str) -> None:
    print(f"[e2e] {msg}", flush=True)


def _write(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=None, separators=(",", ":"), default=str))
    tmp.replace(path)


def _counters(llm) -> dict:
    try:
        metrics = llm.get_metrics()
    except Exception as exc:  # noqa: BLE001 - counters are a bonus, never lose a job to them
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {key: 0.0 for key in COUNTERS}
    for m in metrics:
        for key, name in COUNTERS.items():
            if m.name in (name, name + "_total") and type(m).__name__ == "Counter":
                out[key] += float(m.value)
    return out


def _delta(before: dict, after: dict) -> dict:
    if "error" in before or "error" in after:
        return {"error": before.get("error") or after.get("error")}
    return {k: after[k] - before[k] for k in COUNTERS}


def _startup_from_log(log_path: str | None, model: str) -> dict:
    """KV figures and timings the engine printed while starting (parsed by servebook.startup_log)."""
    if not log_path or not Path(log_path).exists():
        return {}
    from servebook.startup_log import parse_startup_log

    text = Path(log_path).read_text(errors="replace")
    text = text[text.rfind(LOG_MARK + model):] if LOG_MARK + model in text else text
    parsed = parse_startup_log(text)
    try:
        fields = dataclasses.asdict(parsed)
    except TypeError:
        fields = dict(vars(parsed))
    keep = ("kv cache", "concurrency", "blocks", "model loading", "cuda graph", "memory", "max model len",
            "chunked prefill", "initializing")
    lines = [ln.strip() for ln in text.splitlines() if any(k in ln.lower() for k in keep) and "[e2e]" not in ln]
    return {"parsed": fields, "lines": lines[:60]}


def _num_gpu_blocks(llm) -> int | None:
    for path in (("llm_engine", "vllm_config", "cache_config", "num_gpu_blocks"),
                 ("llm_engine", "cache_config", "num_gpu_blocks")):
        obj = llm
        for attr in path:
            obj = getattr(obj, attr, None)
        if isinstance(obj, int):
            return obj
    return None


def _request_columns(outs, t0_mono: float, t0_wall: float) -> tuple[dict, list[str]]:
    """Per-request columns (token counts, then each timestamp field present, s after the job start)."""
    cols: dict[str, list] = {"prompt_tokens": [], "output_tokens": []}
    names = [n for n in MONOTONIC_FIELDS + V0_FIELDS + ("arrival_time",)
             if outs and getattr(outs[0].metrics, n, None) is not None]
    for n in names:
        cols[n] = []
    for o in outs:
        cols["prompt_tokens"].append(len(o.prompt_token_ids or []))
        cols["output_tokens"].append(len(o.outputs[0].token_ids))
        for n in names:
            v = getattr(o.metrics, n, None)
            if v is None or v == 0:
                cols[n].append(None)
            else:  # arrival_time is wall-clock (time.time); V1's *_ts are monotonic
                base = t0_wall if n == "arrival_time" or n in V0_FIELDS else t0_mono
                cols[n].append(round(float(v) - base, 6))
    return cols, names


def _peak(cols: dict, start: str, end: str) -> int | None:
    if start not in cols or end not in cols:
        return None
    pairs = [(a, b) for a, b in zip(cols[start], cols[end]) if a is not None and b is not None]
    return peak_concurrency(pairs) if pairs else None


def _step_columns(step_log: str | None, t0_mono: float, t1_mono: float) -> dict | None:
    if not step_log or not Path(step_log).exists():
        return None
    from servebook.lab.harness.step_log import read_step_log

    try:
        steps = [s for s in read_step_log(step_log) if t0_mono <= s["t"] <= t1_mono]
    except Exception:  # noqa: BLE001
        return None
    return {"t_s": [round(s["t"] - t0_mono, 6) for s in steps], "total_tokens": [s["total"] for s in steps],
            "decodes": [s["decodes"] for s in steps], "decode_context_tokens": [s.get("decode_ctx") for s in steps],
            "prefill_requests": [len(s["prefills"]) for s in steps],
            "prefill_tokens": [sum(p[0] for p in s["prefills"]) for s in steps],
            "prefills": [s["prefills"] for s in steps]}


#: Jobs fleet predicts shorter than this (seconds) do not raise the next jobs' expected durations.
MIN_RATIO_PREDICTION_S = 5.0


def run_job(llm, job: Job, engine_args: dict, config: dict, step_log: str | None, gpu: str) -> dict:
    from vllm import SamplingParams

    vocab = int(config.get("vocab_size", 32000))
    inputs, outputs = job_lengths(job, int(engine_args["max_model_len"]))
    prompts = [{"prompt_token_ids": p} for p in token_prompts(inputs, vocab, job.seed)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True, temperature=job.temperature, detokenize=False)
              for n in outputs]
    before = _counters(llm)
    t0_wall, t0 = time.time(), time.monotonic()
    outs = llm.generate(prompts, params, use_tqdm=False)
    t1 = time.monotonic()
    wall = t1 - t0
    after = _counters(llm)
    cols, names = _request_columns(outs, t0, t0_wall)
    steps = _step_columns(step_log, t0, t1)
    produced, fed = sum(cols["output_tokens"]), sum(cols["prompt_tokens"])
    result = {
        "name": job.name, "shape": dataclasses.asdict(job.shape), "requests": job.requests, "seed": job.seed,
        "temperature": job.temperature,
        "wall_s": wall, "prompt_tokens_asked": sum(inputs), "output_tokens_asked": sum(outputs),
        "prompt_tokens": fed, "output_tokens": produced, "output_tokens_per_s": produced / wall,
        "total_tokens_per_s": (produced + fed) / wall,
        "peak_decoding": _peak(cols, "first_token_ts", "last_token_ts") or _peak(cols, "first_token_time",
                                                                               "last_token_time"),
        "peak_scheduled": _peak(cols, "scheduled_ts", "last_token_ts"),
        "peak_running_steps": max((d + p for d, p in zip(steps["decodes"], steps["prefill_requests"])),
                                  default=None) if steps else None,
        "counters": _delta(before, after), "timestamp_fields": names, "request_columns": cols,
        "steps": steps,
    }
    c = result["counters"]
    if "error" not in c and c["prefix_cache_queries"]:
        result["prefix_cache_hit_rate"] = c["prefix_cache_hits"] / c["prefix_cache_queries"]
    try:
        result["fleet"] = predict(config, inputs, outputs, engine_args, gpu=gpu)
    except Exception as exc:  # noqa: BLE001 - a prediction failure must not lose the measurement
        result["fleet"] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def warm_up(llm, engine_args: dict, vocab: int, *, full_budget: bool = True) -> None:
    """Run every kind of step the jobs will run once before timing them.

    On the H200 the first job on an engine paid one-time costs (kernels compiled for step sizes
    the start-up never ran: DeepSeek-V2-Lite's first 5,233-token step took 1.9 s, its later
    8,192-token steps 0.1-0.2 s). So: short prompts decoding (CUDA-graph steps), then enough
    1,024-token prompts for two steps at the full token budget beside decodes (eager mixed steps).
    ``full_budget=False`` (the CPU smoke test, where a first large step costs ~20 s of compilation
    on a 2-core machine) runs only the short prompts.
    """
    from vllm import SamplingParams

    budget = int(engine_args.get("max_num_batched_tokens", 8192))
    long_len = min(1024, int(engine_args["max_model_len"]) // 2)
    lengths = [32] * 32 + ([long_len] * max(1, 2 * budget // long_len) if full_budget else [])
    prompts = [{"prompt_token_ids": p} for p in token_prompts(lengths, vocab, 999)]
    llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True, detokenize=False), use_tqdm=False)


def _needed_s(job: Job, config: dict, engine_args: dict, gpu: str, ratio: float) -> float:
    try:
        inputs, outputs = job_lengths(job, int(engine_args["max_model_len"]))
        predicted = predict(config, inputs, outputs, engine_args, gpu=gpu)["seconds"]
    except Exception:  # noqa: BLE001
        return 0.0
    return predicted * max(PREDICTION_MARGIN, 1.3 * ratio) + 10.0


def engine_inputs(case: dict) -> tuple[dict, dict, list[str]]:
    """``(config the engine loads, engine flags, notes)`` for a case, before the child's own flags.

    The lent image's Gemma 4 workaround (vLLM 0.26.0 with transformers 5.17,
    :mod:`servebook.lab.harness.gemma4_compat`): a ``gemma4_text`` config gets
    ``allow_global_per_layer_attribute_access`` when it lacks it, and the engine flags get the global
    layers' ``num_global_key_value_heads`` and ``global_head_dim`` as ``hf_overrides``. A plan's own
    ``hf_overrides`` value wins key by key (noted when it differs), so a plan that wrote the computed
    ones by hand (labs/tools/e2e_gemma4_26b.toml) starts the same engine as one that wrote none. The
    record keeps the plan's config and its sha256 (what held-out declarations name); the notes go to
    its ``config_adjustment``. Any other config and its flags pass unchanged, with no notes.
    """
    engine_config, notes = gemma4_compat.engine_config(case["config"])
    engine_args, more = gemma4_compat.engine_args_with_overrides(dict(case["engine_args"]), engine_config)
    return engine_config, engine_args, notes + more


def main(case_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    from vllm import LLM
    from vllm.platforms import current_platform

    from servebook.tiny_model import write_model_dir

    device = "cuda" if current_platform.device_type == "cuda" else "cpu"
    model, config = case["model"], case["config"]
    engine_config, engine_args, adjustments = engine_inputs(case)
    out = Path(case["out"])
    jobs = [Job.from_case(model, j) for j in case["jobs"]]
    warm_jobs = [Job.from_case(model, j) for j in case.get("warm_up_jobs", [])]
    # before the engine starts: its processes inherit these (a routing simulation, ...); the record's
    # "environment" lists every VLLM_* variable the engine saw
    os.environ.update(case.get("environment") or {})
    model_dir = write_model_dir(tempfile.mkdtemp(prefix="e2e-model-"), engine_config, tokenizer=False)
    flags = dict(load_format="dummy", skip_tokenizer_init=True, disable_log_stats=False, **engine_args)
    step_log = None
    if case.get("record_steps", True):
        step_log = tempfile.mktemp(prefix="e2e-steps-", suffix=".jsonl")
        os.environ[STEP_LOG_ENV] = step_log  # the engine core (a child process) inherits it
        flags.update(step_log_engine_args(device))
    doc = {"schema": SCHEMA, "model_id": model, "kind": case.get("kind", ""), "date": utc_now_iso(),
           "gpu": None, "vllm_version": vllm_version(), "device": device,
           "weights": "dummy (random, load_format=dummy)", "config": config, "config_sha256": config_sha256(config),
           "engine_args": flags, "environment": {k: v for k, v in os.environ.items() if k.startswith("VLLM_")},
           "method": ("one LLM per model; per job one LLM.generate call with every request submitted at once, "
                      "distinct random token-id prompts, greedy unless the job's temperature says otherwise, ignore_eos, "
                      "max_tokens = the drawn output length; "
                      "wall_s = time.monotonic around generate; per-request timestamps from RequestOutput.metrics "
                      "(s after the job's start); counters are LLM.get_metrics() deltas; steps from "
                      "servebook.lab.harness.step_recorder (t_s = when the step was scheduled); before the first "
                      "job a warm-up (warm_up_s) runs decode-only and full-budget mixed steps once"),
           "jobs": []}
    if adjustments:
        doc["config_adjustment"] = "; ".join(adjustments)
    say(f"{model}: starting the engine ({device}) with {json.dumps(engine_args)}")
    t = time.monotonic()
    llm = LLM(model=str(model_dir), **flags)
    doc["engine_start_s"] = time.monotonic() - t
    # Only now: torch.cuda.mem_get_info makes a CUDA context in this process, which must not exist
    # while vLLM forks its engine or measures the free memory it sizes the KV cache from.
    doc["gpu"] = device_info()
    time.sleep(0.5)  # let the log lines of the start reach the file
    doc["startup"] = _startup_from_log(case.get("log"), model)
    doc["startup"]["num_gpu_blocks"] = _num_gpu_blocks(llm)
    say(f"{model}: engine started in {doc['engine_start_s']:.0f} s")
    t = time.monotonic()
    warm_up(llm, engine_args, int(config.get("vocab_size", 32000)), full_budget=device == "cuda")
    doc["warm_up_s"] = time.monotonic() - t
    if warm_jobs:
        doc["warm_up_jobs"] = []
    for job in warm_jobs:  # the plan's warm-up jobs: their one-time costs stay out of the timed jobs
        need = _needed_s(job, config, engine_args, case.get("gpu", "h200"), 1.0)
        if not deadline.fits(need):
            doc["warm_up_jobs"].append({"name": job.name, "seed": job.seed, "skipped": f"needs ~{need:.0f} s"})
            continue
        t = time.monotonic()
        warm = {"name": job.name, "seed": job.seed}
        try:
            res = run_job(llm, job, engine_args, config, step_log, case.get("gpu", "h200"))
            warm.update(wall_s=res["wall_s"], output_tokens_per_s=res["output_tokens_per_s"],
                        fleet_seconds=(res.get("fleet") or {}).get("seconds"), steps=res.get("steps"))
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is recorded; the timed jobs still run
            warm["error"] = f"{type(exc).__name__}: {exc}"
        doc["warm_up_jobs"].append(warm)
        say(f"{model} warm-up job {job.name}: {time.monotonic() - t:.1f} s")
    doc["method"] += ("; warm_up_jobs: whole jobs (shape, requests and seed listed) run first on the same engine, "
                      "their wall times and step logs kept apart from the timed jobs") if warm_jobs else ""
    _write(out, doc)
    ratio = 1.0
    for job in jobs:
        need = _needed_s(job, config, engine_args, case.get("gpu", "h200"), ratio)
        if not deadline.fits(need):
            doc["jobs"].append({"name": job.name, "skipped": f"needs ~{need:.0f} s, {deadline.seconds_left():.0f} s "
                                                             "left before SERVEBOOK_LAB_DEADLINE"})
            say(f"{model} {job.name}: skipped ({doc['jobs'][-1]['skipped']})")
            _write(out, doc)
            continue
        try:
            result = run_job(llm, job, engine_args, config, step_log, case.get("gpu", "h200"))
        except Exception as exc:  # noqa: BLE001 - record it and go on with the next job
            traceback.print_exc()
            result = {"name": job.name, "error": f"{type(exc).__name__}: {exc}"}
        doc["jobs"].append(result)
        _write(out, doc)
        if "wall_s" in result:
            pred = result["fleet"].get("seconds")
            if pred and pred >= MIN_RATIO_PREDICTION_S:  # a 0.1 s job's one-time costs say nothing of a long one's
                ratio = max(ratio, result["wall_s"] / pred)
            say(f"{model} {job.name}: {result['wall_s']:.1f} s, {result['output_tokens_per_s']:.0f} output tok/s, "
                f"fleet {pred or float('nan'):.1f} s; peak decoding {result['peak_decoding']}, "
                f"steps {result['peak_running_steps']}, preemptions {result['counters'].get('preemptions')}")
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001
        pass
    say(f"{model}: done, {out}")


if __name__ == "__main__":
    main(sys.argv[1])
