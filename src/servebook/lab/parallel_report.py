"""Lab 9's recorded runs on two GPUs: one view per model, measured beside predicted, and what limited the load.

A model's configurations (TP=1, DP=2, TP=2, TP=2+EP) may come from several result files: a run
cut by its time budget records what it skipped, and a second run with
``SERVEBOOK_LAB_L9_CONFIGS`` measures the rest (``l9_tp_vs_dp_<model>[_<configs>]_gpu.json``).
:func:`load_l9` merges them after checking that they describe the same experiment (GPU, driver,
vLLM version, model config, workload), so a table never mixes two setups.

The saturation load of the recorded runs sends all requests at once through ``vllm bench serve``
to one ``vllm serve`` per replica. Two readings of its speed are kept apart here:

* the **client's**: output tokens over the benchmark's duration, and its time per output token
  (what a user of that server saw);
* the **engine's**: ``vllm:inter_token_latency_seconds`` is timed from the engine core's own output
  timestamps (``IterationStats.update_from_output`` in 0.27.1), so its mean is the engine's time
  between a request's tokens. When every request of the load decodes at once (no more requests per
  engine than ``--max-num-seqs``, no preemption), the engine emits ``requests / mean ITL`` tokens
  per second while it decodes.

When the client's time per token is several times the engine's, the tokens were made faster than
they were delivered: the HTTP path (one API server process and one benchmark client per server)
set the measured throughput, not the GPUs.

Units: GiB, tokens, ms (``*_ms``), tokens/s (``*_tok_s``).
"""
from __future__ import annotations

from pathlib import Path

from servebook.lab.errors import LabError
from servebook.lab.parallel import comparison_rows, engine_decode_tok_s, mean_engine_itl_s
from servebook.lab.engine_stats import logged_prefix_hit_pct
from servebook.lab.recorded import RECORDED_DIR, figure_title, load_recorded
from servebook.lab.split import check_same_experiment, part_paths
from servebook.model_spec import ModelSpec

#: Configurations in the order the lab measures them.
CONFIG_ORDER = ("TP=1", "DP=2", "TP=2", "TP=2+EP")


def l9_paths(model_id: str, directory: str | Path = RECORDED_DIR) -> list[Path]:
    """The recorded Lab 9 files of ``model_id`` (``l9_tp_vs_dp_<model_id>[_<configs>]_gpu.json``), sorted."""
    return part_paths(f"l9_tp_vs_dp_{model_id}", directory)


def _check_same(docs: list[dict], paths: list[Path]) -> None:
    check_same_experiment(docs, paths, measurement_keys=("workload", "setup"), what="Lab 9 files of one model",
                          hint="record the missing configurations again with the same engine and config")


def load_l9(model_id: str, directory: str | Path = RECORDED_DIR) -> dict:
    """Every recorded Lab 9 configuration of ``model_id``, merged from its result files.

    Returns ``{"doc": <earliest file's document>, "files": {config: file name},
    "measurements": {"workload", "setup", "predicted", "points"}, "not_measured": [configs]}``
    with ``points`` in :data:`CONFIG_ORDER`, one measured point per configuration (the earliest
    file's when two measured it). Raises :class:`LabError` when there is no file, when the files
    disagree on GPU, driver, release, model config or load, or when no configuration was measured.
    """
    paths = l9_paths(model_id, directory)
    if not paths:
        raise LabError(f"no Lab 9 result for {model_id} in {directory}: run "
                       f"`bash labs/tools/run_labs_gpu.sh l9-dense` or `l9-moe` on two GPUs and copy "
                       "l9_tp_vs_dp_<model>*_gpu.json there unedited")
    docs = [load_recorded(p) for p in paths]
    for doc, path in zip(docs, paths):
        if not doc["lab"].startswith(f"l9_tp_vs_dp_{model_id}"):
            raise LabError(f"{path.name} holds lab {doc['lab']!r}, not Lab 9 of {model_id}")
    order = sorted(range(len(docs)), key=lambda i: docs[i]["date"])
    docs, paths = [docs[i] for i in order], [paths[i] for i in order]
    _check_same(docs, paths)
    measured: dict[str, tuple[dict, str]] = {}
    for doc, path in zip(docs, paths):
        for point in doc["measurements"]["points"]:
            if "startup" in point and point["config"] not in measured:
                measured[point["config"]] = (point, path.name)
    unknown = sorted(set(measured) - set(CONFIG_ORDER))
    if unknown:
        raise LabError(f"Lab 9 configurations {unknown} are not among {list(CONFIG_ORDER)}")
    if not measured:
        raise LabError(f"the Lab 9 files of {model_id} measured no configuration: "
                       + "; ".join(p.get("skipped") or p.get("error", "")[:200]
                                   for d in docs for p in d["measurements"]["points"]))
    m0 = docs[0]["measurements"]
    points = [measured[c][0] for c in CONFIG_ORDER if c in measured]
    return {
        "doc": docs[0],
        "files": {c: measured[c][1] for c in CONFIG_ORDER if c in measured},
        "measurements": {"workload": m0["workload"], "setup": m0["setup"], "predicted": m0["predicted"],
                         "points": points},
        "not_measured": [c for c in CONFIG_ORDER
                         if c not in measured and any(p["config"] == c for d in docs
                                                      for p in d["measurements"]["points"])],
    }


def _point(view: dict, config: str) -> dict:
    for p in view["measurements"]["points"]:
        if p["config"] == config:
            return p
    raise LabError(f"configuration {config} was not measured (measured: {list(view['files'])})")


