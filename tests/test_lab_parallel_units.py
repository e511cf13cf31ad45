"""Units of servebook.lab.analyses.lab9_parallel (Lab 9, TP vs DP): no engine; expectations by hand arithmetic."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servebook.hf_config import load_model_spec
from servebook.lab.analyses import lab9_parallel as lab9
from servebook.lab.harness import random_prompts
from servebook.lab.errors import LabError
from servebook.lab.analyses.lab9_parallel import (
    ParallelSetup,
    allreduce_rows,
    combine_bench_runs,
    logged_capacity,
    predicted_configs,
    replica_envs,
    request_tpot_s,
    split_prompts,
    sum_metric_deltas,
)

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "src" / "servebook" / "data" / "models"
STEP_TIMING = ROOT / "labs" / "results" / "step_timing"


# --------------------------------------------------------------------------- load splitting
@pytest.mark.parametrize("n, k, expected", [(5, 2, [3, 2]), (4, 2, [2, 2]), (7, 3, [3, 2, 2]), (1, 1, [1])])
def test_split_prompts(n, k, expected):
    assert split_prompts(n, k) == expected


@pytest.mark.parametrize("n, k", [(1, 2), (3, 0)])
def test_split_prompts_refuses_empty_replicas(n, k):
    with pytest.raises(LabError, match="at least one request per replica"):
        split_prompts(n, k)


def test_replica_envs_pin_each_replica_to_its_gpus():
    envs = replica_envs({"A": "1", "CUDA_VISIBLE_DEVICES": "0,1"}, [[0], [1]])
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1"]
    assert all(e["A"] == "1" for e in envs)
    assert replica_envs({}, [[0, 1], [2, 3]])[1]["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_replica_envs_refuse_shared_gpus():
    with pytest.raises(LabError, match="disjoint"):
        replica_envs({}, [[0], [0]])


# --------------------------------------------------------------------------- combined bench summary
def _run(duration, requests):
    return {"summary": {"duration": duration}, "requests": [
        {"input_len": i, "output_len": o, "ttft_s": t, "latency_s": l} for i, o, t, l in requests]}


def test_request_tpot_is_time_after_first_token_per_later_token():
    # 11 tokens: the first at 0.5 s, the other 10 over the next 1.0 s.
    assert request_tpot_s({"output_len": 11, "ttft_s": 0.5, "latency_s": 1.5}) == pytest.approx(0.1)
    assert request_tpot_s({"output_len": 1, "ttft_s": 0.5, "latency_s": 0.5}) is None


def test_combine_bench_runs_by_hand():
    a = _run(10.0, [(100, 11, 0.2, 1.2), (100, 11, 0.4, 2.4)])   # TPOT 0.1, 0.2 s
    b = _run(8.0, [(50, 21, 0.6, 2.6)])                          # TPOT 0.1 s
    s = combine_bench_runs([a, b])
    assert s["completed"] == 3 and s["runs"] == 2
    assert s["duration_s"] == 10.0                               # the longer run ends the job
    assert s["total_output_tokens"] == 43 and s["total_input_tokens"] == 250
    assert s["output_throughput"] == pytest.approx(4.3)
    assert s["request_throughput"] == pytest.approx(0.3)
    assert s["mean_ttft_ms"] == pytest.approx(400.0)
    assert s["median_ttft_ms"] == pytest.approx(400.0)
    # linear interpolation between 400 and 600 ms at 99% of the way from rank 1 to rank 2
    assert s["p99_ttft_ms"] == pytest.approx(400 + 0.98 * 200)
    assert s["mean_tpot_ms"] == pytest.approx(400 / 3)
    assert s["median_tpot_ms"] == pytest.approx(100.0)


def test_combine_single_run_equals_that_run():
    a = _run(4.0, [(10, 5, 0.1, 0.5), (10, 5, 0.3, 0.7)])
    s = combine_bench_runs([a])
    assert s["output_throughput"] == pytest.approx(10 / 4.0)
    assert s["mean_tpot_ms"] == pytest.approx(100.0)


def test_combine_refuses_nothing():
    with pytest.raises(LabError):
        combine_bench_runs([])
    with pytest.raises(LabError, match="not positive"):
        combine_bench_runs([_run(0.0, [(1, 2, 0.1, 0.2)])])


def test_metric_deltas_sum_over_replicas():
    before = [{"vllm:generation_tokens_total": 10.0}, {"vllm:generation_tokens_total": 0.0}]
    after = [{"vllm:generation_tokens_total": 110.0}, {"vllm:generation_tokens_total": 50.0}]
    assert sum_metric_deltas(before, after, ["vllm:generation_tokens"]) == {"vllm:generation_tokens": 150.0}
    with pytest.raises(LabError):
        sum_metric_deltas(before, after[:1], ["vllm:generation_tokens"])


# --------------------------------------------------------------------------- KV capacity with sharded heads
def _raw(model_id):
    return json.loads((MODELS / f"{model_id}.json").read_text())


@pytest.mark.parametrize("model_id", ["qwen3-32b", "qwen3-30b-a3b"])
def test_logged_capacity_shards_kv_heads(model_id):
    cfg = _raw(model_id)
    layers, kv_heads, head_dim = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    available_gib = 40.0
    spec = load_model_spec(model_id)
    for tp in (1, 2):
        # K and V, bf16 (2 bytes), 16-token blocks, KV heads split over tp ranks
        block_bytes = layers * (kv_heads // tp) * head_dim * 2 * 2 * 16
        blocks = int(available_gib * 2**30) // block_bytes
        got = logged_capacity(spec, available_gib, tp=tp, max_model_len=4096, max_num_batched_tokens=8192)
        assert got["num_gpu_blocks"] == blocks
        assert got["kv_cache_tokens"] == blocks * 16          # 4096 is a whole number of blocks
        assert got["max_concurrency"] == pytest.approx(blocks / (4096 // 16))


def test_logged_capacity_reproduces_recorded_tp2_log():
    # labs/results/step_timing/qwen3-32b-tp2.json: H200 x2, vLLM 0.26.0 logged
    # "Available KV cache memory: 93.47 GiB" and "GPU KV cache size: 765,696 tokens".
    doc = json.loads((STEP_TIMING / "qwen3-32b-tp2.json").read_text())
    log = doc["cases"][0]["log"]
    assert "Available KV cache memory: 93.47 GiB" in log and "GPU KV cache size: 765,696 tokens" in log
    got = logged_capacity(load_model_spec("qwen3-32b"), 93.47, tp=2, max_model_len=16448,
                          max_num_batched_tokens=16384)
    assert got["kv_cache_tokens"] == 765_696


# --------------------------------------------------------------------------- predictions
def _setup(**kw):
    base = dict(gpu="H200", max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=8192,
                gpu_memory_utilization=0.9, enforce_eager=False, input_len=512, output_len=128, num_prompts=256)
    return ParallelSetup(**dict(base, **kw))


@pytest.fixture(scope="module")
def coeffs():
    from servebook.perf.model import calibrated_coefficients

    return calibrated_coefficients("H200")[0]


def test_predicted_configs_relations(coeffs):
    cfg = _raw("qwen3-32b")
    spec = load_model_spec("qwen3-32b")
    rows = {r["config"]: r for r in predicted_configs(spec, _setup(), coeffs)}
    one, two, dp = rows["TP=1"], rows["TP=2"], rows["DP=2"]
    per_token_tp1 = cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2 * 2
    assert one["kv_bytes_per_token"] == per_token_tp1
    assert two["kv_bytes_per_token"] == per_token_tp1 // 2
    for r in rows.values():                                    # blocks carved from the budget by hand
        assert r["num_gpu_blocks"] == r["available_kv_bytes"] // (r["kv_bytes_per_token"] * 16)
    # Replicas are copies of TP=1: same per-GPU figures, twice the tokens in all.
    assert dp["num_gpu_blocks"] == one["num_gpu_blocks"]
    assert dp["tokens_in_kv_all_replicas"] == 2 * one["kv_cache_tokens"]
    assert dp["output_tokens_per_s"] == pytest.approx(2 * one["output_tokens_per_s"], rel=1e-9)
    # TP=2 halves the weights per GPU (the rotary caches, whole on every rank, excepted): more KV
    # budget per GPU than TP=1, and each token costs half.
    buffers_gib = spec.buffer_bytes / 2**30
    assert buffers_gib > 0
    assert two["weights_gib"] - buffers_gib == pytest.approx((one["weights_gib"] - buffers_gib) / 2, rel=1e-6)
    assert two["available_kv_bytes"] > one["available_kv_bytes"]
    assert two["kv_cache_tokens"] > 2 * one["kv_cache_tokens"]
    assert one["allreduce_s"] == 0 == dp["allreduce_s"] and two["allreduce_s"] > 0
    assert two["decode_step_s"] < one["decode_step_s"]


def test_allreduce_term_by_hand(coeffs):
    # The model's all-reduce for one TP=2 decode step: 2 per layer, each latency + 2(tp-1)/tp x bytes / link,
    # bytes = batch x hidden x 2 (bf16).
    from servebook.perf.gpu import gpu_numbers

    cfg = _raw("qwen3-32b")
    spec = load_model_spec("qwen3-32b")
    one = json.loads((STEP_TIMING / "qwen3-32b.json").read_text())
    two = json.loads((STEP_TIMING / "qwen3-32b-tp2.json").read_text())
    rows = allreduce_rows(spec, "H200", coeffs, one, two)
    assert {(r["batch"], r["prompt_tokens"]) for r in rows} >= {(1, 512), (256, 512)}
    link = gpu_numbers("H200").link_bytes_per_s_each_way * coeffs.link_eff
    for r in rows:
        each = coeffs.allreduce_latency_s + 2 * (2 - 1) / 2 * r["batch"] * cfg["hidden_size"] * 2 / link
        assert r["model_allreduce_s"] == pytest.approx(2 * cfg["num_hidden_layers"] * each, rel=1e-9)
        assert r["halving_excess_s"] == pytest.approx(r["tp2_step_s"] - r["tp1_step_s"] / 2)


def test_allreduce_rows_need_shared_points(coeffs):
    from servebook.errors import ServebookError

    one = {"cases": [{"result": {"decode": [{"batch": 1, "prompt_tokens": 512, "mean_context_tokens": 528.5,
                                             "step_s": 0.02}]}}]}
    two = {"cases": [{"result": {"decode": [{"batch": 4, "prompt_tokens": 512, "mean_context_tokens": 528.5,
                                             "step_s": 0.01}]}}]}
    with pytest.raises(ServebookError, match="share no"):
        allreduce_rows(load_model_spec("qwen3-32b"), "H200", coeffs, one, two)
    assert math.isfinite(allreduce_rows(load_model_spec("qwen3-32b"), "H200", coeffs, one, one)[0]["halving_excess_s"])


# --------------------------------------------------------------------------- measured vs predicted rows
def _point(config, tp, gib, extra=None):
    run = _run(4.0, [(512, 11, 0.05, 0.05 + 10 * 0.02), (512, 11, 0.15, 0.15 + 10 * 0.04)])
    args = dict({"tensor_parallel_size": tp} if tp > 1 else {}, **(extra or {}))
    return {"config": config, "engine_args": args,
            "startup": [{"available_kv_cache_gib": gib, "kv_cache_tokens": 123}],
            "light": {"summary": combine_bench_runs([run])},
            "saturated": {"summary": combine_bench_runs([run]), "runs": [run]},
            "metrics_delta": {"vllm:inter_token_latency_seconds_sum": 3.0,
                              "vllm:inter_token_latency_seconds_count": 200.0, "vllm:num_preemptions": 2.0}}


def test_comparison_rows_by_hand(coeffs):
    from servebook.lab.analyses.lab9_parallel import comparison_rows

    spec = load_model_spec("qwen3-32b")
    cfg = _raw("qwen3-32b")
    setup = _setup()
    predicted = predicted_configs(spec, setup, coeffs)
    measurements = {"workload": {"max_model_len": 4096, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
                    "predicted": {"qwen3-32b": predicted},
                    "points": [_point("TP=1", 1, 40.0), _point("TP=2+EP", 2, 40.0, {"enable_expert_parallel": True}),
                               {"config": "DP=2", "error": "EngineStartError: out of memory"}]}
    rows, notes = comparison_rows(measurements, spec)
    assert [r["config"] for r in rows] == ["TP=1", "TP=2+EP"]
    assert notes == ["DP=2: not measured: EngineStartError: out of memory"]
    for r, tp in zip(rows, (1, 2)):
        block_bytes = cfg["num_hidden_layers"] * (cfg["num_key_value_heads"] // tp) * cfg["head_dim"] * 2 * 2 * 16
        assert r["tokens from log GiB"] == (40 * 2**30 // block_bytes) * 16
        assert r["KV tokens log"] == 123 and r["preemptions"] == 2.0
        assert r["engine ITL ms (saturated)"] == 15.0                  # 3 s over 200 gaps
        assert r["TPOT alone ms"] == 30.0                                # median of 20 and 40 ms
        assert r["out tok/s"] == round(22 / 4.0)
        assert r["engine tok/s (saturated)"] is None                     # preempted: not all decoded at once
    calm = _point("TP=1", 1, 40.0)
    calm["metrics_delta"]["vllm:num_preemptions"] = 0.0
    [row], _ = comparison_rows(dict(measurements, points=[calm]), spec)
    assert row["engine tok/s (saturated)"] == round(2 / 0.015)          # 2 requests, 15 ms between tokens
    assert row["client TPOT ms (saturated)"] == 30.0                    # mean of 20 and 40 ms
    # the EP point is compared with the TP=2 prediction
    assert rows[1]["tokens pred"] == predicted[1]["kv_cache_tokens"] and predicted[1]["config"] == "TP=2"
    with pytest.raises(LabError, match="not qwen3-30b-a3b"):
        comparison_rows(dict(measurements, predicted={"a": predicted, "b": predicted}),
                        load_model_spec("qwen3-30b-a3b"))


# --------------------------------------------------------------------------- replicas (fake servers, no engine)
class _FakeServer:
    started: list = []

    def __init__(self, model, engine_args, *, env, port, startup_timeout_s, lock):
        self.model, self.engine_args, self.env, self.port, self.lock = model, engine_args, env, port, lock
        self.stopped = False

    def start(self):
        if self.env.get("FAIL"):
            raise RuntimeError(f"replica on GPU {self.env['CUDA_VISIBLE_DEVICES']} failed")
        _FakeServer.started.append(self)

    def stop(self):
        self.stopped = True


@pytest.fixture
def fake_servers(monkeypatch):
    from contextlib import nullcontext

    import servebook.lab.harness.server as server

    _FakeServer.started = []
    made = []

    def factory(*a, **kw):
        made.append(_FakeServer(*a, **kw))
        return made[-1]

    monkeypatch.setattr(server, "VllmServer", factory)
    monkeypatch.setattr(server, "timed_engine_lock", nullcontext)
    return made


def test_running_replicas_start_pinned_servers_and_stop_them(fake_servers):
    from servebook.lab.analyses.lab9_parallel import running_replicas

    envs = replica_envs({}, [[0], [1]])
    with running_replicas("m", {"max_model_len": 64}, envs) as servers:
        assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0", "1"]
        assert len({s.port for s in servers}) == 2 and not any(s.lock for s in servers)
        assert not any(s.stopped for s in servers)
    assert all(s.stopped for s in fake_servers)


def test_running_replicas_stop_all_when_one_fails(fake_servers):
    from servebook.lab.analyses.lab9_parallel import running_replicas

    envs = replica_envs({}, [[0], [1]])
    envs[1]["FAIL"] = "1"
    with pytest.raises(RuntimeError, match="GPU 1 failed"):
        with running_replicas("m", {}, envs):
            pytest.fail("the block must not run when a replica failed to start")
    assert len(fake_servers) == 2 and all(s.stopped for s in fake_servers)


def test_bench_replicas_split_the_load_and_run_together(monkeypatch):
    import threading

    import servebook.lab.harness.bench as bench
    from servebook.lab.analyses.lab9_parallel import bench_replicas

    barrier = threading.Barrier(2, timeout=10)   # breaks unless both benchmarks are in flight at once
    calls = []

    def fake_run_bench(server, *, num_prompts, seed, **kw):
        calls.append((server, num_prompts, seed, kw))
        barrier.wait()
        return {"server": server, "n": num_prompts}

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    out = bench_replicas(["s0", "s1"], num_prompts=5, input_len=8, output_len=4, seed=7)
    assert [r["server"] for r in out] == ["s0", "s1"] and [r["n"] for r in out] == [3, 2]
    assert sorted((c[0], c[2]) for c in calls) == [("s0", 7), ("s1", 8)]
    assert all(c[3] == {"input_len": 8, "output_len": 4} for c in calls)


# --------------------------------------------------------------------------- clients per server (issue 26)
def test_client_loads_split_each_servers_share_and_give_every_client_its_seed():
    # 256 requests, 2 servers, 6 clients: 128 a server = 22 + 22 + 21 + 21 + 21 + 21; seeds 0-5 and 6-11
    loads = lab9.client_loads(256, 2, 6)
    assert loads[0] == [(0, 22), (1, 22), (2, 21), (3, 21), (4, 21), (5, 21)]
    assert loads[1] == [(6, 22), (7, 22), (8, 21), (9, 21), (10, 21), (11, 21)]
    # one client per server keeps the seeds the recorded runs used (replica i: seed + i)
    assert lab9.client_loads(256, 2, 1, seed=0) == [[(0, 128)], [(1, 128)]]
    with pytest.raises(LabError, match="at least one of each"):
        lab9.client_loads(8, 1, 0)
    with pytest.raises(LabError, match="at least one request"):
        lab9.client_loads(3, 1, 4)          # a client without a request


def test_bench_replicas_runs_every_client_of_every_server_at_once(monkeypatch):
    import threading

    import servebook.lab.harness.bench as bench

    barrier = threading.Barrier(4, timeout=10)   # breaks unless all four clients are in flight together
    calls = []

    def fake_run_bench(server, *, num_prompts, seed, **kw):
        calls.append((server, num_prompts, seed))
        barrier.wait()
        return {"requests": [None] * num_prompts}

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    out = lab9.bench_replicas(["s0", "s1"], num_prompts=10, clients_per_server=2, seed=3, input_len=8, output_len=4)
    assert [(r["server_index"], r["client_index"], len(r["requests"])) for r in out] == \
        [(0, 0, 3), (0, 1, 2), (1, 0, 3), (1, 1, 2)]
    assert sorted(calls) == [("s0", 2, 4), ("s0", 3, 3), ("s1", 2, 6), ("s1", 3, 5)]


def _timed_run(first_start, duration, requests):
    run = _run(duration, requests)
    run["first_start_s"] = first_start
    return run


def test_combine_clients_over_the_span_from_first_start_to_last_end():
    # client a sends at t=100 s for 10 s, client b at t=102 s for 10 s: the load spans 100-112 s
    a = _timed_run(100.0, 10.0, [(100, 11, 0.2, 1.2)])
    b = _timed_run(102.0, 10.0, [(100, 13, 0.2, 2.6)])
    s = lab9.combine_bench_runs([a, b])
    assert s["duration_s"] == pytest.approx(12.0)
    assert s["output_throughput"] == pytest.approx(24 / 12.0)
    assert s["request_throughput"] == pytest.approx(2 / 12.0)
    assert s["mean_tpot_ms"] == pytest.approx((100 + 200) / 2)    # 1.0 s / 10 and 2.4 s / 12
    # a run recorded without a start time (the 2026-11-30 files): the longest duration, as before
    del b["first_start_s"]
    assert lab9.combine_bench_runs([a, b])["duration_s"] == 10.0


def _sat_point(runs, itl_sum, itl_count, preemptions=0):
    return {"saturated": {"runs": runs}, "metrics_delta": {
        "vllm:inter_token_latency_seconds_sum": itl_sum, "vllm:inter_token_latency_seconds_count": itl_count,
        "vllm:num_preemptions": preemptions}}


def _client(server, n, tpot_s, output_len=11):
    # n requests of output_len tokens, the first at 0.5 s, then one every tpot_s
    return {"server_index": server, "requests": [
        {"output_len": output_len, "ttft_s": 0.5, "latency_s": 0.5 + (output_len - 1) * tpot_s}] * n}


def test_rate_check_agrees_within_ten_percent():
    # 2 servers x 2 clients x 3 requests = 12 requests; engine: 1.2 s of gaps over 120 -> 10 ms ITL,
    # so 12 / 0.010 = 1,200 tokens/s
    runs = [_client(0, 3, 0.0105), _client(0, 3, 0.0105), _client(1, 3, 0.0105), _client(1, 3, 0.0105)]
    check = lab9.rate_check(_sat_point(runs, 1.2, 120), max_num_seqs=6)
    assert check["engine_decode_tok_s"] == pytest.approx(1200)
    assert check["client_decode_tok_s"] == pytest.approx(12 / 0.0105)          # 1,142.9 tokens/s
    assert check["client_over_engine"] == pytest.approx(0.0100 / 0.0105)       # 0.952: within 10%
    assert check["agree"] is True and (check["servers"], check["clients"]) == (2, 4)
    # the clients twice as slow per token as the engine: half the rate, well outside 10%
    slow = [_client(0, 3, 0.020), _client(1, 3, 0.020)]
    check = lab9.rate_check(_sat_point(slow, 0.6, 60), max_num_seqs=6)
    assert check["client_over_engine"] == pytest.approx(0.5) and check["agree"] is False
    # just past the line: engine 10 ms, clients 11.2 ms -> 0.893
    assert lab9.rate_check(_sat_point([_client(0, 3, 0.0112)], 0.3, 30), max_num_seqs=6)["agree"] is False


def test_rate_check_needs_every_request_of_a_server_decoding_at_once():
    # 2 clients x 3 requests on one server with max_num_seqs 5: 6 > 5, some waited (each client alone fits)
    runs = [_client(0, 3, 0.01), _client(0, 3, 0.01)]
    check = lab9.rate_check(_sat_point(runs, 0.6, 60), max_num_seqs=5)
    assert check["engine_decode_tok_s"] is None and check["client_decode_tok_s"] is None
    assert check["agree"] is None
    assert lab9.rate_check(_sat_point(runs, 0.6, 60, preemptions=1), max_num_seqs=8)["agree"] is None


def test_rate_verdict_says_not_recorded_for_points_saved_before_the_check():
    assert lab9.rate_verdict({"saturated": {"runs": []}}) == "not recorded"
    point = _sat_point([_client(0, 3, 0.020)], 0.3, 30)
    point["saturated"]["rate_check"] = lab9.rate_check(point, max_num_seqs=6)
    assert lab9.rate_verdict(point) == "differ: client 150 vs engine 300 tok/s (0.50; +-10%)"


# --------------------------------------------------------------------------- distinct prompts across clients
QWEN3 = {"vocab_size": 151936, "num_special_ids": 3, "input_len": 512, "output_len": 128}   # tiny_model's tokenizer


def test_prompt_starts_by_hand():
    # vLLM draws input lengths, output lengths, then offsets from one default_rng(seed)
    import numpy as np

    rng = np.random.default_rng(5)
    rng.integers(511, 512, size=4)
    rng.integers(128, 129, size=4)
    offsets = rng.integers(0, 151936, size=4)
    expected = [(int(o) + i) % 151933 for i, o in enumerate(offsets)]
    assert random_prompts.prompt_starts(5, 4, **QWEN3) == expected
    # prompt i starts i positions after its offset, wrapped around the allowed ids
    small = random_prompts.prompt_starts(0, 3, vocab_size=10, num_special_ids=3, input_len=4, output_len=1)
    rng = np.random.default_rng(0)
    rng.integers(3, 4, size=3)
    rng.integers(1, 2, size=3)
    assert small == [(int(o) + i) % 7 for i, o in enumerate(rng.integers(0, 10, size=3))]


def test_repeated_starts_finds_a_shared_seed():
    assert random_prompts.repeated_starts([(3, 5), (3, 5)], **QWEN3) == {
        s: 2 for s in random_prompts.prompt_starts(3, 5, **QWEN3)}


@pytest.mark.parametrize("servers", [1, 2])
def test_the_gpu_profiles_clients_send_no_prompt_twice(servers):
    from servebook.lab.harness.profiles import LAB_PARAMS

    w = LAB_PARAMS["gpu"]["l9"]
    loads = [load for per_server in lab9.client_loads(w["num_prompts"], servers, w["bench_clients"])
             for load in per_server]
    assert len({seed for seed, _ in loads}) == len(loads) == servers * w["bench_clients"]
    # the single-stream load (seed 100, replica 0) goes first: its prompts must not be hits either
    loads.append((100, w["light_prompts"]))
    dataset = dict(QWEN3, input_len=w["input_len"], output_len=w["output_len"])
    assert random_prompts.repeated_starts(loads, **dataset) == {}


def test_prefix_hits_from_the_metrics_counters():
    point = _sat_point([], 0, 0)
    assert lab9.metrics_prefix_hit_pct(point) is None                    # counters not scraped (2026-11-30)
    point["metrics_delta"].update({"vllm:prefix_cache_queries": 131072.0, "vllm:prefix_cache_hits": 512.0})
    assert lab9.metrics_prefix_hit_pct(point) == pytest.approx(100 * 512 / 131072)     # 0.39%
    point["metrics_delta"]["vllm:prefix_cache_queries"] = 0.0
    assert lab9.metrics_prefix_hit_pct(point) is None
