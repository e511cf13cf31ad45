"""A drill's exhibit: real recorded material shown with the question, lines selected, never retyped.

Start-up logs and the bench capture ship with the package (:mod:`servebook.shipped`); step
timings and lab results are recorded results (:mod:`servebook.records`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from servebook.errors import DrillError

#: Where exhibits come from: shipped data (``shipped``) or recorded results (``records``), and the
#: default file inside a folder.
EXHIBIT_ROOTS = {
    "startup_log": (("shipped", "startup_logs"), "startup.log"),
    "capture": (("shipped", "bench"), None),
    "step_timing": (("records", "step_timing"), None),
    "lab": (("records", "labs"), None),
}


@dataclass(frozen=True)
class Exhibit:
    """Recorded material shown with a question.

    Attributes:
        source: ``"startup_log"`` (a shipped GPU start-up, servebook/data/startup_logs), ``"capture"``
            (the shipped capture, servebook/data/bench), ``"step_timing"`` (recorded results'
            step_timing/) or ``"lab"`` (a recorded lab result, the results' labs/*.json;
            see :mod:`servebook.records`).
        name: the folder (or, for step timing and labs, the JSON file's stem).
        file: the file inside a capture folder (``metrics_after.txt``, ``bench_stdout.txt`` ...).
        grep: regular expression; only matching lines are shown (all lines when empty; for
            a lab, the lines of each selected point's engine log, none when empty).
        points: lab only: which ``measurements.points`` to show, ``{key: [values]}``.
        fields: lab only: dotted paths inside a point (``bench.summary.output_throughput``)
            shown as the file spells them, ``"leaf": value``, before the log lines.
        max_line_chars: longer lines are cut (with "...") so the page stays readable.
        caption: one line saying what the material is and where it was recorded.
    """

    source: str
    name: str
    file: str | None = None
    grep: str = ""
    max_line_chars: int = 400
    caption: str = ""
    points: dict = field(default_factory=dict)
    fields: tuple = ()

    def path(self) -> Path:
        from servebook.records import results_path
        from servebook.shipped import DATA_DIR

        if self.source not in EXHIBIT_ROOTS:
            raise DrillError(f"exhibit source {self.source!r} is not one of {', '.join(EXHIBIT_ROOTS)}")
        (where, folder), default = EXHIBIT_ROOTS[self.source]
        base = DATA_DIR / folder if where == "shipped" else results_path(folder)
        if self.source in ("step_timing", "lab"):
            return base / f"{self.name}.json"
        return base / self.name / (self.file or default or "")

    def recorded_files(self) -> list[Path]:
        """The files the exhibit's lines come from: :meth:`path`, or for a lab recorded in part files
        (no ``<name>.json``; :func:`servebook.lab.analyses.rendered.load_lab`) each part file."""
        p = self.path()
        if self.source != "lab" or p.is_file():
            return [p]
        from servebook.lab.harness.split import part_paths

        return part_paths(self.name.removesuffix("_gpu"), p.parent) or [p]

    def lines(self) -> list[str]:
        """The selected lines of the recorded file, unedited except for cutting long lines."""
        if self.source == "lab":
            return self._lab_lines()
        p = self.path()
        if not p.is_file():
            raise DrillError(f"exhibit {p} does not exist; record it first (see the folder's README)")
        text = p.read_text(errors="replace")
        if self.source == "step_timing":
            import json

            data = json.loads(text)
            text = "\n".join(c.get("log", "") for c in data["cases"])
        text = re.sub(r"\x1b\[[0-9;]*m", "", text)
        pattern = re.compile(self.grep) if self.grep else None
        out = []
        for line in text.splitlines():
            if pattern is None or pattern.search(line):
                out.append(line if len(line) <= self.max_line_chars else line[: self.max_line_chars] + " ...")
        if not out:
            raise DrillError(f"exhibit {p}: no line matches {self.grep!r}")
        return out

    def _lab_lines(self) -> list[str]:
        """Selected points of a lab result: each field as the JSON file writes it, then matching log lines.

        The result is read by :func:`servebook.lab.analyses.rendered.load_lab` (checked; a lab recorded in
        part files comes merged)."""
        import json

        from servebook.drills.calls import repo_relative, value_at
        from servebook.lab.errors import LabError
        from servebook.lab.analyses.rendered import load_lab

        try:
            name, doc = load_lab(self.name, self.path().parent)
        except LabError as e:
            raise DrillError(f"exhibit {self.name}: {e}; record it first (see the folder's README)") from None
        name = repo_relative(Path(name))
        points = doc.get("measurements", {}).get("points", [])
        chosen = [pt for pt in points if all(pt.get(k) in v for k, v in self.points.items())]
        if not chosen:
            raise DrillError(f"exhibit {name}: no measurement point matches {self.points!r}")
        pattern = re.compile(self.grep) if self.grep else None
        out = []
        for pt in chosen:
            for path in self.fields:
                value = value_at(pt, path, f"exhibit {name}",
                                 f"measurements.points[{points.index(pt)}]", DrillError)
                out.append(f'"{path.split(".")[-1]}": {json.dumps(value)}')
            if pattern is not None:
                for line in re.sub(r"\x1b\[[0-9;]*m", "", pt.get("log", "")).splitlines():
                    if pattern.search(line):
                        out.append(line if len(line) <= self.max_line_chars else line[: self.max_line_chars] + " ...")
        return out

    def text(self) -> str:
        return "\n".join(self.lines())
