"""Figures for the chapter pages: one plot per argument, drawn at page width.

Every function takes data the page has already loaded (a recorded lab, a step-timing file, the
library's memory budget) and returns a matplotlib figure of about 7 x 3.5 inches with 10-point
text, so that it stays readable when the book scales it to the text column. Pages glue the
figure and caption it with a ``{glue:figure}`` directive; the caption carries the provenance
(GPU, vLLM version), glued from the same data.
"""
from __future__ import annotations

from servebook.figure_style import PAGE_FIGSIZE, page_axes, page_style

#: Colours of the start-up memory claims (as in the memory-budget notebook).
CLAIM_COLOURS = {"weights": "#4c72b0", "activations": "#dd8452", "non-torch": "#937860",
                 "CUDA graphs": "#8172b3", "KV cache": "#55a868", "not requested": "#dddddd"}

GIB = 2**30


_COUNT_WORDS = {1: "one", 2: "two", 4: "four", 8: "eight"}


def recorded_on(doc: dict) -> str:
    """Where a recorded GPU result ran, for a figure's caption: ``"one NVIDIA H200, vLLM 0.26.0"``
    (``"two NVIDIA H200s, ..."`` for two).

    ``doc`` is a recorded file (a lab, a step-timing or batch-tactics record) with ``gpu.name``,
    ``gpu.count`` (1 when absent) and ``vllm_version``.
    """
    count = doc["gpu"].get("count", 1)
    gpus = doc["gpu"]["name"] + ("s" if count > 1 else "")
    return f"{_COUNT_WORDS.get(count, str(count))} {gpus}, vLLM {doc['vllm_version']}"


# ---- 6.5: where the GPU's memory goes --------------------------------------------------------

def memory_claims_gib(budget) -> dict[str, float]:
    """The start-up claims of a :class:`servebook.memory.MemoryBudget`, GiB, in the order vLLM makes them.

    Keys: weights, activations (profiled peak), non-torch, CUDA graphs, KV cache, not requested
    (``total - requested``); they add up to the GPU's total memory.
    """
    return {"weights": budget.weights_gib, "activations": budget.activation_gib,
            "non-torch": budget.non_torch_gib, "CUDA graphs": budget.cudagraph_gib,
            "KV cache": budget.available_kv_gib,
            "not requested": budget.total_memory_gib - budget.requested_gib}


def plot_memory_claims(budgets: dict[str, object]):
    """One stacked horizontal bar per model: its GPU's memory split into the start-up claims, GiB.

    ``budgets`` maps a bar's label (the model) to its ``MemoryBudget``. Claims of at least 8 GiB
    are labelled with their size. Returns the figure.
    """
    with page_style():
        fig, ax = page_axes()
        labels = list(budgets)
        for y, label in enumerate(labels):
            left = 0.0
            for name, gib in memory_claims_gib(budgets[label]).items():
                ax.barh(y, gib, left=left, color=CLAIM_COLOURS[name], edgecolor="white",
                        label=name if y == 0 else None)
                if gib >= 8:
                    ax.text(left + gib / 2, y, f"{gib:.1f}", ha="center", va="center",
                            color="black" if name == "not requested" else "white")
                left += gib
        ax.set_yticks(range(len(labels)), labels)
        ax.invert_yaxis()
        ax.set_xlim(0, max(b.total_memory_gib for b in budgets.values()))
        ax.set_xlabel("memory of one GPU, GiB")
        ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.42, -0.22), frameon=False)
        fig.tight_layout()
    return fig


# ---- 6.4: roofline with recorded steps ------------------------------------------------------

def recorded_step_points(spec, prefill: list[dict], decode: list[dict]) -> dict[str, list[tuple]]:
    """Recorded steps placed on the roofline: (FLOP/byte, achieved TFLOP/s) per step.

    ``prefill``: rows ``{"tokens", "time_s"}`` (one prompt prefilled in one step); ``decode``: rows
    ``{"batch", "mean_context_tokens", "step_s"}``, as in a step-timing record. FLOPs and bytes
    come from :mod:`servebook.perf.roofline` (one GPU, no tensor parallelism); achieved TFLOP/s =
    model FLOPs / measured seconds / 1e12.
    """
    from servebook.perf.roofline import decode_intensity, prefill_intensity

    points: dict[str, list[tuple]] = {"prefill": [], "decode": []}
    for row in prefill:
        w = prefill_intensity(spec, [row["tokens"]])
        points["prefill"].append((float(w["intensity_flops_per_byte"][0]),
                                  float(w["flops"][0]) / row["time_s"] / 1e12))
    for row in decode:
        w = decode_intensity(spec, [row["batch"]], row["mean_context_tokens"])
        points["decode"].append((float(w["intensity_flops_per_byte"][0]),
                                 float(w["flops"][0]) / row["step_s"] / 1e12))
    return points


