"""The live-calculator directive (book/_ext/live_calculator.py): what it puts on a page, and the
starting values it refuses at build time (a typo must fail the build, not a reader's click)."""
from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
import live_calculator  # noqa: E402

from servebook import live  # noqa: E402


def test_gpu_aliases_become_the_names_the_gpu_control_lists():
    assert live_calculator._checked({"gpu": "H200"})["gpu"] in live.options()["gpus"]


@pytest.mark.parametrize("defaults, words", [
    ({"model": "llama-3-8b"}, "not a shipped reference model"),
    ({"gpu": "H300"}, "unknown GPU 'H300'"),
    ({"kv_cache_dtype": "int4"}, "use one of auto, fp8"),
])
def test_bad_starting_values_are_refused(defaults, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        live_calculator._checked(defaults)


def test_the_placeholder_carries_the_calculator_and_its_starting_values():
    text = live_calculator._html("plan", {"model": "qwen3-32b", "tp": 2})
    attrs = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', text))
    assert attrs["data-calculator"] == "plan" and attrs["data-state"] == "idle"
    assert json.loads(html.unescape(attrs["data-defaults"])) == {"model": "qwen3-32b", "tp": 2}
    assert '<button type="button" class="servebook-live-run" disabled>Run live</button>' in text


def test_every_directive_in_the_book_uses_a_calculator_the_facade_has():
    root = Path(__file__).resolve().parents[1]
    used = {m for page in [*root.glob("book/*.md"), *root.glob("notebooks/*.md")]
            for m in re.findall(r"```\{live-calculator\} (\S+)", page.read_text())}
    opts = live.options()
    assert used and used <= set(live_calculator.CALCULATORS) == set(opts["calculators"]) | set(opts["unavailable"])
