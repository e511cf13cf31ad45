"""Read recorded lab results (schema ``servebook.lab/1``) and summarise them.

The labs (``labs/l1_memory_budget.md`` ... ``labs/l4_fp8_kv.md``) call the ``*_table`` and
``*_summary`` functions here on the ``measurements`` they are about to save; the book calls the
same functions on the saved files, so a lab and the page that renders its recorded run print the
same table from one code path.

* :func:`load_recorded` — one result file, schema and provenance checked.
* :func:`load_l3` — Lab 3's sweep merged from the files of a run split in parts (:mod:`servebook.lab.split`).
* :func:`recorded_path` — the file the book renders for a lab (``labs/results/labs/<lab>_gpu.json``);
  :func:`previous_path` — the recording it replaced, kept unedited in ``labs/results/raw/``
  (:data:`PREVIOUS_RECORDINGS` names them); :func:`recording_changes` — what changed between the two.
* :func:`provenance` — the header a page prints: GPU, driver, vLLM version, date, model shape.
* ``l1_table`` / ``l2_summary`` / ``l3_table`` / ``l4_table`` / ``l5_table`` / ``l6_serving_table`` /
  ``l6_offline_table`` — the labs' comparison tables (lists of dicts, for
  :func:`servebook.lab.side_by_side` or pandas).
* ``plot_l1`` ... ``plot_l6`` — matplotlib figures of the same numbers, axes labelled with units.

Lab 6 prints its tables through the functions here too; Lab 5 prints its own while it runs, and
``l5_table`` reads what it saved (predictions beside measurements) for the book.

Throughputs are output tokens per second, latencies seconds unless the key says ``_ms``.
"""
from __future__ import annotations

import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path

from servebook.lab.errors import LabError
from servebook.lab.results import REQUIRED, SCHEMA
from servebook.lab.table import ratio
from servebook.records import results_path

#: Where the GPU runs are committed (``labs/results/labs/<lab>_gpu.json``).
RECORDED_DIR = results_path("labs")
#: The labs this module summarises, by the ``lab`` field of their result files.
LABS = ("l1_memory_budget", "l2_paged_continuous", "l3_preemption", "l4_fp8_kv", "l5_chunked_prefill",
        "l6_prefix_caching")
_GPU_FIELDS = ("name", "count", "driver")


#: Where superseded recordings are kept, unedited, under their date (``<lab>_gpu-<date>.json``).
RAW_DIR = results_path("raw")
#: The rule for re-recordings: the newest run of a lab is ``labs/results/labs/<lab>_gpu.json`` (what
#: the book renders); the run it replaced moves to ``labs/results/raw/`` under the date of its run.
#: This names, per re-recorded lab, the file it replaced (the results page compares the two).
PREVIOUS_RECORDINGS = {
    "l2_paged_continuous": "l2_paged_continuous_gpu-2026-11-30.json",
    "l3_preemption": "l3_preemption_gpu-2026-11-30.json",
    "l4_fp8_kv": "l4_fp8_kv_gpu-2026-11-30.json",
}


def recorded_path(lab: str, profile: str = "gpu") -> Path:
    """``labs/results/labs/<lab>_<profile>.json``: the recording the book renders."""
    return RECORDED_DIR / f"{lab}_{profile}.json"


def previous_path(lab: str) -> Path:
    """The recording of ``lab`` that :func:`recorded_path` replaced (``labs/results/raw/...``).

    Raises :class:`LabError` for a lab that has not been re-recorded.
    """
    if lab not in PREVIOUS_RECORDINGS:
        raise LabError(f"{lab!r} has not been re-recorded: no previous recording is named in "
                       f"PREVIOUS_RECORDINGS (re-recorded: {', '.join(PREVIOUS_RECORDINGS)})")
    return RAW_DIR / PREVIOUS_RECORDINGS[lab]


