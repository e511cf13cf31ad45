"""Write tests/notebook_refs/<name>.ipynb: each notebooks/<name>.md executed, the reference outputs
nbval compares the checked cells with (tag ``nbval-check-output``; see conftest.py).

Runs the notebook as the tests do: converted by jupytext, in a kernel of this interpreter (nbval's
current-environment kernel) started in notebooks/. Only the code cells are kept, and only the
marked ones with their outputs; the other code cells keep their source and lose their outputs,
which keeps plots and widget state out of git. A notebook with no marked cell gets no reference.

Usage: bash scripts/refresh-notebook-refs.sh [NAME ...]   (default: every notebook)
"""
from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from conftest import is_checked  # noqa: E402  (one rule for the tests and the references)

NOTEBOOKS = ROOT / "notebooks"
REFERENCES = ROOT / "tests" / "notebook_refs"
CELL_TIMEOUT_S = 300


def reference(path: Path) -> nbformat.NotebookNode | None:
    """``path`` executed with only its marked cells' outputs kept; None when no cell is marked."""
    notebook = jupytext.read(path)
    if not any(c.cell_type == "code" and is_checked(c) for c in notebook.cells):
        return None
    km = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    NotebookClient(notebook, km=km, timeout=CELL_TIMEOUT_S,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook.cells = [c for c in notebook.cells if c.cell_type == "code"]   # the prose is not compared
    for number, cell in enumerate(notebook.cells):
        cell.id = f"code-{number}"   # jupytext makes random ids: fixed ones keep the git diff to outputs
        if not is_checked(cell):
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)   # timestamps: would change every refresh
    notebook.metadata.pop("widgets", None)
    return notebook


def main(names: list[str]) -> int:
    paths = [NOTEBOOKS / f"{n}.md" for n in names] if names else sorted(NOTEBOOKS.glob("*.md"))
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"error: no such notebook {missing}; names are the stems of notebooks/*.md", file=sys.stderr)
        return 2
    REFERENCES.mkdir(parents=True, exist_ok=True)
    for path in paths:
        target = REFERENCES / f"{path.stem}.ipynb"
        notebook = reference(path)
        if notebook is None:
            target.unlink(missing_ok=True)
            print(f"{path.stem}: no cell tagged nbval-check-output, no reference")
            continue
        nbformat.write(notebook, target)
        print(f"{path.stem}: wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
