"""Lab 3, ``--max-num-seqs`` and preemption on a fixed KV pool.

:func:`preemption_knee` is the prediction, :func:`l3_table` the sweep's table, :func:`first_preempting`
the measured knee, :func:`load_l3` the recorded sweep merged from the part files of a run split over
device calls (:mod:`servebook.lab.harness.split`), :func:`change_quantities` what a re-recording is compared
on (:mod:`servebook.lab.recordings.rerecordings`), :func:`plot_l3` the figure (section 6.9 shows it too).
``labs/l3_preemption.md`` and the results page (``labs/results_l3.md``) share them.

Throughputs are output tokens per second, TTFT/TPOT milliseconds, latencies seconds.
"""
from __future__ import annotations

import math
from pathlib import Path

from servebook.lab.errors import LabError
from servebook.lab.recordings.recorded import RECORDED_DIR, figure_title, load_recorded


def preemption_knee(num_blocks: int, input_len: int, output_len: int, block_size: int) -> tuple[int, int]:
    """(blocks one finished request holds, the max-num-seqs above which the pool must preempt).

    A request of ``input_len + output_len`` tokens ends holding ``ceil(tokens / block_size)``
    blocks; :func:`servebook.kv_cache.requests_that_fit` of them fit in the pool together.
    """
    from servebook.kv_cache import requests_that_fit

    tokens = input_len + output_len
    return math.ceil(tokens / block_size), requests_that_fit(num_blocks, tokens, block_size)


def l3_table(points: list[dict]) -> list[dict]:
    """Lab 3's sweep: preemptions, output throughput (tokens/s), TTFT/TPOT (ms), p99 latency (s)."""
    keys = ("max_num_seqs", "preemptions", "output_throughput", "mean_ttft_ms", "mean_tpot_ms", "p99_latency_s")
    return [{k: p[k] for k in keys} for p in points]


def load_l3(directory: str | Path = RECORDED_DIR) -> dict:
    """Lab 3's recorded sweep, merged from its result files, as one ``l3_preemption`` document.

    The GPU sweep may be recorded in parts (``SERVEBOOK_LAB_L3_MAX_NUM_SEQS``: files
    ``l3_preemption[_<values>]_gpu.json``, :mod:`servebook.lab.harness.split`). They are merged only when
    GPU name/count/driver, vLLM release, model config and load (``measurements.workload`` and
    ``block_size``) agree; the earliest file's measured point wins when two measured one value.
    Returns the earliest file's document with ``measurements.points`` (measured points only, in
    ``--max-num-seqs`` order) and ``measurements.measured_first_preempting_max_num_seqs`` recomputed
    over them, plus ``files`` (``{max_num_seqs: file name}``) and ``not_measured`` (values a part
    skipped and none measured). One file alone comes back with its points unchanged.

    Raises :class:`LabError` when there is no file, when files disagree (naming the field and both
    files) or when no point was measured.
    """
    import copy

    from servebook.lab.harness.split import check_same_experiment, part_paths

    paths = part_paths("l3_preemption", directory)
    if not paths:
        raise LabError(f"no Lab 3 result in {directory}: run `bash labs/tools/run_labs_gpu.sh l3a` and `l3b` "
                       "on one GPU and copy l3_preemption*_gpu.json there unedited")
    docs = [_load_l3_part(p) for p in paths]
    order = sorted(range(len(docs)), key=lambda i: docs[i]["date"])
    docs, paths = [docs[i] for i in order], [paths[i] for i in order]
    check_same_experiment(docs, paths, measurement_keys=("workload", "block_size"), what="Lab 3 files",
                          hint="record the missing --max-num-seqs values again with the same engine and load")
    measured: dict[int, tuple[dict, str]] = {}
    for doc, path in zip(docs, paths):
        for point in doc["measurements"]["points"]:
            if "skipped" not in point and point["max_num_seqs"] not in measured:
                measured[point["max_num_seqs"]] = (point, path.name)
    if not measured:
        raise LabError("the Lab 3 files " + ", ".join(p.name for p in paths) + " measured no --max-num-seqs value: "
                       + "; ".join(str(p.get("skipped")) for d in docs for p in d["measurements"]["points"]))
    merged = copy.deepcopy(docs[0])
    merged["lab"] = "l3_preemption"   # a part file names its part (l3_preemption_16_48); the merge is the lab
    points = [measured[v][0] for v in sorted(measured)]
    merged["measurements"]["points"] = points
    merged["measurements"]["measured_first_preempting_max_num_seqs"] = first_preempting(points)
    merged["files"] = {v: measured[v][1] for v in sorted(measured)}
    merged["not_measured"] = sorted({p["max_num_seqs"] for d in docs for p in d["measurements"]["points"]}
                                    - set(measured))
    return merged


def _load_l3_part(path: Path) -> dict:
    """One Lab 3 file, checked: its ``lab`` is ``l3_preemption`` for the whole sweep, or the part's name
    (``l3_preemption_16_48``, :func:`servebook.lab.harness.split.part_name`), which must match the file's name."""
    doc = load_recorded(path)
    expected = path.name.removesuffix("_gpu.json")
    if doc["lab"] not in ("l3_preemption", expected):
        raise LabError(f"{path} holds lab {doc['lab']!r}, not l3_preemption or the part {expected!r}: "
                       "pass the files of Lab 3, unedited")
    return doc



def first_preempting(points: list[dict]) -> int | None:
    """The smallest swept max-num-seqs whose run preempted, or None if none did."""
    return next((p["max_num_seqs"] for p in sorted(points, key=lambda p: p["max_num_seqs"]) if p["preemptions"] > 0),
                None)


def change_quantities(m: dict) -> dict[str, float]:
    """The quantities :func:`servebook.lab.recordings.rerecordings.recording_changes` compares for Lab 3, by name."""
    out = {"first max-num-seqs that preempted": first_preempting(m["points"])}
    for p in m["points"]:
        out[f"output tok/s at max-num-seqs {p['max_num_seqs']}"] = p["output_throughput"]
    for p in m["points"]:
        out[f"preemptions at max-num-seqs {p['max_num_seqs']}"] = p["preemptions"]
    return out


def plot_l3(measurements: dict, doc: dict | None = None):
    """Output throughput (line) and preemptions (bars) against max-num-seqs, predicted knee marked.

    Drawn at page width with 10-point text (:mod:`servebook.figure_style`): 6.9 shows it too.
    """
    from servebook.figure_style import page_axes, page_style

    points, knee = measurements["points"], measurements["predicted_knee"]
    with page_style():
        fig, ax = page_axes()
        xs = [p["max_num_seqs"] for p in points]
        ax2 = ax.twinx()
        bars = ax2.bar(xs, [p["preemptions"] for p in points], width=[x * 0.2 for x in xs], alpha=0.3,
                       color="red", label="preemptions")
        ax2.set_ylabel("preemptions (count)")
        line, = ax.plot(xs, [p["output_throughput"] for p in points], "o-", label="output tokens/s")
        knee_line = ax.axvline(knee, ls="--", color="grey", label=f"predicted knee ({knee})")
        ax.set_zorder(ax2.get_zorder() + 1)   # the line over the bars
        ax.patch.set_visible(False)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("--max-num-seqs (log scale)")
        ax.set_ylabel("output throughput, tokens/s")
        blocks = measurements["workload"]["num_gpu_blocks_override"]
        ax.set_title(figure_title(doc, f"Preemptions and throughput, pool of {blocks:,} blocks"))
        ax.legend(handles=[line, bars, knee_line], loc="upper left")
        fig.tight_layout()
    return fig
