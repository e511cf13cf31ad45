"""``servebook plan``: JSON fields against hand arithmetic, the table, the serve command, bad input."""
from __future__ import annotations

import json
import shlex

import pytest

from servebook.cli import main

GIB = 2**30


def plan_json(capsys, *args):
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def plan_error(capsys, *args) -> str:
    assert main(["plan", *args]) == 2
    return capsys.readouterr().err


def test_llama_8b_from_a_logged_budget_by_hand(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "100", "--max-model-len", "8192")
    # 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131072 B/token; a 16-token block of all layers = 2 MiB.
    assert d["kv_bytes_per_token"] == 131072
    assert d["num_gpu_blocks"] == 100 * GIB // (16 * 131072) == 51200
    assert d["max_concurrency"] == 51200 / (8192 // 16) == 100.0
    assert d["kv_cache_tokens"] == 819200
    assert d["padding_layers"] == 0
    assert d["available_kv_gib"] == 100.0
    # 8.03 B parameters in bf16 (Hub figure) ~ 14.96 GiB
    assert d["weights_gib"] == pytest.approx(8.03e9 * 2 / GIB, rel=0.01)
    # Full attention: running requests of 8192 tokens hold 512 blocks each, as booked; vLLM keeps one
    # block (its null block) out of the pool: 51199 // 512 = 99 run at once, and 85% of 99 is 84.15.
    assert d["request_tokens"] == 8192
    assert d["running_blocks_per_request"] == d["admission_blocks_per_request"] == 512
    assert d["usable_gpu_blocks"] == 51199
    assert d["running_concurrency"] == 99
    assert d["recommended_max_num_seqs"] == 84
    # H200 is the default GPU: vllm serve defaults there are 8192 tokens / 1024 sequences.
    assert d["max_num_batched_tokens"] == 8192


def test_recommended_max_num_seqs_never_exceeds_what_the_cache_holds(capsys):
    # 1.2 full-length requests fit: 85% -> 1, the run-time figure is 1.
    one_request = 128 * 1024 * 8192 / GIB  # GiB for one 8192-token request
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", f"{1.2 * one_request}", "--max-model-len", "8192")
    assert d["max_concurrency"] == pytest.approx(1.2, abs=0.01)
    assert d["recommended_max_num_seqs"] == 1


def test_recommendation_is_capped_at_vllm_default_max_num_seqs(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "120", "--max-model-len", "128")
    assert d["max_concurrency"] > 1024 / 0.85
    assert d["recommended_max_num_seqs"] == 1024


def test_fp8_doubles_the_blocks(capsys):
    bf16 = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "40", "--max-model-len", "4096")
    fp8 = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "40", "--max-model-len", "4096",
                    "--kv-cache-dtype", "fp8")
    assert fp8["kv_bytes_per_token"] * 2 == bf16["kv_bytes_per_token"]
    assert fp8["num_gpu_blocks"] == 2 * bf16["num_gpu_blocks"]
    assert "--kv-cache-dtype fp8" in fp8["vllm_serve_command"]


def test_gemma3_27b_reports_its_padding_layers(capsys):
    d = plan_json(capsys, "--config", "gemma-3-27b", "--available-kv-gib", "40", "--max-model-len", "32768")
    assert d["padding_layers"] == 8  # 52 sliding layers padded to 6 groups of 10
    assert d["padding_waste_pct"] == 15.38


