"""``servebook tune``'s pick against a measured sweep of the same grid (issue 37, ``serve_sweep37``).

Unit tests of the sweep rule on small synthetic records, then the recorded sweep: the facts the
results page states, recomputed here from the records without the functions under test where
that is possible."""
from __future__ import annotations

import json
import re
import tomllib

import pytest

from servebook.lab.analyses import serve_sweep as sw
from servebook.lab.analyses.serve_latency import engine_means
from servebook.reductions import percentile
from servebook.records import results_dir, serve_latency_results

CONFIG = "mistral.json"


# ---- synthetic records -----------------------------------------------------------------------------

def _run(rate: float, ttft: float, tpot: float, *, throughput: float | None = None, n: int = 20) -> dict:
    """A run whose every request has TTFT ``ttft`` and TPOT ``tpot`` (seconds)."""
    out = 11
    reqs = [{"ttft_s": ttft, "latency_s": ttft + tpot * (out - 1), "output_len": out} for _ in range(n)]
    return {"rate": rate, "num_prompts": n, "requests": reqs,
            "summary": {"request_throughput": rate if throughput is None else throughput}}


def _server(name: str, runs: list[dict], **flags) -> dict:
    return {"name": name, "config": CONFIG, "engine_flags": {"max_model_len": 2048, **flags}, "runs": runs}


TARGET = {"id": "T", "config": CONFIG, "rate": 72, "percentile": 50, "ttft_s": 0.1, "tpot_s": 0.02}
GOOD, SLOW = (0.05, 0.01), (0.5, 0.01)   # (ttft, tpot): meets TARGET / misses its TTFT


def _grid_rates(good_at: set[float], name: str = "default", **flags) -> dict:
    return _server(name, [_run(r, *(GOOD if r in good_at else SLOW)) for r in (18, 24, 36)], **flags)


def test_sweep_best_takes_the_fewest_replicas_that_meet():
    grid = [_grid_rates({18, 24})]
    best = sw.sweep_best(grid, TARGET, keep_up=False)
    assert best["replicas"] == 3 and best["rate_per_replica"] == 24 and best["flags"] == {}
    grid = [_grid_rates({18}), _grid_rates({18, 24, 36}, "seqs128", max_num_seqs=128)]
    best = sw.sweep_best(grid, TARGET, keep_up=False)
    assert (best["replicas"], best["server"], best["flags"]) == (2, "seqs128", {"max_num_seqs": 128})


def test_sweep_best_prefers_defaults_then_fewer_changed_flags_and_reports_ties():
    both = _grid_rates({18}, "both", max_num_seqs=128, max_num_batched_tokens=2048)
    seqs = _grid_rates({18}, "seqs", max_num_seqs=128)
    tokens = _grid_rates({18}, "tokens", max_num_batched_tokens=2048)
    default = _grid_rates({18})
    assert sw.sweep_best([both, seqs, default, tokens], TARGET, keep_up=False)["server"] == "default"
    best = sw.sweep_best([both, seqs, tokens], TARGET, keep_up=False)
    assert best["server"] == "seqs" and best["also"] == ["tokens"] and best["replicas"] == 4
    assert sw.sweep_best([both], TARGET, keep_up=False)["flags"] == {"max_num_seqs": 128,
                                                                     "max_num_batched_tokens": 2048}


def test_keep_up_test_filters_runs_that_fell_behind():
    behind = _server("default", [_run(18, *GOOD), _run(24, *GOOD, throughput=20.0)])
    assert not sw.kept_up(behind["runs"][1]) and sw.kept_up(behind["runs"][0])
    assert sw.sweep_best([behind], TARGET, keep_up=False)["replicas"] == 3
    assert sw.sweep_best([behind], TARGET, keep_up=True)["replicas"] == 4
    all_behind = _server("default", [_run(r, *GOOD, throughput=0.8 * r) for r in (18, 24, 36)])
    assert sw.sweep_best([all_behind], TARGET, keep_up=True) is None


def test_sweep_best_is_none_when_nothing_meets():
    assert sw.sweep_best([_grid_rates(set()), _grid_rates(set(), "s", max_num_seqs=128)], TARGET,
                         keep_up=False) is None


