"""Every chapter notebook (notebooks/*.md, MyST markdown) runs top to bottom without error.

One test per notebook: jupytext reads it, nbclient runs it in a ``python3`` kernel started from
this test's own interpreter (the .venv), with the notebook's folder as working directory, as the
book build does. A cell that raises fails the test with the cell and its traceback. The notebooks
put their real checks in ``assert`` cells. GPU labs (labs/) are not run here.

Each run of a notebook has a wall-clock limit (NOTEBOOK_LIMIT_S, kernel start included). Once in
several CI runs nbclient and its kernel both sat idle for minutes on one notebook; past the limit
the kernel's process group is killed and the notebook runs once more from a fresh kernel (with a
warning in the pytest summary); a second run past the limit fails the test, naming the cell.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path, PurePosixPath

import jupytext
import nbformat
import pytest
import yaml
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.md"))
#: Wall-clock limit of one run of one notebook, kernel start included. On the 2-core CI machine
#: the slowest notebook (scheduler) takes about 9 s and the others 1-4 s, so this is over 10x that.
NOTEBOOK_LIMIT_S = 120
#: After the kernel is killed: how long nbclient may take to notice and tidy up.
_WIND_DOWN_S = 30

# First cell run in every notebook: which Python the kernel is.
_WHICH_PYTHON = "import sys; print(sys.prefix)"


class NotebookTimedOut(Exception):
    """A run went past its limit; its kernel (and the kernel's process group) was killed and reaped."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def _describe_cell(notebook: nbformat.NotebookNode, index: int | None) -> str:
    """Name cell ``index`` of a notebook whose cell 0 is the added _WHICH_PYTHON cell."""
    if index is None:
        return "no cell yet (starting the kernel)"
    if index == 0:
        return f"the added first cell `{_WHICH_PYTHON}`"
    code = [i for i, c in enumerate(notebook.cells[1:], start=1) if c.cell_type == "code"]
    lines = [line for line in notebook.cells[index].source.splitlines() if line.strip()]
    first = lines[0].strip() if lines else ""
    return f"code cell {code.index(index) + 1} of {len(code)}, which begins `{first}`"


async def _execute_within(client: NotebookClient, limit_s: float, running: dict) -> None:
    task = asyncio.ensure_future(client.async_execute())
    done, _ = await asyncio.wait({task}, timeout=limit_s)
    if done:
        task.result()  # re-raises a failing cell's CellExecutionError
        return
    provisioner = getattr(client.km, "provisioner", None)
    process: subprocess.Popen | None = getattr(provisioner, "process", None)
    if process is not None:
        try:  # the kernel leads its own session (jupyter_client starts it so): take its children too
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    task.cancel()
    await asyncio.wait({task}, timeout=_WIND_DOWN_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it; the time-out is what counts
    if process is not None:
        await asyncio.to_thread(process.wait, _WIND_DOWN_S)  # reaped: no zombie kernel left
    raise NotebookTimedOut(_describe_cell(client.nb, running.get("index")))


def execute_within(notebook: nbformat.NotebookNode, cwd: Path, limit_s: float) -> None:
    """Run every cell of ``notebook`` in a fresh python3 kernel; raise CellExecutionError for a
    failing cell, NotebookTimedOut (kernel killed) when the whole run takes over ``limit_s``."""
    running: dict = {}
    client = NotebookClient(notebook, timeout=None, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}},
                            on_cell_execute=lambda cell, cell_index: running.update(index=cell_index))
    # A loop of our own rather than asyncio.run: were nbclient ever to ignore the cancellation,
    # asyncio.run would wait for it forever while closing.
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_execute_within(client, limit_s, running))
    finally:
        # After a time-out nbclient leaves its kernel-alive poller pending: stop it before closing.
        leftover = asyncio.all_tasks(loop)
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.wait(leftover, timeout=_WIND_DOWN_S))
        loop.close()


