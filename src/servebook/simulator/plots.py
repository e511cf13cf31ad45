"""Pictures of simulator runs (matplotlib); every function returns a Figure.

* :func:`plot_memory_maps` — KV memory at one moment, paged blocks vs contiguous ranges.
* :func:`plot_block_tables` — each request's logical blocks -> physical blocks.
* :func:`plot_gantt` — when each request waited, prefilled, decoded and was returned.
* :func:`plot_kv_over_time` — reserved KV slots and slots holding tokens, over time.
* :func:`plot_kv_share` — share of reserved KV memory that holds real tokens, per policy.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch, Rectangle

#: Kwon et al., SOSP 2023 (arXiv 2309.06180), Fig. 2: share of KV memory holding token
#: states in prior systems (Orca with max, pow2 and oracle reservation).
PAPER_PRIOR_SYSTEMS_RANGE = (0.204, 0.382)


def _colours(names):
    cmap = plt.get_cmap("tab20")
    return {name: cmap(i % 20) for i, name in enumerate(sorted(names, key=_natural))}


def _natural(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else -1)


def plot_memory_maps(paged: dict, contiguous: dict, columns: int = 32):
    """Paged blocks (grid, one cell per block, shading = share filled) above the contiguous
    address space (one bar, reserved ranges with their filled part solid)."""
    fig, (ax_p, ax_c) = plt.subplots(2, 1, figsize=(11, 6), gridspec_kw={"height_ratios": [3, 1]})
    owners = {o for o in paged["owner"] if o not in (None, "shared")}
    owners |= {rid for _, _, rid, _ in contiguous["ranges"]}
    colours = _colours(owners)
    bs, n = paged["block_size"], paged["num_blocks"]
    rows = -(-n // columns)
    for b in range(n):
        x, y = b % columns, rows - 1 - b // columns
        owner = paged["owner"][b]
        if owner is None:
            face = "#dddddd" if paged["cached_free"][b] else "white"
            ax_p.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor="#999999", lw=0.5))
            continue
        colour = "black" if owner == "shared" else colours[owner]
        frac = paged["filled"][b] / bs
        ax_p.add_patch(Rectangle((x, y), 1, 1, facecolor="white", edgecolor="#999999", lw=0.5))
        ax_p.add_patch(Rectangle((x, y), frac, 1, facecolor=colour, edgecolor="none"))
    ax_p.set_xlim(0, columns)
    ax_p.set_ylim(0, rows)
    ax_p.set_aspect("equal")
    ax_p.set_xticks([])
    ax_p.set_yticks([])
    used = sum(o is not None for o in paged["owner"])
    filled = sum(paged["filled"])
    ax_p.set_title(f"Paged: {used} of {n} blocks of {bs} tokens in use, {filled} tokens stored "
                   f"({filled / max(1, used * bs):.0%} of allocated slots)")
    ax_p.legend(handles=[Patch(color="black", label="shared prefix block"),
                         Patch(facecolor="#dddddd", edgecolor="#999999", label="free, prefix still cached"),
                         Patch(facecolor="white", edgecolor="#999999", label="free")],
                loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8, frameon=False)
    cap = contiguous["capacity_tokens"]
    reserved = held = 0
    for start, length, rid, fill in contiguous["ranges"]:
        reserved += length
        held += fill
        ax_c.add_patch(Rectangle((start, 0), length, 1, facecolor=colours[rid], alpha=0.25, edgecolor="black", lw=0.5))
        ax_c.add_patch(Rectangle((start, 0), fill, 1, facecolor=colours[rid], edgecolor="none"))
    ax_c.set_xlim(0, cap)
    ax_c.set_ylim(0, 1)
    ax_c.set_yticks([])
    ax_c.set_xlabel("KV slot (tokens)")
    ax_c.set_title(f"Contiguous: {reserved} of {cap} slots reserved, {held} hold tokens "
                   f"({held / max(1, reserved):.0%}); pale = reserved but empty, white = free")
    fig.tight_layout()
    return fig


def plot_block_tables(paged: dict, max_requests: int = 8):
    """Block tables: row = request, column = logical block, number = physical block id."""
    tables = dict(sorted(paged["tables"].items(), key=lambda kv: _natural(kv[0]))[:max_requests])
    width = max((len(t) for t in tables.values()), default=1)
    fig, ax = plt.subplots(figsize=(min(12, 1 + 0.45 * width), 0.5 + 0.4 * len(tables)))
    colours = _colours(tables)
    for row, (rid, blocks) in enumerate(tables.items()):
        for col, block in enumerate(blocks):
            shared = paged["owner"][block] == "shared"
            ax.add_patch(Rectangle((col, row), 1, 1, facecolor="black" if shared else colours[rid],
                                   alpha=1.0 if shared else 0.6, edgecolor="white"))
            ax.text(col + 0.5, row + 0.5, str(block), ha="center", va="center", fontsize=7,
                    color="white" if shared else "black")
    ax.set_xlim(0, width)
    ax.set_ylim(len(tables), 0)
    ax.set_yticks(np.arange(len(tables)) + 0.5, list(tables))
    ax.set_xlabel(f"logical block (block {paged['block_size']} tokens); cell = physical block id, black = shared")
    ax.set_title("Block tables")
    fig.tight_layout()
    return fig


def plot_gantt(results: dict, max_requests: int = 24):
    """One panel per run: per request, waiting (grey), prefill until the first token (orange),
    decoding (blue) and, for static batching, finished but held until the batch returns (red)."""
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 1.2 + 0.22 * max_requests * len(results)),
                             sharex=True, squeeze=False)
    for ax, (label, result) in zip(axes[:, 0], results.items()):
        reqs = result.requests[:max_requests]
        for y, m in enumerate(reqs):
            ax.barh(y, m.start_s - m.arrival_s, left=m.arrival_s, color="#cccccc")
            ax.barh(y, m.first_token_s - m.start_s, left=m.start_s, color="tab:orange")
            ax.barh(y, m.last_token_s - m.first_token_s, left=m.first_token_s, color="tab:blue")
            if m.finish_s > m.last_token_s + 1e-12:
                ax.barh(y, m.finish_s - m.last_token_s, left=m.last_token_s, color="tab:red", alpha=0.6)
        ax.set_yticks(range(len(reqs)), [m.request_id for m in reqs], fontsize=7)
        ax.invert_yaxis()
        s = result.summary()
        ax.set_title(f"{label}: makespan {s['makespan_s']:.2f} s, mean latency {s['latency_mean_s']:.2f} s")
    axes[-1, 0].set_xlabel("time (s)")
    axes[0, 0].legend(handles=[Patch(color="#cccccc", label="waiting"), Patch(color="tab:orange", label="prefill"),
                               Patch(color="tab:blue", label="decoding"),
                               Patch(color="tab:red", alpha=0.6, label="done, held by the batch")],
                      loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def plot_kv_over_time(results: dict):
    """Reserved KV slots and slots holding tokens, as a share of the pool, against time."""
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, (label, result) in enumerate(results.items()):
        steps = result.steps
        t = np.asarray(steps.start_s) + np.asarray(steps.duration_s)
        cap = result.config.capacity_tokens
        colour = f"C{i}"
        ax.plot(t, np.asarray(steps.reserved_slots) / cap, color=colour, lw=1, alpha=0.5,
                label=f"{label}: reserved")
        ax.plot(t, np.asarray(steps.held_tokens) / cap, color=colour, lw=1.5, label=f"{label}: holding tokens")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("share of KV pool (fraction of slots)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("KV memory over time")
    fig.tight_layout()
    return fig


def plot_kv_share(shares: dict[str, float]):
    """Bars: share of reserved KV memory holding real tokens (time-weighted), with the range
    Kwon et al. (SOSP 2023, Fig. 2) report for prior systems shaded."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    labels = list(shares)
    ax.bar(labels, [100 * shares[k] for k in labels], color=[f"C{i}" for i in range(len(labels))])
    lo, hi = PAPER_PRIOR_SYSTEMS_RANGE
    ax.axhspan(100 * lo, 100 * hi, color="grey", alpha=0.2,
               label="prior systems in Kwon et al. 2023 (20.4-38.2%)")
    for i, k in enumerate(labels):
        ax.text(i, 100 * shares[k] + 1, f"{100 * shares[k]:.1f}%", ha="center", fontsize=9)
    ax.set_ylabel("reserved KV slots holding tokens (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