def test_budget_path_on_h200_is_positive_and_consistent(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--gpu", "H200", "--max-model-len", "8192")
    claims = d["weights_gib"] + d["activation_gib"] + d["non_torch_gib"] + d["cudagraph_gib"]
    assert d["available_kv_gib"] == pytest.approx(d["gpu_memory_gib"] * 0.92 - claims, abs=1e-6)
    assert 0 < d["available_kv_gib"] < d["gpu_memory_gib"]


def test_smaller_gpus_get_the_smaller_batch_default(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--gpu", "L40S", "--max-model-len", "4096")
    assert d["max_num_batched_tokens"] == 2048  # < 70 GiB: vllm serve default 2048


def test_serve_command_uses_real_flags_and_the_hub_repo(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "50", "--max-model-len", "8192",
                  "--tp", "2", "--block-size", "32", "--gpu-memory-utilization", "0.9")
    argv = shlex.split(d["vllm_serve_command"])
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {
        "--tensor-parallel-size": "2", "--max-model-len": "8192", "--gpu-memory-utilization": "0.9",
        "--max-num-batched-tokens": "8192", "--max-num-seqs": str(d["recommended_max_num_seqs"]),
        "--block-size": "32",
    }


def test_table_shows_the_four_claims_and_the_flags(capsys):
    assert main(["plan", "--config", "llama-3.1-8b", "--gpu", "H200", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    for label in ("weights", "peak activation", "non-torch", "CUDA graphs", "available KV cache",
                  "admission ceiling (logged)", "running at once", "--max-num-seqs", "vllm serve"):
        assert label in out


def test_model_that_does_not_fit_names_the_tp_to_use(capsys):
    err = plan_error(capsys, "--config", "llama-3.1-70b", "--gpu", "H100", "--max-model-len", "8192")
    # 70.6 B params x 2 bytes = 131 GiB > 80 GiB x 0.92; two H100s hold 65.7 GiB each.
    assert "--tp 2" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpu-memory-utilization", "0"], "(0, 1]"),
        (["--gpu-memory-utilization", "1.5"], "(0, 1]"),
        (["--block-size", "24"], "multiple of 16"),
        (["--max-model-len", "-5"], "must be >= 1"),
        (["--max-model-len", "999999999"], "max_position_embeddings"),
        (["--max-num-batched-tokens", "0"], "must be >= 1"),
        (["--tp", "3"], "use one of"),
        (["--available-kv-gib", "-1"], "positive number of GiB"),
        (["--gpu", "Z9000"], "Z9000"),
    ],
)
def test_out_of_range_input_names_what_to_change(capsys, args, needle):
    base = ["--config", "llama-3.1-8b"]
    if "--gpu" not in args and "--available-kv-gib" not in args:
        base += ["--available-kv-gib", "50"]
    err = plan_error(capsys, *base, *args)
    assert needle in err and "Traceback" not in err


def test_context_too_long_for_the_budget_is_a_clear_error(capsys):
    err = plan_error(capsys, "--config", "llama-3.1-8b", "--available-kv-gib", "1", "--max-model-len", "131072")
    assert "longest context that fits is" in err


def test_config_path_is_accepted(capsys, tmp_path):
    from servebook.hf_config import load_reference_config

    (tmp_path / "config.json").write_text(json.dumps(load_reference_config("qwen3-32b")))
    d = plan_json(capsys, "--config", str(tmp_path / "config.json"), "--available-kv-gib", "30", "--max-model-len", "4096")
    assert d["kv_bytes_per_token"] == 64 * 2 * 8 * 128 * 2  # head_dim 128 from the config, not 5120/64
    assert shlex.split(d["vllm_serve_command"])[2] == str(tmp_path)


def test_unknown_gpu_lists_the_known_names(capsys):
    err = plan_error(capsys, "--config", "llama-3.1-8b", "--gpu", "Z9000")
    assert "H100-SXM-80GB" in err and "H200-SXM-141GB" in err


def test_malformed_config_names_every_missing_field(capsys, tmp_path):
    from servebook.hf_config import load_reference_config

    cfg = load_reference_config("llama-3.1-8b")
    for key in ("num_hidden_layers", "intermediate_size", "vocab_size"):
        del cfg[key]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    err = plan_error(capsys, "--config", str(tmp_path / "config.json"))
    for key in ("num_hidden_layers", "intermediate_size", "vocab_size"):
        assert repr(key) in err, key
    assert "Traceback" not in err


def test_not_json_config_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{oops")
    err = plan_error(capsys, "--config", str(tmp_path / "config.json"))
    assert "not valid JSON" in err and "Traceback" not in err


def test_a_shipped_reference_file_is_served_by_its_hub_repo(capsys):
    from pathlib import Path

    import servebook

    path = Path(servebook.__file__).parent / "data" / "models" / "qwen3-32b.json"
    d = plan_json(capsys, "--config", str(path), "--available-kv-gib", "30", "--max-model-len", "4096")
    assert shlex.split(d["vllm_serve_command"])[2] == "Qwen/Qwen3-32B"


def test_the_budget_says_what_its_coefficients_rest_on(capsys):
    d = plan_json(capsys, "--config", "llama-3.1-8b", "--max-model-len", "8192")
    assert d["coefficients_status"].startswith("fitted on ") and "H200" in d["coefficients_status"]
    assert "vLLM 0.26.0" in d["coefficients_status"]
    for key in ("kv_bytes_per_token", "num_gpu_blocks", "kv_cache_tokens", "max_concurrency", "padding_layers",
                "weights_gib", "available_kv_gib", "recommended_max_num_seqs", "vllm_serve_command"):
        assert key in d, key
    assert main(["plan", "--config", "llama-3.1-70b", "--gpu", "H100", "--tp", "2", "--max-model-len", "8192"]) == 0
    out = capsys.readouterr().out
    from servebook.memory import load_coefficients

    assert "fitted on " in out
    # The TP>1 non-torch figure is flagged as a guess exactly when no TP>1 start-up was fitted.
    assert ("prior guess: no TP>1 start-up recorded" in out) == load_coefficients().tp_gt1_non_torch_is_prior


# ---- the two concurrency figures (issue 20): admission bound vs requests that run at once -------------

def _gemma3_27b_by_hand():
    """Gemma 3 27B's layer counts and KV shape, read from its published config.json (not from servebook)."""
    from servebook.shipped import MODELS_DIR

    cfg = json.loads((MODELS_DIR / "gemma-3-27b.json").read_text())
    text = cfg.get("text_config", cfg)
    n = text["num_hidden_layers"]
    pattern = text.get("sliding_window_pattern", 6)          # every 6th layer is global
    full = sum(1 for i in range(n) if (i + 1) % pattern == 0)
    bytes_per_layer_token = 2 * text["num_key_value_heads"] * text["head_dim"] * 2   # K+V, bf16
    return n - full, full, text["sliding_window"], bytes_per_layer_token


def test_gemma3_27b_running_concurrency_by_hand(capsys):
    sliding, full, window, layer_token_bytes = _gemma3_27b_by_hand()
    assert (sliding, full, window) == (52, 10, 1024)
    # vLLM groups 10 layers per block table: 52 sliding layers -> cdiv(52, 10) = 6 groups, 10 full -> 1.
    # One block id costs 10 layers x 16 tokens x bytes per layer-token.
    block_bytes = 10 * 16 * layer_token_bytes
    blocks = 80_000
    d = plan_json(capsys, "--config", "gemma-3-27b", "--available-kv-gib", repr(blocks * block_bytes / GIB),
                  "--max-model-len", "16384", "--request-tokens", "6256")
    assert d["num_gpu_blocks"] == blocks
    # Admission (logged): the full group books 16384 / 16 = 1024 blocks; each sliding group
    # min(1023 + 2 x 8192 in flight, 16384) -> 1024 blocks + 1 = 1025. 1024 + 6 x 1025 = 7174.
    assert d["admission_blocks_per_request"] == 7174
    assert d["max_concurrency"] == blocks / 7174
    # Running, 6256 tokens: the full group holds cdiv(6256, 16) = 391 blocks; a sliding group frees what
    # left the window and holds cdiv(1024 + 2 - 2, 16) + 1 = 65 (async scheduling: 2 unsettled tokens).
    assert d["running_blocks_per_request"] == 391 + 6 * 65 == 781
    assert d["running_concurrency"] == (blocks - 1) // 781 == 102
    assert d["recommended_max_num_seqs"] == int(0.85 * 102) == 86
    assert d["running_concurrency"] > 9 * d["max_concurrency"]
    assert d["watch_metrics"] == ["vllm:kv_cache_usage_perc", "vllm:num_preemptions"]
    assert "admission" in d["concurrency_note"]


def test_request_tokens_defaults_to_max_model_len(capsys):
    d = plan_json(capsys, "--config", "gemma-3-27b", "--available-kv-gib", "60", "--max-model-len", "16384")
    e = plan_json(capsys, "--config", "gemma-3-27b", "--available-kv-gib", "60", "--max-model-len", "16384",
                  "--request-tokens", "16384")
    assert d["request_tokens"] == 16384 and d == e
    # at full length the full group holds all 1024 blocks; the six sliding groups still 65 each
    assert d["running_blocks_per_request"] == 1024 + 6 * 65


def test_table_names_both_figures_and_what_to_watch(capsys):
    assert main(["plan", "--config", "gemma-3-27b", "--max-model-len", "16384", "--request-tokens", "6256"]) == 0
    out = capsys.readouterr().out
    assert "admission ceiling (logged)" in out and "running at once" in out and "6,256 tokens" in out
    assert "vllm:kv_cache_usage_perc" in out and "vllm:num_preemptions" in out


@pytest.mark.parametrize("value, words", [("0", "must be >= 1"), ("-5", "must be >= 1"),
                                          ("20000", "exceeds --max-model-len 16384")])
def test_bad_request_tokens_say_what_to_change(capsys, value, words):
    err = plan_error(capsys, "--config", "gemma-3-27b", "--max-model-len", "16384", "--request-tokens", value)
    assert words in err and "--request-tokens" in err