def plot_roofline_steps(spec, gpu, prefill: list[dict], decode: list[dict]):
    """The GPU's roofline (bf16 peak, HBM bandwidth) with recorded prefill and decode steps on it.

    Log-log: FLOP per byte read from HBM against TFLOP/s; ``gpu`` is a catalogue name or
    ``GpuNumbers``. Rows as for :func:`recorded_step_points`. Returns the figure.
    """
    from servebook.perf.gpu import gpu_numbers

    g = gpu_numbers(gpu)
    pts = recorded_step_points(spec, prefill, decode)
    xs = [x for rows in pts.values() for x, _ in rows]
    lo, hi = min(xs + [g.ridge_flops_per_byte]) / 2, max(xs + [g.ridge_flops_per_byte]) * 2
    with page_style():
        fig, ax = page_axes()
        ax.plot([lo, g.ridge_flops_per_byte, hi],
                [g.hbm_bandwidth_bytes_per_s * lo / 1e12, g.bf16_dense_flops / 1e12, g.bf16_dense_flops / 1e12],
                "k-", label="roofline (bf16 peak, HBM bandwidth)")
        ax.plot(*zip(*pts["decode"]), "o", color="C0", label="decode steps (batch 1-256)")
        ax.plot(*zip(*pts["prefill"]), "s", color="C3", label="prefill steps (one prompt)")
        ax.axvline(g.ridge_flops_per_byte, ls=":", color="grey")
        ax.annotate(f"ridge: {g.ridge_flops_per_byte:.0f} FLOP/byte", (g.ridge_flops_per_byte, g.bf16_dense_flops / 20e12),
                    xytext=(5, 0), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity, FLOP per byte read")
        ax.set_ylabel("achieved, TFLOP/s")
        ax.legend(loc="lower right")
        fig.tight_layout()
    return fig


# ---- 6.11: Lab 5's TTFT against the decodes' worst gap ---------------------------------------

def plot_chunk_tradeoff(rows: list[dict], target_ms: float | None = None, knee_budget: int | None = None):
    """Lab 5: long prompt's TTFT against the decodes' worst inter-token gap, one point per budget.

    ``rows`` from :func:`servebook.lab.analyses.lab5_chunked_prefill.l5_table`; measured points labelled with their
    ``--max-num-batched-tokens``, the calibrated model's prediction dashed, and ``target_ms`` (the
    procedure's gap target) as a horizontal line when given, and the chunked row of ``knee_budget``
    (the measured knee) ringed when given. Gap on a log scale. Returns the figure.
    """
    from servebook.lab.analyses.lab5_chunked_prefill import draw_tradeoff

    with page_style():
        fig, ax = page_axes()
        draw_tradeoff(ax, rows, predicted="predicted (step model)", measured="measured", off=" (chunking off)",
                      xytext=(6, -4))
        if knee_budget is not None:
            [k] = [r for r in rows if r["chunking"] == "on" and r["budget"] == knee_budget]
            ax.plot([k["TTFT ms measured"]], [k["worst ITL ms measured"]], "o", ms=14, mfc="none", mec="C3",
                    mew=1.5, label=f"measured knee ({knee_budget:,})")
        if target_ms is not None:
            ax.axhline(target_ms, ls=":", color="C2", label=f"gap target ({target_ms:.0f} ms)")
        ax.set_yscale("log")
        ax.set_xlim(right=max(r["TTFT ms measured"] for r in rows) * 1.25)
        ax.set_xlabel("long prompt's time to first token, ms")
        ax.set_ylabel("decodes' worst gap, ms (log)")
        ax.legend(loc="upper right")
        fig.tight_layout()
    return fig


# ---- 6.14: tensor parallelism against replicas (Lab 9) ---------------------------------------

def plot_tp_vs_dp(view: dict, spec):
    """Lab 9, one model: KV tokens per replica, one request's time per token, and output tokens/s
    with the whole load at once, for each configuration (TP=1, DP=2, TP=2...).

    ``view`` from :func:`servebook.lab.analyses.lab9_parallel.load_l9`, ``spec`` the model's spec. Measured
    bars beside the prediction (left, middle); on the right the tokens/s the clients received
    beside the tokens/s the engines emitted. Returns the figure.
    """
    import matplotlib.pyplot as plt

    from servebook.lab.analyses.lab9_parallel import capacity_rows, saturation_rows, single_stream_rows

    cap, single, sat = capacity_rows(view, spec), single_stream_rows(view, spec), saturation_rows(view)
    names = [r["config"] for r in cap]
    xs = list(range(len(names)))
    panels = (
        ("KV tokens per replica,\nthousands", ("engine log", "predicted"),
         [r["KV tokens logged"] / 1e3 for r in cap], [r["KV tokens predicted"] / 1e3 for r in cap]),
        ("ms per output token,\none request alone", ("measured", "predicted"),
         [r["TPOT ms"] for r in single], [r["TPOT predicted"] for r in single]),
        (f"output tokens/s,\n{view['measurements']['workload']['num_prompts']} requests at once",
         ("at the engines", "at the clients"),
         [r["engine decode tok/s"] or 0 for r in sat], [r["client out tok/s"] for r in sat]),
    )
    with page_style():
        fig, axes = plt.subplots(1, 3, figsize=(PAGE_FIGSIZE[0], 3.8))
        for ax, (ylabel, labels, left, right) in zip(axes, panels):
            ax.bar([x - 0.2 for x in xs], left, 0.4, color="C0", label=labels[0])
            ax.bar([x + 0.2 for x in xs], right, 0.4, color="grey" if "predicted" in labels[1] else "C1",
                   label=labels[1])
            ax.set_xticks(xs, names)
            ax.set_xlabel("configuration")
            ax.set_ylabel(ylabel)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False)
        fig.tight_layout(w_pad=0.6)
    return fig


