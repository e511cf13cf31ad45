"""The calculators print what they printed before they lost numpy, to the last digit.

``tests/fixtures/golden_core.json`` holds the outputs of ``tests/golden_core.py``'s cases as the
code printed them at the commit the fixture names (numpy in the step model, fleet, speculation and
simulator); each case is re-run here and compared as text.
"""
from __future__ import annotations

import json

import pytest

import golden_core

GOLDEN = json.loads(golden_core.FIXTURE.read_text())


@pytest.mark.parametrize("name", sorted(golden_core.CLI_CASES))
def test_cli_prints_what_it_printed(name):
    assert golden_core.cli_output(golden_core.CLI_CASES[name]) == GOLDEN["cli"][name]


def test_library_calls_return_what_they_returned():
    now = golden_core.function_cases()
    assert sorted(now) == sorted(GOLDEN["functions"])
    for key, expected in GOLDEN["functions"].items():
        assert now[key] == expected, key
