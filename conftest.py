"""pytest collects every chapter notebook (notebooks/*.md, MyST markdown) through nbval.

nbval reads only .ipynb files, so this hook reads each .md with jupytext and hands nbval's own
collector (``nbval.plugin.IPyNbFile``) the converted notebook: every code cell becomes one test
item (``notebooks/<name>.md::Cell <n>``) run in one kernel per notebook, started from this
interpreter (nbval's current-environment kernel) in the notebook's folder, as the book build runs it.

Semantics are nbval's ``--nbval-lax``: a cell only has to run without raising, unless it carries
nbval's tag ``nbval-check-output`` (``:tags: [nbval-check-output]`` in the MyST source; the comment
``# NBVAL_CHECK_OUTPUT`` works too but shows on the page). Such a cell's printed output is a claim of the book;
nbval compares it with the committed executed copy ``tests/notebook_refs/<name>.ipynb`` (made by
``bash scripts/refresh-notebook-refs.sh``) after the substitutions of
``tests/notebook_sanitize.cfg``, and a changed number fails with nbval's diff of the cell.

A hung kernel fails the cell after ``--nbval-cell-timeout`` seconds (set in pyproject.toml); nbval
then kills the kernel's process group and marks the notebook's remaining cells xfail.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import jupytext
import nbformat
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, RunningKernel
from nbval.plugin import IPyNbCell, IPyNbFile, find_comment_markers, find_metadata_tags

ROOT = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"
REFERENCES = ROOT / "tests" / "notebook_refs"
SANITIZE = ROOT / "tests" / "notebook_sanitize.cfg"
REFRESH = "bash scripts/refresh-notebook-refs.sh"

# The references are data for the notebooks above, not notebooks to run (nbval --nbval would collect them).
collect_ignore = ["tests/notebook_refs"]


def pytest_addoption(parser):
    group = parser.getgroup("nbval-myst", "MyST-markdown notebooks through nbval (conftest.py)")
    group.addoption("--notebook-refs", default=str(REFERENCES), metavar="DIR",
                    help="folder of the executed reference copies <name>.ipynb (default: tests/notebook_refs)")


def pytest_collect_file(file_path: Path, parent):
    if file_path.suffix == ".md" and file_path.parent == NOTEBOOKS:
        return MystNotebook.from_parent(parent, path=file_path)
    return None


def is_checked(cell) -> bool:
    """Whether a code cell is compared with its reference: nbval's ``nbval-check-output`` tag (how the
    notebooks mark it: ``:tags: [nbval-check-output]``, invisible on the page) or its
    ``# NBVAL_CHECK_OUTPUT`` comment."""
    options = dict(find_metadata_tags(cell.metadata) or ())
    options.update(find_comment_markers(cell.source))
    return options.get("check", False) is True


def with_reference_outputs(notebook, reference, name: str):
    """``notebook`` (read from the .md, no outputs) with the reference's outputs copied into its
    checked cells, matched in order; the other cells stay unrun. Raises ValueError when the two
    do not have the same checked cells with the same source."""
    def checked(nb):
        return [c for c in nb.cells if c.cell_type == "code" and is_checked(c)]
    ours, theirs = checked(notebook), checked(reference)
    stale = f"tests/notebook_refs/{name}.ipynb is stale: run `{REFRESH}` and commit the result"
    if len(ours) != len(theirs):
        raise ValueError(f"{name}.md has {len(ours)} cells marked nbval-check-output, "
                         f"its reference {len(theirs)}; {stale}")
    for index, (cell, ref) in enumerate(zip(ours, theirs), start=1):
        if cell.source != ref.source:
            first = cell.source.strip().splitlines()[0]
            raise ValueError(f"{name}.md: checked cell {index} (`{first}`) differs from its reference; {stale}")
        if ref.execution_count is None:
            raise ValueError(f"{name}.md: checked cell {index} has no executed output in the reference; {stale}")
        cell.outputs, cell.execution_count = ref.outputs, ref.execution_count
    return notebook


class MystNotebook(IPyNbFile):
    """One MyST notebook: nbval's collector fed with jupytext's conversion."""

    def collect(self):
        name = self.path.stem
        notebook = jupytext.read(self.path)
        if notebook.metadata.get("kernelspec", {}).get("name") != "python3":
            raise ValueError(f"{self.path.name}: its jupytext header must name the python3 kernel "
                             "(kernelspec: name: python3)")
        code = [c for c in notebook.cells if c.cell_type == "code"]
        if not code:
            raise ValueError(f"{self.path.name} has no code cells: is the jupytext header "
                             "(format_name: myst) there?")
        for cell in code:
            cell.outputs, cell.execution_count = [], None
        reference_path = Path(self.config.option.notebook_refs) / f"{name}.ipynb"
        if any(is_checked(c) for c in code):
            if not reference_path.exists():
                raise ValueError(f"{self.path.name} has cells marked nbval-check-output but no "
                                 f"reference {reference_path}: run `{REFRESH}`")
            with_reference_outputs(notebook, nbformat.read(reference_path, as_version=4), name)
        self.nb = notebook
        for number, cell in enumerate(code):
            options = defaultdict(bool, find_metadata_tags(cell.metadata))
            options.update(find_comment_markers(cell.source))
            options.setdefault("check", False)  # --nbval-lax: only marked cells are compared
            yield IPyNbCell.from_parent(self, name=f"Cell {number}", cell_num=number, cell=cell,
                                        options=options)

    def setup(self):
        # The kernel of this interpreter (never a python3 kernelspec found elsewhere), started
        # in the notebook's folder: nbval's own set-up, with the kernel fixed.
        self.kernel = RunningKernel(CURRENT_ENV_KERNEL_NAME, cwd=str(self.path.parent),
                                    startup_timeout=self.config.option.nbval_kernel_startup_timeout)
        self.setup_sanitize_files()

    def get_sanitize_files(self):
        return [self.config.option.nbval_sanitize_with or str(SANITIZE)]

