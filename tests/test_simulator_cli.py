"""``servebook simulate``: runs, prints JSON, and refuses impossible settings with exit 2."""
import json
import re

import pytest

from servebook.cli import main


def test_simulate_json_summary(capsys):
    assert main(["simulate", "--requests", "30", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["num_requests"] == 30 and data["summary"]["policy"] == "paged"
    assert data["config"]["block_size"] == 16


def test_simulate_policies_and_steps(capsys):
    for policy in ("paged", "contiguous", "static"):
        assert main(["simulate", "--requests", "12", "--policy", policy, "--json", "--steps"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["summary"]["policy"] == policy
        assert len(data["steps"]["scheduled_tokens"]) == data["summary"]["num_steps"]
        assert max(data["steps"]["scheduled_tokens"]) <= data["config"]["max_num_batched_tokens"]
        # No preemption and no shared prefix: every prompt token is computed once and every output
        # token but the last is fed back once, so the steps carry sum(prompt + output - 1) tokens.
        assert data["summary"]["preemptions"] == 0
        expected = sum(r["prompt_tokens"] + r["output_tokens"] - 1 for r in data["requests"])
        assert sum(data["steps"]["scheduled_tokens"]) == expected


def test_simulate_text_and_errors(capsys):
    assert main(["simulate", "--requests", "10"]) == 0
    assert "KV holding tokens" in capsys.readouterr().out
    assert main(["simulate", "--requests", "10", "--num-blocks", "2"]) == 2
    err = capsys.readouterr().err
    assert "num_blocks" in err and "Traceback" not in err


def test_simulate_says_how_many_requests_max_model_len_cut(capsys):
    # long-context prompts have a median of 8,000 tokens (sigma 0.5): none of 10 is drawn under 10 tokens,
    # so every prompt is cut to max_model_len - 1 = 9 tokens and every output to the 1 token left.
    argv = ["simulate", "--requests", "10", "--max-model-len", "10", "--lengths", "long-context"]
    assert main(argv + ["--json", "--steps"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(r["prompt_tokens"], r["output_tokens"]) for r in data["requests"]} == {(9, 1)}
    t = data["truncation"]
    assert (t["requests"], t["prompts"], t["prompt_cap_tokens"], t["outputs"]) == (10, 10, 9, 10)
    assert t["longest_drawn_tokens"] > 1000
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "10 of 10 requests cut" in out and "10 prompts cut to 9 tokens" in out and "--max-model-len" in out


def test_simulate_reports_no_cut_when_lengths_fit(capsys):
    argv = ["simulate", "--requests", "20", "--lengths", "alpaca-like", "--max-model-len", "100000"]
    assert main(argv + ["--json"]) == 0
    t = json.loads(capsys.readouterr().out)["truncation"]
    assert (t["requests"], t["prompts"], t["outputs"]) == (0, 0, 0) and t["longest_drawn_tokens"] < 100000
    assert main(argv) == 0
    assert "truncated" not in capsys.readouterr().out


def _options(command: str) -> set[str]:
    import argparse

    from servebook.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {o for a in sub.choices[command]._actions for o in a.option_strings}


@pytest.mark.parametrize("argv, hint", [
    # 70B of bf16 weights (131 GiB) on one 80 GiB H100: two GPUs hold it.
    (["simulate", "--requests", "5", "--config", "llama-3.1-70b", "--gpu", "h100"], "--tp 2"),
    (["step", "--config", "llama-3.1-70b", "--gpu", "h100", "--phase", "decode", "--batch", "1", "--context", "100"],
     "--tp 2"),
    (["fleet", "--config", "llama-3.1-70b", "--gpu", "h100", "--gpus", "8", "--requests", "10", "--input-tokens", "100",
      "--output-tokens", "10"], "--tp 2"),
    (["plan", "--config", "llama-3.1-70b", "--gpu", "h100"], "--tp 2"),
    (["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "1", "--requests", "10", "--input-tokens", "1000",
      "--output-tokens", "100", "--batch", "100000"], "lower --batch"),
    # 40,900 tokens of Qwen3-32B's KV (256 KiB a token) take 10.0 GiB; at 0.9 of an A100 (vLLM's LLM-class
    # defaults there: 8,192 tokens, 256 sequences) the engine's longest request that fits is shorter.
    (["fleet", "--config", "qwen3-32b", "--gpu", "a100", "--gpus", "1", "--requests", "10", "--input-tokens", "40000",
      "--output-tokens", "900", "--gpu-memory-utilization", "0.9"], "--kv-cache-dtype fp8"),
    # Fits at TP 2 on A100s, but a 131,072-token request needs 20 GiB of KV cache a GPU: the KV hint.
    (["simulate", "--requests", "5", "--config", "llama-3.1-70b", "--tp", "2", "--gpu", "a100",
      "--max-model-len", "131072"], "--max-model-len"),
])
def test_does_not_fit_hints_name_flags_the_command_has(capsys, argv, hint):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert hint in err and "Traceback" not in err
    named = set(re.findall(r"--[a-z][a-z-]*", err))
    assert named and named <= _options(argv[0]), f"{argv[0]} has no {sorted(named - _options(argv[0]))}"


def test_perf_simulate_and_slo_sizing_leave_out_the_null_block(capsys):
    from servebook import make_plan
    from servebook.simulator.sizing import _replica_setup

    # Both size the simulated pool from plan's num_gpu_blocks; vLLM hands out all but one (the null block).
    blocks = make_plan("llama-3.1-8b", gpu="h200", max_model_len=2048, block_size=16).capacity.num_gpu_blocks
    assert main(["simulate", "--requests", "2", "--config", "llama-3.1-8b", "--gpu", "h200", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["num_blocks"] == blocks - 1
    config, _, _ = _replica_setup("llama-3.1-8b", "h200", 1, 2048, "auto")
    assert config.num_blocks == blocks - 1


def test_simulate_at_a_rate_reports_latency_as_served_the_way_tune_predicts_it(capsys):
    """One deployment, one TTFT: simulate --rate on a GPU adds the measured serving path to the
    engine's TTFT, as servebook tune does, and gives the vllm serve runs' held-out band."""
    from servebook.simulator.online import latency_band, measured_serving_path

    args = ["simulate", "--config", "llama-3.1-8b", "--gpu", "h200", "--rate", "8", "--requests", "80",
            "--input-tokens", "800", "--output-tokens", "64", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    path = measured_serving_path("h200")
    assert path.ttft_s > 0
    served = data["served"]
    # every request's TTFT moves by the serving path, so the median moves by exactly that much
    assert served["ttft_p50_s"] == pytest.approx(data["summary"]["ttft_p50_s"] + path.ttft_s, abs=1e-9)
    assert served["error_band"] == latency_band("h200")
    assert main(args[:-1]) == 0
    text = capsys.readouterr().out
    assert "as served" in text and "held-out vllm serve runs" in text
