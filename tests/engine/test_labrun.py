"""The lab runner (labrun.execute_lab) gives the lab its variables and leaves this process's environment alone.

Starts no engine: a two-cell MyST notebook in a temporary folder stands in for a lab.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import execute_lab  # noqa: E402

NOTEBOOK = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

```{code-cell} ipython3
import os
print(os.environ["SERVEBOOK_LAB_PROFILE"], os.environ["SERVEBOOK_LABRUN_PROBE"], os.getcwd())
```
"""


def test_the_kernel_gets_the_variables_and_this_process_keeps_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEBOOK_LAB_PROFILE", "gpu")
    monkeypatch.delenv("SERVEBOOK_LABRUN_PROBE", raising=False)
    before = dict(os.environ)
    lab = tmp_path / "lab.md"
    lab.write_text(NOTEBOOK)
    nb = execute_lab(lab, {"SERVEBOOK_LAB_PROFILE": "cpu-smoke", "SERVEBOOK_LABRUN_PROBE": "1"}, timeout_s=60)
    printed = "".join(o.get("text", "") for o in nb.cells[0].outputs).split()
    assert printed == ["cpu-smoke", "1", str(tmp_path)]
    assert dict(os.environ) == before
