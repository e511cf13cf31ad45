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

#: The one printed number allowed to move, and why. ``fleet``'s mean running context is a dot
#: product over a 32,768-point length distribution; numpy computed it with BLAS (``np.dot``), whose
#: order of additions and fused multiply-adds depend on the CPU and thread count, so its last digit
#: was never the same on every machine. It is now the correctly rounded sum (``math.fsum``); with
#: fixed lengths (every other fleet case) the terms are exact and nothing moves at all.
BLAS_DOT = {("fleet gpt-oss-120b mla-free moe", "mean_running_context_tokens"),
            ("fleet qwen3-30b cv", "mean_running_context_tokens")}


@pytest.mark.parametrize("name", sorted(golden_core.CLI_CASES))
def test_cli_prints_what_it_printed(name):
    now = golden_core.cli_output(golden_core.CLI_CASES[name])
    moved = {key for case, key in BLAS_DOT if case == name}
    if not moved:
        assert now == GOLDEN["cli"][name]
        return
    old, new = json.loads(GOLDEN["cli"][name]), json.loads(now)
    for key in moved:
        assert new[key] == pytest.approx(old[key], rel=4e-16, abs=0), key  # within 2 units in the last place
        new[key] = old[key]
    assert json.dumps(new) == json.dumps(old)


def test_library_calls_return_what_they_returned():
    now = golden_core.function_cases()
    assert sorted(now) == sorted(GOLDEN["functions"])
    for key, expected in GOLDEN["functions"].items():
        assert now[key] == expected, key
