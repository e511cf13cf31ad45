"""Tables and a plot of Lab 7 (speculative decoding) from its ``measurements``.

Lab 7 (``labs/l7_speculative.md``) calls :func:`acceptance_rows` and :func:`step_rows` on what it
measured; the results page (``labs/recorded_results.md``) and the chapter call the same functions
on the recorded file (``labs/results/labs/l7_speculative_gpu.json``), so both print one table from
one code path.

* :func:`acceptance_rows` — acceptance per speculative config, from vLLM's spec-decode counters.
* :func:`speedup_rows` — measured speedup (wall-time ratio to the baseline at the same batch) next
  to the prediction the lab recorded (``servebook.perf.speculative.speculative_step``).
* :func:`step_rows` — milliseconds per engine step and its ratio to a plain step: why the measured
  speedup is what it is (speedup = tokens per sequence-step / step-cost ratio).
* :func:`engines_not_run` — the configs a runner's deadline stopped (``ok`` False).
* :func:`plot_l7` — speedup and step time against batch size (log2 x), axes with units.

Engine names are the lab's: ``"baseline"``, ``"ngram k=3"``, ``"draft k=2"``, ``"draft schedule"``.
"""
from __future__ import annotations

from servebook.lab.errors import LabError
from servebook.lab.recorded import figure_title

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
            :func:`servebook.lab.speculative_run.acceptance_summary` (counters summed over batch
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
    an n-gram (:func:`servebook.lab.speculative_run.sequence_steps`)."""
    from servebook.lab.speculative_run import sequence_steps

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