def load_rendered(stem: str, directory: str | Path | None = None) -> tuple[str, dict]:
    """(name to show, document) of the recording the book renders for a file stem (``l3_preemption_gpu``).

    ``<stem>.json`` when it exists, checked by :func:`load_recorded`; otherwise, for a lab recorded
    in parts (Lab 3: :func:`load_l3`), the merged parts, shown as ``l3_preemption_{16_48,128_256}_gpu.json``.
    ``directory`` defaults to :data:`RECORDED_DIR`. Raises :class:`LabError` when neither exists.
    """
    directory = Path(directory) if directory is not None else RECORDED_DIR
    path = directory / f"{stem}.json"
    lab = stem.removesuffix("_gpu")
    if path.is_file() or lab not in _PART_MERGERS:
        return str(path), load_recorded(path)
    doc = _PART_MERGERS[lab](directory)
    files = list(dict.fromkeys(doc["files"].values()))   # in the order of the points they measured
    parts = [f.removeprefix(lab + "_").removesuffix("_gpu.json") for f in files]
    return str(directory / f"{lab}_{{{','.join(parts)}}}_gpu.json"), doc


def read_checked_document(path: str | Path, *, schema: str, required: tuple[str, ...], what: str,
                          record_hint: str, provenance_word: str = "provenance ") -> dict:
    """Read a recorded JSON document and run the checks every recorded result needs.

    The file must exist and hold a JSON object whose ``schema`` is ``schema``; every field in
    ``required`` and ``gpu.name``/``count``/``driver`` must be present and non-empty; ``date`` must
    be ISO 8601. ``what`` names the kind of file in messages ("lab result"), ``record_hint`` says how
    to produce one. Raises :class:`LabError` naming the file and what to change.
    """
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path}: no such {what}; {record_hint}")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise LabError(f"{path} is not JSON ({err}); restore the file the lab wrote") from None
    if not isinstance(doc, dict):
        raise LabError(f"{path} holds a JSON {type(doc).__name__}, not a {what} object")
    if doc.get("schema") != schema:
        raise LabError(f"{path} has schema {doc.get('schema')!r}, expected {schema!r}: it is not a {what} "
                       "(start-up logs, step timings, lab results and Lab 8's tactics each have their own reader)")
    missing = [k for k in required if doc.get(k) in (None, "", [], {})]
    gpu = doc.get("gpu")
    if isinstance(gpu, dict):
        missing += [f"gpu.{k}" for k in _GPU_FIELDS if gpu.get(k) in (None, "")]
    if missing:
        raise LabError(f"{path} lacks {provenance_word}field(s) {', '.join(missing)}; "
                       "re-run the lab to record it with provenance (never fill them in by hand)")
    try:
        datetime.fromisoformat(doc["date"])
    except (TypeError, ValueError):
        raise LabError(f"{path}: date {doc['date']!r} is not an ISO 8601 time; the lab writes UTC ISO dates") from None
    return doc


def load_recorded(path: str | Path, *, lab: str | None = None) -> dict:
    """Read one lab result file and check it is data the book may render.

    Args:
        path: a ``<lab>_<profile>.json`` written by :func:`servebook.lab.save_result`.
        lab: the lab it must hold (``"l3_preemption"``), or None to accept any.

    Raises:
        LabError: the file is missing or not JSON, its ``schema`` is not ``servebook.lab/1``, a
            provenance field (GPU name/count/driver, vLLM version, date, model config, flags) is
            missing, or it holds another lab. The message names the file and what to change.
    """
    doc = read_checked_document(path, schema=SCHEMA, required=REQUIRED, what="lab result",
                                record_hint="run the lab (labs/tools/run_labs_gpu.sh) to record it")
    if not isinstance(doc["measurements"], dict):
        raise LabError(f"{path}: measurements must be an object, found {type(doc['measurements']).__name__}")
    if lab is not None and doc["lab"] != lab:
        raise LabError(f"{path} holds lab {doc['lab']!r}, not {lab!r}: pass the file of {lab}")
    return doc


def provenance(doc: dict) -> dict:
    """What ran, for a page's header: GPU, driver, vLLM version, date (UTC day), model shape, flags."""
    gpu, config = doc["gpu"], doc["config"]
    return {
        "lab": doc["lab"],
        "gpu": f"{gpu['count']} x {gpu['name']}",
        "gpu_memory_gib": gpu["total_memory_bytes"] / 2**30 if gpu.get("total_memory_bytes") else None,
        "driver": gpu["driver"],
        "cuda": gpu.get("cuda"),
        "torch": gpu.get("torch_version"),
        "vllm_version": doc["vllm_version"],
        "date": doc["date"][:10],
        "model_id": doc["model_id"],
        "weights": doc.get("weights"),
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "attention_heads": config.get("num_attention_heads"),
        "kv_heads": config.get("num_key_value_heads"),
        "vocab_size": config.get("vocab_size"),
        "dtype": config.get("torch_dtype"),
        "engine_args": doc["engine_args"],
    }


