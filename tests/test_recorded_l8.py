"""Lab 8's recorded GPU run (labs/results/batch_tactics/l8-gpu-*.json): the loader checks schema and
provenance, the table, speed-ups and plot the book renders (servebook.lab.analyses.lab8_batch_tactics) agree
with numbers recomputed here by hand from the raw runs, the common writer's file reads back the
same, and the HTTP case reports the server's own error when ``vllm serve`` exits at once.
"""
from __future__ import annotations

import copy
import json
import os
import stat
import time
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from servebook.lab.analyses import lab8_batch_tactics as T  # noqa: E402
from servebook.lab.errors import EngineStartError, LabError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "labs" / "results" / "batch_tactics" / "l8-gpu-nvidia-h200-vllm0.26.0-2026-11-30.json"


def raw() -> dict:
    return json.loads(RECORDED.read_text())


def _write(tmp_path, doc) -> Path:
    path = tmp_path / "l8-gpu-x.json"
    path.write_text(json.dumps(doc))
    return path


# ---- the recorded file ----------------------------------------------------------------------

def test_recorded_path_finds_the_h200_run_and_it_loads():
    assert T.recorded_tactics_path() == RECORDED
    doc = T.load_tactics(RECORDED)
    assert (doc["gpu"]["name"], doc["vllm_version"], doc["date"][:10]) == ("NVIDIA H200", "0.26.0", "2026-11-30")
    assert doc["profile"] == "gpu" and doc["model_id"] == "llama-3.1-8b"


def test_rows_recomputed_by_hand_from_the_runs():
    doc = raw()
    rows = {r["case"]: r for r in T.tactics_rows(T.load_tactics(RECORDED))}
    assert list(rows) == [c["name"] for c in doc["cases"]]
    for case in doc["cases"]:
        walls = [run["wall_s"] for run in case["runs"]]
        fastest = case["runs"][walls.index(min(walls))]
        row = rows[case["name"]]
        assert row["wall s"] == min(walls)
        # throughputs from the counts, not from the file's own *_per_s fields
        assert row["out tok/s"] == pytest.approx(fastest["output_tokens"] / min(walls), rel=1e-9)
        assert row["req/s"] == pytest.approx(fastest["requests"] / min(walls), rel=1e-9)
        assert row["out tok"] == fastest["output_tokens"]
        if "prefix_cache_query_tokens" in fastest:
            assert row["prefix hit share"] == fastest["prefix_cache_hit_tokens"] / fastest["prefix_cache_query_tokens"]
        else:
            assert row["prefix hit share"] is None
    assert rows["http-server"]["prefix hit share"] is None        # the HTTP case reads no engine metrics


def test_ratios_recomputed_by_hand():
    doc = raw()
    wall = {c["name"]: min(r["wall_s"] for r in c["runs"]) for c in doc["cases"]}
    got = T.tactic_ratios(doc)
    assert got == pytest.approx({
        "length-sorted vs shuffled": wall["order-shuffled"] / wall["order-length-sorted"],
        "prefix-grouped vs length-sorted": wall["order-length-sorted"] / wall["order-prefix-grouped+length-sorted"],
        "tight vs loose max_tokens": wall["max-tokens-loose"] / wall["llm-generate"],
        "LLM.generate vs HTTP": wall["http-server"] / wall["llm-generate"],
    })
    no_server = copy.deepcopy(doc)
    no_server["cases"] = [c for c in doc["cases"] if c["name"] != "http-server"]
    assert "LLM.generate vs HTTP" not in T.tactic_ratios(no_server)


def test_every_llm_case_hit_the_whole_prefix_of_every_later_request():
    """The claim the pages make: order could not change prefix hits in this run."""
    doc = raw()
    w = doc["profile_settings"]["workload"]
    # 16 prefixes of 1,024 tokens (a multiple of the 16-token block): each is computed once, then reused whole.
    assert w["prefix_tokens"] % doc["profile_settings"]["block_tokens"] == 0
    by_hand = (w["num_requests"] - w["num_prefixes"]) * w["prefix_tokens"]
    assert T.max_prefix_hit_tokens(doc) == by_hand
    hits = {c["name"]: c["runs"][0].get("prefix_cache_hit_tokens") for c in doc["cases"]}
    llm = {k: v for k, v in hits.items() if k != "http-server"}
    assert len(llm) == 5 and set(llm.values()) == {by_hand}


def test_block_rounding_of_the_prefix_bound():
    doc = raw()
    doc["profile_settings"]["block_tokens"] = 1000          # 1,024-token prefix: one whole block of 1,000
    w = doc["profile_settings"]["workload"]
    assert T.max_prefix_hit_tokens(doc) == (w["num_requests"] - w["num_prefixes"]) * 1000


def test_plot_is_labelled_with_units_and_the_release():
    import matplotlib.pyplot as plt

    fig = T.plot_tactics(raw())
    try:
        (ax,) = fig.axes
        assert "tokens/s" in ax.get_xlabel() and ax.get_ylabel()
        assert "vLLM 0.26.0" in ax.get_title() and "NVIDIA H200" in ax.get_title()
        assert [t.get_text() for t in ax.get_yticklabels()] == [c["name"] for c in raw()["cases"]]
    finally:
        plt.close(fig)


