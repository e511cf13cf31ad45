"""Lab 4, an fp8 KV cache against bf16 at a utilisation small enough that the pool is the limit.

``labs/l4_fp8_kv.md`` prints :func:`l4_table` on what it is about to save; the results page
(``labs/results_l4.md``) and section 6.8 call it (and :func:`l4_ratios`) on the recorded file.
:func:`change_quantities` is what a re-recording is compared on (:mod:`servebook.lab.recordings.rerecordings`),
:func:`plot_l4` the figure. Throughputs are output tokens per second, TPOT milliseconds.
"""
from __future__ import annotations

from servebook.lab.recordings.recorded import figure_title
from servebook.lab.harness.table import ratio


def l4_table(kv_dtypes: list[str], predictions: dict, engines: dict) -> list[dict]:
    """Lab 4's comparison, one row per KV dtype: predicted and engine KV tokens, preemptions,
    output throughput (tokens/s), mean TPOT (ms).

    A dtype the lab did not start (``engines[d]["skipped"]``: its reason) has None in the engine
    columns; rows get a ``skipped`` column ("yes"/"no") only when some dtype was skipped.
    """
    rows = []
    any_skipped = any(engines[d].get("skipped") for d in kv_dtypes)
    for d in kv_dtypes:
        r, p = engines[d], predictions[d]
        if r.get("skipped"):
            rows.append({"kv dtype": d, "tokens predicted": p["kv_cache_tokens"], "tokens engine": None,
                         "engine/predicted": None, "preemptions": None, "output tok/s": None, "mean TPOT ms": None})
        else:
            s = r["bench"]["summary"]
            rows.append({"kv dtype": d, "tokens predicted": p["kv_cache_tokens"], "tokens engine": r["kv_cache_tokens"],
                         "engine/predicted": ratio(r["kv_cache_tokens"], p["kv_cache_tokens"]),
                         "preemptions": r["preemptions"], "output tok/s": s["output_throughput"],
                         "mean TPOT ms": s["mean_tpot_ms"]})
        if any_skipped:
            rows[-1]["skipped"] = "yes" if r.get("skipped") else "no"
    return rows


def l4_ratios(kv_dtypes: list[str], engines: dict) -> tuple[float, float] | tuple[None, None]:
    """(second dtype's KV tokens / first's, second's output throughput / first's).

    (None, None) when either engine was skipped (not started on this CPU).
    """
    base, other = engines[kv_dtypes[0]], engines[kv_dtypes[1]]
    if base.get("skipped") or other.get("skipped"):
        return None, None
    return (other["kv_cache_tokens"] / base["kv_cache_tokens"],
            other["bench"]["summary"]["output_throughput"] / base["bench"]["summary"]["output_throughput"])


def change_quantities(m: dict) -> dict[str, float]:
    """The quantities :func:`servebook.lab.recordings.rerecordings.recording_changes` compares for Lab 4, by name."""
    dtypes, e = m["workload"]["kv_dtypes"], m["engines"]
    out = {}
    for d in dtypes:
        out[f"{d}: output tok/s"] = e[d]["bench"]["summary"]["output_throughput"]
        out[f"{d}: preemptions"] = e[d]["preemptions"]
        out[f"{d}: mean TPOT ms"] = e[d]["bench"]["summary"]["mean_tpot_ms"]
    out[f"{dtypes[1]} / {dtypes[0]} output throughput"] = l4_ratios(dtypes, e)[1]
    return out


def plot_l4(measurements: dict, doc: dict | None = None):
    """KV tokens (predicted and engine) and output throughput for each KV dtype.

    Drawn at page width with 10-point text (:mod:`servebook.figure_style`): 6.8 shows it too.
    """
    import matplotlib.pyplot as plt

    from servebook.figure_style import PAGE_FIGSIZE, page_style

    dtypes = measurements["workload"]["kv_dtypes"]
    rows = l4_table(dtypes, measurements["predictions"], measurements["engines"])
    with page_style():
        fig, (a, b) = plt.subplots(1, 2, figsize=PAGE_FIGSIZE)
        xs = range(len(rows))
        a.bar([x - 0.2 for x in xs], [r["tokens predicted"] / 1e3 for r in rows], 0.4, label="predicted")
        a.bar([x + 0.2 for x in xs], [(r["tokens engine"] or 0) / 1e3 for r in rows], 0.4, label="engine log")
        labels = [d + ("\n(skipped)" if r.get("skipped") == "yes" else "") for d, r in zip(dtypes, rows)]
        a.set_xticks(list(xs), labels)
        a.set_xlabel("--kv-cache-dtype")
        a.set_ylabel("KV cache, thousands of tokens")
        a.legend(loc="upper left")
        b.bar(list(xs), [r["output tok/s"] or 0 for r in rows], color="C2")
        b.set_xticks(list(xs), labels)
        b.set_xlabel("--kv-cache-dtype")
        b.set_ylabel("output throughput, tokens/s")
        fig.suptitle(figure_title(doc, "fp8 KV cache: pool size and throughput"))
        fig.tight_layout()
    return fig
