"""Lab 5 (chunked prefill) runs top to bottom in ``cpu-smoke``; the engine's own numbers agree with
hand arithmetic on the workload.

Facts checked are read from what the engine recorded (its step log, written by vLLM's own
``schedule()`` output through ``--scheduler-cls``, and its start-up log), not from the lab's
summaries. No timing is asserted: on a shared 2-core machine a step's wall time is noise.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, check_provenance, run_lab  # noqa: E402

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_lab(LABS / "l5_chunked_prefill.md", tmp_path_factory.mktemp("l5"))


def _config(doc, chunked: bool) -> dict:
    [config] = [c for c in doc["measurements"]["configs"] if c["chunked"] is chunked]
    return config


def test_provenance_and_workload(doc):
    check_provenance(doc)
    w = doc["measurements"]["workload"]
    for config in doc["measurements"]["configs"]:
        run = config["first_run"]["run"]
        assert len(run["decodes"]) == w["decode_requests"]
        # ignore_eos: every request streamed exactly the tokens it asked for.
        assert all(sum(d["tokens_per_chunk"]) == w["decode_output_tokens"] for d in run["decodes"])
        assert sum(run["long"]["tokens_per_chunk"]) == w["long_output_tokens"]
        # The long prompt was sent while every decode was still streaming.
        assert all(d["arrivals_s"][-1] > run["long_send_s"] for d in run["decodes"])


def test_chunked_steps_never_exceed_the_budget(doc):
    w = doc["measurements"]["workload"]
    config = _config(doc, True)
    budget, L, N = config["max_num_batched_tokens"], w["long_prompt_tokens"], w["decode_requests"]
    steps = config["first_run"]["steps"]
    assert max(s["total"] for s in steps) <= budget
    # The engine's own line at start-up names the budget.
    assert f"Chunked prefill is enabled with max_num_batched_tokens={budget}." in config["log"]
    # The long prompt's chunks, read from the engine's steps: the decodes take one token each
    # first, the prompt gets the rest, ceil(L / (B - N)) steps, consecutive, covering the prompt.
    chunks = [(tokens, before, s["decodes"]) for s in steps for tokens, prompt, before in s["prefills"] if prompt == L]
    assert len(chunks) == math.ceil(L / (budget - N))
    assert [before for _, before, _ in chunks] == [sum(t for t, _, _ in chunks[:i]) for i in range(len(chunks))]
    assert sum(t for t, _, _ in chunks) == L
    assert all(t == budget - N and decodes == N for t, _, decodes in chunks[:-1])


def test_iteration_tokens_histogram_books_the_chunked_prompt_whole(doc):
    # vllm:iteration_tokens_total, scraped around the run: although no step of the chunked engine
    # exceeded its budget (above), the histogram holds an observation of more than 512 tokens —
    # the 930-token prompt, counted in the step where its first token came out.
    w = doc["measurements"]["workload"]
    config = _config(doc, True)
    assert w["long_prompt_tokens"] > 512 >= config["max_num_batched_tokens"]
    buckets = config["first_run"]["iteration_tokens_buckets"]
    assert buckets["inf"] - buckets["512.0"] >= 1
    assert max(s["total"] for s in config["first_run"]["steps"]) <= config["max_num_batched_tokens"]


def test_unchunked_prompt_goes_in_one_step(doc):
    w = doc["measurements"]["workload"]
    config = _config(doc, False)
    L, N = w["long_prompt_tokens"], w["decode_requests"]
    assert config["engine_args"]["no_enable_chunked_prefill"] is True
    assert "does not officially support disabling chunked prefill" in config["log"]
    assert "Chunked prefill is enabled" not in config["log"]
    steps = config["first_run"]["steps"]
    found = [s for s in steps if any(prompt == L for _, prompt, _ in s["prefills"])]
    assert len(found) == 1, ("expected the long prompt in exactly one step among the decodes; steps with prefills: "
                             f"{[s for s in steps if s['prefills']]}")
    [step] = found
    # The whole prompt beside all N decodes, in one step of L + N tokens.
    assert step["prefills"] == [[L, L, 0]] and step["decodes"] == N and step["total"] == L + N
    # ... which is more than any step of the chunked engine was allowed.
    assert step["total"] > _config(doc, True)["max_num_batched_tokens"]
