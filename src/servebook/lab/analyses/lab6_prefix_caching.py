"""Lab 6, prefix caching: the engine's hit counters against the block rule's prediction.

``labs/l6_prefix_caching.md`` prints :func:`l6_serving_table` and :func:`l6_offline_table` on what it
is about to save; the results page (``labs/results_l6.md``) and section 6.12 call them on the recorded
file; :func:`plot_l6` draws them. The prediction itself is :mod:`servebook.lab.harness.prefix`.
TTFT is milliseconds, throughput output tokens per second, wall time seconds.
"""
from __future__ import annotations

from servebook.lab.recordings.recorded import figure_title
from servebook.lab.harness.table import ratio


def l6_serving_table(measurements: dict) -> list[dict]:
    """Lab 6 serving workloads: engine counters against the prediction, TTFT and throughput.

    One row per workload and caching setting; hit rate = ``vllm:prefix_cache_hits`` over
    ``vllm:prefix_cache_queries`` (deltas over the workload), None when nothing was queried.
    """
    rows = []
    for name, pred in measurements["predicted"].items():
        for caching in ("on", "off"):
            r = measurements["engines"][caching]["workloads"][name]
            s = r["summary"]
            rows.append({"workload": name, "caching": caching, "queried tokens": r["queries"],
                         "hit tokens": r["hits"],
                         "hit rate": ratio(r["hits"], r["queries"]),
                         "predicted hit rate": pred["hit_rate"] if caching == "on" else 0.0,
                         "mean TTFT ms": s["mean_ttft_ms"], "p99 TTFT ms": s["p99_ttft_ms"],
                         "output tok/s": s["output_throughput"]})
    return rows


def l6_offline_table(measurements: dict) -> list[dict]:
    """Lab 6 offline batch (caching on): hit rate by submission order against both predictions."""
    rows = []
    for order, r in measurements["engines"]["on"]["offline"].items():
        pred = measurements["offline_predicted"][order]
        rows.append({"order": order, "queried tokens": r["queries"], "hit tokens": r["hits"],
                     "hit rate": ratio(r["hits"], r["queries"]),
                     "predicted (this pool)": pred["pool"]["hit_rate"],
                     "predicted (unlimited cache)": pred["unlimited"]["hit_rate"],
                     "wall s": r["wall_s"], "requests": r["requests"]})
    return rows


def plot_l6(measurements: dict, doc: dict | None = None):
    """Mean TTFT and output throughput with caching on/off (serving), and offline wall time by order."""
    import matplotlib.pyplot as plt

    serving = l6_serving_table(measurements)
    names = list(measurements["predicted"])
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(11, 3.4))
    for k, caching in enumerate(("off", "on")):
        rows = [next(r for r in serving if r["workload"] == n and r["caching"] == caching) for n in names]
        xs = [i + 0.4 * k for i in range(len(names))]
        a.bar(xs, [r["mean TTFT ms"] for r in rows], 0.4, label=f"caching {caching}")
        b.bar(xs, [r["output tok/s"] for r in rows], 0.4, label=f"caching {caching}")
    for ax, label in ((a, "mean TTFT, ms"), (b, "output throughput, tokens/s")):
        ax.set_xticks([i + 0.2 for i in range(len(names))], names)
        ax.set_xlabel("serving workload")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    offline = l6_offline_table(measurements)
    c.bar([r["order"] for r in offline], [r["wall s"] for r in offline], color="C2")
    c.set_xlabel("offline batch order (caching on)")
    c.set_ylabel("wall time, s")
    fig.suptitle(figure_title(doc, "Prefix caching: serving with it on and off; offline order"), fontsize=9)
    fig.tight_layout()
    return fig
