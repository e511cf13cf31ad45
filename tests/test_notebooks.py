"""Checks on the chapter notebooks (notebooks/*.md) besides running them.

The notebooks themselves run through nbval: conftest.py at the repository root collects every
notebooks/<name>.md (converted by jupytext), one test item per code cell, in one kernel of this
interpreter per notebook (`pytest notebooks` or `pytest notebooks/<name>.md`). Cells tagged
``nbval-check-output`` are compared with tests/notebook_refs/<name>.ipynb
(`bash scripts/refresh-notebook-refs.sh` regenerates it). The tests here check what nbval does
not: that a changed number fails with nbval's diff, that a stale reference is named, that a hung
cell fails within the cell time-out and leaves no process behind, and that every notebook is
published and every lab stays unexecuted. GPU labs (labs/) are not run here.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path, PurePosixPath

import jupytext
import nbformat
import pytest
import yaml
from processes import alive

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))
REFERENCES = ROOT / "tests" / "notebook_refs"


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no *.md notebook"


def _pytest(*args: str, cwd: Path = ROOT, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """pytest in a child process of this interpreter (the .venv), its output captured."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def test_a_changed_number_fails_with_nbvals_diff_and_a_stale_reference_is_named(tmp_path):
    """A reference whose checked output differs by one digit fails that cell, and only that cell,
    with nbval's diff showing both numbers; a reference whose checked cell's source no longer
    matches the notebook is refused at collection, naming the command that refreshes it."""
    refs = tmp_path / "refs"
    refs.mkdir()
    kv = nbformat.read(REFERENCES / "kv_per_token.ipynb", as_version=4)
    first = next(c for c in kv.cells if c.outputs)
    assert "131,072 bytes" in first.outputs[0].text, "the reference no longer holds the bf16 figure"
    first.outputs[0].text = first.outputs[0].text.replace("131,072 bytes", "131,073 bytes")
    nbformat.write(kv, refs / "kv_per_token.ipynb")
    spec = nbformat.read(REFERENCES / "speculation.ipynb", as_version=4)
    checked = next(c for c in spec.cells if c.outputs)
    checked.source = checked.source.replace("0.7", "0.75", 1)
    nbformat.write(spec, refs / "speculation.ipynb")

    run = _pytest("notebooks/kv_per_token.md", "notebooks/speculation.md", "--notebook-refs", str(refs),
                  "--continue-on-collection-errors")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    cells = sum(c.cell_type == "code" for c in jupytext.read(ROOT / "notebooks" / "kv_per_token.md").cells)
    assert f"1 failed, {cells - 1} passed, 1 error" in out, out
    assert "FAILED notebooks/kv_per_token.md::Cell 0" in out, out
    assert "Cell outputs differ" in out, out
    assert "131,073 bytes" in out and "131,072 bytes" in out, out
    assert "speculation.md: checked cell 1" in out and "bash scripts/refresh-notebook-refs.sh" in out, out


def test_a_hung_cell_fails_within_the_cell_timeout_and_leaves_no_process(tmp_path):
    """The guard against a hung kernel is nbval's --nbval-cell-timeout (pyproject.toml sets it for
    the notebooks). Here a cell that ignores the interrupt nbval sends first, and has a child
    process: the cell fails, the next is marked xfail, and the kernel and its child are gone."""
    record = ("import os, signal, subprocess, time\n"
              "child = subprocess.Popen(['sleep', '600'])\n"
              "open('pids', 'w').write(f'{os.getpid()} {child.pid}')\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "time.sleep(600)")
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(record),
                      nbformat.v4.new_code_cell("print(x)")]
    nbformat.write(notebook, tmp_path / "hang.ipynb")
    run = _pytest("hang.ipynb", "--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout", "3",
                  "-rA", cwd=tmp_path, timeout_s=60)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed, 1 xfailed" in out, out
    assert "FAILED hang.ipynb::Cell 1" in out and "Timeout of 3 seconds exceeded" in out, out
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    left = [pid for pid in pids if alive(pid)]
    assert not left, f"kernel or its child still running after the time-out: {left}"


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


