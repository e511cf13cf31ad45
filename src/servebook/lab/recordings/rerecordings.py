"""Re-recordings: the recording a lab's newest run replaced, and what changed between the two.

The rule: the newest run of a lab is ``labs/results/labs/<lab>_gpu.json`` (what the book renders);
the run it replaced moves, unedited, to ``labs/results/raw/`` under the date of its run
(:data:`PREVIOUS_RECORDINGS` names it, :func:`previous_path` finds it). :func:`recording_changes`
compares the two on the quantities the lab's own module names (its ``change_quantities``, which the
caller passes: this reader knows no lab), after checking that GPU, driver, vLLM release, model config,
flags and workload are the same.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from servebook.lab.recordings.engine_stats import load_hit_pct
from servebook.lab.errors import LabError
from servebook.lab.harness.table import ratio
from servebook.records import results_path

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


def previous_path(lab: str) -> Path:
    """The recording of ``lab`` that :func:`recorded_path` replaced (``labs/results/raw/...``).

    Raises :class:`LabError` for a lab that has not been re-recorded.
    """
    if lab not in PREVIOUS_RECORDINGS:
        raise LabError(f"{lab!r} has not been re-recorded: no previous recording is named in "
                       f"PREVIOUS_RECORDINGS (re-recorded: {', '.join(PREVIOUS_RECORDINGS)})")
    return RAW_DIR / PREVIOUS_RECORDINGS[lab]


#: Workload fields that budget the harness, not the load (Lab 3's per-engine time estimate, added when
#: its sweep was split over two device calls): two recordings may differ in them.
_HARNESS_ONLY = frozenset({"point_time_s"})
#: What must be the same in two recordings for their difference to be read as the prompts'.
_SAME = (("GPU", lambda d: d["gpu"]["name"]), ("driver", lambda d: d["gpu"]["driver"]),
         ("vLLM", lambda d: d["vllm_version"]), ("model config", lambda d: d["config_sha256"]),
         ("flags", lambda d: d["engine_args"]),
         ("workload", lambda d: {k: v for k, v in d["measurements"]["workload"].items() if k not in _HARNESS_ONLY}))


def recording_changes(before: dict, after: dict,
                      quantities: Callable[[dict], dict[str, float]]) -> list[dict]:
    """What changed between two recordings of one lab: one row per quantity.

    ``quantities`` is the lab's own ``change_quantities`` (its module's: Lab 3's
    :func:`servebook.lab.analyses.lab3_preemption.change_quantities`), called on each recording's
    ``measurements``; it returns the compared quantities by name. Rows: ``quantity``, ``before``,
    ``after``, ``after/before`` (None when ``before`` is 0 or None), plus a first row with the highest
    prefix-cache hit rate of each (%, see :func:`load_hit_pct`; its ``how`` says where it was read).
    Raises :class:`LabError` when the two are of different labs, or when GPU, driver, vLLM release,
    model config, flags or workload differ (then the difference is not the prompts' alone).
    """
    lab = after["lab"]
    if before["lab"] != lab:
        raise LabError(f"cannot compare a recording of {before['lab']!r} with one of {lab!r}")
    differ = [name for name, get in _SAME if get(before) != get(after)]
    if differ:
        raise LabError(f"the two recordings of {lab} differ in {', '.join(differ)}: their numbers are not "
                       "comparable as a re-recording of the same lab")
    (hit_b, how_b), (hit_a, how_a) = load_hit_pct(before), load_hit_pct(after)
    rows = [{"quantity": "highest prefix-cache hit rate of a load, %", "before": hit_b, "after": hit_a,
             "after/before": None, "how": f"{how_b} / {how_a}"}]
    qb, qa = quantities(before["measurements"]), quantities(after["measurements"])
    for name, b in qb.items():
        a = qa.get(name)
        rows.append({"quantity": name, "before": b, "after": a, "after/before": ratio(a, b), "how": ""})
    return rows