# ---- the common writer and reader (servebook.lab.harness.save_result, schema servebook.lab/1) ---------

def _save_as_the_lab_would(tmp_path, monkeypatch, doc):
    """save_tactics on a recorded document, with the engine's provenance that run reported (no engine)."""
    from servebook.lab.harness import results
    from servebook.lab.harness.profiles import Profile

    monkeypatch.setenv("SERVEBOOK_LAB_RESULTS", str(tmp_path))
    monkeypatch.setattr(results, "engine_provenance", lambda env=None: {"gpu": doc["gpu"],
                                                                       "vllm_version": doc["vllm_version"]})
    profile = Profile(name="gpu", device="cuda", model_id=doc["model_id"], model_config=doc["config"],
                      engine_args={"load_format": "dummy"})
    return T.save_tactics(doc, profile)


def test_a_file_of_the_common_writer_reads_back_as_the_recorded_one(tmp_path, monkeypatch):
    doc = raw()
    path = _save_as_the_lab_would(tmp_path, monkeypatch, doc)
    assert path == tmp_path / "l8_batch_tactics_gpu.json"
    saved = json.loads(path.read_text())
    assert (saved["schema"], saved["lab"]) == ("servebook.lab/1", "l8_batch_tactics")
    assert saved["measurements"]["cases"] == doc["cases"] and saved["config_sha256"] == doc["config_sha256"]
    view = T.load_tactics(path)
    assert T.tactics_rows(view) == T.tactics_rows(T.load_tactics(RECORDED))
    assert T.tactic_ratios(view) == T.tactic_ratios(doc)
    assert T.max_prefix_hit_tokens(view) == T.max_prefix_hit_tokens(doc)
    assert (view["gpu"], view["vllm_version"], view["profile"]) == (doc["gpu"], doc["vllm_version"], "gpu")


def test_the_common_writers_file_is_the_one_rendered_once_it_exists(tmp_path, monkeypatch):
    from servebook.lab.recordings import recorded

    monkeypatch.setattr(recorded, "RECORDED_DIR", tmp_path)
    assert T.recorded_tactics_path() == RECORDED                   # only the 2026-11-30 file so far
    path = _save_as_the_lab_would(tmp_path, monkeypatch, raw())
    assert T.recorded_tactics_path() == path


def test_common_writer_file_without_cases_or_of_another_model_is_refused(tmp_path, monkeypatch):
    from servebook.lab.harness.profiles import Profile

    path = _save_as_the_lab_would(tmp_path, monkeypatch, raw())
    saved = json.loads(path.read_text())
    del saved["measurements"]["cases"]
    path.write_text(json.dumps(saved))
    with pytest.raises(LabError, match="measurements lack cases"):
        T.load_tactics(path)
    tiny = Profile(name="cpu-smoke", device="cpu", model_id="tiny-llama", model_config={"hidden_size": 64})
    with pytest.raises(LabError, match="served llama-3.1-8b, the cpu-smoke profile names tiny-llama.*SERVEBOOK_LAB_MODEL"):
        T.save_tactics(raw(), tiny)


def test_settings_come_from_the_shared_profile_table():
    from servebook.lab.harness.profiles import LAB_PARAMS

    for name, settings in T.PROFILES.items():
        params = LAB_PARAMS[name]["l8"]
        assert settings.name == name and settings.max_num_seqs == params["max_num_seqs"]
        assert settings.workload.num_requests == params["workload"]["num_requests"]
    # the sizes the 2026-11-30 H200 run recorded are the gpu profile's, field for field
    from dataclasses import asdict

    assert json.loads(json.dumps(asdict(T.PROFILES["gpu"]))) == raw()["profile_settings"]


# ---- bad input ------------------------------------------------------------------------------

def test_wrong_schema_is_refused_naming_it(tmp_path):
    doc = raw()
    doc["schema"] = "servebook.lab/1"
    path = _write(tmp_path, doc)
    with pytest.raises(LabError, match=f"{path.name}.*'servebook.lab/1', expected 'servebook.batch_tactics/1'"):
        T.load_tactics(path)


@pytest.mark.parametrize("drop", ["vllm_version", "date", "config_sha256", "engine_args", "cases",
                                  "gpu.driver", "gpu.name"])
def test_missing_provenance_field_is_named(tmp_path, drop):
    doc = raw()
    if drop.startswith("gpu."):
        del doc["gpu"][drop[4:]]
    else:
        del doc[drop]
    path = _write(tmp_path, doc)
    with pytest.raises(LabError, match=f"{path.name} lacks field.*{drop.replace('.', '[.]')}"):
        T.load_tactics(path)


