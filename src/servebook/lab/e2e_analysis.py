"""Recorded end-to-end jobs against ``servebook fleet``: predicted vs measured, and where the time went.

For every job of a ``servebook.e2e/1`` record (:mod:`servebook.lab.e2e_job`) :func:`job_rows` gives
fleet's prediction for the job's own lengths and engine flags next to what the engine did: wall time
and output tokens/s, and the *steady state* (:func:`steady_state`): the part of the job during which
the engine ran at least 90% of its peak batch, with its output tokens/s, mean step time and batch.
Comparing fleet with the whole job and with its steady state separates the two error sources a
finite job has: the ramp and the drain (outside the steady state) and the step time itself (inside).
:func:`summary` gives the mean absolute and worst error of a group of rows. Models are split into
those the fleet model is fitted on and those held out by ``perf/data/e2e_split.json``.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from servebook.errors import ServebookError

SPLIT_PATH = Path(__file__).resolve().parent.parent / "perf" / "data" / "e2e_split.json"
#: A step belongs to the steady state when its batch is at least this share of the job's peak batch.
STEADY_SHARE_OF_PEAK = 0.9


def fitted_models(path: str | Path | None = None) -> list[str]:
    """The models whose jobs the fleet model may be fitted on (the rest are held out)."""
    doc = json.loads(Path(path or SPLIT_PATH).read_text())
    if "fitted_on" not in doc:
        raise ServebookError(f"{path or SPLIT_PATH} lacks 'fitted_on' (a list of model ids)")
    return list(doc["fitted_on"])


def steady_state(job: dict, share: float = STEADY_SHARE_OF_PEAK) -> dict | None:
    """The steady part of a job: from the first to the last step whose batch is >= ``share`` x peak.

    The batch of a step is the requests it scheduled (decodes + prefill chunks). Output tokens in
    the window are its decode tokens plus the first tokens (``first_token_ts``) that fell in it.
    Returns ``start_s``, ``end_s``, ``share_of_wall``, ``steps``, ``mean_batch``, ``mean_step_s``,
    ``output_tokens_per_s``; None without a step log or with fewer than 3 steps in the window.
    """
    steps = job.get("steps")
    if not steps or not steps.get("t_s"):
        return None
    batch = [d + p for d, p in zip(steps["decodes"], steps["prefill_requests"])]
    peak = max(batch)
    inside = [i for i, b in enumerate(batch) if b >= share * peak]
    if len(inside) < 3:
        return None
    first, last = inside[0], inside[-1]
    t0, t1 = steps["t_s"][first], steps["t_s"][last]
    if t1 <= t0:
        return None
    decodes = sum(steps["decodes"][first:last])
    firsts = sum(1 for f in job["request_columns"].get("first_token_ts", []) if f is not None and t0 <= f < t1)
    return {"start_s": t0, "end_s": t1, "share_of_wall": (t1 - t0) / job["wall_s"], "steps": last - first,
            "mean_batch": statistics.fmean(batch[first:last]), "mean_step_s": (t1 - t0) / (last - first),
            "output_tokens_per_s": (decodes + firsts) / (t1 - t0)}


def _catalogue_gpu(doc: dict, gpu: str | None) -> tuple[str, str]:
    """(catalogue GPU to predict for, how it was chosen)."""
    if gpu:
        return gpu, "given"
    from servebook.lab.profiles import _catalogue_gpu as catalogue

    reported = (doc.get("gpu") or {}).get("name")
    try:
        return catalogue(reported), f"recorded ({reported})"
    except Exception:  # noqa: BLE001 - a CPU record: fleet has no CPU in its catalogue
        return "h200", f"assumed h200: recorded on {reported!r}, not a catalogue GPU"


def job_rows(doc: dict, *, fitted: list[str], gpu: str | None = None) -> list[dict]:
    """One row per measured job of a record: fleet's prediction, the measurement, the steady state."""
    from servebook.lab.e2e_plan import predict

    g, where = _catalogue_gpu(doc, gpu)
    rows = []
    for job in doc["jobs"]:
        if "wall_s" not in job:
            continue
        cols = job["request_columns"]
        pred = predict(doc["config"], cols["prompt_tokens"], cols["output_tokens"], doc["engine_args"], gpu=g)
        measured = job["output_tokens"] / job["wall_s"]
        steady = steady_state(job)
        row = {
            "model": doc["model_id"], "kind": doc.get("kind", ""), "job": job["name"],
            "group": "fitted" if doc["model_id"] in fitted else "held out", "gpu": g, "gpu_source": where,
            "vllm_version": doc.get("vllm_version"), "requests": job["requests"],
            "mean_input": statistics.fmean(cols["prompt_tokens"]), "mean_output": statistics.fmean(cols["output_tokens"]),
            "measured_s": job["wall_s"], "predicted_s": pred["seconds"],
            "measured_tps": measured, "predicted_tps": pred["output_tokens_per_s"],
            "error": pred["output_tokens_per_s"] / measured - 1,
            "fleet_batch": pred["batch"], "fleet_step_s": pred["step_s"], "peak_running": job.get("peak_running_steps"),
            "preemptions": (job.get("counters") or {}).get("preemptions"),
        }
        if steady:
            row.update(steady_share=steady["share_of_wall"], steady_tps=steady["output_tokens_per_s"],
                       steady_batch=steady["mean_batch"], steady_step_s=steady["mean_step_s"],
                       steady_error=pred["output_tokens_per_s"] / steady["output_tokens_per_s"] - 1)
        rows.append(row)
    return rows


def summary(rows: list[dict], key: str = "error") -> dict:
    """``{"jobs", "mae", "worst", "mean"}`` of ``key`` (relative errors) over ``rows`` that have it."""
    errs = [r[key] for r in rows if r.get(key) is not None]
    if not errs:
        return {"jobs": 0, "mae": None, "worst": None, "mean": None}
    return {"jobs": len(errs), "mae": statistics.fmean(abs(e) for e in errs),
            "worst": max(errs, key=abs), "mean": statistics.fmean(errs)}