# ---- 6.16: speculation's speed-up against batch and acceptance -------------------------------

def speedup_curves(specs: dict[str, object], gpu, coeffs, *, k: int, alphas, batches,
                   context_tokens: float) -> dict[str, dict[float, list[float]]]:
    """Predicted decode speed-up (×) of ``k`` free drafts: ``{label: {alpha: [speed-up per batch]}}``.

    From :func:`servebook.perf.speculative.speculative_step` (the calibrated step model; drafts
    cost nothing, as n-gram lookup). ``context_tokens`` per sequence.
    """
    from servebook.perf.speculative import speculative_step

    return {label: {a: [speculative_step(spec, gpu, coeffs, k=k, alpha=a, batch=b,
                                         context_tokens=context_tokens).speedup for b in batches]
                    for a in alphas}
            for label, spec in specs.items()}


def plot_speculation_speedup(specs: dict[str, object], gpu, coeffs, *, k: int, alphas=(0.5, 0.7, 0.9),
                             batches=(1, 2, 4, 8, 16, 32, 64, 128), context_tokens: float = 1024):
    """One panel per model: predicted decode speed-up against batch (log 2), one line per acceptance α.

    ``specs`` maps a panel title to a ``ModelSpec``; see :func:`speedup_curves`. A dotted line at
    1x marks no gain. Returns the figure.
    """
    import matplotlib.pyplot as plt

    curves = speedup_curves(specs, gpu, coeffs, k=k, alphas=alphas, batches=batches, context_tokens=context_tokens)
    with page_style():
        fig, axes = plt.subplots(1, len(specs), figsize=PAGE_FIGSIZE, sharey=True, squeeze=False)
        for ax, (label, by_alpha) in zip(axes[0], curves.items()):
            for i, (a, ys) in enumerate(sorted(by_alpha.items())):
                ax.plot(batches, ys, "o-", color=f"C{i}", label=f"α = {a:.0%}")
            ax.axhline(1.0, ls=":", color="grey")
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(batches), [str(b) for b in batches])
            ax.minorticks_off()
            ax.set_title(label)
            ax.set_xlabel("batch (sequences, log scale)")
        axes[0][0].set_ylabel(f"decode speed-up, × (k = {k})")
        axes[0][0].set_ylim(bottom=0)
        axes[0][0].legend(loc="lower left")   # below the lines: nothing falls under 1x there
        fig.tight_layout()
    return fig


# ---- 6.15: MoE against dense decode steps ----------------------------------------------------

