"""Shared pytest set-up.

Markers (declared in pyproject.toml) follow from where a test lives, so a new test file gets them
without remembering to: tests/engine/** -> ``engine`` (needs .venv-vllm), tests/browser/** ->
``browser`` (needs Chromium and the built book). ``pytest -m "not engine and not browser"`` is the
quick loop; scripts/test.sh runs everything.
"""
from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MARKER_BY_FOLDER = {"engine": pytest.mark.engine, "browser": pytest.mark.browser}


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        marker = MARKER_BY_FOLDER.get(folder)
        if marker is not None:
            item.add_marker(marker)
