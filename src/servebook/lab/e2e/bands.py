"""Held-out residuals of the recorded GPU runs, per regime: what ``perf/data/error_bands.json`` holds.

Two sources, both on one H200 (vLLM 0.26.0):

* the step-timing sweeps (``labs/results/step_timing``): their points held out by the calibration's
  split rule (``calibration.json`` "split_rule"; :func:`servebook.perf.calibrate.points_of`), priced
  by the shipped coefficients against each point's recorded median; an MoE sweep counts only with
  uniform routing, as in the fit;
* the end-to-end jobs (``labs/results/e2e*/``), each job :func:`job_group`'s "held out": a record of
  a model no fit saw (``perf/data/e2e_split.json``, the records the calibration lists as sources, the
  models a term was designed after, :data:`SHAPED_A_TERM`), or, in a folder with a ``heldout.toml``, the
  group declared there before the jobs ran. Its job-level errors (fleet's default answer, its steady
  state alone, the simulator's replay) and its recorded steps priced one by one, summed per step kind
  and CUDA-graph regime (one error per job and regime, from at least :data:`MIN_STEPS` steps).

Repeats of one job (same config, job, seed, engine flags and routing) are averaged into one error,
never counted twice. An MoE job whose engine routed tokens by its random-weight router (not as the
step model prices them) is reported beside the bands, in none of them. Every error is ``measured /
predicted seconds - 1`` (:mod:`servebook.perf.error_bands`).
"""
from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path

from servebook.lab.e2e.analysis import _step_model, job_rows, routing
from servebook.perf.calibrate_steps import fitted_models, fitted_shape, recorded_steps, routes_as_priced
from servebook.perf.error_bands import band_of, model_kind, regime_key

#: The end-to-end folders; the first four are the jobs compared with fleet (the benchmark's tables;
#: e2e_issue39b holds the second declared held-out set, recorded after the MLA and fp8-KV terms were fitted,
#: e2e_issue39c the third, two dense models that shaped nothing, and e2e_gemma4_26b the first Gemma 4 job,
#: both recorded 2026-12-04).
FOLDERS = ("e2e", "e2e_issue39", "e2e_issue39b", "e2e_issue39c", "e2e_gemma4_26b", "e2e_attention", "e2e_repeat",
           "e2e_routing")
COMPARED_FOLDERS = FOLDERS[:5]
#: Models a term of the step model was designed after, having seen their error (labs/e2e_results.md;
#: labs/results/e2e_issue39/heldout.toml names them): their jobs count as fitted.
SHAPED_A_TERM = {"mixtral-8x7b": "the expert-width term was designed after its jobs' error",
                 "gpt-oss-20b": "the MXFP4 expert-rows term was designed after its jobs' error"}
#: Fewest recorded steps of one regime in a job for that job to give the regime an error.
MIN_STEPS = 10


def records(folder: str, directory: str | Path | None = None) -> list[tuple[Path, dict]]:
    """``(path, record)`` of every ``e2e_*.json`` in a results folder (none when the folder is absent)."""
    from servebook.records import results_dir

    base = results_dir(directory) / folder
    return [(p, json.loads(p.read_text())) for p in sorted(base.glob("e2e_*.json"))] if base.is_dir() else []


def declaration(folder: str, directory: str | Path | None = None) -> dict | None:
    """A folder's ``heldout.toml`` (written before its jobs ran), None when it has none."""
    from servebook.records import results_dir

    path = results_dir(directory) / folder / "heldout.toml"
    return tomllib.loads(path.read_text()) if path.exists() else None


def _calibration_sources() -> set[str]:
    """Files (``folder/name``) of every end-to-end record a calibration stage was fitted on."""
    from servebook.perf.model import load_calibration

    cal = load_calibration()
    files = [s["file"] for s in cal.get("sources", [])]
    for stage in ("stage0", "stage2", "stage3"):
        files += [s["file"] for s in (cal.get(stage) or {}).get("sources", [])]
    return {"/".join(Path(f).parts[-2:]) for f in files}


