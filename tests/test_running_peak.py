"""The H200's measured peak of running requests (Gemma 3 27B shape) against the library's two figures.

The recorded job (labs/results/e2e/e2e_gemma-3-27b.json, vLLM 0.26.0) queued 96 requests of
6,000 + 256 tokens on an engine with --max-model-len 16384. The file's own fields are read here by
hand; the library's figures are recomputed from the config and KV memory the engine logged.
"""
import copy
import json

import pytest

from servebook.errors import ServebookError
from servebook.lab.e2e.running_peak import running_peak
from servebook.records import results_path

GEMMA = results_path("e2e", "e2e_gemma-3-27b.json")


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(GEMMA.read_text())


def test_the_measured_peak_is_the_run_time_figure_not_the_logged_admission_bound(doc):
    job = next(j for j in doc["jobs"] if j["name"] == "peak-6000-96")
    # measured: the most requests decoding at once, recounted here from each request's first and
    # last token times (a request decodes between the two)
    cols = job["request_columns"]
    events = sorted([(t, 1) for t in cols["first_token_ts"]] + [(t, -1) for t in cols["last_token_ts"]],
                    key=lambda e: (e[0], e[1]))
    running, most = 0, 0
    for _, step in events:
        running += step
        most = max(most, running)
    peak = running_peak(doc, "peak-6000-96")
    assert peak.measured_running == job["peak_decoding"] == most
    assert peak.preemptions == job["counters"]["preemptions"] == 0
    assert peak.request_tokens == 6000 + 256 and peak.requests == 96 == len(cols["first_token_ts"])
    # the library's pool and logged figure agree with the engine's start-up log
    assert abs(peak.predicted_gpu_blocks - peak.logged_gpu_blocks) <= 5
    assert peak.predicted_admission == pytest.approx(peak.logged_admission, abs=0.01)
    # the run-time figure is the measured peak to within one request (admission needs the whole
    # prompt free in every group, so the engine runs at most one below the figure) ...
    assert peak.predicted_running - 1 <= peak.measured_running <= peak.predicted_running
    # ... and the logged admission bound is nine times below it; scaled to these shorter requests
    # (tokens alone, as a reader might), still more than three times below
    assert peak.measured_running > 8 * peak.logged_admission
    assert peak.measured_running > 3 * peak.logged_admission * peak.max_model_len / peak.request_tokens


def test_a_job_that_cannot_be_compared_is_named(doc):
    with pytest.raises(ServebookError, match="no job 'nope'"):
        running_peak(doc, "nope")
    with pytest.raises(ServebookError, match="varying lengths"):
        running_peak(doc, "long-prompt-96")
    skipped = copy.deepcopy(doc)
    skipped["jobs"][0] = {"name": "peak-6000-96", "skipped": "needs ~60 s, 3 s left"}
    with pytest.raises(ServebookError, match="not measured: needs ~60 s"):
        running_peak(skipped, "peak-6000-96")
