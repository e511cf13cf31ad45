"""servebook.vllm_rules: one home for each vLLM rule and default the calculators use.

The values themselves are checked against the installed vLLM by the drift test
(tests/engine/test_cpu_capacity.py::test_defaults_servebook_uses_are_the_pinned_release_defaults).
Here: that every command gives one message for one mistake, that no other module keeps
its own copy, and the rules' arithmetic on hand-worked cases.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from servebook.cli import main
from servebook.errors import ServebookError
from servebook.model_spec import AttentionLayer
from servebook.vllm_rules import (
    check_tp,
    cudagraph_max_tokens,
    decode_unsettled_tokens,
    in_flight_tokens,
    kv_heads_per_gpu,
    sliding_window_hold_tokens,
    sliding_window_running_blocks,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "servebook"

COMMANDS = {
    "plan": ["plan", "--config", "llama-3.1-8b"],
    "fleet": ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--requests", "100",
              "--input-tokens", "200", "--output-tokens", "50"],
    "step": ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "decode", "--batch", "1",
             "--context", "10"],
    "simulate": ["simulate", "--requests", "5", "--config", "llama-3.1-8b", "--gpu", "h200"],
}


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    prefix = f"servebook {argv[0]}: error: "
    assert err.startswith(prefix), err
    return err[len(prefix):]


@pytest.mark.parametrize("tp", ["3", "0", "-2"])
def test_plan_fleet_step_simulate_give_one_message_for_one_tp_mistake(capsys, tp):
    messages = {name: _error(capsys, argv + ["--tp", tp]) for name, argv in COMMANDS.items()}
    assert len(set(messages.values())) == 1, messages
    message = messages["plan"]
    assert "--tp" in message and tp in message
    if tp == "3":  # Llama 3.1 8B: 32 query heads, 8 KV heads -> powers of two up to 32 (8 < tp replicates)
        assert message.endswith("use one of [1, 2, 4, 8, 16, 32] for --tp")


def test_kv_heads_per_gpu_shards_then_replicates():
    layer = AttentionLayer(kind="full", num_kv_heads=8, head_dim=128, v_head_dim=128)
    assert [kv_heads_per_gpu(layer, tp) for tp in (1, 2, 8, 16, 32)] == [8, 4, 1, 1, 1]
    assert kv_heads_per_gpu(AttentionLayer(kind="mla", num_kv_heads=1, head_dim=576, v_head_dim=0), 8) == 1


def test_check_tp_names_the_kv_heads_when_only_they_do_not_split():
    from servebook.hf_config import load_model_spec

    with pytest.raises(ServebookError, match="KV heads"):
        # 24 query heads divide by 6; 8 KV heads neither divide by 6 nor divide 6
        check_tp(load_model_spec({**_llama_config(), "num_attention_heads": 24, "head_dim": 128}), 6)


def _llama_config() -> dict:
    import json

    return json.loads((SRC / "data" / "models" / "llama-3.1-8b.json").read_text())


def test_sliding_window_hold_and_in_flight_tokens():
    # window 4096, async scheduling on, 8192 tokens per step: 4095 + 2 x 8192
    assert sliding_window_hold_tokens(4096, in_flight_tokens(8192, True)) == 4095 + 16384
    assert in_flight_tokens(2048, False) == 2048


def _live_blocks_while_decoding(window: int, block_size: int, unsettled: int, tokens: int) -> int:
    """Step a request through decode the way vLLM 0.27.1's allocate_slots does, and return its peak.

    At each step with processed prefix p: remove_skipped_blocks frees the whole blocks below
    p - window + 1; allocate_new_blocks extends the table to cdiv(p + unsettled, block_size).
    """
    table = 0      # blocks in the request's table (freed ones stay as null placeholders)
    freed = 0
    peak = 0
    for p in range(0, tokens - unsettled + 1):
        freed = max(freed, max(0, p - window + 1) // block_size)
        table = max(table, -(-(p + unsettled) // block_size))
        peak = max(peak, table - freed)
    return peak


@pytest.mark.parametrize("window, block, unsettled", [(1024, 16, 2), (1024, 16, 1), (4096, 16, 2), (17, 16, 1),
                                                      (128, 16, 2), (256, 128, 1), (100, 32, 3)])
def test_sliding_window_running_blocks_is_the_peak_of_a_stepped_request(window, block, unsettled):
    assert sliding_window_running_blocks(window, block, unsettled) == \
        _live_blocks_while_decoding(window, block, unsettled, tokens=window + 5 * block)


def test_running_hold_is_window_over_block_plus_one_not_the_booked_window_plus_in_flight():
    # Gemma 3: window 1024, 16-token blocks, async scheduling (one step in flight + the new token).
    assert decode_unsettled_tokens(True) == 2 and decode_unsettled_tokens(False) == 1
    assert decode_unsettled_tokens(True, query_tokens=4) == 8      # 3 speculative tokens per step
    assert sliding_window_running_blocks(1024, 16, 2) == 1024 // 16 + 1 == 65
    booked = -(-sliding_window_hold_tokens(1024, in_flight_tokens(8192, True)) // 16) + 1
    assert booked == 1089 > 16 * 65


@pytest.mark.parametrize("bad", [0, -1, 1.5, None])
def test_sliding_window_running_blocks_refuses_non_positive_input(bad):
    with pytest.raises(ServebookError, match="positive number of tokens"):
        sliding_window_running_blocks(1024, 16, bad)


def test_cudagraph_capture_size():
    assert cudagraph_max_tokens(1024, 8192) == 512        # capped
    assert cudagraph_max_tokens(128, 8192) == 256         # 2 x max_num_seqs
    assert cudagraph_max_tokens(128, 8192, num_speculative_tokens=1) == 512
    assert cudagraph_max_tokens(1024, 300) == 300         # never above the token budget
    assert cudagraph_max_tokens(1024, 8192, enforce_eager=True) == 0


HOMED = {"KV_DTYPE_BYTES", "DEFAULT_GPU_MEMORY_UTILIZATION", "CUDA_DEFAULT_BLOCK_SIZE", "CPU_DEFAULT_BLOCK_SIZE",
         "DEFAULT_CUDAGRAPH_MAX_TOKENS", "LARGE_GPU_BYTES", "BLOCK_TOKENS", "SLIDING_KERNEL_BLOCK_SIZE",
         "LARGE_GPU_BATCH_DEFAULTS", "SMALL_GPU_BATCH_DEFAULTS", "CPU_BATCH_DEFAULTS", "USAGE_CONTEXTS",
         "PINNED_VLLM"}
RULE_FUNCTIONS = {"check_tp", "check_tensor_parallel", "tp_splits_heads", "kv_heads_per_gpu", "vllm_batch_defaults",
                  "default_block_size", "default_async_scheduling", "cudagraph_max_tokens", "check_utilization",
                  "check_batch_budget", "check_long_prefill_threshold"}


@pytest.mark.parametrize("path", [p for p in sorted(SRC.rglob("*.py")) if "vllm_rules" not in p.parts],
                         ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_keeps_its_own_copy_of_a_vllm_rule(path):
    tree = ast.parse(path.read_text())
    assigned = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    if path.parent.name == "drills":
        defined -= {"kv_heads_per_gpu", "cudagraph_max_tokens"}  # drill answers by model id, calling the rules
    assert not (assigned & HOMED) and not (defined & RULE_FUNCTIONS), path
