"""A lab's sweep split over two device calls (servebook.lab.harness.split, recorded.load_l3), without an engine.

The point-selection variable is parsed against the lab's own values; a sweep saves after every
point and records what the runner's deadline made it skip; Lab 3's recorded file, cut into two
altered copies, merges back into the same table only when GPU, driver, release, model config and
load agree, and is refused naming the field otherwise.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from servebook.lab.analyses.lab3_preemption import l3_table, load_l3
from servebook.lab.recordings.recorded import load_recorded
from servebook.lab.harness.deadline import ENV as DEADLINE
from servebook.lab.errors import LabError
from servebook.lab.harness.split import part_name, part_paths, selected, sweep

ROOT = Path(__file__).resolve().parents[1]
# Lab 3's first GPU run, one file for the whole sweep (replaced by two part files, kept in raw/).
L3 = ROOT / "labs" / "results" / "raw" / "l3_preemption_gpu-2026-11-30.json"
RECORDED = ROOT / "labs" / "results" / "labs"
VAR = "SERVEBOOK_LAB_L3_MAX_NUM_SEQS"
SWEPT = [16, 48, 128, 256]


# ---- the point-selection variable ------------------------------------------------------------------

def test_unset_or_empty_selects_nothing(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert selected(VAR, SWEPT, int) == []
    monkeypatch.setenv(VAR, " , ")
    assert selected(VAR, SWEPT, int) == []


def test_named_values_come_back_in_the_labs_order(monkeypatch):
    monkeypatch.setenv(VAR, " 128,16 ")
    assert selected(VAR, SWEPT, int) == [16, 128]


@pytest.mark.parametrize("value,says", [("16,sixty", "not a comma-separated list"),
                                        ("16,64", "names 64, not swept"),
                                        ("48,48", "names a point twice")])
def test_bad_values_name_the_variable_and_the_valid_values(monkeypatch, value, says):
    monkeypatch.setenv(VAR, value)
    with pytest.raises(LabError, match=says) as err:
        selected(VAR, SWEPT, int)
    assert VAR in str(err.value) and "16,48,128,256" in str(err.value)


def test_string_points_as_lab_9_names_them(monkeypatch):
    monkeypatch.setenv("SERVEBOOK_LAB_L9_CONFIGS", "TP=2+EP,TP=2")
    only = selected("SERVEBOOK_LAB_L9_CONFIGS", ["TP=1", "DP=2", "TP=2", "TP=2+EP"])
    assert only == ["TP=2", "TP=2+EP"]
    assert part_name("l9_tp_vs_dp_qwen3-30b-a3b", only) == "l9_tp_vs_dp_qwen3-30b-a3b_tp2_tp2-ep"


def test_part_names():
    assert part_name("l3_preemption", []) == "l3_preemption"
    assert part_name("l3_preemption", [16, 48]) == "l3_preemption_16_48"


# ---- save after every engine ------------------------------------------------------------------------

def _fake_engine_runs(log):
    def measure(max_num_seqs):
        log.append(("measure", max_num_seqs))
        return {"preemptions": 0, "output_throughput": float(max_num_seqs)}
    return measure


def test_sweep_saves_after_every_point(monkeypatch, tmp_path):
    monkeypatch.delenv(DEADLINE, raising=False)
    log, out = [], tmp_path / "l3_preemption_16_48_gpu.json"

    def save(points):
        out.write_text(json.dumps(points))
        log.append(("save", [p["max_num_seqs"] for p in points]))

    points = sweep([16, 48], _fake_engine_runs(log), save, key="max_num_seqs", need_s=240)
    assert log == [("measure", 16), ("save", [16]), ("measure", 48), ("save", [16, 48])]
    assert [p["max_num_seqs"] for p in json.loads(out.read_text())] == [16, 48]
    assert all(p["wall_s"] >= 0 and "skipped" not in p for p in points)


def test_a_cut_run_keeps_what_it_measured(monkeypatch, tmp_path):
    """An engine that fails (or a run interrupted) after the first point leaves that point saved."""
    monkeypatch.delenv(DEADLINE, raising=False)
    out = tmp_path / "part.json"

    def measure(max_num_seqs):
        if max_num_seqs == 48:
            raise KeyboardInterrupt   # what `timeout --signal=INT` delivers to the lab
        return {"preemptions": 0}

    with pytest.raises(KeyboardInterrupt):
        sweep([16, 48, 128], measure, lambda pts: out.write_text(json.dumps(pts)), key="max_num_seqs", need_s=1)
    assert [p["max_num_seqs"] for p in json.loads(out.read_text())] == [16]


def test_points_past_the_deadline_are_recorded_as_skipped(monkeypatch):
    monkeypatch.setenv(DEADLINE, str(time.time() + 1000))
    saved = []

    def measure(max_num_seqs):
        monkeypatch.setenv(DEADLINE, str(time.time() + 100))   # the engine used up the time
        return {"preemptions": 0}

    ticks = iter([0.0, 200.0])   # the first point took 200 s; the slowest so far sets the need
    points = sweep([128, 256], measure, lambda pts: saved.append([dict(p) for p in pts]),
                   key="max_num_seqs", need_s=50, clock=lambda: next(ticks))
    assert points[0]["wall_s"] == 200.0 and "skipped" not in points[0]
    assert points[1]["max_num_seqs"] == 256 and "runner's deadline" in points[1]["skipped"]
    assert "needs ~200 s" in points[1]["skipped"]
    assert len(saved) == 2 and saved[-1] == points


# ---- merging Lab 3's part files --------------------------------------------------------------------------

def _split_recording(tmp_path, change=None) -> list[Path]:
    """The recorded sweep cut into two part files, the second an hour later (``change`` alters it)."""
    doc = json.loads(L3.read_text())
    paths = []
    for values, hour in (([16, 48], "10"), ([128, 256], "11")):
        part = json.loads(json.dumps(doc))
        part["date"] = part["date"][:11] + hour + part["date"][13:]
        part["measurements"]["points"] = [p for p in doc["measurements"]["points"] if p["max_num_seqs"] in values]
        if change and values[0] == 128:
            change(part)
        path = tmp_path / f"{part_name('l3_preemption', values)}_gpu.json"
        path.write_text(json.dumps(part))
        paths.append(path)
    return paths


def test_parts_that_agree_merge_into_the_recorded_table(tmp_path):
    _split_recording(tmp_path)
    whole = load_recorded(L3, lab="l3_preemption")
    merged = load_l3(tmp_path)
    assert l3_table(merged["measurements"]["points"]) == l3_table(whole["measurements"]["points"])
    assert merged["files"] == {16: "l3_preemption_16_48_gpu.json", 48: "l3_preemption_16_48_gpu.json",
                               128: "l3_preemption_128_256_gpu.json", 256: "l3_preemption_128_256_gpu.json"}
    assert merged["measurements"]["measured_first_preempting_max_num_seqs"] == 128
    assert merged["date"][11:13] == "10" and merged["not_measured"] == []


@pytest.mark.parametrize("change,field", [
    (lambda d: d.update(vllm_version="0.27.1"), "vllm_version"),
    (lambda d: d["gpu"].update(driver="999.99"), "gpu.driver"),
    (lambda d: d["gpu"].update(name="NVIDIA H100 80GB HBM3"), "gpu.name"),
    (lambda d: d.update(config_sha256="0" * 64), "config_sha256"),
    (lambda d: d["measurements"]["workload"].update(num_prompts=256), "measurements.workload"),
    (lambda d: d["measurements"].update(block_size=32), "measurements.block_size"),
])
def test_parts_of_different_experiments_are_refused_naming_the_field(tmp_path, change, field):
    _split_recording(tmp_path, change)
    with pytest.raises(LabError, match=rf"l3_preemption_128_256_gpu\.json.*{field}.*l3_preemption_16_48_gpu\.json"):
        load_l3(tmp_path)


def test_a_skipped_value_is_listed_and_the_earliest_measurement_wins(tmp_path):
    first, second = _split_recording(tmp_path)
    doc = json.loads(second.read_text())
    doc["measurements"]["points"][1] = {"max_num_seqs": 256, "skipped": "runner's deadline: 20 s left"}
    doc["measurements"]["points"].append(dict(json.loads(first.read_text())["measurements"]["points"][0],
                                              output_throughput=1.0))   # 16 again, later: ignored
    second.write_text(json.dumps(doc))
    merged = load_l3(tmp_path)
    assert sorted(merged["files"]) == [16, 48, 128] and merged["not_measured"] == [256]
    assert merged["measurements"]["points"][0]["output_throughput"] > 1.0


def test_a_single_file_for_the_whole_sweep_loads_unchanged(tmp_path):
    (tmp_path / "l3_preemption_gpu.json").write_text(L3.read_text())
    whole = load_recorded(L3, lab="l3_preemption")
    view = load_l3(tmp_path)
    assert view["measurements"] == whole["measurements"]
    assert set(view["files"].values()) == {"l3_preemption_gpu.json"}


def test_the_recorded_parts_name_their_part_and_merge_into_the_whole_sweep():
    parts = part_paths("l3_preemption", RECORDED)
    assert [p.name for p in parts] == ["l3_preemption_128_256_gpu.json", "l3_preemption_16_48_gpu.json"]
    assert {json.loads(p.read_text())["lab"] for p in parts} == {"l3_preemption_16_48", "l3_preemption_128_256"}
    view = load_l3()
    assert view["lab"] == "l3_preemption" and view["not_measured"] == []
    assert [p["max_num_seqs"] for p in view["measurements"]["points"]] == SWEPT
    assert view["files"][16] == view["files"][48] == "l3_preemption_16_48_gpu.json"
    assert view["files"][128] == view["files"][256] == "l3_preemption_128_256_gpu.json"


def test_a_part_whose_lab_does_not_match_its_file_name_is_refused(tmp_path):
    doc = json.loads((RECORDED / "l3_preemption_16_48_gpu.json").read_text())
    doc["lab"] = "l3_preemption_128_256"
    (tmp_path / "l3_preemption_16_48_gpu.json").write_text(json.dumps(doc))
    with pytest.raises(LabError, match="holds lab 'l3_preemption_128_256'.*part 'l3_preemption_16_48'"):
        load_l3(tmp_path)


def test_no_file_or_only_skipped_points_say_what_to_do(tmp_path):
    with pytest.raises(LabError, match="run_labs_gpu.sh l3a"):
        load_l3(tmp_path)
    doc = json.loads(L3.read_text())
    doc["measurements"]["points"] = [{"max_num_seqs": 16, "skipped": "runner's deadline: 3 s left"}]
    (tmp_path / "l3_preemption_16_gpu.json").write_text(json.dumps(doc))
    with pytest.raises(LabError, match="measured no --max-num-seqs value.*3 s left"):
        load_l3(tmp_path)


def test_part_paths_ignore_other_labs_and_profiles(tmp_path):
    for name in ("l3_preemption_gpu.json", "l3_preemption_16_48_gpu.json", "l3_preemption_cpu-smoke.json",
                 "l3_preemption_gpu-2026-11-30.json", "l4_fp8_kv_gpu.json"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in part_paths("l3_preemption", tmp_path)] == [
        "l3_preemption_16_48_gpu.json", "l3_preemption_gpu.json"]


# ---- the GPU runner's l3a / l3b targets (labs/tools/run_labs_gpu.sh), with a fake interpreter ------------

@pytest.mark.parametrize("target,values", [("l3a", "16,48"), ("l3b", "128,256")])
def test_runner_l3_parts_run_lab_3_with_their_values(tmp_path, target, values):
    import os
    import subprocess

    out = tmp_path / "out"
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$3 $SERVEBOOK_LAB_L3_MAX_NUM_SEQS" > "$SERVEBOOK_LAB_RESULTS/seen"\n'
                    'echo "{}" > "$SERVEBOOK_LAB_RESULTS/l3_preemption_$(echo $SERVEBOOK_LAB_L3_MAX_NUM_SEQS'
                    ' | tr , _)_gpu.json"\n')
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "OUT": str(out), "PY": str(fake)}
    proc = subprocess.run(["bash", str(ROOT / "labs" / "tools" / "run_labs_gpu.sh"), target], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "seen").read_text().split() == [str(ROOT / "labs" / "l3_preemption.md"), values]
    assert f"result: {out}/l3_preemption_{values.replace(',', '_')}_gpu.json" in proc.stdout
    assert (out / f"{target}.log").exists()