def job_group(path: Path, doc: dict, job: str, declared: dict | None, *, fitted: list[str],
              sources: set[str]) -> tuple[str, str]:
    """``(group, why)`` of one job: ``"held out"`` or ``"fitted"``, by the rules of the module docstring."""
    if declared is not None:
        # appended after the run: a declared held-out job whose model then shaped a term (heldout.toml's
        # [[regrouped]]; servebook.lab.e2e.analysis.declared_rows reads it the same way)
        for d in declared.get("regrouped", []):
            if d["record"] == path.stem and d["job"] == job:
                return d["group"], f"regrouped after the run ({path.parent.name}/heldout.toml): {d['why']}"
        for d in declared.get("job", []):
            if d["record"] == path.stem and d["job"] == job:
                return d["group"], f"declared before the run ({path.parent.name}/heldout.toml)"
    if fitted_shape(doc, fitted):
        return "fitted", "a model the step model is fitted on (perf/data/e2e_split.json)"
    if f"{path.parent.name}/{path.name}" in sources:
        return "fitted", "a calibration stage was fitted on this record (calibration.json sources)"
    shaped = [m for m in SHAPED_A_TERM if fitted_shape(doc, [m])]
    if shaped:
        return "fitted", SHAPED_A_TERM[shaped[0]]
    return "held out", "no fit saw this model"


def _repeat_key(doc: dict, job: dict) -> tuple:
    flags = doc["engine_args"]
    return (doc.get("config_sha256"), job["name"], job.get("seed"), flags.get("max_num_seqs"),
            flags.get("max_num_batched_tokens"), flags.get("kv_cache_dtype") or "auto",
            int(flags.get("tensor_parallel_size") or 1), routing(doc, True))


