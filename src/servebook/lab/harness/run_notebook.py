"""Run a MyST-markdown lab headless: ``python -m servebook.lab.harness.run_notebook labs/l1_memory_budget.md``.

For GPU nodes without Jupyter: the ``{code-cell}`` blocks run in order in one namespace,
with matplotlib on the Agg backend. Exit status 1 (and the cell's source) on the first error.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
from pathlib import Path

_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def code_cells(text: str) -> list[str]:
    """Source of every ``{code-cell}`` block, cell options (``:tags:``) and magics removed."""
    cells = []
    for body in _CELL.findall(text):
        lines = [l for l in body.splitlines() if not l.startswith(":") and not l.lstrip().startswith("%")]
        cells.append("\n".join(lines))
    return cells


def main(path: str) -> int:
    os.environ.setdefault("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__main__"}
    t0 = time.monotonic()
    for i, cell in enumerate(code_cells(Path(path).read_text())):
        t_cell = time.monotonic()
        try:
            exec(compile(cell, f"{path}#cell{i}", "exec"), namespace)
            print(f"--- {path}: cell {i} took {time.monotonic() - t_cell:.1f} s", flush=True)
        except BaseException:
            traceback.print_exc()
            print(f"--- {path}: cell {i} failed:\n{cell}", file=sys.stderr)
            return 1
    print(f"--- {path}: done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
