"""The "Run it live" note: GPU labs get the GPU-node steps, executed pages the notebook steps."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
import run_live_note  # noqa: E402
import yaml  # noqa: E402

#: What the build passes the extension (Jupyter Book maps execute.exclude_patterns to nb_execution_excludepatterns).
EXCLUDE = yaml.safe_load((Path(__file__).resolve().parents[1] / "_config.yml").read_text())["execute"]["exclude_patterns"]


def _text(docname: str) -> str:
    note = run_live_note._note(docname, ".md", EXCLUDE)
    return "" if note is None else note.astext()


def test_gpu_labs_get_the_gpu_node_note():
    for lab in ("labs/l1_memory_budget", "labs/l9_tp_vs_dp"):
        text = _text(lab)
        assert "never executed when the book is built" in text
        assert "requirements-gpu-labs.txt" in text


def test_the_end_to_end_results_page_is_not_called_a_gpu_lab():
    # It is executed at build time and starts no engine: the notebook steps apply.
    text = _text("labs/e2e_results")
    assert "never executed" not in text and "requirements-gpu-labs.txt" not in text
    assert "bash scripts/lab.sh labs/e2e_results.md" in text


def test_the_labs_results_pages_are_not_called_gpu_labs():
    # labs/results_l<N> render a lab's recorded run at build time: notebook steps, not the GPU node's
    for n in range(1, 10):
        text = _text(f"labs/results_l{n}")
        assert "never executed" not in text and "requirements-gpu-labs.txt" not in text, n
        assert f"bash scripts/lab.sh labs/results_l{n}.md" in text, n


def test_chapter_pages_get_no_note():
    assert run_live_note._note("book/06-01-why-a-serving-engine", ".md", EXCLUDE) is None
