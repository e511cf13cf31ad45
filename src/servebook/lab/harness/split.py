"""One lab's sweep split over several runs, and the files merged back into one view.

A device ``run`` call lasts at most 600 s (``labs/tools/run_labs_gpu.sh`` caps a lab at 570 s), so
a sweep of engines that needs longer is measured in parts. Labs 3 and 9 share the pieces here:

* :func:`selected` — the points an environment variable names (``SERVEBOOK_LAB_L3_MAX_NUM_SEQS=16,48``,
  ``SERVEBOOK_LAB_L9_CONFIGS=TP=2``), checked against the lab's own list;
* :func:`part_name` — the result file of such a part carries the names (``l3_preemption_16_48``),
  so it never replaces another part's file;
* :func:`sweep` — measures one point after another, skips what cannot finish before the runner's
  deadline (:mod:`servebook.lab.harness.deadline`) and saves after every point, so a run cut short keeps
  what it measured and records what it skipped;
* :func:`part_paths` and :func:`check_same_experiment` — the renderer finds a lab's part files and
  merges them only when they describe the same experiment: GPU name, count and driver, vLLM
  release, model and model config, and the load (named ``measurements`` fields) all agree.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable

from servebook.lab.harness import deadline
from servebook.lab.errors import LabError

#: Top-level fields that must agree between the part files of one experiment.
SAME_FIELDS = ("vllm_version", "model_id", "config_sha256")
#: ``gpu`` fields that must agree (the same machine kind and driver).
SAME_GPU_FIELDS = ("name", "count", "driver")


def selected(env: str, valid: list, parse: Callable[[str], object] = str) -> list:
    """The points ``$env`` names (comma-separated, in the lab's order), or [] when it is unset or empty.

    ``parse`` turns each name into a point (``int`` for ``--max-num-seqs`` values). Raises
    :class:`LabError` naming the variable and the valid values when a name does not parse, is not
    among ``valid``, or is given twice.
    """
    raw = os.environ.get(env, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if not names:
        return []
    choose = ",".join(str(v) for v in valid)
    try:
        points = [parse(n) for n in names]
    except ValueError:
        raise LabError(f"{env}={raw!r} is not a comma-separated list of the lab's points; "
                       f"choose from {choose} (e.g. {env}={valid[0]})") from None
    unknown = [n for n, p in zip(names, points) if p not in valid]
    if unknown:
        raise LabError(f"{env} names {', '.join(unknown)}, not swept by this profile; choose from {choose}")
    if len(set(points)) != len(points):
        raise LabError(f"{env}={raw!r} names a point twice; name each once, from {choose}")
    return [v for v in valid if v in points]


def part_name(lab: str, points: list) -> str:
    """``lab`` alone for the whole sweep, else ``lab_<point>_<point>`` (lower case, '=' dropped, '+' as '-')."""
    if not points:
        return lab
    return lab + "_" + "_".join(str(p).lower().replace("=", "").replace("+", "-") for p in points)


def sweep(points: list, measure: Callable[[object], dict], save: Callable[[list[dict]], object], *,
          key: str, need_s: float, clock: Callable[[], float] = time.monotonic) -> list[dict]:
    """Measure ``points`` one after another, saving the list after every one.

    Before each point, :func:`servebook.lab.harness.deadline.fits` is asked whether the slowest point so far
    (``need_s`` before the first) still fits; if not, ``{key: point, "skipped": reason}`` is recorded
    instead. ``measure(point)`` returns the point's record (``key`` is set on it, with ``wall_s``,
    its seconds). ``save(records)`` is called after every point, measured or skipped. Returns the
    records in order.
    """
    records: list[dict] = []
    durations: list[float] = []
    for point in points:
        need = max([need_s, *durations])
        if not deadline.fits(need):
            left = deadline.seconds_left()
            records.append({key: point, "skipped": f"runner's deadline: {left:.0f} s left, a point needs ~{need:.0f} s"})
        else:
            t0 = clock()
            record = dict(measure(point))
            durations.append(clock() - t0)
            records.append({key: point, **record, "wall_s": round(durations[-1], 1)})
        save(records)
    return records


def part_paths(lab: str, directory: str | Path, profile: str = "gpu") -> list[Path]:
    """``<lab>_<profile>.json`` and every ``<lab>_<part>_<profile>.json`` in ``directory``, sorted."""
    directory = Path(directory)
    pattern = re.compile(rf"{re.escape(lab)}(_[a-z0-9_-]+)?_{re.escape(profile)}\.json")
    return sorted(p for p in directory.glob(f"{lab}*_{profile}.json") if pattern.fullmatch(p.name))


def check_same_experiment(docs: list[dict], paths: list[Path], *, measurement_keys: tuple[str, ...],
                          what: str, hint: str) -> None:
    """Raise :class:`LabError` unless every document agrees with the first on what makes the experiment.

    Compared: :data:`SAME_FIELDS`, ``gpu.``:data:`SAME_GPU_FIELDS` and ``measurements[k]`` for each
    ``k`` in ``measurement_keys`` (the load). The message names the field, both files and both
    values; ``what`` names the files ("Lab 3 files"), ``hint`` says how to get a mergeable part.
    """
    first, head = docs[0], paths[0].name
    for doc, path in zip(docs[1:], paths[1:]):
        for key in SAME_FIELDS:
            if doc[key] != first[key]:
                raise LabError(f"{path.name} has {key} {doc[key]!r} but {head} has {first[key]!r}: "
                               f"{what} must come from the same experiment; {hint}")
        for key in SAME_GPU_FIELDS:
            if doc["gpu"][key] != first["gpu"][key]:
                raise LabError(f"{path.name} ran on gpu.{key} {doc['gpu'][key]!r}, {head} on "
                               f"{first['gpu'][key]!r}: merge only runs on the same machine kind; {hint}")
        for key in measurement_keys:
            if doc["measurements"].get(key) != first["measurements"].get(key):
                raise LabError(f"{path.name}: measurements.{key} differs from {head}'s; the runs measured "
                               f"different loads and cannot share a table; {hint}")
