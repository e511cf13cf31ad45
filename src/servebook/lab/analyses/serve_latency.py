"""Predicted vs measured latency of ``vllm serve`` under Poisson load (issue 37's H200 runs).

Each recorded run (``servebook.records.serve_latency_results``) is one rate on one server; the
prediction is :func:`servebook.simulator.online.predict_latency` on the plan of that server's flags,
for the workload as declared (rate, lengths uniform in [L/2, 3L/2]) and as many requests as the run
sent. Measured figures use ``vllm bench serve``'s definitions on the run's per-request rows.

The serving path (:class:`~servebook.simulator.online.ServingPath`) is measured on the fitted
model's lightest runs only (:func:`fit_serving_path`), where no request waits for another, so the
gap between measured and predicted TTFT is what the API server adds; the held-out runs then show
what it buys (:func:`ablation`).
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.reductions import percentile
from servebook.simulator.online import OnlineWorkload, ServingPath

METRICS = ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
#: Issue 37's goal on held-out runs: |error| within this fraction.
GOAL = {"ttft_p50": 0.15, "tpot_p50": 0.15, "ttft_p90": 0.25, "tpot_p90": 0.25}
#: How many of the fitted model's lightest rates measure the serving path.
FIT_RATES = 2


@dataclass(frozen=True)
class RunRow:
    """One run: measured and predicted seconds per metric, and the error (predicted / measured - 1)."""

    server: str
    model: str
    group: str
    rate: float
    num_prompts: int
    measured: dict[str, float]
    predicted: dict[str, float]
    engine: dict[str, float]

    @property
    def error(self) -> dict[str, float]:
        return {m: self.predicted[m] / self.measured[m] - 1.0 for m in METRICS}

    def within_goal(self) -> dict[str, bool]:
        return {m: abs(e) <= GOAL[m] for m, e in self.error.items()}


def measured_figures(run: dict) -> dict[str, float]:
    """TTFT and TPOT percentiles (seconds) of one run's requests, as vllm bench serve defines them."""
    reqs = run["requests"]
    ttft = [r["ttft_s"] for r in reqs]
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["output_len"] - 1) for r in reqs if r["output_len"] > 1]
    return {"ttft_p50": percentile(ttft, 50), "ttft_p90": percentile(ttft, 90),
            "tpot_p50": percentile(tpot, 50), "tpot_p90": percentile(tpot, 90)}


def engine_means(run: dict) -> dict[str, float]:
    """The engine's own means over the run from ``/metrics`` (seconds): TTFT, queue, prefill, ITL."""
    before, after = run["metrics_before"], run["metrics_after"]

    def mean(name: str) -> float:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        return total / count if count else float("nan")

    return {"ttft": mean("vllm:time_to_first_token_seconds"), "queue": mean("vllm:request_queue_time_seconds"),
            "prefill": mean("vllm:request_prefill_time_seconds"), "itl": mean("vllm:inter_token_latency_seconds")}


def workload_of(doc: dict, run: dict) -> OnlineWorkload:
    w = doc["workload"]
    return OnlineWorkload(run["rate"], w["input_len"], w["output_len"], range_ratio=w["range_ratio"],
                          burstiness=w.get("burstiness", 1.0), num_requests=run["num_prompts"])


def plan_of(doc: dict):
    """The plan of the server's flags (vllm serve's defaults otherwise) on an H200, by the rules of the
    release the run was recorded on."""
    from servebook.hf_config import load_model_spec
    from servebook.plan import make_plan

    flags = doc["engine_flags"]
    spec = load_model_spec(doc["config_json"], name=doc["model"])
    return make_plan(spec, gpu="h200", max_model_len=flags["max_model_len"],
                     kv_cache_dtype=flags.get("kv_cache_dtype", "auto"),
                     gpu_memory_utilization=flags.get("gpu_memory_utilization", 0.9), usage_context="serve",
                     max_num_seqs=flags.get("max_num_seqs"), max_num_batched_tokens=flags.get("max_num_batched_tokens"),
                     vllm_version=doc["vllm_version"])   # the rules of the release the run was recorded on


def rows(docs: list[dict], serving_path: ServingPath | None = None) -> list[RunRow]:
    """Every run of every record, predicted with ``serving_path`` (default: the measured one)."""
    from servebook.simulator.online import measured_serving_path, predict_from_requests, replica_engine

    path = serving_path if serving_path is not None else measured_serving_path("h200")
    out = []
    for doc in docs:
        plan = plan_of(doc)
        config, step, _ = replica_engine(plan)
        group = doc["declaration"].get("groups", {}).get(doc["name"], "undeclared")
        for run in doc["runs"]:
            p = predict_from_requests(workload_of(doc, run).requests(), config, step, serving_path=path)
            predicted = {"ttft_p50": p.ttft_s[50], "ttft_p90": p.ttft_s[90],
                         "tpot_p50": p.tpot_s[50], "tpot_p90": p.tpot_s[90]}
            out.append(RunRow(doc["name"], doc["model"], group, run["rate"], run["num_prompts"],
                              measured_figures(run), predicted, engine_means(run)))
    return out