_HIT_RATE = re.compile(r"Prefix cache hit rate: ([0-9.]+)%")
_RUNNING = re.compile(r"Running: (\d+) reqs")


def logged_prefix_hit_pct(logs, *, min_running: int = 2) -> float | None:
    """The highest prefix-cache hit rate (%) in engine logs, over lines with ``min_running`` or more requests running.

    vLLM's periodic stats line (every 10 s) carries ``Running: N reqs`` and ``Prefix cache hit
    rate: X%`` (over recent requests). Lines with fewer requests running (idle, or a single-stream
    load) are left out. None when no line qualifies.
    """
    rates = []
    for log in logs:
        for line in log.splitlines():
            hit, running = _HIT_RATE.search(line), _RUNNING.search(line)
            if hit and running and int(running.group(1)) >= min_running:
                rates.append(float(hit.group(1)))
    return max(rates) if rates else None


def logged_max_running(log: str) -> int | None:
    """The most requests running at once in an engine log's periodic stats lines (``Running: N reqs``,
    one line every 10 s, so a sample, not every step); None when the log has no such line."""
    counts = [int(m) for m in _RUNNING.findall(log)]
    return max(counts) if counts else None


def engine_logs(measurements) -> list[str]:
    """Every engine log kept in a lab's measurements (any string value holding vLLM's stats line)."""
    if isinstance(measurements, dict):
        return [log for v in measurements.values() for log in engine_logs(v)]
    if isinstance(measurements, list):
        return [log for v in measurements for log in engine_logs(v)]
    return [measurements] if isinstance(measurements, str) and "Prefix cache hit rate" in measurements else []


def bench_prefix_caches(measurements) -> list[dict]:
    """Every ``prefix_cache`` record (:func:`servebook.lab.bench.prefix_cache_delta`) in a lab's
    measurements, in the order found: one per ``vllm bench serve`` load. Empty for recordings made
    before the harness kept them."""
    if isinstance(measurements, dict):
        own = [measurements["prefix_cache"]] if isinstance(measurements.get("prefix_cache"), dict) else []
        return own + [r for k, v in measurements.items() if k != "prefix_cache" for r in bench_prefix_caches(v)]
    if isinstance(measurements, list):
        return [r for v in measurements for r in bench_prefix_caches(v)]
    return []


def load_hit_pct(doc: dict) -> tuple[float | None, str]:
    """(the highest prefix-cache hit rate of a recording's loads, %; how it was read).

    From the ``prefix_cache`` counters when the file has them (hits / queries over each load),
    else the highest rate the engines logged (:func:`logged_prefix_hit_pct`, the older files).
    """
    rates = [r["hit_rate"] for r in bench_prefix_caches(doc["measurements"]) if r.get("hit_rate") is not None]
    if rates:
        return max(rates) * 100, "counters"
    return logged_prefix_hit_pct(engine_logs(doc["measurements"])), "engine log"


def _l2_quantities(m: dict) -> dict[str, float]:
    s = l2_summary(m)
    return {"vLLM output tok/s": s["vllm_output_throughput"], "HF static output tok/s": s["static_output_throughput"],
            "vLLM / static output throughput": s["speedup"],
            "vLLM mean inter-token latency ms (clients)": m["vllm"]["summary"]["mean_itl_ms"]}


def _l3_quantities(m: dict) -> dict[str, float]:
    out = {"first max-num-seqs that preempted": first_preempting(m["points"])}
    for p in m["points"]:
        out[f"output tok/s at max-num-seqs {p['max_num_seqs']}"] = p["output_throughput"]
    for p in m["points"]:
        out[f"preemptions at max-num-seqs {p['max_num_seqs']}"] = p["preemptions"]
    return out


