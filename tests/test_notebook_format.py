"""The notebooks are stored exactly as jupytext writes them, so JupyterLab opens them unchanged.

Issue 38: "every notebook opens in JupyterLab marked as changed". JupyterLab's jupytext view reads a
MyST notebook and writes it back in jupytext's own form; a file that differs from that form (a missing
``jupytext_version``, no blank line after a cell's options) is rewritten, hence marked as changed,
the moment a reader opens it.
"""
from __future__ import annotations

from pathlib import Path

import jupytext
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.md"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 9


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_text_is_what_jupytext_writes(path):
    text = path.read_text()
    assert jupytext.writes(jupytext.reads(text, fmt="md:myst"), fmt="md:myst") == text, (
        f"{path.name} is not in jupytext's form: re-save it with "
        f"`python -c \"import jupytext; jupytext.write(jupytext.read('{path}'), '{path}', fmt='md:myst')\"`")
