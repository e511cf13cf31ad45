"""``servebook step`` and ``servebook fleet`` on a calibration file written by the test."""
import json

import pytest

from perf_fixtures import KNOWN
from servebook.cli import main


@pytest.fixture
def calibration(tmp_path, monkeypatch):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"schema": "servebook.perf_calibration/1",
                                "coefficients": {"H200-SXM-141GB": KNOWN.to_dict()}}))
    monkeypatch.setenv("SERVEBOOK_PERF_CALIBRATION", str(path))
    return path


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_step_decode_json(calibration, capsys):
    out = _json(capsys, ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "decode", "--batch", "1",
                         "--context", "1000", "--json"])
    # weights (untied embedding excluded) at 80 % of 4.8 TB/s bound this step from below
    assert out["step_s"] > (8_030_261_248 - 128256 * 4096) * 2 / (0.8 * 4.8e12)
    assert out["breakdown"]["bound"] == "memory" and out["kv_batch_limit"] > 1


def test_step_prefill_json(calibration, capsys):
    out = _json(capsys, ["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "prefill", "--tokens",
                         "8192", "--json"])
    assert out["step_s"] > 2 * 8192 * 6.98e9 / 989.5e12 and out["request_s"] > out["step_s"]


@pytest.mark.parametrize("argv, message", [
    (["--tp", "3", "--phase", "decode", "--batch", "1", "--context", "10"], "does not divide"),
    (["--phase", "decode", "--batch", "100000", "--context", "16000"], "at most"),
    (["--phase", "decode", "--batch", "4"], "needs --batch B and --context C"),
    (["--phase", "prefill"], "needs --tokens"),
])
def test_step_bad_input_exits_2_with_reason(calibration, capsys, argv, message):
    assert main(["step", "--config", "llama-3.1-8b", "--gpu", "h200", *argv]) == 2
    assert message in capsys.readouterr().err


def test_step_without_calibration_says_how_to_make_one(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SERVEBOOK_PERF_CALIBRATION", str(tmp_path / "missing.json"))
    assert main(["step", "--config", "llama-3.1-8b", "--gpu", "h200", "--phase", "prefill", "--tokens", "10"]) == 2
    assert "servebook.perf.calibrate" in capsys.readouterr().err


def test_fleet_json(calibration, capsys):
    out = _json(capsys, ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--tp", "2",
                         "--requests", "1000000", "--input-tokens", "2000", "--output-tokens", "500",
                         "--price-per-gpu-hour", "2", "--json"])
    assert out["replicas"] == 4 and out["gpu_hours"] == pytest.approx(out["hours"] * 8)
    assert out["cost"] == pytest.approx(out["gpu_hours"] * 2)


def test_fleet_compare_draft_json(calibration, capsys):
    out = _json(capsys, ["fleet", "--compare-draft", "--json"])
    assert [r["draft"]["hours"] for r in out["rows"]] == pytest.approx([556.1, 260.0, 1441.1, 911.5, 69.5], abs=0.05)
    assert all(r["why"] for r in out["rows"])


def test_fleet_needs_its_arguments(calibration, capsys):
    assert main(["fleet", "--config", "llama-3.1-8b"]) == 2
    assert "--gpu" in capsys.readouterr().err


def _vllm_default_gpu_memory_utilization() -> float:
    """vLLM 0.27.1's parser default, from the claims file that the drift test checks against vLLM itself."""
    import tomllib
    from importlib import resources

    claims = tomllib.loads(resources.files("servebook").joinpath("data/vllm_claims.toml").read_text())
    (flag,) = [f for f in claims["flag"] if f["flag"] == "--gpu-memory-utilization"]
    return flag["parser_default"]


def test_every_command_and_library_default_is_vllms_gpu_memory_utilization():
    import argparse
    import dataclasses
    import inspect

    from servebook.cli import build_parser
    from servebook.perf import fleet

    vllm_default = _vllm_default_gpu_memory_utilization()
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    defaults = {name: action.default for name, p in sub.choices.items() for action in p._actions
                if "--gpu-memory-utilization" in action.option_strings}
    assert {"plan", "step", "fleet"} <= set(defaults)
    assert defaults == {name: vllm_default for name in defaults}
    assert "gpu_memory_utilization" not in {f.name for f in dataclasses.fields(fleet.Deployment)}  # the Plan's
    for fn in (fleet.Deployment.of, fleet.decode_batch_limit, fleet.check_decode_fits):
        assert inspect.signature(fn).parameters["gpu_memory_utilization"].default == vllm_default


def test_step_admits_the_batch_plan_says_fits(calibration, capsys):
    # Qwen3-32B: 64 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes = 256 KiB a token, so a
    # 4,096-token sequence holds exactly 1 GiB; plan's KV budget in GiB is then the batch that fits.
    plan = _json(capsys, ["plan", "--config", "qwen3-32b", "--gpu", "h200", "--json"])
    assert plan["kv_bytes_per_token"] == 64 * 8 * 128 * 2 * 2
    fits = int(plan["available_kv_gib"])
    step = _json(capsys, ["step", "--config", "qwen3-32b", "--gpu", "h200", "--phase", "decode",
                          "--batch", str(fits), "--context", "4096", "--json"])
    assert step["kv_batch_limit"] == fits
    assert main(["step", "--config", "qwen3-32b", "--gpu", "h200", "--phase", "decode",
                 "--batch", str(fits + 1), "--context", "4096"]) == 2
    assert f"at most {fits} sequences fit" in capsys.readouterr().err