def test_pick_verdict_judges_the_picks_server_at_its_rate():
    grid = [_grid_rates({18}), _grid_rates({18, 24}, "seqs", max_num_seqs=128)]
    ok = sw.pick_verdict(grid, TARGET, {"replicas": 3, "flags": {"max_num_seqs": 128}, "rate_per_replica": 24})
    assert ok["meets"] is True and ok["server"] == "seqs" and ok["measured"]["ttft_p50"] == pytest.approx(0.05)
    miss = sw.pick_verdict(grid, TARGET, {"replicas": 3, "flags": {}, "rate_per_replica": 24})
    assert miss["meets"] is False and miss["server"] == "default"
    # a pick outside the recorded grid, or at a rate not run, has no verdict; no pick at all neither
    assert sw.pick_verdict(grid, TARGET, {"replicas": 3, "flags": {"max_num_batched_tokens": 2048},
                                          "rate_per_replica": 24})["meets"] is None
    assert sw.pick_verdict(grid, TARGET, {"replicas": 5, "flags": {}, "rate_per_replica": 14.4})["meets"] is None
    assert sw.pick_verdict(grid, TARGET, None)["meets"] is None


def test_meets_checks_both_targets_at_the_sets_percentile():
    run = _run(18, 0.05, 0.03)
    assert not sw.meets(run, TARGET)                       # TPOT 30 ms > 20 ms
    assert sw.meets(run, {**TARGET, "tpot_s": 0.03, "percentile": 90})


# ---- the recorded sweep -----------------------------------------------------------------------------

FOLDER = "serve_sweep37"


@pytest.fixture(scope="module")
def docs():
    return serve_latency_results(FOLDER)


@pytest.fixture(scope="module")
def declared():
    folder = results_dir() / FOLDER
    return (tomllib.loads((folder / "heldout.toml").read_text()),
            tomllib.loads((folder / "targets.toml").read_text())["target_set"],
            json.loads((folder / "tune_picks.json").read_text()))


@pytest.fixture(scope="module")
def grid(docs, declared):
    config = {t["config"] for t in declared[1]}
    assert len(config) == 1
    return [d for d in docs if d["config"] in config]


def _figures(run: dict, q: int) -> tuple[float, float]:
    """(TTFT, TPOT) at percentile ``q`` of a run, straight from its per-request rows."""
    reqs = run["requests"]
    tpot = [(r["latency_s"] - r["ttft_s"]) / (r["output_len"] - 1) for r in reqs if r["output_len"] > 1]
    return percentile([r["ttft_s"] for r in reqs], q), percentile(tpot, q)


def _meets(run: dict, t: dict) -> bool:
    ttft, tpot = _figures(run, t["percentile"])
    return ttft <= t["ttft_s"] and tpot <= t["tpot_s"]


def _changed(doc: dict) -> dict:
    return {k: v for k, v in doc["engine_flags"].items()
            if k in ("max_num_seqs", "max_num_batched_tokens") and v is not None}


def test_every_declared_server_was_recorded_and_held_out(docs, declared):
    heldout = declared[0]
    assert {d["name"] for d in docs} == set(heldout["groups"])
    assert set(heldout["groups"].values()) == {"held out"}
    for d in docs:
        assert d["vllm_version"] == heldout["vllm_version"] and not d["not_run"]
        assert all(len(r["requests"]) == r["num_prompts"] for r in d["runs"])


def test_no_sweep_run_passes_the_declared_kept_up_test_and_the_amendment_says_so(grid, declared):
    runs = [r for d in grid for r in d["runs"]]
    assert len(runs) == 12
    assert all(r["summary"]["request_throughput"] < 0.95 * r["rate"] for r in runs)
    assert not any(sw.kept_up(r) for r in runs)
    amendment = declared[0]["amendment"]
    assert len(amendment) == 1 and amendment[0]["after_runs"] is True
    assert "kept-up" in amendment[0]["what"]


def test_each_tune_pick_names_a_recorded_grid_server_run_at_its_rate(grid, declared):
    _, targets, picks = declared
    for t in targets:
        for headroom in ("default_headroom", "headroom_0"):
            pick = picks["sets"][t["id"]][headroom]["pick"]
            servers = [d for d in grid if _changed(d) == pick["flags"]]
            assert len(servers) == 1, (t["id"], headroom)
            assert pick["rate_per_replica"] * pick["replicas"] == pytest.approx(t["rate"])
            assert any(abs(r["rate"] - pick["rate_per_replica"]) < 1e-9 for r in servers[0]["runs"])


def test_sets_whose_pick_meets_recomputed_from_the_requests(docs, grid, declared):
    """The page glues the count comparison() gives; recompute it from the per-request rows."""
    _, targets, picks = declared
    met = []
    for t in targets:
        pick = picks["sets"][t["id"]]["default_headroom"]["pick"]
        doc = next(d for d in grid if _changed(d) == pick["flags"])
        run = next(r for r in doc["runs"] if abs(r["rate"] - pick["rate_per_replica"]) < 1e-9)
        met.append(_meets(run, t))
    rows = sw.comparison(docs, results_dir() / FOLDER)
    assert [r["tune"]["meets"] for r in rows] == met
    assert sum(met) == len(targets) - 1 and not met[-1]   # the page's "4 of 5", S5 missing


def test_sweep_best_without_the_test_recomputed_by_brute_force(docs, grid, declared):
    """For each set the fewest replicas with some meeting run, and the servers that qualify there."""
    _, targets, _ = declared
    rows = {r["id"]: r for r in sw.comparison(docs, results_dir() / FOLDER)}
    for t in targets:
        options = sorted((round(t["rate"] / r["rate"]), len(_changed(d)), d["name"])
                         for d in grid for r in d["runs"] if _meets(r, t))
        best = rows[t["id"]]["sweep"]
        assert rows[t["id"]]["sweep_declared"] is None
        assert (best["replicas"], len(best["flags"])) == options[0][:2]
        tied = {o[2] for o in options if o[:2] == options[0][:2]}
        assert {best["server"], *best["also"]} == tied
    fewer = [i for i, r in rows.items() if r["sweep"]["replicas"] < r["tune"]["replicas"]]
    fewer0 = [i for i, r in rows.items() if r["sweep"]["replicas"] < r["tune_headroom_0"]["replicas"]]
    assert fewer == ["S1", "S2", "S3", "S4"] and fewer0 == ["S1", "S3", "S4"]
    s5 = rows["S5"]["sweep"]
    assert s5["replicas"] == rows["S5"]["tune"]["replicas"] and len(s5["flags"]) == 1 and len(s5["also"]) == 1


def test_the_default_server_ran_first_and_its_lightest_rate_first(grid):
    """The page's caveat on S5's miss: the default server was the sweep's first, 18/s its first run."""
    first = min(grid, key=lambda d: d["recorded"])
    assert _changed(first) == {}
    assert [r["rate"] for r in first["runs"]] == sorted(r["rate"] for r in first["runs"])


def test_tunes_horizon_predicts_a_fuller_batch_than_the_short_run(grid, declared):
    """The page's horizon paragraph: at 24/s on vLLM's defaults, the 30-s prediction misses S1's
    TPOT p90 target, the run's own request count and the measurement meet it."""
    s1 = declared[1][0]
    doc = next(d for d in grid if not _changed(d))
    run = next(r for r in doc["runs"] if r["rate"] == 24)
    long, short = sw.horizon_prediction(doc, 24), sw.horizon_prediction(doc, 24, run["num_prompts"])
    assert long.num_requests > run["num_prompts"] == short.num_requests
    assert long.tpot_s[90] > s1["tpot_s"] >= _figures(run, 90)[1]
    assert long.tpot_s[90] > short.tpot_s[90] and long.mean_running > short.mean_running


def test_gemma4_server_is_bound_outside_the_engine(docs):
    """The page's Gemma 4 paragraph: flat output throughput, vLLM's TTFT far above queue + prefill."""
    doc = next(d for d in docs if d["name"] == "gemma-4-26b-a4b")
    tput = [r["summary"]["output_throughput"] for r in doc["runs"]]
    assert max(tput) < 1.1 * min(tput) and max(tput) < doc["runs"][0]["rate"] * doc["workload"]["output_len"]
    e = engine_means(doc["runs"][0])
    assert e["ttft"] > 3 * (e["queue"] + e["prefill"])
    assert re.search(r"Using AttentionBackendEnum\.TRITON_ATTN", doc["startup_log"])
    assert "Using default MoE config" in doc["startup_log"]
