"""Recorded end-to-end jobs against ``servebook fleet``: predicted vs measured, and where the time went.

For every job of a ``servebook.e2e/1`` record (:mod:`servebook.lab.e2e.job`) :func:`job_rows` gives
fleet's prediction for the job's own lengths and engine flags next to what the engine did: wall time
and output tokens/s, and the *steady state* (:func:`steady_state`): the part of the job during which
the engine ran at least 90% of its peak batch, with its output tokens/s, mean step time and batch.
Comparing fleet with the whole job and with its steady state separates the two error sources a
finite job has: the ramp and the drain (outside the steady state) and the step time itself (inside).
:func:`summary` gives the mean absolute and worst error of a group of rows. Models are split into
those the fleet model is fitted on and those held out by ``perf/data/e2e_split.json``.
"""
from __future__ import annotations

import statistics

from servebook.perf.calibrate_steps import fitted_models, fitted_shape, recorded_steps  # noqa: F401 (re-exported)
from servebook.vllm_rules.moe import ROUTING_SIMULATION_ENV, routes_uniformly  # noqa: F401 (the name: re-exported)

#: A step belongs to the steady state when its batch is at least this share of the job's peak batch.
STEADY_SHARE_OF_PEAK = 0.9


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
    from servebook.lab.harness.profiles import _catalogue_gpu as catalogue

    reported = (doc.get("gpu") or {}).get("name")
    try:
        return catalogue(reported), f"recorded ({reported})"
    except Exception:  # noqa: BLE001 - a CPU record: fleet has no CPU in its catalogue
        return "h200", f"assumed h200: recorded on {reported!r}, not a catalogue GPU"


def routing(doc: dict, moe: bool) -> str | None:
    """How the record's MoE layers routed tokens: ``"uniform (simulated)"``, ``"random router"`` (the
    model's own router on random weights), or None for a dense model."""
    if not moe:
        return None
    return "uniform (simulated)" if routes_uniformly(doc.get("environment")) else "random router"


def in_scope(row: dict) -> bool:
    """Whether a job ran what the step model describes: a dense model, or an MoE whose tokens were
    routed uniformly. A random router on random weights can send a batch's tokens to fewer experts than
    a trained, load-balanced router does (DeepSeek-V2-Lite's decode steps ran below the time uniform
    routing takes just to read its experts), so such jobs measure the test, not the model."""
    return row.get("routing") in (None, "uniform (simulated)")


def find_job_record(docs: list[dict], model_id: str, job_name: str) -> dict:
    """The record of ``model_id`` that holds a measured job ``job_name`` (a model can have several records)."""
    for doc in docs:
        if doc["model_id"] == model_id and any(j.get("name") == job_name and "wall_s" in j for j in doc["jobs"]):
            return doc
    from servebook.errors import ServebookError

    raise ServebookError(f"no record of {model_id!r} holds a measured job {job_name!r}")