def run_with_one_retry(load, cwd: Path, name: str, limit_s: float = NOTEBOOK_LIMIT_S) -> nbformat.NotebookNode:
    """Execute ``load()``'s notebook; past ``limit_s`` run a fresh ``load()`` once more.
    Returns the executed notebook; a second time-out fails the test."""
    first: NotebookTimedOut | None = None
    for _ in range(2):
        notebook = load()
        try:
            execute_within(notebook, cwd, limit_s)
        except NotebookTimedOut as exc:
            if first is not None:
                pytest.fail(
                    f"{name}: ran past {limit_s:.0f} s twice, each time in a fresh kernel that was then killed; "
                    f"the second run was in {exc.where} (the first in {first.where})", pytrace=False)
            first = exc
            continue
        if first is not None:
            warnings.warn(f"{name}: the first run went past {limit_s:.0f} s in {first.where}; "
                          "its kernel was killed and the second run passed")
        return notebook
    raise AssertionError("unreachable")


def _load_notebook(path: Path) -> nbformat.NotebookNode:
    notebook = jupytext.read(path)
    assert notebook.metadata.get("kernelspec", {}).get("name") == "python3", (
        f"{path.name}: its jupytext header must name the python3 kernel (kernelspec: name: python3)")
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert code_cells, f"{path.name} has no code cells: is the jupytext header (format_name: myst) there?"
    notebook.cells.insert(0, nbformat.v4.new_code_cell(_WHICH_PYTHON))
    return notebook


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no *.md notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path):
    name = str(path.relative_to(ROOT))
    try:
        notebook = run_with_one_retry(lambda: _load_notebook(path), path.parent, name)
    except CellExecutionError as exc:
        pytest.fail(f"{name}: a cell failed\n{exc}", pytrace=False)
    kernel_prefix = "".join(o.get("text", "") for o in notebook.cells[0].outputs).strip()
    assert kernel_prefix == sys.prefix, (
        f"the notebook ran in {kernel_prefix}, not in this environment ({sys.prefix}); "
        "a python3 kernelspec elsewhere shadows it: run the tests with .venv/bin/python -m pytest")


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an orphan's zombie may wait for a non-reaping init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _hanging_notebook(hang_source: str) -> nbformat.NotebookNode:
    """A notebook whose second code cell records the kernel's pid and a child's pid, then runs ``hang_source``."""
    record = ("import os, subprocess\n"
              "child = subprocess.Popen(['sleep', '600'])\n"
              "with open('pids', 'a') as f:\n"
              "    f.write(f'{os.getpid()} {child.pid}\\n')\n")
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(_WHICH_PYTHON), nbformat.v4.new_markdown_cell("# hang"),
                      nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(record + hang_source)]
    return notebook


_TEST_LIMIT_S = 4  # kernel start takes about 1 s here


def test_a_notebook_that_hangs_twice_fails_naming_the_cell_and_leaves_no_process(tmp_path):
    with pytest.raises(pytest.fail.Exception) as failed:
        run_with_one_retry(lambda: _hanging_notebook("import time; time.sleep(600)"), tmp_path, "hang.md",
                           limit_s=_TEST_LIMIT_S)
    message = str(failed.value)
    assert message.startswith("hang.md: ran past 4 s twice"), message
    assert message.count("code cell 2 of 2, which begins `import os, subprocess`") == 2, message
    runs = [line.split() for line in (tmp_path / "pids").read_text().splitlines()]
    assert len(runs) == 2, runs
    left = [int(pid) for run in runs for pid in run if _alive(int(pid))]
    assert not left, f"still running after the time-out: {left}"


def test_a_notebook_that_hangs_once_passes_on_its_second_run(tmp_path):
    hang_once = ("import pathlib, time\n"
                 "if not pathlib.Path('hung-once').exists():\n"
                 "    pathlib.Path('hung-once').touch()\n"
                 "    time.sleep(600)\n"
                 "child.kill(); child.wait()\n"
                 "print('done')")
    with pytest.warns(UserWarning, match="first run went past 4 s in code cell 2 of 2"):
        notebook = run_with_one_retry(lambda: _hanging_notebook(hang_once), tmp_path, "hang.md",
                                      limit_s=_TEST_LIMIT_S)
    assert "done" in "".join(o.get("text", "") for o in notebook.cells[-1].outputs)
    runs = [line.split() for line in (tmp_path / "pids").read_text().splitlines()]
    assert len(runs) == 2, runs
    left = [int(pid) for run in runs for pid in run if _alive(int(pid))]
    assert not left, f"still running: {left}"


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


#: Pages under labs/ that start no engine and are executed at build time: they render recorded data.
RENDERED_LAB_PAGES = [ROOT / "labs" / "recorded_results.md"]


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
