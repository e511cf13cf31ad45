"""Diagrams of the chapter's mechanisms, drawn from the library's own numbers where they carry any.

Where :mod:`servebook.figures` plots measurements, these draw the mechanisms the measurements come
from: a request's block table and a hybrid model's KV-cache groups (:func:`plot_block_table_and_groups`),
what a request holds in each group over its life (:func:`plot_kv_hold`), asynchronous scheduling's
timeline (:func:`plot_async_timeline`), the three CUDA-graph regimes of a step
(:func:`plot_graph_regimes`), tensor parallelism's KV heads (:func:`plot_kv_head_sharding`) and the
speculative verify pass (:func:`plot_verify_pass`). Every count they draw (blocks, groups, heads,
positions, thresholds) comes from :mod:`servebook.kv_cache` and :mod:`servebook.vllm_rules`; each
drawn element that stands for one of them carries a ``gid`` naming it, so tests count them back.

Each function returns a matplotlib figure at page width with 10-point text
(:mod:`servebook.figure_style`); pages glue it and caption it with ``{glue:figure}``.
"""
from __future__ import annotations

import random

from servebook.errors import ServebookError
from servebook.figure_style import PAGE_FIGSIZE, page_style
from servebook.kv_cache import KVCacheLayout, LayerCacheSpec
from servebook.vllm_rules.parallel import kv_heads_per_gpu
from servebook.vllm_rules.scheduler import max_concurrent_batches

#: Colours shared by the diagrams: a block or head held, freed, booked; a token accepted or rejected.
HELD, FREED, FULL, SLIDING = "#4c72b0", "#e5e5e5", "#4c72b0", "#55a868"
ACCEPTED, REJECTED, TARGET, DISCARDED = "#55a868", "#c44e52", "#4c72b0", "#cccccc"
GIB = 2**30


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _box(ax, x, y, w, h, *, color, gid=None, edge="white", text=None, text_color="black", lw=0.8):
    from matplotlib.patches import Rectangle

    r = Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=lw)
    if gid:
        r.set_gid(gid)
    ax.add_patch(r)
    if text is not None:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", color=text_color)
    return r


def _bare(ax):
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


# ---- 6.2: a block table, and a hybrid model's KV-cache groups ---------------------------------------

def group_label(group, index: int) -> str:
    """A group's row label: ``"full 0: 10 layers"`` or ``"sliding 3: 8 + 2 padding"``."""
    pad = f" + {group.num_padding_layers} pad" if group.num_padding_layers else " layers"
    return f"{group.kind} {index}: {len(group.layer_indices)}{pad}"


