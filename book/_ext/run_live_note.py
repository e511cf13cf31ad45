"""Sphinx extension: tell readers of every notebook page how to run it live.

Each page under ``notebooks/`` gets a short note under its title: where to download the source
(the download button offers the MyST ``.md`` file) and how to open it in JupyterLab
(``bash scripts/lab.sh <path>``, where a MyST-markdown notebook opens as a notebook). Pages
under ``labs/`` that the build never executes (the GPU labs, by _config.yml's exclude patterns)
get the GPU-node version of the note; the others there (the recorded-results page, executed at
build) get the notebook one.
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath

from docutils import nodes


def _never_executed(path: str, exclude_patterns) -> bool:
    """Whether the build keeps ``path`` from execution (_config.yml's execute.exclude_patterns,
    which Jupyter Book passes to myst-nb as ``nb_execution_excludepatterns``)."""
    return any(PurePosixPath(path).match(p) for p in exclude_patterns)


def _note(docname: str, source_suffix: str, exclude_patterns=()) -> nodes.Node | None:
    path = f"{docname}{source_suffix}"
    gpu_lab = docname.startswith("labs/") and _never_executed(path, exclude_patterns)
    if docname.startswith(("notebooks/", "labs/")) and not gpu_lab:
        intro = ("Run this notebook live: download its source with the download button at the top of "
                 f"the page ({path}, a MyST-markdown notebook), or use a clone of the repository. "
                 "From the repository root, one command makes the environment (once) and opens it in "
                 "JupyterLab as a notebook, widgets live.")
        steps = f"bash scripts/lab.sh {path}"
    elif gpu_lab:
        intro = ("This GPU lab starts a real vLLM engine and is never executed when the book is built. "
                 "Run it on a GPU node (README: “Run the labs on a GPU node”); in JupyterLab, "
                 "right-click the file and choose Open With → Jupytext Notebook.")
        steps = (f"python3 -m venv .venv-labs && .venv-labs/bin/pip install -r requirements-gpu-labs.txt\n"
                 f".venv-labs/bin/jupyter lab {path}")
    else:
        return None
    note = nodes.admonition(classes=["tip", "servebook-run-live"])
    note += nodes.title(text="Run it live")
    note += nodes.paragraph(text=intro)
    note += nodes.literal_block(steps, steps, language="bash")
    return note


def _add_note(app, doctree: nodes.document) -> None:
    docname = app.env.docname
    suffix = os.path.splitext(str(app.env.doc2path(docname, base=False)))[1]
    note = _note(docname, suffix, app.config.nb_execution_excludepatterns)
    if note is None:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        doctree.insert(0, note)
        return
    title_index = next((i for i, child in enumerate(section.children) if isinstance(child, nodes.title)), -1)
    section.insert(title_index + 1, note)


def setup(app):
    app.connect("doctree-read", _add_note)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
