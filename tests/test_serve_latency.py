"""Issue 37's H200 ``vllm serve`` records against the latency model: every declared run is
present and reported, the serving path is what its script derives from the fitted runs only, and
the declared target sets are each verified by a run at exactly the pick's rate."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from servebook.lab.analyses import serve_latency as sl
from servebook.records import serve_latency_results

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docs():
    return serve_latency_results()


def test_every_declared_server_was_recorded_with_provenance(docs):
    declared = docs[0]["declaration"]["groups"]
    assert {d["name"] for d in docs} == set(declared)
    for d in docs:
        assert d["vllm_version"] == "0.26.0" and "H200" in json.dumps(d["device"])
        assert len(d["runs"]) >= 3 and not d["not_run"]
        assert all(len(r["requests"]) == r["num_prompts"] for r in d["runs"])


def test_serving_path_comes_from_fitted_runs_only(docs):
    """Dropping every held-out record changes nothing in the fit; the term only adds time."""
    fitted_only = [d for d in docs if d["declaration"]["groups"][d["name"]] == "fitted"]
    assert sl.fit_serving_path(fitted_only) == sl.fit_serving_path(docs)
    path = sl.fit_serving_path(docs)
    assert path.ttft_s > 0 and path.tpot_s >= 0
    assert "llama-3.1-8b" in path.source and "gemma" not in path.source


def test_committed_serving_path_file_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("fit_serving_path", ROOT / "scripts" / "fit_serving_path.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from servebook.simulator.online import SERVING_PATH_FILE

    assert json.loads(SERVING_PATH_FILE.read_text()) == json.loads(json.dumps(module.build()))


def test_rows_report_every_run_of_every_group(docs):
    rs = sl.rows(docs)
    assert len(rs) == sum(len(d["runs"]) for d in docs)
    assert {r.group for r in rs} == {"fitted", "held out"}
    # measured TPOT is per request (latency - TTFT) / (outputs - 1), a few ms to a few tens of ms on an H200
    assert all(0.002 < r.measured["tpot_p50"] < 0.2 for r in rs)


def test_every_target_set_is_verified_by_a_run_at_its_picks_rate(docs):
    sets = sl.target_sets(docs)
    assert len(sets) == len(docs[0]["declaration"]["target_set"]) >= 5
    assert all(t["measured"] is not None for t in sets)