def plot_block_table_and_groups(layout: KVCacheLayout, *, request_tokens: int, unsettled_tokens: int,
                                table_tokens: int = 88, pool_blocks: int = 24, seed: int = 2):
    """Left: one short request's block table, logical blocks mapped to scattered physical blocks of a pool.
    Right: every KV-cache group of ``layout`` (full-attention groups first), one row each, with the
    blocks one running request of ``request_tokens`` tokens holds in it and those its sliding
    window has freed.

    The left panel's request has ``table_tokens`` tokens in blocks of ``layout.block_size``; its
    physical block ids are a seeded sample of ``range(pool_blocks)`` (any free block will do: that is
    the point). On the right a group's row has ``cdiv(request_tokens, block size)`` cells, of which
    :meth:`servebook.kv_cache.LayerCacheSpec.running_blocks` (``unsettled_tokens`` still in flight)
    are held, the newest ones. Patches carry gids ``logical-i``, ``physical-j``, ``g<k>-held`` and
    ``g<k>-freed``. Returns the figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch

    bs = layout.block_size
    n_logical = _cdiv(table_tokens, bs)
    if n_logical > pool_blocks:
        raise ServebookError(f"{table_tokens} tokens need {n_logical} blocks, more than the pool's {pool_blocks}")
    physical = random.Random(seed).sample(range(pool_blocks), n_logical)
    groups = sorted(layout.groups, key=lambda g: g.kind != "full")
    with page_style():
        fig, (left, right) = plt.subplots(1, 2, figsize=(PAGE_FIGSIZE[0], 3.6), gridspec_kw={"width_ratios": [1, 1.25]})
        # Block table: logical row on top, the pool as a grid below.
        cols = 8
        rows = _cdiv(pool_blocks, cols)
        top = rows + 2.2
        for i in range(n_logical):
            filled = min(bs, table_tokens - i * bs) / bs
            _box(left, i + 0.08, top, 0.84, 1, color=FREED, gid=f"logical-{i}", edge="black", lw=0.6)
            _box(left, i + 0.08, top, 0.84 * filled, 1, color=HELD, edge="none")
            left.text(i + 0.5, top + 1.1, str(i), ha="center", va="bottom")
        for j in range(pool_blocks):
            x, y = j % cols, rows - 1 - j // cols
            used = j in physical
            _box(left, x + 0.04, y + 0.04, 0.92, 0.92, color=HELD if used else FREED, gid=f"physical-{j}",
                 edge="none", text=str(j), text_color="white" if used else "grey")
        for i, j in enumerate(physical):
            x, y = j % cols + 0.5, rows - 1 - j // cols + 0.96
            left.add_patch(FancyArrowPatch((i + 0.5, top), (x, y), arrowstyle="-|>", mutation_scale=9,
                                           color="black", lw=0.8, shrinkA=1, shrinkB=1))
        left.text(0, top + 1.9, f"block table: logical blocks\n({bs} tokens each; the last one part-filled)",
                  va="bottom")
        left.text(0, -0.2, "physical blocks of the pool", va="top")
        left.set_xlim(-0.1, cols + 0.1)
        left.set_ylim(-1.3, top + 4.0)
        _bare(left)
        # Groups: one row per group.
        width = max(_cdiv(request_tokens, g.spec.block_size) for g in groups)
        labels = []
        for k, g in enumerate(groups):
            n = _cdiv(request_tokens, g.spec.block_size)
            held = g.spec.running_blocks(request_tokens, unsettled_tokens)
            y = len(groups) - 1 - k
            cell = width / n
            for b in range(n):
                kept = b >= n - held
                _box(right, b * cell, y + 0.1, cell, 0.8, color=(FULL if g.kind == "full" else SLIDING) if kept
                     else FREED, gid=f"g{k}-{'held' if kept else 'freed'}", edge="white", lw=0.2)
            labels.append(group_label(g, k))
        right.set_yticks([len(groups) - 1 - k + 0.5 for k in range(len(groups))], labels)
        right.set_xlim(0, width)
        right.set_ylim(0, len(groups))
        right.set_xticks([])
        right.set_xlabel(f"a {request_tokens:,}-token request's blocks:\nheld (colour), freed (grey)")
        for side in ("top", "right", "bottom"):
            right.spines[side].set_visible(False)
        fig.tight_layout(w_pad=0.5)
    return fig


# ---- 6.7: what one request holds over its life --------------------------------------------------------

def _admission_group_blocks(spec: LayerCacheSpec, prompt_tokens: int, max_model_len: int, in_flight: int) -> int:
    # The per-group term of KVCacheLayout.admission_blocks (whose sum over groups is that method).
    return min(_cdiv(prompt_tokens, spec.block_size), spec.blocks_per_request(max_model_len, in_flight))


def kv_hold_series(layout: KVCacheLayout, *, prompt_tokens: int, output_tokens: int, chunk_tokens: int,
                   max_model_len: int, in_flight_tokens: int, async_scheduling: bool) -> dict:
    """Bytes one request holds, per attention kind (groups of a kind summed), step by step.

    Returns ``{"context": [...], "full": [...], "sliding": [...], "admission": {"full": b, "sliding": b},
    "chunks": [...]}``, bytes on this GPU. ``context``: the request's tokens with slots after each
    step: the prompt in chunks of ``chunk_tokens`` (``chunks``: their sizes), then one decode step per
    output token. A group holds :meth:`~servebook.kv_cache.LayerCacheSpec.running_blocks` of them; the
    tokens not yet processed are the step's own chunk plus, with asynchronous scheduling, the chunk
    before it still in flight (a decode step: :func:`~servebook.vllm_rules.scheduler.decode_unsettled_tokens`).
    ``admission``: what admitting the prompt checks free in each kind
    (:meth:`~servebook.kv_cache.KVCacheLayout.admission_blocks`, per group). A block id costs
    ``layout.bytes_per_block`` (one page in each of the group's layer tensors).
    """
    from servebook.vllm_rules.scheduler import decode_unsettled_tokens

    if min(prompt_tokens, output_tokens, chunk_tokens) < 1 or prompt_tokens + output_tokens > max_model_len:
        raise ServebookError("use positive prompt, output and chunk sizes whose prompt + output fits max_model_len")
    per_block = layout.bytes_per_block
    kinds = {"full": [g for g in layout.groups if g.kind != "sliding"],
             "sliding": [g for g in layout.groups if g.kind == "sliding"]}
    out: dict = {"context": [], "full": [], "sliding": [], "chunks": [],
                 "admission": {kind: per_block * sum(_admission_group_blocks(g.spec, prompt_tokens, max_model_len,
                                                                             in_flight_tokens) for g in gs)
                               for kind, gs in kinds.items()}}

    def record(tokens: int, unsettled: int) -> None:
        out["context"].append(tokens)
        for kind, gs in kinds.items():
            out[kind].append(per_block * sum(g.spec.running_blocks(tokens, unsettled) for g in gs))

    done, previous = 0, 0
    while done < prompt_tokens:
        chunk = min(chunk_tokens, prompt_tokens - done)
        done += chunk
        out["chunks"].append(chunk)
        record(done, chunk + (previous if async_scheduling else 0))
        previous = chunk
    for t in range(prompt_tokens + 1, prompt_tokens + output_tokens + 1):
        record(t, decode_unsettled_tokens(async_scheduling))
    return out


def plot_kv_hold(series: dict, *, model_label: str):
    """GiB one request holds in the full-attention and the sliding-window groups over its context, with what
    admission checked free for its prompt (dashed), from :func:`kv_hold_series`. Returns the figure."""
    from servebook.figure_style import page_axes

    ctx = series["context"]
    prompt = sum(series["chunks"])
    with page_style():
        fig, ax = page_axes()
        for kind, colour, name in (("full", FULL, "full-attention"), ("sliding", SLIDING, "sliding-window")):
            ax.step([0] + ctx, [0] + [b / GIB for b in series[kind]], where="pre", color=colour, lw=2,
                    label=f"{name}: held")
            ax.hlines(series["admission"][kind] / GIB, 0, prompt, colors=colour, linestyles="--", lw=1.2,
                      label=f"{name}: admission check")
        ax.axvline(prompt, ls=":", color="grey")
        top = max(max(series["full"]), max(series["sliding"]), *series["admission"].values()) / GIB
        ax.annotate("prefill ends,\ndecode begins", (prompt, top * 0.45), xytext=(6, 0), textcoords="offset points")
        ax.set_xlim(0, ctx[-1] * 1.02)
        ax.set_ylim(0, top * 1.6)
        ax.set_xlabel(f"tokens of one {model_label} request in the KV cache (prompt in chunks, then decode)")
        ax.set_ylabel("KV cache of the request, GiB")
        ax.legend(loc="upper left", ncol=2, fontsize=10, frameon=False)
        fig.tight_layout()
    return fig


# ---- 6.13: asynchronous scheduling's timeline ----------------------------------------------------------

def async_timeline(async_scheduling: bool, *, steps: int = 4, schedule: float = 0.35, process: float = 0.15,
                   gpu: float = 1.0) -> dict[str, list[tuple[int, float, float]]]:
    """Bars of the CPU's and the GPU's work for ``steps`` engine steps: ``{"cpu": [...], "gpu": [...]}``,
    each ``(step, start, end)`` in units of one GPU step's length ``gpu``.

    The CPU schedules a step (``schedule``) and later processes its outputs (``process``). Without
    asynchronous scheduling it schedules step n + 1 only after processing step n; with it, it
    schedules step n + 1 while the GPU runs step n, and may run ahead of the GPU by at most
    :func:`~servebook.vllm_rules.scheduler.max_concurrent_batches` steps scheduled but not processed.
    Times are illustrative (the caption says so); the order and the overlap are the mechanism.
    """
    ahead = max_concurrent_batches(async_scheduling)
    cpu, gpu_bars = [], []
    cpu_free = gpu_free = 0.0
    processed_at: list[float] = []
    for n in range(steps):
        start = cpu_free
        if n >= ahead:          # at most `ahead` steps scheduled and not yet processed
            start = max(start, processed_at[n - ahead])
        cpu.append((n, start, start + schedule))
        g0 = max(start + schedule, gpu_free)
        gpu_bars.append((n, g0, g0 + gpu))
        gpu_free = g0 + gpu
        if async_scheduling:
            cpu_free = start + schedule
        else:
            cpu.append((n, gpu_free, gpu_free + process))
            cpu_free = gpu_free + process
        processed_at.append(gpu_free + process)
    if async_scheduling:       # outputs processed once each step's GPU work ends, between schedules
        for n, _, end in gpu_bars:
            cpu.append((n, end, end + process))
    return {"cpu": cpu, "gpu": gpu_bars}


def steps_in_flight(timeline: dict) -> int:
    """Most steps scheduled (their schedule bar started) but not yet processed at any instant of ``timeline``."""
    sched = {n: s for n, s, _ in timeline["cpu"] if not any(m == n and s2 < s for m, s2, _ in timeline["cpu"])}
    done = {}
    for n, s, e in timeline["cpu"]:
        if s > sched[n]:
            done[n] = e
    instants = sorted({t for t in sched.values()} | {t for t in done.values()})
    return max(sum(sched[n] <= t < done[n] for n in sched) for t in instants)


def plot_async_timeline(steps: int = 4):
    """Two timelines of the same ``steps`` engine steps, without and with asynchronous scheduling: the CPU's
    lane (schedule, process outputs) above the GPU's. Bars carry gids ``<mode>-cpu-<n>``, ``<mode>-gpu-<n>``
    (mode ``sync``/``async``). Returns the figure."""
    import matplotlib.pyplot as plt

    with page_style():
        fig, axes = plt.subplots(2, 1, figsize=(PAGE_FIGSIZE[0], 3.6), sharex=True)
        for ax, mode in zip(axes, (False, True)):
            tl = async_timeline(mode, steps=steps)
            name = "async" if mode else "sync"
            seen = set()
            for n, s, e in tl["cpu"]:
                first = n not in seen
                seen.add(n)
                _box(ax, s, 1.1, e - s, 0.8, color="#dd8452" if first else "#937860", gid=f"{name}-cpu-{n}",
                     text=(f"S{n}" if first else "P"), text_color="white")
            for n, s, e in tl["gpu"]:
                _box(ax, s, 0.1, e - s, 0.8, color=HELD, gid=f"{name}-gpu-{n}", text=f"step {n}", text_color="white")
            ax.set_yticks([0.5, 1.5], ["GPU", "CPU"])
            ax.set_ylim(0, 2)
            ax.set_title("async scheduling " + ("on: the CPU schedules step n + 1 while the GPU runs step n" if mode
                                                else "off: the GPU waits while the CPU schedules"), loc="left")
            for side in ("top", "right"):
                ax.spines[side].set_visible(False)
        axes[1].set_xlim(0, max(e for _, _, e in async_timeline(False, steps=steps)["gpu"]) + 0.2)
        axes[1].set_xlabel("time, in GPU steps (S: schedule and prepare step n; P: process its outputs)")
        fig.tight_layout()
    return fig


# ---- 6.13: which steps replay a CUDA graph -------------------------------------------------------------

def plot_graph_regimes(capture_max_tokens: int, max_num_batched_tokens: int, *, recorded: dict | None = None):
    """The CUDA-graph regime of a step against its tokens, for decode-only steps and steps with a prefill chunk.

    Up to ``capture_max_tokens`` (:func:`servebook.vllm_rules.compilation.cudagraph_max_tokens`) a
    decode-only step replays one full graph and a step with a prefill chunk piecewise graphs (attention
    outside them); above it, up to ``max_num_batched_tokens``, every step runs eagerly. ``recorded``:
    optional ``{regime: (median tokens, median ms)}`` (regimes ``full_graph``, ``piecewise``, ``eager``)
    drawn as points labelled with their median step time. Spans carry gids ``<row>-<regime>``.
    Log-2 token axis. Returns the figure.
    """
    from servebook.figure_style import page_axes

    if not 0 < capture_max_tokens <= max_num_batched_tokens:
        raise ServebookError("the largest captured step must be positive and at most max_num_batched_tokens")
    colours = {"full_graph": "#4c72b0", "piecewise": "#8172b3", "eager": "#c44e52"}
    names = {"full_graph": "full graph", "piecewise": "piecewise graphs", "eager": "eager (no graph)"}
    rows = (("decode", 1, "full_graph"), ("mixed", 0, "piecewise"))
    with page_style():
        fig, ax = page_axes(figsize=(PAGE_FIGSIZE[0], 3.0))
        for row, y, graph in rows:
            for regime, lo, hi in ((graph, 1, capture_max_tokens), ("eager", capture_max_tokens, max_num_batched_tokens)):
                span = ax.barh(y, hi - lo, left=lo, height=0.6, color=colours[regime], edgecolor="white")
                span.patches[0].set_gid(f"{row}-{regime}")
                ax.text((lo * hi) ** 0.5, y, names[regime], ha="center", va="center", color="white")
        ax.axvline(capture_max_tokens, color="black", lw=1)
        ax.annotate(f"largest captured step: {capture_max_tokens:,}", (capture_max_tokens, 1.45), xytext=(4, 0),
                    textcoords="offset points", va="center")
        if recorded:
            for regime, (tokens, ms) in recorded.items():
                y = 1 if regime == "full_graph" else 0
                ax.plot([tokens], [y - 0.42], "^", color="black", ms=7, gid=f"recorded-{regime}")
                right = regime == "eager"            # eager to the right of its marker, graphs to the left
                ax.annotate(f"{ms:.1f} ms", (tokens, y - 0.42), xytext=(7 if right else -7, 0),
                            textcoords="offset points", ha="left" if right else "right", va="center")
        ax.set_xscale("log", base=2)
        ticks = [2**i for i in range(0, max_num_batched_tokens.bit_length()) if 2**i <= max_num_batched_tokens]
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(1, max_num_batched_tokens)
        ax.set_ylim(-0.8, 1.7)
        ax.set_yticks([1, 0], ["decode only", "with a prefill\nchunk"])
        ax.set_xlabel("tokens in the step (log scale, up to --max-num-batched-tokens)")
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        fig.tight_layout()
    return fig


# ---- 6.20: KV heads under tensor parallelism -----------------------------------------------------------

def kv_head_placement(num_kv_heads: int, tp: int, per_gpu: int) -> list[list[int]]:
    """The KV heads each of ``tp`` ranks stores, ``per_gpu`` each
    (:func:`~servebook.vllm_rules.parallel.kv_heads_per_gpu`): consecutive slices when ``tp`` divides the
    heads; when ``tp`` exceeds them, rank r holds head ``r // (tp // num_kv_heads)`` (vLLM replicates each
    head on ``tp // num_kv_heads`` consecutive ranks)."""
    if tp <= num_kv_heads:
        return [list(range(r * per_gpu, (r + 1) * per_gpu)) for r in range(tp)]
    copies = tp // num_kv_heads
    return [[r // copies] for r in range(tp)]


def plot_kv_head_sharding(spec, tp: int, *, model_label: str):
    """One panel per attention kind of ``spec`` (sliding-window, full/global): a row per GPU of TP ``tp``, a
    column per KV head, a filled cell where that GPU stores that head. Cells carry gids
    ``<kind>-gpu<r>-head<h>``. Returns the figure."""
    import matplotlib.pyplot as plt

    kinds = []
    for layer in spec.layers:
        if layer.kind not in [k.kind for k in kinds]:
            kinds.append(layer)
    kinds.sort(key=lambda l: l.kind != "sliding")
    with page_style():
        fig, axes = plt.subplots(1, len(kinds), figsize=(PAGE_FIGSIZE[0], 3.0), squeeze=False,
                                 gridspec_kw={"width_ratios": [max(l.num_kv_heads, 4) for l in kinds]})
        for ax, layer in zip(axes[0], kinds):
            n = layer.num_kv_heads
            per = kv_heads_per_gpu(layer, tp)
            placement = kv_head_placement(n, tp, per)
            colour = SLIDING if layer.kind == "sliding" else FULL
            for r, heads in enumerate(placement):
                for h in range(n):
                    on = h in heads
                    _box(ax, h, tp - 1 - r, 1, 1, color=colour if on else FREED, gid=f"{layer.kind}-gpu{r}-head{h}"
                         if on else None, text=f"h{h}" if on else None, text_color="white")
            copies = tp * per // n
            kind = "sliding-window" if layer.kind == "sliding" else "global"
            ax.set_title(f"{kind} layers: {n} KV heads\n{per} per GPU, each on {copies} GPU{'s' * (copies > 1)}",
                         loc="left")
            ax.set_xlim(0, max(n, 4))
            ax.set_ylim(0, tp)
            ax.set_xticks([])
            ax.set_yticks([tp - 1 - r + 0.5 for r in range(tp)], [f"GPU {r}" for r in range(tp)])
            ax.set_xlabel("KV heads")
            for side in ("top", "right", "bottom"):
                ax.spines[side].set_visible(False)
        fig.suptitle(f"{model_label} at TP {tp}", x=0.01, ha="left")
        fig.tight_layout()
    return fig


# ---- 6.16: the speculative verify pass ----------------------------------------------------------------

def verify_outcome(k: int, accepted: int) -> dict:
    """One speculative step with ``k`` drafts of which the first ``accepted`` pass: counts of positions
    scored, tokens emitted, drafts rejected and discarded.

    The target scores ``k + 1`` positions in one pass. It emits the ``accepted`` drafts plus one token of
    its own: the correction at the first rejected draft, or the bonus after all ``k``. Drafts after the
    first rejection are discarded (``k - accepted - 1`` of them; none when all pass).
    """
    if not 0 <= accepted <= k or k < 1:
        raise ServebookError(f"accepted drafts must be between 0 and k ({k}); got {accepted}")
    return {"positions": k + 1, "emitted": accepted + 1, "rejected": int(accepted < k),
            "discarded": max(k - accepted - 1, 0)}


def plot_verify_pass(k: int, rejected_at: int, *, expected_tokens: float, alpha: float):
    """Two speculative steps of ``k`` drafts side by side: one whose draft ``rejected_at`` (1-based) is rejected,
    one where all pass. Rows: the drafts, the target's one pass over ``k + 1`` positions, the tokens emitted.
    ``expected_tokens`` (tokens per step at acceptance ``alpha``, from
    :func:`servebook.perf.speculative.expected_tokens_per_step`) is written under them. Boxes carry gids
    ``<case>-draft-<i>``, ``<case>-position-<i>``, ``<case>-emit-<i>`` (case ``reject``/``all``). Returns the figure.
    """
    import matplotlib.pyplot as plt

    if not 1 <= rejected_at <= k:
        raise ServebookError(f"rejected_at must be a draft between 1 and k ({k}); got {rejected_at}")
    with page_style():
        fig, axes = plt.subplots(1, 2, figsize=(PAGE_FIGSIZE[0], 3.4))
        for ax, case, accepted in ((axes[0], "reject", rejected_at - 1), (axes[1], "all", k)):
            out = verify_outcome(k, accepted)
            for i in range(k):
                colour = ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED
                _box(ax, i + 1, 2.2, 0.9, 0.7, color=colour, gid=f"{case}-draft-{i}", text=f"d{i + 1}",
                     text_color="white" if colour != DISCARDED else "black")
            for i in range(out["positions"]):
                _box(ax, i, 1.1, 0.9, 0.7, color=TARGET, gid=f"{case}-position-{i}", text=f"p{i}", text_color="white")
            for i in range(out["emitted"]):
                own = i == out["emitted"] - 1
                _box(ax, i + 1, 0.0, 0.9, 0.7, color=TARGET if own else ACCEPTED, gid=f"{case}-emit-{i}",
                     text=("t" if own else f"d{i + 1}"), text_color="white")
            ax.text(-0.1, 2.55, "drafts", ha="right", va="center")
            ax.text(-0.1, 1.45, "target,\none pass", ha="right", va="center")
            ax.text(-0.1, 0.35, "emitted", ha="right", va="center")
            what = (f"d{rejected_at} rejected: {out['emitted']} tokens" if case == "reject"
                    else f"all {k} pass: {out['emitted']} tokens (bonus t)")
            ax.set_title(what, loc="left")
            ax.set_xlim(-1.6, k + 2.0)
            ax.set_ylim(-0.3, 3.1)
            _bare(ax)
        fig.text(0.01, 0.02, "p0: the last accepted token; t: the target's own token.\n"
                             f"At acceptance α = {alpha:.0%} a step emits {expected_tokens:.2f} tokens on average.",
                 ha="left", va="bottom")
        fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig
