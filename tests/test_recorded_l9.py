"""Lab 9's recorded runs on two H200s (labs/results/labs/l9_tp_vs_dp_<model>*_gpu.json): the loader
merges a model's files only when they describe one experiment, picks each configuration from the
file that measured it, and the rates the book renders are recomputed here from the raw requests and
counters (labs/results_l9.md renders them; the lab page links it instead of quoting numbers).
"""
from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from servebook.hf_config import load_model_spec  # noqa: E402
from servebook.lab.analyses import lab9_parallel as R  # noqa: E402
from servebook.lab.errors import LabError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "labs" / "results" / "labs"
DENSE, MOE = "qwen3-32b", "qwen3-30b-a3b"


def raw_points(model: str) -> dict[str, list[tuple[str, dict]]]:
    """Every point of every file of ``model``, by configuration: (file name, point)."""
    out: dict[str, list] = {}
    for path in sorted(RESULTS.glob(f"l9_tp_vs_dp_{model}*_gpu.json")):
        for p in json.loads(path.read_text())["measurements"]["points"]:
            out.setdefault(p["config"], []).append((path.name, p))
    return out


# ---- the recorded files ---------------------------------------------------------------------------

@pytest.mark.parametrize("model,configs", [(DENSE, ["TP=1", "DP=2", "TP=2"]),
                                           (MOE, ["TP=1", "DP=2", "TP=2", "TP=2+EP"])])
def test_every_configuration_comes_from_the_file_that_measured_it(model, configs):
    view = R.load_l9(model)
    assert list(view["files"]) == configs and view["not_measured"] == []
    points = raw_points(model)
    for config, name in view["files"].items():
        measured = [(f, p) for f, p in points[config] if "startup" in p]
        assert len(measured) == 1 and measured[0][0] == name
    # the first run of each model skipped TP=2 (its time budget), the second measured it
    skipped = [f for f, p in points["TP=2"] if "skipped" in p]
    assert skipped and skipped[0] not in (view["files"]["TP=2"],)
    doc = view["doc"]
    assert (doc["gpu"]["name"], doc["gpu"]["count"], doc["vllm_version"]) == ("NVIDIA H200", 2, "0.26.0")


def test_engine_rate_recomputed_from_the_raw_counters():
    view = R.load_l9(DENSE)
    rows = {r["config"]: r for r in R.saturation_rows(view)}
    for config, name in view["files"].items():
        point = json.loads((RESULTS / name).read_text())
        [p] = [q for q in point["measurements"]["points"] if q["config"] == config]
        d = p["metrics_delta"]
        n = sum(len(run["requests"]) for run in p["saturated"]["runs"])
        assert n == 256 and d["vllm:num_preemptions"] == 0
        # 256 requests decode together: every one of them is in every step, so count = 256 x 127 gaps
        assert d["vllm:inter_token_latency_seconds_count"] == n * (128 - 1)
        itl = d["vllm:inter_token_latency_seconds_sum"] / d["vllm:inter_token_latency_seconds_count"]
        assert rows[config]["engine decode tok/s"] == round(n / itl)
        tokens = sum(r["output_len"] for run in p["saturated"]["runs"] for r in run["requests"])
        longest = max(run["summary"]["duration"] for run in p["saturated"]["runs"])
        assert rows[config]["client out tok/s"] == round(tokens / longest)


def test_capacity_rows_read_the_engine_logs():
    view = R.load_l9(MOE)
    rows = {r["config"]: r for r in R.capacity_rows(view, load_model_spec(MOE))}
    for config, name in view["files"].items():
        [p] = [q for q in json.loads((RESULTS / name).read_text())["measurements"]["points"]
               if q["config"] == config]
        logged = re.search(r"GPU KV cache size: ([\d,]+) tokens", p["logs"][0])
        assert rows[config]["KV tokens logged"] == int(logged.group(1).replace(",", ""))
    assert rows["TP=2"]["logged / TP=1"] == round(rows["TP=2"]["KV tokens logged"] / rows["TP=1"]["KV tokens logged"], 3)


def test_plot_has_one_row_of_three_panels_per_model():
    fig = R.plot_l9({DENSE: R.load_l9(DENSE), MOE: R.load_l9(MOE)})
    assert len(fig.axes) == 6
    assert all(ax.get_ylabel() for ax in fig.axes)
    assert "vLLM 0.26.0" in fig.axes[0].get_title(loc="left")


# ---- merging rules, on copies ------------------------------------------------------------------------

def _copy_dense(tmp_path) -> list[Path]:
    out = []
    for path in sorted(RESULTS.glob(f"l9_tp_vs_dp_{DENSE}*_gpu.json")):
        shutil.copy(path, tmp_path / path.name)
        out.append(tmp_path / path.name)
    return out


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("change,word", [
    (lambda d: d.update(vllm_version="0.27.1"), "vllm_version"),
    (lambda d: d["gpu"].update(driver="999"), "gpu.driver"),
    (lambda d: d["measurements"]["workload"].update(num_prompts=512), "measurements.workload"),
    (lambda d: d.update(config_sha256="0" * 64), "config_sha256"),
])
def test_files_of_different_experiments_are_not_merged(tmp_path, change, word):
    paths = _copy_dense(tmp_path)
    _edit(paths[-1], change)
    with pytest.raises(LabError, match=re.escape(word)):
        R.load_l9(DENSE, tmp_path)


def test_missing_files_say_how_to_record(tmp_path):
    with pytest.raises(LabError, match="run_labs_gpu.sh l9-dense"):
        R.load_l9(DENSE, tmp_path)


def test_the_earliest_measurement_wins_and_unmeasured_configs_are_listed(tmp_path):
    paths = _copy_dense(tmp_path)
    # drop the second file: TP=2 is then only skipped
    [second] = [p for p in paths if p.name.endswith("_tp2_gpu.json")]
    second.unlink()
    view = R.load_l9(DENSE, tmp_path)
    assert list(view["files"]) == ["TP=1", "DP=2"] and view["not_measured"] == ["TP=2"]
    with pytest.raises(LabError, match="TP=2 was not measured"):
        R.split_cost_ms(view)


def test_a_model_name_that_prefixes_another_does_not_collect_its_files(tmp_path):
    _copy_dense(tmp_path)
    shutil.copy(next(RESULTS.glob(f"l9_tp_vs_dp_{MOE}_gpu.json")), tmp_path)
    assert all(DENSE in p.name for p in R.l9_paths(DENSE, tmp_path))
    assert R.l9_paths("qwen3", tmp_path) == []


# ---- the rates, on hand-made points ------------------------------------------------------------------

def _point(requests_per_run, itl_sum, itl_count, preemptions=0, logs=("",)):
    runs = [{"requests": [{"output_len": 4}] * n, "summary": {}} for n in requests_per_run]
    return {"saturated": {"runs": runs}, "logs": list(logs),
            "metrics_delta": {"vllm:inter_token_latency_seconds_sum": itl_sum,
                              "vllm:inter_token_latency_seconds_count": itl_count,
                              "vllm:num_preemptions": preemptions}}


def test_engine_rate_is_requests_over_mean_itl_only_when_all_decode_at_once():
    # 2 replicas x 128 requests, mean ITL 0.02 s -> 256 / 0.02 = 12,800 tokens/s
    assert R.engine_decode_tok_s(_point([128, 128], 2.0, 100), max_num_seqs=256) == pytest.approx(12_800)
    assert R.engine_decode_tok_s(_point([300], 2.0, 100), max_num_seqs=256) is None      # some waited
    assert R.engine_decode_tok_s(_point([128], 2.0, 100, preemptions=3), max_num_seqs=256) is None
    assert R.engine_decode_tok_s(_point([128], 0.0, 0), max_num_seqs=256) is None


def test_prefix_hit_rate_only_from_lines_inside_the_load():
    log = "\n".join([
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, Prefix cache hit rate: 0.0%",
        "Engine 000: Avg prompt throughput: 9.0 tokens/s, Running: 40 reqs, Waiting: 9 reqs, Prefix cache hit rate: 12.5%",
        "Engine 000: Avg prompt throughput: 9.0 tokens/s, Running: 90 reqs, Waiting: 0 reqs, Prefix cache hit rate: 30.0%",
    ])
    assert R.saturated_prefix_hit_pct(_point([1], 1, 1, logs=[log])) == 30.0
    only_light = log.splitlines()[0]
    assert R.saturated_prefix_hit_pct(_point([1], 1, 1, logs=[only_light])) is None


def test_recorded_hit_rates_show_the_repeated_random_prompts():
    # the recorded loads hit the prefix cache (the 131-token test tokenizer made vLLM's random
    # prompts repeat); the book says so, and this pins the value it quotes
    rows = {r["config"]: r for r in R.saturation_rows(R.load_l9(DENSE))}
    assert rows["TP=1"]["prefix hits % (log)"] == rows["TP=2"]["prefix hits % (log)"] == 55.4
