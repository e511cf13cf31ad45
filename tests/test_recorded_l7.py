"""Lab 7 as recorded on one H200 (labs/results/labs/l7_speculative_gpu.json): the tables and plot
of servebook.lab.analyses.lab7_speculative agree with numbers recomputed here by hand from the raw points
(labs/results_l7.md renders them; the lab page links it instead of quoting numbers).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from servebook.lab.harness import LabError  # noqa: E402
from servebook.lab.analyses import lab7_speculative as S  # noqa: E402
from servebook.lab.recordings.recorded import load_recorded, provenance, recorded_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "labs" / "results" / "labs" / "l7_speculative_gpu.json"
RUN1 = ROOT / "labs" / "results" / "raw" / "l7_speculative_gpu-2026-11-30-run1.json"


def raw(path: Path = FILE) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def doc() -> dict:
    return load_recorded(recorded_path("l7_speculative"), lab="l7_speculative")


def _points(m: dict, name: str) -> dict:
    return {p["batch"]: p for p in m["engines"][name]["points"]}


# ---- provenance ------------------------------------------------------------------------------

def test_recorded_run_is_the_h200_run_with_a_trained_pair(doc):
    head = provenance(doc)
    assert head["gpu"] == "1 x NVIDIA H200" and head["vllm_version"] == "0.26.0" and head["date"] == "2026-11-30"
    assert doc["weights"] == "real" and doc["measurements"]["hub_pair"] is False
    # Its target is the lab's own 8-layer, 768-wide Llama, not the 8B shape of Labs 1-4.
    assert (head["layers"], head["hidden_size"], head["vocab_size"]) == (8, 768, 8192)
    m = doc["measurements"]
    assert m["workload"]["repeats"] == 2 and m["workload"]["batch_sizes"] == [1, 8, 64]


# ---- acceptance ------------------------------------------------------------------------------

def test_acceptance_rows_recomputed_from_the_counters_of_each_batch(doc):
    m = raw()["measurements"]
    rows = {r["config"]: r for r in S.acceptance_rows(doc["measurements"]["acceptance"])}
    assert sorted(rows) == ["draft k=2", "draft k=4", "ngram k=3"]
    for name, row in rows.items():
        pts = m["engines"][name]["points"]
        drafts = sum(p["counters"]["drafts"] for p in pts)
        drafted = sum(p["counters"]["draft_tokens"] for p in pts)
        accepted = sum(p["counters"]["accepted_tokens"] for p in pts)
        first = sum(p["counters"]["accepted_per_position"][0] for p in pts)
        output = sum(p["output_tokens"] for p in pts)
        assert (row["drafted"], row["accepted"]) == (drafted, accepted)
        assert row["acceptance rate"] == pytest.approx(accepted / drafted)
        assert row["1st-draft acceptance"] == pytest.approx(first / drafts)
        assert row["mean accept. length"] == pytest.approx(1 + accepted / drafts)
        if name.startswith("draft"):   # exact: one prefill step per request plus one step per draft
            assert row["tokens/seq-step"] == pytest.approx(output / (drafts + sum(p["batch"] for p in pts)))
            # The trained draft's first draft is accepted well above chance, near its offline agreement.
            assert 0.5 < row["1st-draft acceptance"] < 0.7
        else:
            assert row["tokens/seq-step"] == pytest.approx(output / (output - accepted))
        k = int(name.split("=")[1])
        a = first / drafts
        assert row["E(k, 1st-draft acc.)"] == pytest.approx(sum(a ** j for j in range(k + 1)))
    agree = m["pair"]["offline_greedy_agreement"]
    assert agree["untrained_draft"] == 0.0 and 0.5 < agree["trained_draft"] < 0.6


# ---- speedup ---------------------------------------------------------------------------------

def test_speedup_rows_are_wall_time_ratios_to_the_baseline(doc):
    m = raw()["measurements"]
    base = _points(m, "baseline")
    rows = S.speedup_rows(doc["measurements"])
    assert len(rows) == 9
    recorded = {(r["config"], r["batch"]): r for r in m["speedup"]}
    for row in rows:
        p = _points(m, row["config"])[row["batch"]]
        assert p["output_tokens"] == base[row["batch"]]["output_tokens"] == 128 * row["batch"]
        assert row["measured speedup"] == pytest.approx(base[row["batch"]]["wall_s"] / p["wall_s"])
        # The lab recorded the same figures rounded to 0.01.
        rec = recorded[(row["config"], row["batch"])]
        assert row["measured speedup"] == pytest.approx(rec["measured speedup"], abs=0.005)
        assert row["tokens/seq-step"] == pytest.approx(rec["tokens/seq-step"], abs=0.005)
        assert row["predicted speedup"] == rec["predicted speedup"]
    # The finding: below 1 at every batch size, above 1 predicted.
    assert max(r["measured speedup"] for r in rows) < 1 < min(r["predicted speedup"] for r in rows)
    d2 = {r["batch"]: round(r["measured speedup"], 2) for r in rows if r["config"] == "draft k=2"}
    assert d2 == {1: 0.75, 8: 0.85, 64: 0.63}


def test_draft_k2_batch1_by_hand():
    m = raw()["measurements"]
    # draft k=2, batch 1: 66 drafts + 1 prefill step = 67 steps for 128 tokens.
    p = _points(m, "draft k=2")[1]
    assert (p["counters"]["drafts"], p["output_tokens"]) == (66, 128)
    rows = {(r["config"], r["batch"]): r for r in S.step_rows(m["engines"], 128)}
    r = rows[("draft k=2", 1)]
    assert r["steps counted"] == "exact"
    assert r["ms per step"] == pytest.approx(p["wall_s"] / 67 * 1e3)
    plain = _points(m, "baseline")[1]["wall_s"] / 128 * 1e3
    assert rows[("baseline", 1)]["ms per step"] == pytest.approx(plain)
    assert r["step / plain step"] == pytest.approx(p["wall_s"] / 67 * 1e3 / plain)
    # speedup = tokens per sequence-step / step cost over a plain step
    speed = {(x["config"], x["batch"]): x for x in S.speedup_rows(m)}[("draft k=2", 1)]
    assert speed["measured speedup"] == pytest.approx((128 / 67) / r["step / plain step"])


def test_step_rows_estimate_ngram_steps_and_cover_every_engine_that_ran(doc):
    m = doc["measurements"]
    rows = S.step_rows(m["engines"], m["workload"]["max_tokens"])
    assert {r["config"] for r in rows} == {"baseline", "ngram k=3", "draft k=2", "draft k=4"}
    p = _points(m, "ngram k=3")[64]
    steps_per_request = (p["output_tokens"] - p["counters"]["accepted_tokens"]) / 64
    ng = next(r for r in rows if (r["config"], r["batch"]) == ("ngram k=3", 64))
    assert ng["steps counted"] == "estimated"
    assert ng["ms per step"] == pytest.approx(p["wall_s"] / steps_per_request * 1e3)
    # Every speculative step cost more than a plain step at the same batch.
    assert all(r["step / plain step"] > 1.3 for r in rows if r["config"] != "baseline")


def test_weight_read_is_a_few_percent_of_the_plain_step():
    m = raw()["measurements"]
    t = m["pair"]["configs"]["target"]
    # Llama by hand: embeddings + LM head, per layer q, k, v, o, gate/up/down and two norms, final norm.
    h, f, L, v, kv = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"], t["vocab_size"], \
        t["num_key_value_heads"] * t["head_dim"]
    params = 2 * v * h + L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h
    assert params == m["pair"]["parameters"]["target"]
    read_ms = S.weight_read_ms(params * 2, 4.8e12)            # bf16, H200 peak HBM bandwidth
    plain_ms = _points(m, "baseline")[1]["wall_s"] / 128 * 1e3
    assert read_ms < 0.02 * plain_ms
    with pytest.raises(LabError, match="must be > 0"):
        S.weight_read_ms(0, 4.8e12)


def test_schedule_engine_is_reported_not_run(doc):
    m = doc["measurements"]
    assert S.engines_not_run(m) == ["draft schedule"]
    assert m["engines"]["draft schedule"]["error"].startswith("not run: not reported within the")
    assert "draft schedule" not in {r["config"] for r in S.speedup_rows(m)}


def test_first_run_carried_a_one_time_batch1_cost():
    m1, m2 = raw(RUN1)["measurements"], raw()["measurements"]
    assert m1["workload"]["repeats"] == 1
    r1, r2 = _points(m1, "draft k=2"), _points(m2, "draft k=2")
    assert r1[1]["wall_s"] > r1[8]["wall_s"] and r1[1]["wall_s"] > 3 * r2[1]["wall_s"]


# ---- plot and bad input ----------------------------------------------------------------------

def test_plot_labels_both_axes_with_units_and_batch_on_log2(doc):
    import matplotlib.pyplot as plt

    fig = S.plot_l7(doc["measurements"], doc)
    try:
        assert len(fig.axes) == 2
        for ax in fig.axes:
            assert ax.get_xscale() == "log" and "batch size" in ax.get_xlabel()
            assert [int(t) for t in ax.get_xticks()] == [1, 8, 64]
        assert "(x)" in fig.axes[0].get_ylabel() and "ms" in fig.axes[1].get_ylabel()
        assert "0.26.0" in fig._suptitle.get_text() and "H200" in fig._suptitle.get_text()
        # The measured lines hold the wall-time ratios.
        line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "draft k=2 measured")
        m = raw()["measurements"]
        base, d2 = _points(m, "baseline"), _points(m, "draft k=2")
        assert list(line.get_ydata()) == pytest.approx([base[b]["wall_s"] / d2[b]["wall_s"] for b in (1, 8, 64)])
    finally:
        plt.close(fig)


def test_missing_baseline_or_bad_max_tokens_is_refused(doc):
    m = copy.deepcopy(doc["measurements"])
    m["engines"]["baseline"]["ok"] = False
    with pytest.raises(LabError, match="no successful 'baseline'"):
        S.speedup_rows(m)
    with pytest.raises(LabError, match="'engines' object"):
        S.speedup_rows({})
    with pytest.raises(LabError, match="max_tokens must be a whole number"):
        S.step_rows(doc["measurements"]["engines"], 0)
    m = copy.deepcopy(doc["measurements"])
    m["engines"]["draft k=2"]["points"][0]["output_tokens"] = 64
    with pytest.raises(LabError, match="needs the same work"):
        S.speedup_rows(m)