def plot_moe_dense_steps(moe_steps: dict[int, float], dense_steps: dict[int, float], moe_spec,
                         labels: tuple[str, str] = ("MoE", "dense"), *,
                         moe_samples: dict[int, list[float]] | None = None,
                         dense_samples: dict[int, list[float]] | None = None):
    """Measured decode step time (ms) of an MoE and a dense model against batch, with the experts
    the MoE's batch touches per layer on a second axis.

    ``*_steps`` map batch to measured step seconds (the median of the repeats); ``*_samples``, when
    given, map batch to every repeat (seconds) and are drawn as a bar from the fastest to the slowest
    repeat; the touched experts are
    :func:`servebook.perf.expected_distinct_experts` of ``moe_spec`` (uniform routing) at the MoE's
    batches. Batch on a log-2 axis. Returns the figure.
    """
    from servebook.perf import expected_distinct_experts

    with page_style():
        fig, ax = page_axes()
        ax2 = ax.twinx()
        mb = sorted(moe_steps)
        touched = [float(expected_distinct_experts(moe_spec, b)) for b in mb]
        experts, = ax2.plot(mb, touched, ":", color="grey", label=f"experts touched ({labels[0]})")
        ax2.set_ylim(0, moe_spec.moe.num_experts * 1.05)
        ax2.set_ylabel(f"experts touched per layer (count,\nof {moe_spec.moe.num_experts})")
        db = sorted(dense_steps)
        dense, = ax.plot(db, [dense_steps[b] * 1e3 for b in db], "s-", color="C3", label=f"{labels[1]} step")
        moe, = ax.plot(mb, [moe_steps[b] * 1e3 for b in mb], "o-", color="C0", label=f"{labels[0]} step")
        tops = [*moe_steps.values(), *dense_steps.values()]
        for steps, samples, colour in ((moe_steps, moe_samples, "C0"), (dense_steps, dense_samples, "C3")):
            for b, reps in (samples or {}).items():
                if b in steps and len(reps) > 1:
                    ax.vlines(b, min(reps) * 1e3, max(reps) * 1e3, color=colour, alpha=0.5, linewidth=3)
                    tops.append(max(reps))
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.set_ylim(0, max(tops) * 1e3 * 1.45)   # room for the legend
        batches = sorted(set(mb) | set(db))
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("decode batch (sequences, log scale)")
        ax.set_ylabel("decode step, ms")
        ax.legend(handles=[dense, moe, experts], loc="upper left")
        fig.tight_layout()
    return fig


# ---- 6.22: the layouts of one job on the same GPUs -------------------------------------------

def plot_layout_hours(options: dict[tuple[int, str], object]):
    """Job hours of each layout of the same GPUs: bars grouped by TP size, one per KV dtype.

    ``options`` maps ``(tp, kv_cache_dtype)`` to its :class:`servebook.perf.fleet.FleetPlan`
    (``kv_cache_dtype`` ``"auto"`` is drawn as bf16). Each bar is labelled with its batch per
    replica; the fastest layout is outlined. Returns the figure.
    """
    tps = sorted({tp for tp, _ in options})
    dtypes = list(dict.fromkeys(kv for _, kv in options))
    best = min(options, key=lambda key: options[key].hours)
    width = 0.8 / len(dtypes)
    with page_style():
        fig, ax = page_axes()
        for i, kv in enumerate(dtypes):
            xs = [j + (i - (len(dtypes) - 1) / 2) * width for j, tp in enumerate(tps) if (tp, kv) in options]
            plans = [options[tp, kv] for tp in tps if (tp, kv) in options]
            bars = ax.bar(xs, [p.hours for p in plans], width, color=f"C{i}",
                          label=f"{'bf16' if kv == 'auto' else kv} KV cache")
            for bar, tp, p in zip(bars, [tp for tp in tps if (tp, kv) in options], plans):
                ax.annotate(f"{p.batch:,}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            xytext=(0, 2), textcoords="offset points", ha="center", va="bottom")
                if (tp, kv) == best:
                    bar.set_edgecolor("black")
                    bar.set_linewidth(2)
        replicas = {tp: p.replicas for (tp, _), p in options.items()}
        ax.set_xticks(range(len(tps)), [f"TP {tp}\n({replicas[tp]} replica{'s' if replicas[tp] > 1 else ''})"
                                        for tp in tps])
        ax.set_xlabel("layout of the GPUs (batch per replica over each bar)")
        ax.set_ylabel("job wall-clock, hours")
        ax.set_ylim(0, max(p.hours for p in options.values()) * 1.15)
        ax.legend(loc="upper center")
        fig.tight_layout()
    return fig


# ---- 6.27: moving one prompt's KV cache -----------------------------------------------------

def plot_kv_handoff(prefill_s: float, transfers_s: dict[str, float], *, prompt_label: str):
    """Horizontal bars, ms (log scale): the prompt's prefill beside the time to move its KV cache over each
    link. ``transfers_s`` maps a link's label to seconds (bytes / one-direction bandwidth); each bar is
    labelled with its time. Returns the figure."""
    rows = [(f"prefill of {prompt_label}", prefill_s * 1e3, "C3")] + \
        [(f"move its KV: {name}", s * 1e3, "C0") for name, s in transfers_s.items()]
    with page_style():
        fig, ax = page_axes(figsize=(PAGE_FIGSIZE[0], 2.8))
        for y, (label, ms, colour) in enumerate(rows):
            ax.barh(y, ms, color=colour)
            ax.annotate(f"{ms:,.1f} ms", (ms, y), xytext=(4, 0), textcoords="offset points", va="center")
        ax.set_yticks(range(len(rows)), [r[0] for r in rows])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlim(min(r[1] for r in rows) / 2, max(r[1] for r in rows) * 6)
        ax.set_xlabel("time, ms (log scale)")
        fig.tight_layout()
    return fig