def _l4_quantities(m: dict) -> dict[str, float]:
    dtypes, e = m["workload"]["kv_dtypes"], m["engines"]
    out = {}
    for d in dtypes:
        out[f"{d}: output tok/s"] = e[d]["bench"]["summary"]["output_throughput"]
        out[f"{d}: preemptions"] = e[d]["preemptions"]
        out[f"{d}: mean TPOT ms"] = e[d]["bench"]["summary"]["mean_tpot_ms"]
    out[f"{dtypes[1]} / {dtypes[0]} output throughput"] = l4_ratios(dtypes, e)[1]
    return out


#: The quantities :func:`recording_changes` compares, per lab (each from the lab's measurements).
CHANGE_QUANTITIES = {"l2_paged_continuous": _l2_quantities, "l3_preemption": _l3_quantities,
                     "l4_fp8_kv": _l4_quantities}
#: Workload fields that budget the harness, not the load (Lab 3's per-engine time estimate, added when
#: its sweep was split over two device calls): two recordings may differ in them.
_HARNESS_ONLY = frozenset({"point_time_s"})
#: What must be the same in two recordings for their difference to be read as the prompts'.
_SAME = (("GPU", lambda d: d["gpu"]["name"]), ("driver", lambda d: d["gpu"]["driver"]),
         ("vLLM", lambda d: d["vllm_version"]), ("model config", lambda d: d["config_sha256"]),
         ("flags", lambda d: d["engine_args"]),
         ("workload", lambda d: {k: v for k, v in d["measurements"]["workload"].items() if k not in _HARNESS_ONLY}))


def recording_changes(before: dict, after: dict) -> list[dict]:
    """What changed between two recordings of one lab: one row per quantity.

    Rows: ``quantity``, ``before``, ``after``, ``after/before`` (None when ``before`` is 0 or
    None), plus a first row with the highest prefix-cache hit rate of each (%, see
    :func:`load_hit_pct`; its ``how`` says where it was read). Raises :class:`LabError` when the
    two are of different labs, when the lab has no quantities here (:data:`CHANGE_QUANTITIES`), or
    when GPU, driver, vLLM release, model config, flags or workload differ (then the difference is
    not the prompts' alone).
    """
    lab = after["lab"]
    if before["lab"] != lab:
        raise LabError(f"cannot compare a recording of {before['lab']!r} with one of {lab!r}")
    if lab not in CHANGE_QUANTITIES:
        raise LabError(f"no quantities to compare for {lab!r}; known: {', '.join(CHANGE_QUANTITIES)}")
    differ = [name for name, get in _SAME if get(before) != get(after)]
    if differ:
        raise LabError(f"the two recordings of {lab} differ in {', '.join(differ)}: their numbers are not "
                       "comparable as a re-recording of the same lab")
    (hit_b, how_b), (hit_a, how_a) = load_hit_pct(before), load_hit_pct(after)
    rows = [{"quantity": "highest prefix-cache hit rate of a load, %", "before": hit_b, "after": hit_a,
             "after/before": None, "how": f"{how_b} / {how_a}"}]
    qb, qa = CHANGE_QUANTITIES[lab](before["measurements"]), CHANGE_QUANTITIES[lab](after["measurements"])
    for name, b in qb.items():
        a = qa.get(name)
        rows.append({"quantity": name, "before": b, "after": a, "after/before": ratio(a, b), "how": ""})
    return rows


# ---- L1: the memory budget ---------------------------------------------------------------------

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


# ---- L2: paged + continuous batching against static batching -----------------------------------

