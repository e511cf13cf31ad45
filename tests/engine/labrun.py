"""Run a lab notebook (``labs/*.md``) top to bottom, the way the book executes notebooks (shared by the lab tests).

``execute_lab`` is the one runner: jupytext converts the lab, nbclient runs it in the book's
``python3`` kernel from the lab's folder, with the variables given added to the kernel's
environment only (this test process's ``os.environ`` is left as it was, so nothing leaks into
later tests). ``run_lab`` runs one of the labs that save ``<lab>_cpu-smoke.json`` through
``servebook.lab.harness.results`` in the ``cpu-smoke`` profile, returns that document and prints the lab's
wall time, separating the time spent waiting for other engines (the machine-wide engine lock).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jupytext
import nbclient
import nbformat
from servebook.vllm_rules import PINNED_VLLM

LABS = Path(__file__).resolve().parents[2] / "labs"
PROVENANCE = ("date", "gpu", "vllm_version", "config", "config_sha256", "engine_args", "profile")


def execute_lab(path: Path, env: dict[str, str], timeout_s: int) -> nbformat.NotebookNode:
    """Execute the lab at ``path`` with ``env`` added to its kernel's environment; return the executed notebook."""
    nb = jupytext.read(path)
    client = nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute(env={**os.environ, **env})  # handed to the kernel's start, not set in this process
    return nb


def run_lab(path: Path, results: Path, timeout_s: int = 400) -> dict:
    """Execute one lab in ``cpu-smoke`` with its results sent to ``results``; return its saved result document."""
    t0 = time.monotonic()
    execute_lab(path, {"SERVEBOOK_LAB_PROFILE": "cpu-smoke", "SERVEBOOK_LAB_RESULTS": str(results)}, timeout_s)
    wall = time.monotonic() - t0
    [out] = results.glob(f"{path.stem}_cpu-smoke.json")
    doc = json.loads(out.read_text())
    waited = doc.get("harness", {}).get("engine_lock_wait_s", 0.0)
    print(f"\n{path.name}: {wall:.0f} s wall, {waited:.0f} s of it waiting for other engines, "
          f"{wall - waited:.0f} s own")
    return doc


def check_provenance(doc: dict) -> None:
    """The result carries the provenance every recorded lab result must have (cpu-smoke run)."""
    for key in PROVENANCE:
        assert doc.get(key) not in (None, "", {}), key
    assert doc["vllm_version"] == PINNED_VLLM
    assert doc["profile"] == "cpu-smoke"
    assert doc["gpu"]["name"] == "cpu"