def fit_serving_path(docs: list[dict]) -> ServingPath:
    """The serving path measured on the fitted model's :data:`FIT_RATES` lightest runs.

    ``ttft_s``: the median of measured - predicted TTFT p50 over those runs (engine times alone);
    ``tpot_s``: the same for TPOT p50, floored at 0 (a path cannot make tokens faster). Both have a
    physical sign: the API server only adds time.
    """
    from statistics import median

    fitted = [d for d in docs if d["declaration"].get("groups", {}).get(d["name"]) == "fitted"]
    if not fitted:
        raise ValueError("no record is declared 'fitted': nothing to measure the serving path on")
    base = rows(fitted, ServingPath())
    chosen = []
    for name in sorted({r.server for r in base}):
        chosen += sorted((r for r in base if r.server == name), key=lambda r: r.rate)[:FIT_RATES]
    ttft = median(r.measured["ttft_p50"] - r.predicted["ttft_p50"] for r in chosen)
    tpot = median(r.measured["tpot_p50"] - r.predicted["tpot_p50"] for r in chosen)
    where = ", ".join(f"{r.server} at {r.rate:g}/s" for r in chosen)
    return ServingPath(ttft_s=max(0.0, ttft), tpot_s=max(0.0, tpot),
                       source=f"measured on vLLM 0.26.0 + one H200 ({where}): measured - predicted, median")


def summary(rs: list[RunRow], group: str = "held out") -> dict[str, dict]:
    """Per metric over the group's runs: count, within goal, median |error|, worst error."""
    from statistics import median

    chosen = [r for r in rs if r.group == group]
    out = {}
    for m in METRICS:
        errs = [r.error[m] for r in chosen]
        if not errs:
            continue
        out[m] = {"runs": len(errs), "within_goal": sum(abs(e) <= GOAL[m] for e in errs),
                  "median_abs": median(abs(e) for e in errs), "worst": max(errs, key=abs)}
    return out


def ablation(docs: list[dict], path: ServingPath) -> dict[str, dict]:
    """Held-out summaries with and without the serving path: what the measured term buys."""
    return {"without": summary(rows(docs, ServingPath())), "with": summary(rows(docs, path))}


def target_sets(docs: list[dict]) -> list[dict]:
    """Each declared target set with the measured run of its pick: does the pick meet the targets?"""
    by_name = {d["name"]: d for d in docs}
    declaration = docs[0]["declaration"] if docs else {}
    out = []
    for t in declaration.get("target_set", []):
        pick = t["pick"]
        doc = by_name.get(pick["server"])
        run = None if doc is None else min(doc["runs"], key=lambda r: abs(r["rate"] - pick["rate_per_replica"]),
                                           default=None)
        row = {"id": t["id"], "model": t["model"], "rate": t["rate"], "percentile": t["percentile"],
               "ttft_s": t["ttft_s"], "tpot_s": t["tpot_s"], "pick": pick, "measured": None, "meets": None}
        if run is not None and abs(run["rate"] - pick["rate_per_replica"]) < 1e-6:
            m = measured_figures(run) if t["percentile"] in (50, 90) else {}
            q = t["percentile"]
            got = {"ttft": m[f"ttft_p{q}"], "tpot": m[f"tpot_p{q}"]}
            row.update(measured=got, meets=got["ttft"] <= t["ttft_s"] and got["tpot"] <= t["tpot_s"])
        out.append(row)
    return out


def predicted_curve(doc: dict, rates: list[float], num_requests: int = 300) -> list[dict]:
    """The model's TTFT/TPOT p50 and output tokens/s at each rate for one server (seconds, tokens/s)."""
    from servebook.simulator.online import predict_latency

    plan = plan_of(doc)
    w = doc["workload"]
    out = []
    for rate in rates:
        p = predict_latency(plan, OnlineWorkload(rate, w["input_len"], w["output_len"], range_ratio=w["range_ratio"],
                                                 num_requests=num_requests))
        out.append({"rate": rate, "ttft_p50": p.ttft_s[50], "tpot_p50": p.tpot_s[50],
                    "output_tokens_per_s": p.output_tokens_per_s, "saturated": p.saturated})
    return out


def plot_latency_throughput(docs: list[dict], rs: list[RunRow]):
    """Measured (markers) and predicted (lines) TTFT and TPOT p50 against measured output tokens/s."""
    import matplotlib.pyplot as plt

    from servebook.figure_style import page_style

    with page_style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(8.0, 3.6))
        for i, doc in enumerate(docs):
            color = f"C{i}"
            runs = [r for r in rs if r.server == doc["name"]]
            measured_tput = [run["summary"]["output_throughput"] for run in doc["runs"]]
            top = max(run["rate"] for run in doc["runs"])
            curve = predicted_curve(doc, [top * f for f in (0.05, 0.15, 0.3, 0.45, 0.6, 0.7, 0.8, 0.9, 1.0)])
            curve = [c for c in curve if not c["saturated"]]
            for ax, key in ((a, "ttft_p50"), (b, "tpot_p50")):
                ax.plot([c["output_tokens_per_s"] for c in curve], [c[key] * 1e3 for c in curve], "-", color=color,
                        lw=1.2, label=f"{doc['name']} ({runs[0].group})" if ax is a else None)
                ax.plot(measured_tput, [r.measured[key] * 1e3 for r in runs], "o", color=color, ms=4)
        a.set_yscale("log")
        a.set_ylabel("TTFT p50, ms (log scale)")
        b.set_ylabel("TPOT p50, ms")
        for ax in (a, b):
            ax.set_xlabel("output tokens/s (one H200)")
        a.legend(fontsize=7, loc="upper left")
        fig.suptitle("vllm serve on one H200 (vLLM 0.26.0): measured (dots) vs servebook (lines)", fontsize=9)
        fig.tight_layout()
    return fig


def run_table(rs: list[RunRow]) -> list[dict]:
    """One row per run: measured and predicted p50/p90 in ms, and the error."""
    out = []
    for r in rs:
        row = {"server": r.server, "group": r.group, "rate/s": f"{r.rate:g}"}
        for m in METRICS:
            row[m.replace("_", " ")] = f"{r.measured[m] * 1e3:.1f} / {r.predicted[m] * 1e3:.1f} ({r.error[m]:+.0%})"
        out.append(row)
    return out
