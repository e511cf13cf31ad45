"""Read recorded lab results (schema ``servebook.lab/1``): what every lab's recording needs.

Each lab's own tables, summaries, figure and reader live in its module (:mod:`servebook.lab.analyses`,
which imports this one; this module imports no lab); the labs and their results pages
(``labs/results_l<N>.md``) call the same functions, so a lab and the page that renders its recorded
run print the same table. Here:

* :func:`recorded_path` — the file the book renders for a lab (``labs/results/labs/<lab>_gpu.json``).
* :func:`read_checked_document` — the checks every recorded JSON document needs (schema, provenance,
  ISO date); :func:`load_recorded` — one lab result file, checked.
* :func:`load_rendered` — the recording the book renders for a file stem (a lab recorded in parts
  comes merged by the merger its caller passes).
* :func:`provenance` — the header a page prints: GPU, driver, vLLM version, date, model shape;
  :func:`what_ran` — that header as the Markdown table a results page shows.
* :func:`figure_title` — a figure's title naming the model, GPU and vLLM release it shows.

Re-recordings are compared by :mod:`.rerecordings`; prefix-cache hit rates and running requests are
read from recordings by :mod:`.engine_stats`.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Callable

from servebook.lab.errors import LabError
from servebook.lab.harness.results import REQUIRED, SCHEMA
from servebook.records import results_path

#: Where the GPU runs are committed (``labs/results/labs/<lab>_gpu.json``).
RECORDED_DIR = results_path("labs")
_GPU_FIELDS = ("name", "count", "driver")


def recorded_path(lab: str, profile: str = "gpu") -> Path:
    """``labs/results/labs/<lab>_<profile>.json``: the recording the book renders."""
    return RECORDED_DIR / f"{lab}_{profile}.json"


def load_rendered(stem: str, directory: str | Path | None = None, *,
                  merge_parts: Callable[[Path], dict] | None = None) -> tuple[str, dict]:
    """(name to show, document) of the recording the book renders for a file stem (``l3_preemption_gpu``).

    ``<stem>.json`` when it exists, checked by :func:`load_recorded`; otherwise, for a lab recorded
    in parts, ``merge_parts(directory)``: the lab's own merger, which the caller passes (this reader
    knows no lab; :data:`servebook.lab.analyses.rendered.PART_MERGERS` names each lab's), shown as
    ``l3_preemption_{16_48,128_256}_gpu.json``.
    ``directory`` defaults to :data:`RECORDED_DIR`. Raises :class:`LabError` when neither exists.
    """
    directory = Path(directory) if directory is not None else RECORDED_DIR
    path = directory / f"{stem}.json"
    lab = stem.removesuffix("_gpu")
    if path.is_file() or merge_parts is None:
        return str(path), load_recorded(path)
    doc = merge_parts(directory)
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
        path: a ``<lab>_<profile>.json`` written by :func:`servebook.lab.harness.save_result`.
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


def what_ran(doc: dict) -> str:
    """A results page's "What ran" table (Markdown) for one recording: GPU, driver/CUDA/torch, vLLM,
    date (UTC day), model shape, weights and the flags every engine of the lab was given."""
    h = provenance(doc)
    flags = ", ".join(f"`{k}={v}`" for k, v in h["engine_args"].items())
    gib = f", {h['gpu_memory_gib']:.1f} GiB as torch reports it" if h["gpu_memory_gib"] else ""
    rows = [("GPU", f"{h['gpu']}{gib}"),
            ("driver, CUDA, torch", f"{h['driver']}, CUDA {h['cuda']}, torch {h['torch']}"),
            ("vLLM", f"**{h['vllm_version']}**"),
            ("date (UTC)", h["date"]),
            ("model", f"{h['model_id']} shape ({h['layers']} layers, hidden size {h['hidden_size']}, "
                      f"{h['attention_heads']} attention heads, {h['kv_heads']} KV heads, vocabulary "
                      f"{h['vocab_size']:,}), {h['dtype']}"),
            ("weights", f"{h['weights']} — no download; memory and speed do not depend on the values"),
            ("flags shared by its engines", flags)]
    return "\n".join(["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def figure_title(doc: dict | None, what: str) -> str:
    """A figure's title: ``what``, then the model, GPU and vLLM version of a recorded ``doc`` (if any)."""
    if doc is None:
        return what
    return f"{what}\n{doc['model_id']}, {doc['gpu']['name']}, vLLM {doc['vllm_version']}"
