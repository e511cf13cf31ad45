"""Lab 9 (TP vs DP on two GPUs) in ``cpu-smoke``: no engine starts (the measurement needs two GPUs and
says it is skipped); the prediction part runs and is checked against hand arithmetic on the published
configs, and the recorded-TP analysis against the recorded files themselves.

Runs in a few seconds (kernel start, the calculator, one provenance probe in the engine's Python).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("jupytext")
pytest.importorskip("nbclient")

from labrun import LABS, check_provenance, run_lab  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.vllm_env]   # vLLM's Python, no engine start

ROOT = LABS.parent
MODELS = ROOT / "src" / "servebook" / "data" / "models"
BLOCK = 16      # vLLM's CUDA block size, tokens
BF16 = 2        # bytes per KV element (dtype auto on a bf16 model)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    return run_lab(LABS / "l9_tp_vs_dp.md", tmp_path_factory.mktemp("l9"), timeout_s=120)


def test_skips_the_measurement_and_says_so(doc):
    check_provenance(doc)
    m = doc["measurements"]
    assert m["gpus_visible"] == 0
    assert m["skipped"].startswith("measurement skipped") and "two GPUs" in m["skipped"]
    assert m["points"] == []                      # no engine was started
    assert set(m["predicted"]) == {"qwen3-32b", "qwen3-30b-a3b"}


@pytest.mark.parametrize("model_id", ["qwen3-32b", "qwen3-30b-a3b"])
def test_kv_capacity_per_gpu_shards_the_kv_heads(doc, model_id):
    cfg = json.loads((MODELS / f"{model_id}.json").read_text())
    layers, kv_heads, head_dim = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = doc["measurements"]["workload"]
    rows = {r["config"]: r for r in doc["measurements"]["predicted"][model_id]}
    for name, heads_per_gpu in (("TP=1", kv_heads), ("TP=2", kv_heads // 2), ("DP=2", kv_heads)):
        r = rows[name]
        per_token = layers * heads_per_gpu * head_dim * 2 * BF16          # K and V
        blocks = r["available_kv_bytes"] // (per_token * BLOCK)
        assert r["kv_bytes_per_token"] == per_token
        assert r["num_gpu_blocks"] == blocks
        # full attention, max_model_len a whole number of blocks: the logged token count is blocks x 16
        assert w["max_model_len"] % BLOCK == 0
        assert r["kv_cache_tokens"] == blocks * BLOCK
    assert rows["DP=2"]["tokens_in_kv_all_replicas"] == 2 * rows["TP=1"]["kv_cache_tokens"]
    # half the weights per GPU leave more KV budget per GPU at TP=2
    assert rows["TP=2"]["available_kv_bytes"] > rows["TP=1"]["available_kv_bytes"]


def test_allreduce_table_uses_the_recorded_steps(doc):
    recorded = {}
    for name, tp in (("qwen3-32b", 1), ("qwen3-32b-tp2", 2)):
        f = json.loads((ROOT / "labs" / "results" / "step_timing" / f"{name}.json").read_text())
        assert f["cases"][0]["engine_args"].get("tensor_parallel_size", 1) == tp
        recorded[tp] = {(p["batch"], p["prompt_tokens"]): p["step_s"] for p in f["cases"][0]["result"]["decode"]}
    rows = doc["measurements"]["allreduce_recorded"]["rows"]
    assert {(r["batch"], r["prompt_tokens"]) for r in rows} == set(recorded[1]) & set(recorded[2])
    for r in rows:
        key = (r["batch"], r["prompt_tokens"])
        assert r["tp1_step_s"] == recorded[1][key] and r["tp2_step_s"] == recorded[2][key]
        assert r["halving_excess_s"] == pytest.approx(recorded[2][key] - recorded[1][key] / 2)
