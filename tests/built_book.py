"""A page's executed outputs from the book build of this test run, when there is one (shared by the page tests).

``scripts/test.sh`` builds the book (``scripts/build-book.sh``: every page executed, outputs kept
in ``_build/.jupyter_cache``) and then runs pytest with ``SERVEBOOK_BUILT_BOOK=1``. A test that needs
what a page's code computes can then read the build's executed copy instead of running the page a
second time. :func:`executed_page` returns that copy only when all of these hold, else None (the
caller then runs the page itself, as it does outside ``scripts/test.sh``):

* ``SERVEBOOK_BUILT_BOOK=1`` (set by ``scripts/test.sh`` after its build stage);
* ``_build/.servebook-inputs``, the input stamp the build ran with, equals the stamp of the
  checkout now (``inputs_stamp`` in scripts/_common.sh: configuration, requirements, library,
  recorded GPU data), so no input of the page changed since the build;
* the cache holds a notebook whose code cells and kernel equal the page's now (jupyter-cache's
  hash, the match myst-nb itself uses when the build reads the cache), read with myst-nb's reader
  as the build reads it.
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
CACHE = BUILD / ".jupyter_cache"
STAMP = BUILD / ".servebook-inputs"


@functools.lru_cache(maxsize=1)
def _build_is_current() -> bool:
    if os.environ.get("SERVEBOOK_BUILT_BOOK") != "1" or not CACHE.is_dir() or not STAMP.is_file():
        return False
    now = subprocess.run(["bash", "-c", 'source scripts/_common.sh && inputs_stamp'], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return now.returncode == 0 and now.stdout.strip() == STAMP.read_text().strip()


def executed_page(path: Path) -> nbformat.NotebookNode | None:
    """The build's executed copy of the page at ``path`` (outputs included), or None (see the module docstring)."""
    if not _build_is_current():
        return None
    from jupyter_cache import get_cache
    from myst_nb.core.read import read_myst_markdown_notebook

    notebook = read_myst_markdown_notebook(path.read_text(), add_source_map=True, path=path)
    cache = get_cache(str(CACHE))
    try:
        cache.match_cache_notebook(notebook)
    except KeyError:
        return None
    _, executed = cache.merge_match_into_notebook(notebook)
    return executed


def glued_names(notebook: nbformat.NotebookNode) -> set[str]:
    """Names the executed notebook's code glued (``myst_nb.glue`` writes each as an output carrying
    ``metadata.scrapbook.name``, shown or not)."""
    return {out["metadata"]["scrapbook"]["name"]
            for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.get("outputs", [])
            if "scrapbook" in out.get("metadata", {})}

