"""Run a GPU lab notebook top to bottom in the ``cpu-smoke`` profile (shared by the lab smoke tests).

The lab (``labs/*.md``, MyST markdown) is converted with jupytext and executed with nbclient in the
book's kernel, with ``SERVEBOOK_LAB_PROFILE=cpu-smoke`` and results sent to ``results``. Returns the
JSON document the lab saved (``<lab>_cpu-smoke.json``) and prints the lab's wall time, separating the
time spent waiting for other engines (the machine-wide engine lock).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jupytext
import nbclient

LABS = Path(__file__).resolve().parents[2] / "labs"
PROVENANCE = ("date", "gpu", "vllm_version", "config", "config_sha256", "engine_args", "profile")


def run_lab(path: Path, results: Path, timeout_s: int = 400) -> dict:
    """Execute one lab in ``cpu-smoke``; return its saved result document."""
    nb = jupytext.read(path)
    os.environ["SERVEBOOK_LAB_PROFILE"] = "cpu-smoke"
    os.environ["SERVEBOOK_LAB_RESULTS"] = str(results)
    t0 = time.monotonic()
    nbclient.NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(LABS)}}).execute()
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
    assert doc["vllm_version"] == "0.27.1"
    assert doc["profile"] == "cpu-smoke"
    assert doc["gpu"]["name"] == "cpu"