def static_useful_fraction(output_len: int, range_ratio: float, batch_size: int) -> float:
    """Expected share of static batching's decode slots that produce a useful token.

    Output lengths uniform on ``[(1-r)L, (1+r)L]``; a batch of ``B`` decodes until its longest
    request ends, and the expected maximum of ``B`` uniform draws on ``[lo, hi]`` is
    ``lo + (hi - lo) B / (B + 1)``; the mean length is ``L``.
    """
    lo, hi = int(output_len * (1 - range_ratio)), int(output_len * (1 + range_ratio))
    return output_len / (lo + (hi - lo) * batch_size / (batch_size + 1))


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def l2_summary(measurements: dict) -> dict:
    """Lab 2's comparison of vLLM and the HF static-batching baseline on the same requests.

    Args:
        measurements: with ``vllm.requests`` (``output_len``, ``start_s``, ``latency_s``),
            ``static_baseline`` (``requests`` with ``latency_s``, ``output_throughput``,
            ``computed_tokens``, ``batch_size``).

    Returns:
        ``rows`` (one per system), ``vllm_output_throughput`` (output tokens / time from the first
        request's start to the last one's end, tokens/s), ``static_output_throughput``,
        ``speedup`` (their ratio), ``useful_fraction`` (output tokens / tokens the static
        batches computed).
    """
    vllm_reqs, static = measurements["vllm"]["requests"], measurements["static_baseline"]
    output_tokens = sum(q["output_len"] for q in vllm_reqs)
    v_lat = [q["latency_s"] for q in vllm_reqs]
    h_lat = [q["latency_s"] for q in static["requests"]]
    v_tput = output_tokens / max(q["start_s"] + q["latency_s"] for q in vllm_reqs)
    h_tput = static["output_throughput"]
    rows = [
        {"system": "vLLM (paged, continuous)", "output tok/s": v_tput, "mean latency s": statistics.mean(v_lat),
         "p50 s": _percentile(v_lat, 0.5), "p99 s": _percentile(v_lat, 0.99), "computed tokens": output_tokens},
        {"system": f"HF static, batch {static['batch_size']}", "output tok/s": h_tput,
         "mean latency s": statistics.mean(h_lat), "p50 s": _percentile(h_lat, 0.5),
         "p99 s": _percentile(h_lat, 0.99), "computed tokens": static["computed_tokens"]},
    ]
    return {"rows": rows, "vllm_output_throughput": v_tput, "static_output_throughput": h_tput,
            "speedup": v_tput / h_tput, "useful_fraction": output_tokens / static["computed_tokens"]}


# ---- L3: max-num-seqs and preemption -----------------------------------------------------------

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
    ``l3_preemption[_<values>]_gpu.json``, :mod:`servebook.lab.split`). They are merged only when
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

    from servebook.lab.split import check_same_experiment, part_paths

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
    (``l3_preemption_16_48``, :func:`servebook.lab.split.part_name`), which must match the file's name."""
    doc = load_recorded(path)
    expected = path.name.removesuffix("_gpu.json")
    if doc["lab"] not in ("l3_preemption", expected):
        raise LabError(f"{path} holds lab {doc['lab']!r}, not l3_preemption or the part {expected!r}: "
                       "pass the files of Lab 3, unedited")
    return doc


#: Labs whose sweep may be recorded in part files, and the function that merges them.
_PART_MERGERS = {"l3_preemption": load_l3}


def first_preempting(points: list[dict]) -> int | None:
    """The smallest swept max-num-seqs whose run preempted, or None if none did."""
    return next((p["max_num_seqs"] for p in sorted(points, key=lambda p: p["max_num_seqs"]) if p["preemptions"] > 0),
                None)


# ---- L4: fp8 KV cache --------------------------------------------------------------------------

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


# ---- L5: chunked prefill ----------------------------------------------------------------------

def _config_key(c: dict) -> tuple[bool, int]:
    return bool(c["chunked"]), int(c["max_num_batched_tokens"])


def l5_chunk_step_s(config: dict) -> float | None:
    """Mean engine seconds per step while the long prompt was prefilled (first run of a config).

    From the engine's own step log (``servebook.lab.step_recorder``): the time between the
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


# ---- L6: prefix caching -----------------------------------------------------------------------

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


# ---- plots -------------------------------------------------------------------------------------

def _axes(figsize=(6, 3.5)):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def figure_title(doc: dict | None, what: str) -> str:
    """A figure's title: ``what``, then the model, GPU and vLLM version of a recorded ``doc`` (if any)."""
    if doc is None:
        return what
    return f"{what}\n{doc['model_id']}, {doc['gpu']['name']}, vLLM {doc['vllm_version']}"


def plot_l1(points: list[dict], doc: dict | None = None):
    """Predicted and engine KV tokens per start (grouped bars). Returns the figure."""
    rows = l1_table(points)
    fig, ax = _axes((7, 3.6))
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