@pytest.mark.parametrize("model, gpu, context, seqs_per_gib", [
    # Qwen3-32B: 256 KiB a token, so 1,024 tokens are 1/4 GiB; on an H200 vLLM's default
    # max_num_seqs is 1024, whose sampler rows take more memory than 256 rows would.
    ("qwen3-32b", "h200", 1024, 4),
    # Llama-3.1-8B: 128 KiB a token, so 4,096 tokens are 1/2 GiB; an A100 gets vLLM's small-GPU
    # defaults (2,048 batched tokens, 256 sequences), not an H200's 8,192 tokens.
    ("llama-3.1-8b", "a100", 4096, 2),
])
def test_step_kv_check_uses_plans_vllm_defaults(calibration, capsys, model, gpu, context, seqs_per_gib):
    # The KV check of `step` and the budget of `plan` must come from the same vLLM batch defaults
    # for the GPU; with a fixed 256 sequences / 8,192 tokens `step` admitted 263 (H200) and
    # allowed 114 (A100) sequences where plan's budget holds 262 and 116.
    plan = _json(capsys, ["plan", "--config", model, "--gpu", gpu, "--json"])
    fits = int(plan["available_kv_gib"] * seqs_per_gib)
    step = _json(capsys, ["step", "--config", model, "--gpu", gpu, "--phase", "decode",
                          "--batch", "1", "--context", str(context), "--json"])
    assert step["kv_batch_limit"] == fits


FLEET_JOB = ["fleet", "--config", "llama-3.1-8b", "--gpu", "h200", "--gpus", "8", "--requests", "1000",
             "--input-tokens", "2000", "--output-tokens", "500"]


@pytest.mark.parametrize("option, value", [
    ("--price-per-gpu-hour", "-2"),
    ("--gpus", "0"), ("--gpus", "-8"),
    ("--tp", "0"),
    ("--requests", "0"), ("--requests", "-5"),
    ("--input-tokens", "-2000"), ("--input-tokens", "0"),
    ("--output-tokens", "0"),
    ("--input-cv", "-1"), ("--output-cv", "-0.5"),
    ("--batch", "0"), ("--batch", "-3"),
    ("--max-num-seqs", "0"), ("--max-num-batched-tokens", "-1"),
    ("--spec-k", "-1"),
    ("--cudagraph-max-tokens", "-5"),
])
def test_fleet_refuses_a_negative_or_zero_option_and_names_it(calibration, capsys, option, value):
    argv = list(FLEET_JOB)
    if option in argv:
        argv[argv.index(option) + 1] = value
    else:
        argv += [option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{option} {float(value):g} is not allowed" in err and "must be >=" in err


def test_fleet_library_refuses_a_negative_price():
    from servebook.errors import ServebookError
    from servebook.hf_config import load_model_spec
    from servebook.perf.fleet import Deployment, LengthDistribution, Workload, plan

    job = Workload(1000, LengthDistribution.fixed(2000), LengthDistribution.fixed(500))
    with pytest.raises(ServebookError, match="negative"):
        plan(job, Deployment.of(load_model_spec("llama-3.1-8b"), gpu="h200", gpus=8, name="x", price_per_gpu_hour=-2,
                             kv_budget_bytes_per_gpu=2**34, max_num_batched_tokens=8192), KNOWN)


def test_fleet_free_gpus_cost_nothing(calibration, capsys):
    assert _json(capsys, FLEET_JOB + ["--price-per-gpu-hour", "0", "--json"])["cost"] == 0


def test_fleet_and_step_refuse_requests_longer_than_the_model_alike(calibration, capsys):
    # Qwen3-32B's config.json: max_position_embeddings 40960; 50,000 + 500 tokens exceed it.
    fleet = ["fleet", "--config", "qwen3-32b", "--gpu", "h200", "--gpus", "8", "--requests", "1000",
             "--input-tokens", "50000", "--output-tokens", "500"]
    assert main(fleet) == 2
    err = capsys.readouterr().err
    assert "50,500 tokens, more than qwen3-32b's 40,960 max_position_embeddings" in err and "--input-tokens" in err
    assert main(["step", "--config", "qwen3-32b", "--gpu", "h200", "--phase", "prefill", "--tokens", "50000"]) == 2
    assert "50,000 tokens, more than qwen3-32b's 40,960 max_position_embeddings" in capsys.readouterr().err
    # a request of exactly 40,960 tokens is planned by both
    assert main(fleet[:-4] + ["--input-tokens", "40460", "--output-tokens", "500", "--json"]) == 0
    capsys.readouterr()
    assert main(["step", "--config", "qwen3-32b", "--gpu", "h200", "--phase", "decode", "--batch", "1",
                 "--context", "40959"]) == 0
