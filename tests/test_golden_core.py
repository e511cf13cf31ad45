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

#: Cases allowed to move in their last digits: none since the fixture was re-recorded (issue 20's step
#: model for steps that carry a prefill chunk changed every perf figure) from the standard-library code,
#: whose weighted means are correctly rounded (``math.fsum``) and so the same on every machine. The
#: earlier fixture came from numpy code whose BLAS ``np.dot`` summed in a CPU-dependent order.
BLAS_DOT: set = set()
BLAS_DOT_REL = 2e-15  # about 10 units in the last place


def _same_up_to_last_digits(old, new, path=""):
    if isinstance(old, dict):
        assert sorted(old) == sorted(new), path
        for k in old:
            _same_up_to_last_digits(old[k], new[k], f"{path}.{k}")
    elif isinstance(old, list):
        assert len(old) == len(new), path
        for i, (a, b) in enumerate(zip(old, new)):
            _same_up_to_last_digits(a, b, f"{path}[{i}]")
    elif isinstance(old, float):
        assert type(new) is float and new == pytest.approx(old, rel=BLAS_DOT_REL, abs=0), path
    else:
        assert new == old, path


@pytest.mark.parametrize("name", sorted(golden_core.CLI_CASES))
def test_cli_prints_what_it_printed(name):
    now = golden_core.cli_output(golden_core.CLI_CASES[name])
    if name not in BLAS_DOT:
        assert now == GOLDEN["cli"][name]
    else:
        _same_up_to_last_digits(json.loads(GOLDEN["cli"][name]), json.loads(now))


def test_library_calls_return_what_they_returned():
    now = golden_core.function_cases()
    assert sorted(now) == sorted(GOLDEN["functions"])
    for key, expected in GOLDEN["functions"].items():
        assert now[key] == expected, key
