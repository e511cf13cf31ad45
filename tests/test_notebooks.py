"""Every chapter notebook (notebooks/*.md, MyST markdown) runs top to bottom without error.

One test per notebook: jupytext reads it, nbclient runs it in a ``python3`` kernel started from
this test's own interpreter (the .venv), with the notebook's folder as working directory, as the
book build does. A cell that raises fails the test with the cell and its traceback. The notebooks
put their real checks in ``assert`` cells. GPU labs (labs/) are not run here.
"""
from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

import jupytext
import nbformat
import pytest
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))
CELL_TIMEOUT_S = 300

# First cell run in every notebook: which Python the kernel is.
_WHICH_PYTHON = "import sys; print(sys.prefix)"


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no *.md notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    notebook = jupytext.read(path)
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: its jupytext header must name the python3 kernel (kernelspec: name: python3)")
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert code_cells, f"{path.name} has no code cells: is the jupytext header (format_name: myst) there?"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(_WHICH_PYTHON))
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except CellExecutionError as exc:
        pytest.fail(f"{path.relative_to(ROOT)}: a cell failed\n{exc}", pytrace=False)
    kernel_prefix = "".join(o.get("text", "") for o in notebook.cells[0].outputs).strip()
    assert kernel_prefix == sys.prefix, (
        f"the notebook ran in {kernel_prefix}, not in this environment ({sys.prefix}); "
        "a python3 kernelspec elsewhere shadows it: run the tests with .venv/bin/python -m pytest")


def _toc_files(node) -> set[str]:
    """Every ``file:`` entry of a parsed _toc.yml, at any depth."""
    if isinstance(node, dict):
        found = {node["file"]} if isinstance(node.get("file"), str) else set()
        for value in node.values():
            found |= _toc_files(value)
        return found
    if isinstance(node, list):
        return set().union(*(_toc_files(item) for item in node)) if node else set()
    return set()


def test_every_notebook_is_in_the_toc():
    """A notebook missing from _toc.yml is neither built nor published."""
    listed = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    missing = [p.stem for p in NOTEBOOKS if f"notebooks/{p.stem}" not in listed]
    assert not missing, "add to _toc.yml under 'Notebooks': " + ", ".join(f"- file: notebooks/{m}" for m in missing)


def test_no_paired_ipynb():
    """A .ipynb next to its .md makes the build fail ('multiple files found'); keep only the .md."""
    paired = [p.name for p in (ROOT / "notebooks").glob("*.ipynb")]
    assert not paired, f"remove {paired}: notebooks are kept as MyST markdown only"


def test_labs_are_never_executed_at_build_time():
    """Every lab (labs/**/*.md) is excluded from build-time execution twice: by a pattern in
    _config.yml (execute.exclude_patterns, matched as myst-nb does) and by its own header
    (mystnb: execution_mode: "off")."""
    patterns = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["exclude_patterns"]
    labs = sorted((ROOT / "labs").rglob("*.md"))
    probe = ROOT / "labs" / "any_lab.md"  # holds even before the first lab is written
    for lab in [probe, *labs]:
        posix = PurePosixPath(lab.as_posix())
        assert any(posix.match(p) for p in patterns), f"{lab} is not excluded by execute.exclude_patterns"
    for lab in labs:
        header = jupytext.read(lab).metadata
        if "kernelspec" not in header:
            continue  # a plain markdown page, not a notebook
        mode = header.get("mystnb", {}).get("execution_mode")
        assert mode == "off", (
            f"{lab.relative_to(ROOT)}: add `mystnb:\n  execution_mode: \"off\"` to its header "
            "(a lab starts a real engine and must never run at build time)")