def test_checked_cells_are_tagged_not_commented():
    """A reader sees a cell's source: the check marker is nbval's tag (invisible on the page), never its
    ``# NBVAL_CHECK_OUTPUT`` comment; and every notebook with a reference has tagged cells."""
    for path in NOTEBOOKS:
        cells = [c for c in jupytext.read(path).cells if c.cell_type == "code"]
        shown = [i for i, c in enumerate(cells) if "NBVAL_CHECK_OUTPUT" in c.source]
        assert not shown, f"{path.name}: code cells {shown} carry '# NBVAL_CHECK_OUTPUT'; use :tags: [nbval-check-output]"
        if (REFERENCES / f"{path.stem}.ipynb").exists():
            assert any("nbval-check-output" in c.metadata.get("tags", []) for c in cells), path.name


def test_no_paired_ipynb():
    """A .ipynb next to its .md makes the build fail ('multiple files found'); keep only the .md."""
    paired = [p.name for p in (ROOT / "notebooks").glob("*.ipynb")]
    assert not paired, f"remove {paired}: notebooks are kept as MyST markdown only"


#: Pages under labs/ that start no engine and are executed at build time: they render recorded data.
RENDERED_LAB_PAGES = [ROOT / "labs" / "e2e_results.md", ROOT / "labs" / "results_serve_latency.md",
                      *(ROOT / "labs" / f"results_l{n}.md" for n in range(1, 10))]
#: Labs whose recorded run has a results page of its own, rendered by the page named here.
LAB_RESULTS_PAGES = {"l7_speculative": "results_l7", "l8_batch_tactics": "results_l8", "l9_tp_vs_dp": "results_l9"}


def test_labs_are_never_executed_at_build_time():
    """Every lab (labs/**/*.md but the rendering pages) is excluded from build-time execution
    twice: by a pattern in _config.yml (execute.exclude_patterns, matched as myst-nb does) and by
    its own header (mystnb: execution_mode: "off")."""
    patterns = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["exclude_patterns"]
    labs = sorted(p for p in (ROOT / "labs").rglob("*.md") if p not in RENDERED_LAB_PAGES)
    probe = ROOT / "labs" / "l0_any_lab.md"  # holds even before the first lab is written
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


def test_each_lab_links_its_results_page_listed_right_after_it():
    """A lab's note points to the page that renders its recorded run (instead of quoting its numbers),
    and the table of contents lists that page right after the lab."""
    parts = yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]
    listed = [c["file"] for part in parts for c in part["chapters"]]   # in reading order
    for lab, page in LAB_RESULTS_PAGES.items():
        text = (ROOT / "labs" / f"{lab}.md").read_text()
        note = text[text.index("```{note}"):text.index("```", text.index("```{note}") + 3)]
        assert f"<{page}>" in note, f"labs/{lab}.md: its note should link {{doc}}`... <{page}>`"
        assert listed.index(f"labs/{page}") == listed.index(f"labs/{lab}") + 1, f"list labs/{page} after labs/{lab}"


def test_recorded_results_page_is_executed_and_listed():
    """The page that renders the recorded GPU runs must execute at build time (its glued numbers
    come from the result files) and is published in _toc.yml."""
    patterns = yaml.safe_load((ROOT / "_config.yml").read_text())["execute"]["exclude_patterns"]
    listed = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    for page in RENDERED_LAB_PAGES:
        posix = PurePosixPath(page.as_posix())
        assert not any(posix.match(p) for p in patterns), f"{page.name} is excluded from execution"
        assert jupytext.read(page).metadata.get("mystnb", {}).get("execution_mode") != "off", page.name
        assert f"labs/{page.stem}" in listed, f"add `- file: labs/{page.stem}` to _toc.yml under 'GPU labs'"
