"""The simulator priced by the calibrated performance model: step durations equal what
servebook.perf says for that step's content, computed here directly from servebook.perf."""
import json

import pytest

from servebook.cli import main
from servebook.hf_config import load_model_spec
from servebook.perf import calibrated_coefficients, decode_step, gpu_numbers, prefill_work, step_time
from servebook.simulator import RequestSpec, SchedulerConfig, simulate
from servebook.simulator.step_time import PerfStepTime

GPU = gpu_numbers("h200")
COEFFS, _ = calibrated_coefficients(GPU.name)


def _model(name: str) -> PerfStepTime:
    return PerfStepTime(load_model_spec(name), GPU, COEFFS)


def test_one_request_alone_takes_a_prefill_step_then_decode_steps_of_growing_context():
    spec = load_model_spec("llama-3.1-8b")
    cfg = SchedulerConfig(num_blocks=64, max_model_len=1024)
    result = simulate([RequestSpec("a", 300, 5)], cfg, PerfStepTime(spec, GPU, COEFFS))
    # Prefill of the 300-token prompt (it samples the first output token), then 4 decodes whose
    # KV caches hold 300, 301, 302, 303 tokens when they run.
    prefill = step_time(spec, GPU, prefill_work(spec, 300, last_chunk=True), COEFFS).step_s
    decodes = [decode_step(spec, GPU, COEFFS, batch=1, context_tokens=300 + i).step_s for i in range(4)]
    assert result.steps.duration_s == pytest.approx([prefill] + decodes, rel=1e-12)
    m = result.requests[0]
    assert m.ttft_s == pytest.approx(prefill, rel=1e-12)
    assert m.mean_itl_s == pytest.approx(sum(decodes) / 4, rel=1e-12)


def test_equal_decodes_share_one_step_per_token():
    spec = load_model_spec("llama-3.1-8b")
    reqs = [RequestSpec(f"r{i}", 128, 6) for i in range(8)]
    cfg = SchedulerConfig(num_blocks=256, max_model_len=1024, enable_prefix_caching=False)
    result = simulate(reqs, cfg, PerfStepTime(spec, GPU, COEFFS), record_batches=True)
    # Step 0 prefills the eight prompts together; then five steps each decode all eight.
    assert result.steps.batches[0] == {f"r{i}": 128 for i in range(8)}
    assert result.steps.decode_seqs[1:] == [8] * 5
    prefill_all = sum((prefill_work(spec, 128, last_chunk=True) for _ in range(7)),
                      prefill_work(spec, 128, last_chunk=True))
    prefill_s = step_time(spec, GPU, prefill_all, COEFFS).step_s
    decodes = [decode_step(spec, GPU, COEFFS, batch=8, context_tokens=128 + i).step_s for i in range(5)]
    assert result.steps.duration_s == pytest.approx([prefill_s] + decodes, rel=1e-12)
    # Eight decodes in one step cost far less than eight single decodes (weights are read once).
    assert decodes[0] < 2 * decode_step(spec, GPU, COEFFS, batch=1, context_tokens=128).step_s


def test_chunked_prompt_is_priced_with_its_prior_tokens():
    spec = load_model_spec("llama-3.1-8b")
    cfg = SchedulerConfig(num_blocks=128, max_num_batched_tokens=512, max_model_len=2048)
    result = simulate([RequestSpec("a", 1200, 2)], cfg, PerfStepTime(spec, GPU, COEFFS))
    chunks = [(512, 0, False), (512, 512, False), (176, 1024, True)]
    expected = [step_time(spec, GPU, prefill_work(spec, n, prior_tokens=p, last_chunk=last), COEFFS).step_s
                for n, p, last in chunks]
    assert result.steps.duration_s[:3] == pytest.approx(expected, rel=1e-12)
    # Later chunks read more prior KV, so they cost more than the first.
    assert expected[1] > expected[0]


def test_a_32b_model_serves_fewer_tokens_per_second_than_an_8b_model():
    reqs = [RequestSpec(f"r{i}", 256 + 16 * i, 64) for i in range(32)]
    cfg = SchedulerConfig(num_blocks=4096, max_model_len=2048)
    small = simulate(reqs, cfg, _model("llama-3.1-8b")).summary()
    large = simulate(reqs, cfg, _model("qwen3-32b")).summary()
    # Same schedule (the scheduler does not look at the clock when all arrive at once) ...
    assert small["num_steps"] == large["num_steps"]
    # ... but each step of the 32B model reads about four times the weights.
    assert 2.0 < small["output_tokens_per_s"] / large["output_tokens_per_s"] < 6.0
    assert large["itl_mean_s"] > small["itl_mean_s"]


def test_cli_perf_step_model_reports_real_seconds(capsys):
    assert main(["simulate", "--requests", "20", "--config", "llama-3.1-8b", "--gpu", "h200", "--json", "--steps"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "performance model for llama-3.1-8b" in data["step_model"]
    # The KV pool comes from the memory model (tens of thousands of blocks for an 8B model on an H200).
    assert data["config"]["num_blocks"] > 20_000
    # Every simulated step is at least the calibrated fixed cost of a step.
    assert min(d for d in data["steps"]["duration_s"] if d > 0) >= COEFFS.step_overhead_s


def test_cli_step_model_errors_say_what_to_add(capsys):
    assert main(["simulate", "--requests", "5", "--step-model", "perf", "--config", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert "--gpu" in err and "Traceback" not in err
    assert main(["simulate", "--requests", "5", "--gpu", "h200"]) == 2
    assert "--step-model perf" in capsys.readouterr().err
    assert main(["simulate", "--requests", "5", "--config", "qwen3-32b", "--gpu", "h200", "--tp", "3"]) == 2
    assert "--tp" in capsys.readouterr().err
