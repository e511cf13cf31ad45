"""Lab 5, chunked prefill: one long prompt among decoding requests, per ``--max-num-batched-tokens``.

Lab 5 prints its own tables while it runs; :func:`l5_table` reads what it saved (predictions beside
measurements) for the results page (``labs/results_l5.md``), section 6.11 and the chunk-budget
notebook; :func:`plot_l5` draws it. Times are milliseconds in the table, seconds in the file.
"""
from __future__ import annotations

from servebook.lab.recordings.recorded import figure_title


def _config_key(c: dict) -> tuple[bool, int]:
    return bool(c["chunked"]), int(c["max_num_batched_tokens"])


def l5_chunk_step_s(config: dict) -> float | None:
    """Mean engine seconds per step while the long prompt was prefilled (first run of a config).

    From the engine's own step log (``servebook.lab.harness.step_recorder``): the time between the
    first and the last step that carried a chunk of the prompt, over the steps in between.
    None when the prompt went in one step (chunking off).
    """
    chunks = config["first_run"]["long_prompt_chunks"]
    if len(chunks) < 2:
        return None
    return (chunks[-1]["t"] - chunks[0]["t"]) / (len(chunks) - 1)


def l5_table(measurements: dict) -> list[dict]:
    """Lab 5: per configuration, the prediction beside the measurement.

    Times in ms. TTFT and worst ITL are the medians over the lab's repeats as its streaming
    clients saw them; "step ms" is the mean step while the prompt was prefilled: predicted =
    predicted TTFT / predicted steps, engine = :func:`l5_chunk_step_s`.
    """
    predicted = {_config_key(p): p for p in measurements["prediction"]["configs"]}
    rows = []
    for m in measurements["configs"]:
        p = predicted[_config_key(m)]
        step = l5_chunk_step_s(m)
        rows.append({
            "chunking": "on" if m["chunked"] else "off", "budget": m["max_num_batched_tokens"],
            "steps predicted": p["steps"], "steps engine": m["steps"],
            "TTFT ms predicted": p["ttft_s"] * 1e3, "TTFT ms measured": m["ttft_s"] * 1e3,
            "worst ITL ms predicted": p["worst_itl_s"] * 1e3, "worst ITL ms measured": m["worst_itl_s"] * 1e3,
            "step ms predicted": p["ttft_s"] / p["steps"] * 1e3 if step is not None else None,
            "step ms engine": step * 1e3 if step is not None else None,
        })
    return rows


def draw_tradeoff(ax, rows: list[dict], *, predicted: str, measured: str, off: str, **text) -> None:
    """Draw :func:`l5_table`'s rows on ``ax``: TTFT (x, ms) against the decodes' worst gap (y, ms).

    The prediction as a dashed line labelled ``predicted``, the measurements as points labelled
    ``measured``, each point annotated with its budget (``off`` appended when chunking was off);
    ``text``: keyword arguments of those annotations (offset, font size). Shared by :func:`plot_l5`
    and the chapter's :func:`servebook.figures.plot_chunk_tradeoff`.
    """
    ax.plot([r["TTFT ms predicted"] for r in rows], [r["worst ITL ms predicted"] for r in rows], "x--",
            color="grey", label=predicted)
    ax.plot([r["TTFT ms measured"] for r in rows], [r["worst ITL ms measured"] for r in rows], "o",
            color="C0", label=measured)
    for r in rows:
        ax.annotate(f"{r['budget']:,}" + ("" if r["chunking"] == "on" else off),
                    (r["TTFT ms measured"], r["worst ITL ms measured"]), textcoords="offset points", **text)


def plot_l5(measurements: dict, doc: dict | None = None):
    """TTFT against worst ITL per budget, measured and predicted (left); mean prefill step (right)."""
    import matplotlib.pyplot as plt

    rows = l5_table(measurements)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    draw_tradeoff(a, rows, predicted="predicted (calibrated step model)",
                  measured="measured (clients, median of repeats)", off=" (off)", xytext=(4, 4), fontsize=8)
    a.set_xlabel("long prompt's TTFT, ms")
    a.set_ylabel("decodes' worst inter-token gap, ms")
    a.legend(fontsize=7)
    chunked = [r for r in rows if r["step ms engine"] is not None]
    xs = range(len(chunked))
    b.bar([x - 0.2 for x in xs], [r["step ms predicted"] for r in chunked], 0.4, color="grey", label="predicted")
    b.bar([x + 0.2 for x in xs], [r["step ms engine"] for r in chunked], 0.4, color="C0", label="engine step log")
    b.set_xticks(list(xs), [f"{r['budget']:,}" for r in chunked])
    b.set_xlabel("--max-num-batched-tokens (chunking on)")
    b.set_ylabel("mean step while prefilling, ms")
    b.legend(fontsize=7)
    fig.suptitle(figure_title(doc, "Chunked prefill: TTFT vs ITL, and the price of a chunked step"), fontsize=9)
    fig.tight_layout()
    return fig