def job_rows(doc: dict, *, fitted: list[str], gpu: str | None = None, detail: bool = True) -> list[dict]:
    """One row per measured job of a record: fleet's prediction, the measurement, the steady state.

    ``moe`` says whether the model's config has routed experts (from the config, not the plan's label);
    ``routing`` how its tokens were routed (:func:`routing`).

    With ``detail`` also ``servebook fleet --finite-job`` (``finite_s``, ``finite_error``: measured /
    predicted seconds - 1, i.e. predicted / measured output tokens/s - 1), the simulator's replay of
    the job's own requests (``simulated_s``, ``sim_error``: its
    output tokens/s / measured - 1) and the recorded steps priced by the step-time model
    (``step_error_decode``, ``step_error_mixed``, ``step_error``: predicted / measured step seconds
    - 1; ``outside_steps_s``).
    """
    from servebook.hf_config import load_model_spec
    from servebook.lab.e2e.plan import predict

    g, where = _catalogue_gpu(doc, gpu)
    moe = load_model_spec(doc["config"], name=doc["model_id"]).moe is not None
    group = "fitted" if fitted_shape(doc, fitted) else "held out"
    rows = []
    for job in doc["jobs"]:
        if "wall_s" not in job:
            continue
        cols = job["request_columns"]
        pred = predict(doc["config"], cols["prompt_tokens"], cols["output_tokens"], doc["engine_args"], gpu=g)
        measured = job["output_tokens"] / job["wall_s"]
        steady = steady_state(job)
        row = {
            "model": doc["model_id"], "kind": doc.get("kind", ""), "moe": moe, "routing": routing(doc, moe),
            "job": job["name"],
            "group": group, "gpu": g, "gpu_source": where,
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
        if detail:
            fin = finite_job(doc, job, gpu=g)
            row.update(finite_s=fin["seconds"], finite_error=job["wall_s"] / fin["seconds"] - 1)
            sim = simulated(doc, job, gpu=g)
            row.update(simulated_s=sim["seconds"], simulated_tps=sim["output_tokens_per_s"],
                       sim_error=sim["output_tokens_per_s"] / measured - 1, sim_mean_running=sim["mean_running"])
            priced = priced_steps(doc, job, gpu=g)
            if priced:
                row.update(step_error=priced["all"]["error"], step_error_decode=priced["decode"]["error"],
                           step_error_mixed=priced["mixed"]["error"], outside_steps_s=priced["outside_steps_s"],
                           steps_by_batch=priced["by_batch"], mixed_share=priced["mixed"]["measured_s"]
                           / max(priced["all"]["measured_s"], 1e-12))
        rows.append(row)
    return rows


def large_batch_decode_gap(row: dict, more_than: int = 64) -> float | None:
    """Measured / predicted seconds - 1 over a row's decode-only steps of more than ``more_than``
    requests (:func:`priced_steps`' batch buckets above it); None when it has none."""
    buckets = [v for b, v in (row.get("steps_by_batch") or {}).items() if b > more_than and v["steps"]]
    predicted = sum(v["predicted_s"] for v in buckets)
    return sum(v["measured_s"] for v in buckets) / predicted - 1 if predicted > 0 else None


def summary(rows: list[dict], key: str = "error") -> dict:
    """``{"jobs", "mae", "worst", "mean"}`` of ``key`` (relative errors) over ``rows`` that have it."""
    errs = [r[key] for r in rows if r.get(key) is not None]
    if not errs:
        return {"jobs": 0, "mae": None, "worst": None, "mean": None}
    return {"jobs": len(errs), "mae": statistics.fmean(abs(e) for e in errs),
            "worst": max(errs, key=abs), "mean": statistics.fmean(errs)}


def finite_job(doc: dict, job: dict, *, gpu: str | None = None) -> dict:
    """``servebook fleet --finite-job`` for the job: fleet's steady state plus the simulated ramp and drain.

    The job's own lengths enter as in :func:`servebook.lab.e2e.plan.predict`: 64 quantiles for the steady
    state, all of them for the replay (64 quantiles there, as before 2026-12-03, left out the job's
    longest requests, which set its drain).
    """
    from servebook.hf_config import load_model_spec
    from servebook.simulator.finite_job import finite_job_seconds
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients

    g, _ = _catalogue_gpu(doc, gpu)
    numbers = gpu_numbers(g)
    coeffs, _ = calibrated_coefficients(numbers.name)
    flags, cols = doc["engine_args"], job["request_columns"]
    work = Workload(len(cols["prompt_tokens"]), LengthDistribution.of_job(cols["prompt_tokens"]),
                    LengthDistribution.of_job(cols["output_tokens"]))
    d = Deployment.of(load_model_spec(doc["config"], name=doc["model_id"]), gpu=numbers, gpus=1, name=doc["model_id"],
                      max_num_seqs=int(flags["max_num_seqs"]), max_num_batched_tokens=int(flags["max_num_batched_tokens"]),
                      gpu_memory_utilization=float(flags["gpu_memory_utilization"]),
                      kv_cache_dtype=flags.get("kv_cache_dtype") or "auto",
                      max_model_len=_paired_limit(flags, cols))
    return finite_job_seconds(work, d, coeffs)


def _paired_limit(flags: dict, cols: dict) -> int | None:
    """The engine's ``max_model_len``, raised to the longest prompt plus the longest output of the job
    when fleet's independent lengths pair them (the job itself shortened each prompt to fit its own
    output, so no real request was longer than the engine's limit)."""
    if not flags.get("max_model_len"):
        return None
    return max(int(flags["max_model_len"]), max(cols["prompt_tokens"]) + max(cols["output_tokens"]))


def _step_model(doc: dict, gpu: str):
    from servebook.hf_config import load_model_spec
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.model import calibrated_coefficients
    from servebook.simulator.step_time import perf_step_time
    from servebook.vllm_rules import cudagraph_max_tokens

    flags = doc["engine_args"]
    g = gpu_numbers(gpu)
    coeffs, _ = calibrated_coefficients(g.name)
    spec = load_model_spec(doc["config"], name=doc["model_id"])
    return perf_step_time(spec, g, coeffs, kv_cache_dtype=flags.get("kv_cache_dtype") or "auto",
                          cudagraph_max_tokens=cudagraph_max_tokens(int(flags["max_num_seqs"]),
                                                                    int(flags["max_num_batched_tokens"]),
                                                                    architecture=spec.architecture))


def priced_steps(doc: dict, job: dict, *, gpu: str | None = None) -> dict | None:
    """The job's recorded steps priced one by one by the step-time model, against their measured times.

    A step's measured time is the interval from its scheduling to the next step's (the last step has
    none). Its content is what the engine scheduled: each prefill chunk (tokens, tokens computed
    before, whether it ends its prompt) and the decoding requests, each at the step's mean decode
    context. Returns per group (``decode`` steps without prefill, ``mixed`` steps) the steps, the
    measured and predicted seconds and ``error`` (predicted / measured - 1), ``by_batch`` (decode
    steps in batch buckets), and ``outside_steps_s`` (job wall time before the first and after the
    last step's scheduling). None without a step log that has decode contexts.
    """
    steps = list(recorded_steps(job))
    if not steps:
        return None
    g, _ = _catalogue_gpu(doc, gpu)
    model = _step_model(doc, g)
    t = job["steps"]["t_s"]
    groups: dict = {"decode": [0, 0.0, 0.0], "mixed": [0, 0.0, 0.0]}
    buckets: dict = {}
    for chunks, decodes, mean_context, measured in steps:
        contexts = [max(1, round(mean_context))] * decodes if decodes else []
        predicted = model.step_s(chunks, contexts)
        key = "mixed" if chunks else "decode"
        groups[key][0] += 1
        groups[key][1] += measured
        groups[key][2] += predicted
        if key == "decode":
            b = min(256, 1 << max(0, (decodes - 1).bit_length()))  # 1, 2, 4, ... 256
            acc = buckets.setdefault(b, [0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += measured
            acc[2] += predicted

    def pack(n, meas, pred):
        return {"steps": n, "measured_s": meas, "predicted_s": pred, "error": pred / meas - 1 if meas > 0 else None}

    out = {k: pack(*v) for k, v in groups.items()}
    out["all"] = pack(groups["decode"][0] + groups["mixed"][0], groups["decode"][1] + groups["mixed"][1],
                      groups["decode"][2] + groups["mixed"][2])
    out["by_batch"] = {b: pack(*v) for b, v in sorted(buckets.items())}
    out["outside_steps_s"] = t[0] + (job["wall_s"] - t[-1])
    return out


def simulated(doc: dict, job: dict, *, gpu: str | None = None) -> dict:
    """The job replayed by servebook's scheduler simulator with the step-time model: every request at t=0.

    The KV pool is the engine's own (the start-up log's KV cache tokens, in 16-token blocks) when
    recorded, else the memory model's. Returns ``seconds`` (makespan), ``output_tokens_per_s`` and ``mean_running``.
    """
    from servebook.simulator import SchedulerConfig, simulate
    from servebook.simulator.workload import RequestSpec

    g, _ = _catalogue_gpu(doc, gpu)
    flags = doc["engine_args"]
    tokens = ((doc.get("startup") or {}).get("parsed") or {}).get("kv_cache_tokens")
    if tokens:
        blocks = int(tokens) // 16
    else:
        from servebook.simulator.sizing import planned_num_blocks

        blocks = planned_num_blocks(doc["model_id"], g, max_model_len=int(flags["max_model_len"]),
                                    max_num_batched_tokens=int(flags["max_num_batched_tokens"]),
                                    gpu_memory_utilization=float(flags["gpu_memory_utilization"]))
    cols = job["request_columns"]
    requests = [RequestSpec(f"r{i}", p, o) for i, (p, o) in enumerate(zip(cols["prompt_tokens"], cols["output_tokens"]))]
    config = SchedulerConfig(num_blocks=int(blocks), max_num_seqs=int(flags["max_num_seqs"]),
                             max_num_batched_tokens=int(flags["max_num_batched_tokens"]),
                             max_model_len=int(flags["max_model_len"]))
    s = simulate(requests, config, _step_model(doc, g)).summary()
    return {"seconds": s["makespan_s"], "output_tokens_per_s": s["output_tokens_per_s"], "mean_running": s["mean_running"],
            "preemptions": s["preemptions"]}


def decode_step_medians(job: dict, batches=(8, 16, 32, 64, 128, 256), tolerance: float = 0.1) -> dict[int, float]:
    """Median measured seconds of the job's decode-only steps near each batch size.

    A step counts for batch ``b`` when it carried no prefill chunk and ran within ``tolerance`` (a
    fraction) of ``b`` decoding requests; its time is the interval to the next step's scheduling.
    Batches with no such step are left out.
    """
    steps = job.get("steps") or {}
    t, decodes, prefills = steps.get("t_s") or [], steps.get("decodes") or [], steps.get("prefills") or []
    found: dict[int, list[float]] = {}
    for k in range(len(t) - 1):
        if prefills[k] or not decodes[k]:
            continue
        for b in batches:
            if abs(decodes[k] - b) <= tolerance * b:
                found.setdefault(b, []).append(t[k + 1] - t[k])
    return {b: statistics.median(v) for b, v in sorted(found.items())}


def uniform_routing_floor_s(spec, gpu, batch: int) -> float:
    """Least seconds a decode step of ``batch`` requests can take on ``gpu`` if MoE routing is uniform.

    The weights it must read (the dense ones, plus the routed experts ``batch`` tokens touch when each
    picks its top-k experts uniformly at random: :func:`servebook.perf.work.expected_distinct_experts`)
    over the GPU's peak HBM bandwidth, with no compute and no KV read. A measured step below it read
    fewer experts than uniform routing touches.
    """
    from servebook.perf.gpu import gpu_numbers
    from servebook.perf.work import dense_weight_bytes_read, expert_weight_bytes_read

    weight_bytes = dense_weight_bytes_read(spec, 1) + float(expert_weight_bytes_read(spec, float(batch), 1))
    return weight_bytes / gpu_numbers(gpu).hbm_bandwidth_bytes_per_s


def step_size_first_costs(doc: dict, graph_max: int) -> dict:
    """One-time cost per step size: a record whose timed job repeats its warm-up job's very requests.

    Steps larger than ``graph_max`` tokens (eager) other than the full token budget are split into
    the warm-up's, the timed job's of a size the warm-up already ran ("seen") and of a size it did
    not ("new"). Returns per group the number of steps and their median seconds.
    """
    budget = int(doc["engine_args"]["max_num_batched_tokens"])
    warm = next(w for w in doc.get("warm_up_jobs", []) if w.get("steps"))
    timed = next(j for j in doc["jobs"] if j["name"] == warm["name"] and j.get("seed") == warm.get("seed"))

    def odd_steps(steps):
        t = steps["t_s"]
        return [(steps["total_tokens"][k], t[k + 1] - t[k]) for k in range(len(t) - 1)
                if graph_max < steps["total_tokens"][k] < budget]

    warm_steps = odd_steps(warm["steps"])
    sizes = set(warm["steps"]["total_tokens"])
    timed_steps = odd_steps(timed["steps"])
    groups = {"warm_up": [s for _, s in warm_steps],
              "seen": [s for n, s in timed_steps if n in sizes],
              "new": [s for n, s in timed_steps if n not in sizes]}
    return {k: {"steps": len(v), "median_s": statistics.median(v) if v else None} for k, v in groups.items()} | {
        "job": timed["name"], "warm_up_s": warm["wall_s"], "timed_s": timed["wall_s"]}


def graph_regime_medians(doc: dict, job: dict, graph_max: int, *, min_decodes: int = 192,
                         eager_max_tokens: int = 2048) -> dict:
    """Median measured seconds of a job's steps in the three CUDA-graph regimes, with many decodes running.

    Steps with at least ``min_decodes`` decoding requests: ``full_graph`` (decode only, at most
    ``graph_max`` tokens), ``piecewise`` (a prefill chunk beside them, at most ``graph_max`` tokens)
    and ``eager`` (a prefill chunk, ``graph_max`` < tokens <= ``eager_max_tokens``). Each entry gives
    ``steps``, ``median_s`` (None without steps) and ``median_tokens``.
    """
    groups: dict = {"full_graph": [], "piecewise": [], "eager": []}
    for chunks, decodes, _ctx, measured in recorded_steps(job):
        tokens = decodes + sum(n for n, _, _ in chunks)
        if decodes < min_decodes:
            continue
        if not chunks and tokens <= graph_max:
            groups["full_graph"].append((measured, tokens))
        elif chunks and tokens <= graph_max:
            groups["piecewise"].append((measured, tokens))
        elif chunks and tokens <= eager_max_tokens:
            groups["eager"].append((measured, tokens))
    return {k: {"steps": len(v), "median_s": statistics.median(s for s, _ in v) if v else None,
                "median_tokens": statistics.median(t for _, t in v) if v else None} for k, v in groups.items()}


def declared_rows(declaration: dict, docs: list[dict], *, gpu: str | None = None) -> list[dict]:
    """Every job a held-out declaration lists, priced as a reader would price it, with the declared groups.

    ``declaration``: a ``heldout.toml`` read with :mod:`tomllib` (``[[job]]`` tables naming ``record``
    (the file stem), ``job``, ``group`` and ``strict_group``, written before the jobs ran); ``docs``: the
    records (:func:`servebook.records.e2e_results`). The prediction is ``servebook fleet``'s default
    answer, the job with its ramp and drain (``error``: predicted / measured output tokens/s - 1); the
    steady state alone (``servebook fleet --steady-state``) is ``steady_error``. A declared job without
    its record gets ``recorded`` False and no errors: it is reported, never dropped.

    ``group`` and ``strict_group`` are the groups now: a declaration is only ever appended to, and a job
    declared held out whose model later shaped a term is named by an appended ``[[regrouped]]`` table
    (``record``, ``job``, ``group``, ``strict_group``, ``why``); ``declared_group`` and
    ``declared_strict_group`` keep what was declared before the run, ``regrouped_why`` says why.
    """
    by_record = {f"e2e_{d['model_id']}": d for d in docs}
    regrouped = {(r["record"], r["job"]): r for r in declaration.get("regrouped", [])}
    rows, priced = [], {}
    for declared in declaration["job"]:
        doc = by_record.get(declared["record"])
        now = regrouped.get((declared["record"], declared["job"]), declared)
        row = {"record": declared["record"], "model": declared["model"], "kind": declared.get("kind", ""),
               "job": declared["job"], "group": now["group"], "strict_group": now["strict_group"],
               "declared_group": declared["group"], "declared_strict_group": declared["strict_group"],
               "regrouped_why": now.get("why") if now is not declared else None,
               "recorded": False, "error": None, "steady_error": None}
        if doc is not None:
            row["kv_cache_dtype"] = doc["engine_args"].get("kv_cache_dtype") or "auto"
            if declared["record"] not in priced:
                priced[declared["record"]] = {r["job"]: r for r in job_rows(doc, fitted=[], gpu=gpu, detail=True)}
            measured = priced[declared["record"]].get(declared["job"])
            if measured is not None:
                row.update(recorded=True, measured_s=measured["measured_s"], predicted_s=measured["finite_s"],
                           measured_tps=measured["measured_tps"], error=measured["finite_error"],
                           steady_error=measured["error"], preemptions=measured["preemptions"],
                           peak_running=measured["peak_running"])
        rows.append(row)
    return rows


def read_declaration(folder: str) -> tuple[dict, list[dict]]:
    """``(declaration, records)`` of a results folder holding a ``heldout.toml``: the declaration read with
    :mod:`tomllib` and the folder's end-to-end records (none yet: an empty list, every job then reported
    as not recorded)."""
    import tomllib

    from servebook.records import e2e_results, results_path

    declaration = tomllib.loads(results_path(folder, "heldout.toml").read_text())
    try:
        docs = e2e_results(folder=folder)
    except FileNotFoundError:
        docs = []
    return declaration, docs


def declared_summary(rows: list[dict], *, strict: bool = False, key: str = "error") -> dict:
    """``{"jobs", "median", "mae", "mean", "worst"}`` of ``key`` over the held-out rows of
    :func:`declared_rows` (``strict``: under the declaration's stricter reading), relative errors."""
    group = "strict_group" if strict else "group"
    errs = [r[key] for r in rows if r[group] == "held out" and r.get(key) is not None]
    if not errs:
        return {"jobs": 0, "median": None, "mae": None, "mean": None, "worst": None}
    return {"jobs": len(errs), "median": statistics.median(abs(e) for e in errs),
            "mae": statistics.fmean(abs(e) for e in errs), "mean": statistics.fmean(errs),
            "worst": max(errs, key=abs)}


#: The step regimes :func:`step_regimes` sorts a job's steps into (vLLM 0.26.0's CUDA-graph rule: a step of
#: at most the largest captured size replays a graph, full when it only decodes, piecewise when it carries a
#: prefill chunk; a larger step runs eagerly).
STEP_REGIMES = ("decode, graph", "decode, eager", "mixed, piecewise graph", "mixed, eager, prefill <= 8k",
                "mixed, eager, prefill > 8k")


def step_regimes(doc: dict, job: dict, *, gpu: str | None = None) -> dict[str, dict]:
    """A job's recorded steps priced one by one (as :func:`priced_steps`), summed by regime
    (:data:`STEP_REGIMES`): ``{regime: {"steps", "measured_s", "predicted_s", "error", "median_error"}}``
    (``error``: predicted / measured seconds - 1 over the regime's steps; ``median_error``: the median
    step's). Regimes without steps are left out; {} for a job without a step log."""
    from servebook.hf_config import load_model_spec
    from servebook.vllm_rules import cudagraph_max_tokens

    steps = list(recorded_steps(job))
    if not steps:
        return {}
    g, _ = _catalogue_gpu(doc, gpu)
    model = _step_model(doc, g)
    spec = load_model_spec(doc["config"], name=doc["model_id"])
    flags = doc["engine_args"]
    graph = cudagraph_max_tokens(int(flags["max_num_seqs"]), int(flags["max_num_batched_tokens"]),
                                 enforce_eager=bool(flags.get("enforce_eager")), architecture=spec.architecture)
    acc: dict[str, list] = {}
    for chunks, decodes, mean_context, measured in steps:
        prefill = sum(n for n, _, _ in chunks)
        if not chunks:
            regime = STEP_REGIMES[0] if decodes <= graph else STEP_REGIMES[1]
        elif decodes + prefill <= graph:
            regime = STEP_REGIMES[2]
        else:
            regime = STEP_REGIMES[3] if prefill <= 8192 else STEP_REGIMES[4]
        predicted = model.step_s(chunks, [max(1, round(mean_context))] * decodes if decodes else [])
        acc.setdefault(regime, []).append((measured, predicted))
    out = {}
    for regime in STEP_REGIMES:
        if regime in acc:
            pairs = acc[regime]
            m, p = sum(a for a, _ in pairs), sum(b for _, b in pairs)
            out[regime] = {"steps": len(pairs), "measured_s": m, "predicted_s": p, "error": p / m - 1,
                           "median_error": statistics.median(b / a - 1 for a, b in pairs if a > 0)}
    return out
