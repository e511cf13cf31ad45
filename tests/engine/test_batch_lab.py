"""Lab L8 (labs/l8_batch_tactics.md) runs top to bottom in its cpu-smoke profile and records its JSON.

The runner is tests/engine/labrun.py's ``execute_lab`` (jupytext + nbclient with the ``python3``
kernel, the way the book executes notebooks); the lab takes the engine lock itself (one ``vllm
serve`` start, then one ``LLM`` start).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, execute_lab  # noqa: E402
from servebook.vllm_rules import PINNED_VLLM  # noqa: E402

pytestmark = pytest.mark.engine
LAB = LABS / "l8_batch_tactics.md"


def test_lab_l8_cpu_smoke_runs_and_records(tmp_path):
    # L8 writes through the common writer, where SERVEBOOK_LAB_RESULTS points (as Labs 1-7 and 9 do).
    nb = execute_lab(LAB, {"SERVEBOOK_LAB_PROFILE": "cpu-smoke", "SERVEBOOK_LAB_RESULTS": str(tmp_path),
                           "MPLBACKEND": "Agg"}, timeout_s=900)
    files = list(tmp_path.glob("l8_batch_tactics_cpu-smoke.json"))
    assert len(files) == 1, files
    saved = json.loads(files[0].read_text())
    assert saved["schema"] == "servebook.lab/1" and saved["lab"] == "l8_batch_tactics"
    doc = saved["measurements"]
    assert saved["vllm_version"] == PINNED_VLLM and saved["gpu"]["name"] == "cpu"
    names = {c["name"] for c in doc["cases"]}
    assert names == {"http-server", "llm-generate", "order-shuffled", "order-length-sorted",
                     "order-prefix-grouped+length-sorted", "max-tokens-loose"}
    # Every case ran all 32 requests; the notebook's own asserts checked equal work across cases.
    assert all(run["requests"] == 32 for c in doc["cases"] for run in c["runs"])
    # Prefix-cache hits are bounded by hand: 4 shared 256-token prefixes = 2 CPU blocks of 128 tokens,
    # reusable only by requests after the first of each group (28 of 32); the random tails never match.
    for case in doc["cases"]:
        run = case["runs"][0]
        if "prefix_cache_hit_tokens" in run:
            assert 0 <= run["prefix_cache_hit_tokens"] <= 28 * 256, case["name"]
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "speed-up" in outputs
