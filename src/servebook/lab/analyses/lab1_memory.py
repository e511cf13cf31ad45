"""Lab 1, the memory budget: predicted against engine KV cache, per engine start.

``labs/l1_memory_budget.md`` prints :func:`l1_table` on the points it is about to save; the results
page (``labs/results_l1.md``) and section 6.6 call it on the recorded file, so both print the same
table from one code path. :func:`plot_l1` draws the same numbers. KV sizes are GiB and tokens.
"""
from __future__ import annotations

from servebook.lab.recordings.recorded import figure_title
from servebook.lab.harness.table import ratio


def l1_table(points: list[dict]) -> list[dict]:
    """Lab 1's comparison: predicted vs engine KV GiB and KV tokens, one row per start.

    Args:
        points: ``measurements["points"]``: each with ``point`` (max_model_len,
            gpu_memory_utilization, kv_cache_dtype), ``prediction`` and ``engine`` (None when the
            engine did not start), and ``skipped`` (the reason, when the lab did not start it:
            an fp8 KV cache on a CPU without AVX-512 or AMX).

    Rows get a ``skipped`` column ("yes"/"no") only when some point was skipped, so tables of
    runs that started every point (the recorded GPU runs) are unchanged.
    """
    rows = []
    any_skipped = any(p.get("skipped") for p in points)
    for p in points:
        pred, eng, at = p["prediction"], p.get("engine"), p["point"]
        tokens = eng["kv_cache_tokens"] if eng else None
        rows.append({
            "max_model_len": at["max_model_len"], "util": at["gpu_memory_utilization"],
            "kv dtype": at["kv_cache_dtype"],
            "KV GiB predicted": pred["available_kv_gib"], "KV GiB engine": eng["available_kv_cache_gib"] if eng else None,
            "tokens predicted": pred["kv_cache_tokens"], "tokens engine": tokens,
            "engine/predicted": ratio(tokens, pred["kv_cache_tokens"]),
        })
        if any_skipped:
            rows[-1]["skipped"] = "yes" if p.get("skipped") else "no"
    return rows


def plot_l1(points: list[dict], doc: dict | None = None):
    """Predicted and engine KV tokens per start (grouped bars). Returns the figure."""
    rows = l1_table(points)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["tokens predicted"] / 1e3 for r in rows], 0.4, label="predicted (servebook)")
    ax.bar([x + 0.2 for x in xs], [(r["tokens engine"] or 0) / 1e3 for r in rows], 0.4, label="engine log")
    ax.set_xticks(list(xs), [f"len {r['max_model_len']:,}\nutil {r['util']}\n{r['kv dtype']}"
                             + ("\n(skipped)" if r.get("skipped") == "yes" else "") for r in rows], fontsize=8)
    ax.set_xlabel("start (--max-model-len, --gpu-memory-utilization, --kv-cache-dtype)")
    ax.set_ylabel("KV cache, thousand tokens")
    ax.set_title(figure_title(doc, "KV cache size: predicted vs engine"), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
