"""A lab cut short by its runner's deadline keeps what it measured (servebook.lab.harness.deadline and
measure_speculation's keep_partial), without any engine: a stand-in engine interpreter reports
one job and then hangs, as a speculative-decoding child past the deadline would."""
from __future__ import annotations

import json
import stat
import sys
import time

import pytest

from servebook.lab.harness.deadline import ENV, fits, seconds_left
from servebook.lab.errors import LabError
from servebook.lab.analyses.lab7_speculative import measure_speculation


def test_no_deadline_means_no_limit(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert seconds_left() is None
    assert fits(10**9)


def test_seconds_left_and_fits(monkeypatch):
    monkeypatch.setenv(ENV, "1000")
    assert seconds_left(now=900.0) == 100.0
    assert fits(100, now=900.0) and not fits(101, now=900.0)
    assert seconds_left(now=1010.0) == -10.0 and not fits(0, now=1010.0)


def test_malformed_deadline_says_how_to_set_it(monkeypatch):
    monkeypatch.setenv(ENV, "in ten minutes")
    with pytest.raises(LabError, match=r"not a Unix time in seconds.*date \+%s"):
        seconds_left()


def _fake_engine_python(tmp_path):
    """An 'engine interpreter' that writes a report for the first job, then hangs."""
    script = tmp_path / "fake-vllm-python"
    script.write_text(f"""#!{sys.executable}
import json, sys, time
jobs_path, out_path = sys.argv[-2], sys.argv[-1]
jobs = json.load(open(jobs_path))
report = [{{"name": jobs[0]["name"], "ok": True, "error": "", "startup_s": 1.5,
           "points": [{{"batch": 1, "wall_s": 0.5, "output_tokens": 8,
                        "counters": {{"drafts": 4, "draft_tokens": 8, "accepted_tokens": 4,
                                      "accepted_per_position": [3, 1]}}}}]}}]
json.dump(report, open(out_path, "w"))
print("reported", jobs[0]["name"], flush=True)
time.sleep(120)
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


JOBS = [{"name": n, "engine_args": {}, "prompts": [[1, 2]], "max_tokens": 8, "batch_sizes": [1]}
        for n in ("baseline", "ngram k=3", "draft k=2")]


def test_timeout_keeps_reported_jobs_and_marks_the_rest_not_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEBOOK_VLLM_PYTHON", str(_fake_engine_python(tmp_path)))
    monkeypatch.setenv("SERVEBOOK_ENGINE_LOCK", str(tmp_path / "lock"))
    t0 = time.monotonic()
    results = measure_speculation(JOBS, timeout_s=4, keep_partial=True)
    assert time.monotonic() - t0 < 60            # the hung child was killed, not waited for
    assert [r["name"] for r in results] == [j["name"] for j in JOBS]
    assert results[0]["ok"] and results[0]["points"][0]["counters"]["accepted_tokens"] == 4
    assert "reported baseline" in results[0]["log"]
    for r in results[1:]:
        assert not r["ok"] and r["not_run"] and r["points"] == []
        assert "not reported within the 4 s timeout" in r["error"]


def test_timeout_without_keep_partial_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEBOOK_VLLM_PYTHON", str(_fake_engine_python(tmp_path)))
    monkeypatch.setenv("SERVEBOOK_ENGINE_LOCK", str(tmp_path / "lock"))
    with pytest.raises(LabError, match="ran past 3 s"):
        measure_speculation(JOBS, timeout_s=3)