def plot_l2(measurements: dict, doc: dict | None = None):
    """Latency CDF of vLLM and the static baseline (left) and their output throughput (right)."""
    import matplotlib.pyplot as plt

    summary = l2_summary(measurements)
    static = measurements["static_baseline"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [2, 1]})
    for label, reqs in (("vLLM", measurements["vllm"]["requests"]),
                        (f"HF static (batch {static['batch_size']})", static["requests"])):
        lat = sorted(q["latency_s"] for q in reqs)
        a.step(lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post", label=label)
    a.set_xlabel("request latency, s (all requests queued at t=0)")
    a.set_ylabel("share of requests done (CDF)")
    a.legend(fontsize=8)
    b.bar(["vLLM", "HF static"], [summary["vllm_output_throughput"], summary["static_output_throughput"]],
          color=["C0", "C1"])
    b.set_xlabel("system (same requests)")
    b.set_ylabel("output throughput, tokens/s")
    fig.suptitle(figure_title(doc, "Continuous batching vs static batching"), fontsize=9)
    fig.tight_layout()
    return fig


def plot_l3(measurements: dict, doc: dict | None = None):
    """Output throughput (line) and preemptions (bars) against max-num-seqs, predicted knee marked."""
    points, knee = measurements["points"], measurements["predicted_knee"]
    fig, ax = _axes()
    xs = [p["max_num_seqs"] for p in points]
    ax.plot(xs, [p["output_throughput"] for p in points], "o-", label="output tokens/s")
    ax.axvline(knee, ls="--", color="grey", label=f"predicted knee ({knee})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("--max-num-seqs (requests per step, log scale)")
    ax.set_ylabel("output throughput, tokens/s")
    ax2 = ax.twinx()
    ax2.bar(xs, [p["preemptions"] for p in points], width=[x * 0.2 for x in xs], alpha=0.3, color="red")
    ax2.set_ylabel("preemptions (count)")
    blocks = measurements["workload"]["num_gpu_blocks_override"]
    ax.set_title(figure_title(doc, f"Preemptions and throughput, pool of {blocks:,} blocks"), fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def plot_l4(measurements: dict, doc: dict | None = None):
    """KV tokens (predicted and engine) and output throughput for each KV dtype."""
    import matplotlib.pyplot as plt

    dtypes = measurements["workload"]["kv_dtypes"]
    rows = l4_table(dtypes, measurements["predictions"], measurements["engines"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.4))
    xs = range(len(rows))
    a.bar([x - 0.2 for x in xs], [r["tokens predicted"] / 1e3 for r in rows], 0.4, label="predicted")
    a.bar([x + 0.2 for x in xs], [(r["tokens engine"] or 0) / 1e3 for r in rows], 0.4, label="engine log")
    labels = [d + ("\n(skipped)" if r.get("skipped") == "yes" else "") for d, r in zip(dtypes, rows)]
    a.set_xticks(list(xs), labels)
    a.set_xlabel("--kv-cache-dtype")
    a.set_ylabel("KV cache, thousand tokens")
    a.legend(fontsize=8)
    b.bar(list(xs), [r["output tok/s"] or 0 for r in rows], color="C2")
    b.set_xticks(list(xs), labels)
    b.set_xlabel("--kv-cache-dtype")
    b.set_ylabel("output throughput, tokens/s")
    fig.suptitle(figure_title(doc, "fp8 KV cache: pool size and throughput"), fontsize=9)
    fig.tight_layout()
    return fig


def plot_l5(measurements: dict, doc: dict | None = None):
    """TTFT against worst ITL per budget, measured and predicted (left); mean prefill step (right)."""
    import matplotlib.pyplot as plt

    rows = l5_table(measurements)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    a.plot([r["TTFT ms predicted"] for r in rows], [r["worst ITL ms predicted"] for r in rows], "x--",
           color="grey", label="predicted (calibrated step model)")
    a.plot([r["TTFT ms measured"] for r in rows], [r["worst ITL ms measured"] for r in rows], "o",
           color="C0", label="measured (clients, median of repeats)")
    for r in rows:
        a.annotate(f"{r['budget']:,}" + ("" if r["chunking"] == "on" else " (off)"),
                   (r["TTFT ms measured"], r["worst ITL ms measured"]), textcoords="offset points",
                   xytext=(4, 4), fontsize=8)
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
