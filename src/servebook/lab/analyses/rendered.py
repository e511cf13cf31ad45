"""The recording the book renders for a lab: its file, or its part files merged by the lab's own reader.

:func:`servebook.lab.recordings.recorded.load_rendered` reads any lab's file and knows no lab. A lab whose sweep
may be recorded in part files (split over device calls, :mod:`servebook.lab.harness.split`) names its merger in
:data:`PART_MERGERS`; :func:`load_lab` passes it on. The drills read recorded labs through it.
"""
from __future__ import annotations

from pathlib import Path

from servebook.lab.analyses.lab3_preemption import load_l3
from servebook.lab.recordings.recorded import load_rendered

#: Labs whose sweep may be recorded in part files, and the lab's own function that merges them.
PART_MERGERS = {"l3_preemption": load_l3}


def load_lab(stem: str, directory: str | Path | None = None) -> tuple[str, dict]:
    """(name to show, document) of the recording the book renders for ``stem`` (``l3_preemption_gpu``):
    :func:`~servebook.lab.recordings.recorded.load_rendered` with the lab's merger of part files, if it has one."""
    return load_rendered(stem, directory, merge_parts=PART_MERGERS.get(stem.removesuffix("_gpu")))