def step_errors(doc: dict, job: dict) -> dict[tuple[str, bool], dict]:
    """A job's recorded steps priced one by one, summed per ``(step kind, graph)``: ``steps``,
    ``measured_s``, ``predicted_s``, ``error`` (measured / predicted - 1). A step with a prefill chunk
    and decodes is ``mixed``, with chunks only ``prefill``; ``graph`` when it has at most the CUDA-graph
    size in tokens (full graph for a decode step, piecewise for one with a chunk), else eager."""
    from servebook.lab.e2e.analysis import _catalogue_gpu

    g, _ = _catalogue_gpu(doc, None)
    model = _step_model(doc, g)
    out: dict = {}
    for chunks, decodes, mean_context, measured in recorded_steps(job):
        tokens = decodes + sum(n for n, _, _ in chunks)
        kind = "decode" if not chunks else ("mixed" if decodes else "prefill")
        contexts = [max(1, round(mean_context))] * decodes if decodes else []
        acc = out.setdefault((kind, tokens <= model.cudagraph_max_tokens), [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += measured
        acc[2] += model.step_s(chunks, contexts)
    return {k: {"steps": n, "measured_s": m, "predicted_s": p, "error": m / p - 1}
            for k, (n, m, p) in out.items() if p > 0}


def sources(directory: str | Path | None = None, folders=COMPARED_FOLDERS) -> list[tuple[Path, dict, dict | None]]:
    """``(path, record, that folder's heldout.toml or None)`` for every record of ``folders``; for a
    ``directory`` that holds ``e2e_*.json`` files itself (a test's fixtures), those files."""
    from servebook.records import results_dir

    base = results_dir(directory)
    if directory is not None and not any((base / f).is_dir() for f in folders) and list(base.glob("e2e_*.json")):
        return [(p, json.loads(p.read_text()), None) for p in sorted(base.glob("e2e_*.json"))]
    return [(p, doc, declaration(f, directory)) for f in folders for p, doc in records(f, directory)]


def job_table(recorded: list[tuple[Path, dict, dict | None]] | None = None, *, gpu: str | None = None,
              fitted: list[str] | None = None) -> list[dict]:
    """Every recorded job (``recorded``: :func:`sources`, by default the folders compared with fleet):
    :func:`servebook.lab.e2e.analysis.job_rows`' row with fleet's DEFAULT answer (the job with its ramp and
    drain) as ``predicted_s`` and ``error`` (measured / predicted seconds - 1 = predicted / measured output
    tokens/s - 1), the steady state alone as ``steady_state_s``/``steady_state_error``, the simulator's
    replay as ``simulated_error``; its ``group`` and ``why`` (:func:`job_group`), ``kind``
    (:func:`servebook.perf.error_bands.model_kind`), ``routes_as_priced``, ``record`` and ``repeat_key``."""
    from servebook.hf_config import load_model_spec

    fitted = fitted_models() if fitted is None else fitted
    calibrated = _calibration_sources()
    rows = []
    for path, doc, declared in (sources() if recorded is None else recorded):
        spec = load_model_spec(doc["config"], name=doc["model_id"])
        for r in job_rows(doc, fitted=fitted, gpu=gpu, detail=True):
            job = next(j for j in doc["jobs"] if j["name"] == r["job"] and "wall_s" in j)
            group, why = job_group(path, doc, r["job"], declared, fitted=fitted, sources=calibrated)
            rows.append(r | {
                "record": f"{path.parent.name}/{path.stem}", "kind": model_kind(spec), "group": group, "why": why,
                "routes_as_priced": routes_as_priced(doc, spec),
                "steady_state_s": r["predicted_s"], "steady_state_error": r["error"],
                "steady_state_tps": r["predicted_tps"], "predicted_tps": r["measured_tps"] * r["measured_s"] / r["finite_s"],
                "predicted_s": r["finite_s"], "error": r["finite_error"],
                "simulated_error": r["measured_s"] / r["simulated_s"] - 1,
                "repeat_key": repr(_repeat_key(doc, job)), "tp": int(doc["engine_args"].get("tensor_parallel_size") or 1),
                "_doc": doc, "_job": job})
    return rows


def averaged(rows: list[dict], keys=("error", "steady_state_error", "simulated_error")) -> list[dict]:
    """Rows with repeats of one job (same ``repeat_key``) merged: errors averaged, ``repeats`` counted."""
    merged: dict = {}
    for r in rows:
        merged.setdefault(r["repeat_key"], []).append(r)
    out = []
    for same in merged.values():
        first = dict(same[0])
        for k in keys:
            first[k] = statistics.fmean(r[k] for r in same)
        first["repeats"] = len(same)
        first["records"] = [r["record"] for r in same]
        out.append(first)
    return out


def held_out_summary(rows: list[dict]) -> dict:
    """Held-out jobs that route as priced, repeats averaged: ``jobs``, ``median`` and ``mean`` |error|,
    ``worst`` (signed); and the same for those routed by a random-weight router (reported beside)."""
    def summ(rs):
        errs = [r["error"] for r in rs]
        if not errs:
            return {"jobs": 0, "median": None, "mean": None, "worst": None}
        return {"jobs": len(errs), "median": statistics.median(abs(e) for e in errs),
                "mean": statistics.fmean(abs(e) for e in errs), "worst": max(errs, key=abs)}

    held = averaged([r for r in rows if r["group"] == "held out"])
    return {"held out": summ([r for r in held if r["routes_as_priced"]]),
            "held out, random router (beside)": summ([r for r in held if not r["routes_as_priced"]])}


def _sweep_errors(directory: str | Path | None = None) -> tuple[list[dict], list, dict]:
    """The held-out step-timing points (the calibration's split rule) as dicts of kind, step kind, graph,
    TP and error: the point's recorded median / predicted seconds - 1 (the median of its repeats, not the
    fastest sample the fit uses: what a reader's engine takes); with every point and its ModelSpecs."""
    from servebook.perf.calibrate import load_measurements, predict_points
    from servebook.perf.model import calibrated_coefficients
    from servebook.records import results_dir

    points, specs = load_measurements(results_dir(directory) / "step_timing")
    out = []
    for gpu in sorted({p.gpu for p in points}):
        held = [p for p in points if p.gpu == gpu and p.heldout]
        coeffs, _ = calibrated_coefficients(gpu)
        for p, q in zip(held, predict_points(held, specs, gpu, coeffs)):
            tokens = p.batch if p.phase == "decode" else p.prompt_tokens
            out.append({"gpu": gpu, "model": p.model_id, "kind": model_kind(specs[p.model_id]), "step": p.phase,
                        "graph": tokens <= p.cudagraph_max_tokens, "tp": p.tp, "error": p.recorded_median_s / float(q) - 1,
                        "what": f"{p.model_id} {p.phase} " + (f"batch {p.batch} ctx {p.context_tokens:.0f}"
                                                              if p.phase == "decode" else f"{p.prompt_tokens} tokens")
                        + (f" tp{p.tp}" if p.tp > 1 else "")})
    return out, points, specs


def _envelope(points, specs, directory) -> dict:
    """What was measured per model kind (any record, fitted or held out): TP sizes of steps and of jobs,
    the longest context, the KV cache dtypes."""
    env: dict = {}

    def slot(kind):
        return env.setdefault(kind, {"step_tp": set(), "job_tp": set(), "max_context_tokens": 0.0,
                                     "kv_cache_dtypes": set()})

    for p in points:
        s = slot(model_kind(specs[p.model_id]))
        s["step_tp"].add(p.tp)
        s["kv_cache_dtypes"].add(p.kv_cache_dtype)
        s["max_context_tokens"] = max(s["max_context_tokens"], p.context_tokens if p.phase == "decode"
                                      else float(p.prompt_tokens))
    from servebook.hf_config import load_model_spec

    for folder in FOLDERS:
        for _, doc in records(folder, directory):
            s = slot(model_kind(load_model_spec(doc["config"], name=doc["model_id"])))
            tp = int(doc["engine_args"].get("tensor_parallel_size") or 1)
            s["job_tp"].add(tp)
            s["step_tp"].add(tp)
            s["kv_cache_dtypes"].add(doc["engine_args"].get("kv_cache_dtype") or "auto")
            for j in doc["jobs"]:
                cols = j.get("request_columns") or {}
                if "wall_s" in j and cols.get("prompt_tokens"):
                    s["max_context_tokens"] = max(s["max_context_tokens"], statistics.fmean(cols["prompt_tokens"])
                                                  + statistics.fmean(cols["output_tokens"]))
    return {k: {"step_tp": sorted(v["step_tp"]), "job_tp": sorted(v["job_tp"]),
                "max_context_tokens": round(v["max_context_tokens"]), "kv_cache_dtypes": sorted(v["kv_cache_dtypes"])}
            for k, v in sorted(env.items())}


def build(directory: str | Path | None = None) -> dict:
    """The whole ``error_bands.json`` document (see the module docstring)."""
    sweep, points, specs = _sweep_errors(directory)
    from servebook.perf.gpu import gpu_numbers

    rows = job_table(sources(directory, FOLDERS))
    gpus = {gpu_numbers(g).name for g in {p["gpu"] for p in sweep} | {r["gpu"] for r in rows}}
    if len(gpus) != 1:
        raise ValueError(f"the bands assume one GPU; the records name {sorted(gpus)}")
    held = [r for r in rows if r["group"] == "held out"]
    beside = [r for r in held if not r["routes_as_priced"]]
    priced = [r for r in held if r["routes_as_priced"]]
    # per regime: (errors, members, sources)
    acc: dict = {}

    def add(key, error, member, source, unit):
        a = acc.setdefault(key, {"errors": [], "members": [], "sources": {}, "unit": unit})
        a["errors"].append(error)
        a["members"].append(member)
        a["sources"][source] = a["sources"].get(source, 0) + 1

    for r in averaged(priced):
        member = f"{r['model']} {r['job']}" + (f" (x{r['repeats']} averaged)" if r["repeats"] > 1 else "")
        for prediction, key in (("job", "error"), ("steady_state", "steady_state_error"), ("simulated", "simulated_error")):
            add(regime_key(prediction, r["kind"], r["tp"]), r[key], member, "end-to-end jobs", "jobs")
    # steps of held-out jobs: one error per job (repeats averaged) and regime
    per_repeat: dict = {}
    for r in priced:
        for (step, graph), v in step_errors(r["_doc"], r["_job"]).items():
            if v["steps"] >= MIN_STEPS:
                key = regime_key("step", r["kind"], r["tp"], step, graph)
                per_repeat.setdefault((key, r["repeat_key"]), []).append((v["error"], f"{r['model']} {r['job']}"))
    for (key, _), got in sorted(per_repeat.items()):
        add(key, statistics.fmean(e for e, _ in got), got[0][1], "end-to-end jobs' steps (one per job)", "jobs' steps")
    for p in sweep:
        add(regime_key("step", p["kind"], p["tp"], p["step"], p["graph"]), p["error"], p["what"],
            "step-timing sweep points", "points")
    bands = {}
    for key in sorted(acc):
        a = acc[key]
        unit = a["unit"] if len(a["sources"]) == 1 else "points and jobs"
        bands[key] = band_of(a["errors"]) | {"unit": unit, "sources": dict(sorted(a["sources"].items())),
                                             "members": sorted(a["members"])}
    return {"schema": "servebook.error_bands/1",
            "what": "Held-out error bands of servebook's time predictions per regime, and what was measured per "
                    "model kind. Written by scripts/fit_error_bands.py from labs/results (servebook.lab.e2e.bands); "
                    "do not edit.",
            "error": "measured / predicted seconds - 1 (= predicted / measured rate - 1): positive = took longer",
            "band_rule": "p10/p90 (numpy linear) of the held-out errors with >= 5 of them, else min/max; repeats "
                         "of one job averaged; MoE jobs on their random-weight router reported beside, in no band",
            "gpu": gpus.pop(), "vllm_version": sorted({r["_doc"].get("vllm_version") for r in rows}),
            "calibration_split_rule": _split_rule(),
            "bands": bands,
            "beside": [{"member": f"{r['model']} {r['job']}", "kind": r["kind"], "error": round(r["error"], 4),
                        "why": "MoE on its random-weight router: tokens not routed as priced"}
                       for r in averaged(beside)],
            "measured": _envelope(points, specs, directory)}


def _split_rule() -> str:
    from servebook.perf.model import load_calibration

    return load_calibration().get("split_rule", "")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def table_rows(rows: list[dict]) -> list[dict]:
    """:func:`job_table`'s rows as the benchmark and the results page show them (one dict per job, column
    name -> text): fleet's default answer against the measurement, the steady state and the replay beside."""
    return [{"record": r["record"], "job": r["job"], "kind": r["kind"], "group": r["group"],
             "routing": "as priced" if r["routes_as_priced"] else "own router",
             "measured s": f"{r['measured_s']:.1f}", "fleet s": f"{r['predicted_s']:.1f}", "error": _pct(r["error"]),
             "steady-state s": f"{r['steady_state_s']:.1f}", "steady-state error": _pct(r["steady_state_error"]),
             "replay error": _pct(r["simulated_error"])} for r in rows]


def band_rows(doc: dict) -> list[dict]:
    """The bands file's regimes as table rows: regime, low, high, count, rule, sources."""
    return [{"regime": key, "low": _pct(b["lo"]), "high": _pct(b["hi"]), "count": b["count"], "rule": b["method"],
             "from": ", ".join(f"{n} {s}" for s, n in b["sources"].items())} for key, b in doc["bands"].items()]