def saturated_prefix_hit_pct(point: dict) -> float | None:
    """The highest prefix-cache hit rate (%) a configuration's engines logged while more than one request ran.

    Random prompts should hit ~0%. Lines with one request running belong to the single-stream
    load. None when no line fell inside the saturation load (a load shorter than vLLM's 10 s
    logging interval can end between two lines).
    """
    return logged_prefix_hit_pct(point["logs"])


def saturation_rows(view: dict) -> list[dict]:
    """Per configuration: client throughput and time per token beside the engine's, and prefix hits."""
    w = view["measurements"]["workload"]
    rows = []
    for p in view["measurements"]["points"]:
        sat, d = p["saturated"]["summary"], p["metrics_delta"]
        itl_s = mean_engine_itl_s(d)
        itl_ms = None if itl_s is None else itl_s * 1e3
        engine = engine_decode_tok_s(p, w["max_num_seqs"])
        rows.append({
            "config": p["config"], "servers": len(p["saturated"]["runs"]),
            "client out tok/s": round(sat["output_throughput"]),
            "client TPOT ms": round(sat["mean_tpot_ms"], 1),
            "engine ITL ms": None if itl_ms is None else round(itl_ms, 1),
            "client/engine": None if itl_ms is None else round(sat["mean_tpot_ms"] / itl_ms, 2),
            "engine decode tok/s": None if engine is None else round(engine),
            "prefix hits % (log)": saturated_prefix_hit_pct(p),
        })
    return rows


def measured_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """Lab 9's own measured-beside-predicted rows (:func:`servebook.lab.parallel.comparison_rows`)."""
    rows, _ = comparison_rows(view["measurements"], spec)
    return rows


def capacity_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """KV budget and tokens per configuration: the engine's log, the calculator on the logged GiB, the prediction."""
    rows = measured_rows(view, spec)
    one = next((r for r in rows if r["config"] == "TP=1"), None)
    out = []
    for r in rows:
        out.append({
            "config": r["config"], "KV GiB/GPU logged": r["KV GiB/GPU log"], "KV GiB/GPU predicted": r["KV GiB pred"],
            "KV tokens logged": r["KV tokens log"], "calculator on logged GiB": r["tokens from log GiB"],
            "KV tokens predicted": r["tokens pred"],
            "logged / TP=1": None if one is None else round(r["KV tokens log"] / one["KV tokens log"], 3),
        })
    return out


def single_stream_rows(view: dict, spec: ModelSpec) -> list[dict]:
    """Time per output token and TTFT of one request at a time, measured (medians) and predicted."""
    return [{"config": r["config"], "TPOT ms": r["TPOT alone ms"], "TPOT predicted": r["TPOT pred"],
             "TTFT ms": r["TTFT alone ms"], "TTFT predicted": r["TTFT pred"]} for r in measured_rows(view, spec)]


def split_cost_ms(view: dict) -> dict:
    """What a batch-1 decode step loses to the split: TP=2 TPOT - TP=1 TPOT / 2, measured and predicted (ms)."""
    one, two = _point(view, "TP=1"), _point(view, "TP=2")
    by_name = {r["config"]: r for r in next(iter(view["measurements"]["predicted"].values()))}
    measured = two["light"]["summary"]["median_tpot_ms"] - one["light"]["summary"]["median_tpot_ms"] / 2
    predicted = (by_name["TP=2"]["single_stream_tpot_s"] - by_name["TP=1"]["single_stream_tpot_s"] / 2) * 1e3
    return {"measured_ms": measured, "predicted_ms": predicted}


def plot_l9(views: dict[str, dict]):
    """Three panels per recorded model: KV tokens per replica, single-stream TPOT, saturated tokens/s."""
    import matplotlib.pyplot as plt

    from servebook.hf_config import load_model_spec

    fig, axes = plt.subplots(len(views), 3, figsize=(11, 3.2 * len(views)), squeeze=False)
    for row, (model, view) in zip(axes, views.items()):
        spec = load_model_spec(model)
        cap, single, sat = capacity_rows(view, spec), single_stream_rows(view, spec), saturation_rows(view)
        names = [r["config"] for r in cap]
        xs = list(range(len(names)))
        _pair(row[0], xs, [r["KV tokens logged"] / 1e3 for r in cap], [r["KV tokens predicted"] / 1e3 for r in cap],
              ("engine log", "predicted"), "KV tokens per replica (thousands)")
        _pair(row[1], xs, [r["TPOT ms"] for r in single], [r["TPOT predicted"] for r in single],
              ("measured", "predicted"), "time per output token, one request (ms)")
        _pair(row[2], xs, [r["client out tok/s"] for r in sat],
              [r["engine decode tok/s"] or 0 for r in sat], ("client received", "engine emitted"),
              f"output tokens/s, {view['measurements']['workload']['num_prompts']} requests at once")
        for ax in row:
            ax.set_xticks(xs, names)
            ax.set_xlabel("configuration")
        doc = view["doc"]
        row[0].set_title(figure_title(doc, f"Lab 9 on {doc['gpu']['count']} GPUs").replace("\n", ": "),
                         fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def _pair(ax, xs, left, right, labels, ylabel) -> None:
    ax.bar([x - 0.2 for x in xs], left, 0.4, label=labels[0])
    ax.bar([x + 0.2 for x in xs], right, 0.4, label=labels[1])
    ax.set_ylabel(ylabel, fontsize=8)
    ax.legend(fontsize=7)