def test_other_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(LabError, match="no such Lab 8 result.*run_labs_gpu.sh l8"):
        T.load_tactics(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(LabError, match="bad.json is not JSON"):
        T.load_tactics(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(LabError, match="JSON list, not a Lab 8 result"):
        T.load_tactics(tmp_path / "list.json")
    doc = raw()
    doc["date"] = "today"
    with pytest.raises(LabError, match="not an ISO 8601"):
        T.load_tactics(_write(tmp_path, doc))
    doc = raw()
    doc["cases"][2]["runs"] = []
    with pytest.raises(LabError, match="case 'order-shuffled' has no runs"):
        T.load_tactics(_write(tmp_path, doc))
    doc = raw()
    del doc["cases"][0]["runs"][0]["wall_s"]
    with pytest.raises(LabError, match="case 'http-server' run 0 lacks wall_s"):
        T.load_tactics(_write(tmp_path, doc))


def test_no_recorded_file_says_how_to_record_one(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "RECORDED_DIR", tmp_path)
    with pytest.raises(LabError, match="no l8-gpu-.*run_labs_gpu.sh l8"):
        T.recorded_tactics_path()


# ---- the HTTP case when `vllm serve` exits at once (no engine needed) ------------------------

def _fake_python(tmp_path: Path, body: str) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def test_server_that_exits_at_once_reports_its_own_error_and_a_hint(tmp_path):
    from servebook.lab.analyses import lab8_batch_tactics as tactics

    fake = _fake_python(tmp_path, "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; exit 1")
    with pytest.raises(EngineStartError) as info:
        tactics._serve_case(tactics.PROFILES["cpu-smoke"], tmp_path / "model", [], tmp_path, python=str(fake))
    err = info.value
    assert "vllm serve exited with status 1" in str(err) and "No module named 'vllm'" in str(err)
    assert "PYTHONPATH=$PWD/src:$PYTHONPATH" in err.hint and err.hint in str(err)


def test_other_early_exits_get_the_generic_hint(tmp_path):
    from servebook.lab.analyses import lab8_batch_tactics as tactics

    fake = _fake_python(tmp_path, "echo 'ValueError: max_num_batched_tokens too small'; exit 3")
    with pytest.raises(EngineStartError, match="(?s)exited with status 3.*ValueError: max_num_batched_tokens") as info:
        tactics._serve_case(tactics.PROFILES["cpu-smoke"], tmp_path / "model", [], tmp_path, python=str(fake))
    assert "above the error line" in info.value.hint


def test_server_that_never_answers_is_stopped_with_its_children(tmp_path):
    """A server that stays up but never answers /health: the timeout error, and no process left behind."""
    from servebook.lab.analyses import lab8_batch_tactics as tactics

    pidfile = tmp_path / "child.pid"
    fake = _fake_python(tmp_path, f"sleep 300 & echo $! > {pidfile}; wait")
    with pytest.raises(EngineStartError, match="did not answer .*/health within 2 s"):
        tactics._serve_case(tactics.PROFILES["cpu-smoke"], tmp_path / "model", [], tmp_path, python=str(fake),
                            health_timeout_s=2)
    child = int(pidfile.read_text())
    assert _gone(child), f"pid {child} (the server's child) still runs"


def _gone(pid: int, within_s: float = 5) -> bool:
    """The process has exited (a zombie awaiting its reaper counts as exited)."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


def test_cli_prints_the_hint_last_and_exits_1(tmp_path, monkeypatch, capsys):
    from servebook.lab.analyses import lab8_batch_tactics as tactics

    def fail(*_a, **_k):
        raise EngineStartError("vllm serve exited with code 1 ...\nNo module named 'vllm'", hint="prepend to it")

    monkeypatch.setattr(tactics, "run_tactics", fail)
    assert tactics.main(["--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err
    assert "No module named 'vllm'" in err and err.rstrip().endswith("Hint: prepend to it")
    assert not (tmp_path / "x.json").exists()


# ---- the GPU runner's l8 target (labs/tools/run_labs_gpu.sh), with a fake interpreter ------------

def test_runner_l8_target_runs_the_notebook_with_results_in_out(tmp_path):
    """`run_labs_gpu.sh l8` runs the L8 notebook, points SERVEBOOK_LAB_RESULTS at $OUT and keeps
    the caller's PYTHONPATH after the repository's src (replacing it hid vLLM from `vllm serve`)."""
    import subprocess

    out = tmp_path / "out"
    fake = _fake_python(tmp_path, 'echo "$@" > "$SERVEBOOK_LAB_RESULTS/argv"; '
                                  'echo "$PYTHONPATH" > "$SERVEBOOK_LAB_RESULTS/pythonpath"; '
                                  'echo "{}" > "$SERVEBOOK_LAB_RESULTS/l8_batch_tactics_gpu.json"')
    env = {"PATH": os.environ["PATH"], "OUT": str(out), "PY": str(fake), "PYTHONPATH": "/opt/vllm-site"}
    proc = subprocess.run(["bash", str(ROOT / "labs" / "tools" / "run_labs_gpu.sh"), "l8"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "argv").read_text().split() == ["-m", "servebook.lab.harness.run_notebook",
                                                  str(ROOT / "labs" / "l8_batch_tactics.md")]
    assert (out / "pythonpath").read_text().strip() == f"{ROOT / 'src'}:/opt/vllm-site"
    assert f"result: {out}/l8_batch_tactics_gpu.json" in proc.stdout
    assert (out / "l8.log").exists()
