"""The calculators a reader drives run on the Python standard library alone (issue 22).

Each call below runs in a fresh interpreter in which ``import numpy`` fails (``sys.modules["numpy"]
= None`` before servebook is imported), and must give what the same call gives here, where numpy
is installed: memory budget and plan, KV per token, the step model, the fleet planner, speculation,
the chunk budget and long prompts, the roofline, and the scheduler simulator priced by either
clock. numpy stays for random workloads, calibration fits and plots; asking for those without it
is a clear error that says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BLOCK_NUMPY = "import sys; sys.modules['numpy'] = None  # any `import numpy` now raises ImportError\n"

CALLS = textwrap.dedent('''
    import contextlib, io, json, sys
    from dataclasses import asdict, is_dataclass

    def out(x):
        if hasattr(x, "tolist"):
            x = x.tolist()
        if is_dataclass(x):
            x = asdict(x)
        if isinstance(x, dict):
            return {str(k): out(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [out(v) for v in x]
        return repr(x) if isinstance(x, float) else x

    def cli(*argv):
        from servebook.cli import main
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(list(argv))
        return [rc, buf.getvalue()]

    from servebook import (capacity, kv_cache_layout, load_model_spec, make_plan, memory_budget,
                           RequestSpec, SchedulerConfig, LinearStepTime, simulate)
    from servebook.perf import calibrated_coefficients, decode_step, prefill_step, prefill_request_s
    from servebook.perf import work as W
    from servebook.perf.chunk_budget import recommend_max_num_batched_tokens
    from servebook.perf.fleet import Deployment, LengthDistribution, Speculation, Workload, plan
    from servebook.perf.long_prompt import predict_long_prompt
    from servebook.perf.roofline import attainable_flops, decode_intensity, ridge_batch
    from servebook.perf.speculative import Drafter, best_k, expected_tokens_per_step, k_schedule
    from servebook.simulator.step_time import perf_step_time_for

    llama, moe, gemma = (load_model_spec(m) for m in ("llama-3.1-8b", "qwen3-30b-a3b", "gemma-3-27b"))
    c, _ = calibrated_coefficients("h200")
    p = make_plan("gemma-4-26b-a4b", gpu="H200", max_model_len=16384)
    results = {
        "plan": [p.capacity.num_gpu_blocks, p.default_max_num_seqs, p.max_num_batched_tokens],
        "plan cli": cli("plan", "--config", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--json"),
        "kv per token": W.kv_bytes_per_sequence(gemma, 1.0, tp=2, kv_cache_dtype="fp8"),
        "decode_step": decode_step(moe, "h200", c, batch=64, context_tokens=3000, tp=2),
        "prefill_step": prefill_step(gemma, "h200", c, tokens=4096, prior_tokens=8192),
        "prefill_request_s": prefill_request_s(llama, "h200", c, prompt_tokens=20000, max_num_batched_tokens=8192),
        "step cli": cli("step", "--config", "qwen3-30b-a3b", "--gpu", "h200", "--phase", "decode", "--batch", "128",
                        "--context", "4096", "--json"),
        "fleet": plan(Workload(10**6, LengthDistribution.lognormal(1500, 0.6), LengthDistribution.lognormal(300, 0.5)),
                      Deployment.of(llama, gpu="h200", gpus=8, name="x", speculation=Speculation(3, 0.7), max_num_batched_tokens=8192), c).to_dict(),
        "fleet cli": cli("fleet", "--config", "gemma-3-27b", "--gpu", "h200", "--gpus", "4", "--requests", "100000",
                         "--input-tokens", "3000", "--output-tokens", "400", "--json"),
        "speculation": [expected_tokens_per_step(4, 0.7), best_k(llama, "h200", c, alpha=0.7, batch=8,
                                                                  context_tokens=1000)],
        "k_schedule": k_schedule(moe, "h200", c, alpha=0.75, context_tokens=2000, drafter=Drafter("eagle", llama)),
        "chunk budget": recommend_max_num_batched_tokens(llama, "h200", c, target_step_s=0.05, max_num_seqs=128,
                                                         decode_context_tokens=2000),
        "long prompt": predict_long_prompt(gemma, "h200", c, prompt_tokens=30000, decode_batch=32,
                                           decode_context_tokens=4000, max_num_batched_tokens=4096),
        "roofline": [decode_intensity(moe, [1, 64, 512], 2048)["intensity_flops_per_byte"],
                     attainable_flops("h200", [1.0, 1e4]), ridge_batch(llama, "h200", 0)],
    }
    requests = [RequestSpec(f"r{i}", 50 + 37 * i % 900, 20 + 13 * i % 300, 0.05 * i) for i in range(300)]
    config = SchedulerConfig(num_blocks=3000, max_model_len=2048)
    clock, _ = perf_step_time_for("gemma-3-27b", "h200")
    results["simulate perf"] = simulate(requests, config, clock).summary()
    results["simulate stand-in"] = simulate(requests, config, LinearStepTime()).summary()
    print(json.dumps(out(results)))
''')


def _run(script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                       os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)


def test_the_calculators_give_the_same_numbers_without_numpy():
    without = _run(BLOCK_NUMPY + CALLS)
    assert without.returncode == 0, without.stderr
    with_numpy = _run("import numpy\n" + CALLS)
    assert with_numpy.returncode == 0, with_numpy.stderr
    assert json.loads(without.stdout) == json.loads(with_numpy.stdout)


def test_the_blocker_really_blocks_numpy():
    done = _run(BLOCK_NUMPY + "import numpy")
    assert done.returncode != 0 and "import of numpy halted" in done.stderr


def test_importing_the_library_and_its_cli_imports_no_numpy():
    done = _run("import sys, servebook, servebook.cli, servebook.perf.fleet, servebook.perf.speculative, "
                "servebook.perf.chunk_budget, servebook.perf.long_prompt, servebook.perf.roofline, "
                "servebook.simulator, servebook.simulator.sizing, servebook.plan\n"
                "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith('numpy.')))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("call,needs", [
    ("from servebook.simulator import synthetic_workload; synthetic_workload(5)", "synthetic_workload"),
    ("from servebook.simulator.sizing import poisson_requests; poisson_requests(1.0, 5, 10, 10)", "poisson_requests"),
    ("from servebook import load_model_spec; from servebook.perf.work import expected_distinct_experts; "
     "expected_distinct_experts(load_model_spec('qwen3-30b-a3b'), [1, 2])", "expected_distinct_experts over arrays"),
])
def test_what_needs_numpy_says_so_without_it(call, needs):
    done = _run(BLOCK_NUMPY + call)
    assert done.returncode != 0
    assert "ServebookError" in done.stderr and needs in done.stderr and "needs numpy" in done.stderr


def test_every_live_page_calculator_is_offered_without_numpy():
    """servebook.live (the pages' "Run live") offers a calculator only when its modules import; under
    Pyodide there is no numpy, so each one must import without it."""
    done = _run(BLOCK_NUMPY + "import json\nfrom servebook import live\n"
                "o = live.options()\nprint(json.dumps([o['unavailable'], sorted(o['calculators'])]))")
    assert done.returncode == 0, done.stderr
    unavailable, offered = json.loads(done.stdout)
    assert unavailable == {} and len(offered) >= 4, (unavailable, offered)


# -- the latency search (servebook tune) on Poisson traffic of fixed lengths, its CLI defaults -------

TUNE_CALLS = textwrap.dedent('''
    import json
    from servebook.simulator.online import OnlineWorkload
    from servebook.simulator.tune import LatencyTargets, tune

    shapes = [OnlineWorkload(r, 1024, 256) for r in (0.5, 4.0, 12.5, 40.0)] + [OnlineWorkload(3.0, 700, 90, prefix_tokens=100)]
    arrivals = [[(q.prompt_tokens, q.output_tokens, q.arrival_s.hex()) for q in w.requests(w.rate_per_s / k)]
                for w in shapes for k in (1, 3)]
    r = tune("qwen3-32b", gpu="h200", max_gpus=2, workload=OnlineWorkload(4.0, 1024, 256), tps=(1, 2),
             kv_cache_dtypes=("auto",), targets=LatencyTargets(ttft_s=1.0, tpot_s=0.035))
    print(json.dumps([arrivals, r.best.serve_command(), [c.prediction.to_dict() for c in r.tried]]))
''')


def test_poisson_requests_and_the_tune_pick_are_the_same_without_numpy():
    """Where numpy is missing (Pyodide), OnlineWorkload reads numpy's draws from the shipped file: the
    same requests to the last bit, and so the same search."""
    without = _run(BLOCK_NUMPY + TUNE_CALLS)
    assert without.returncode == 0, without.stderr
    with_numpy = _run("import numpy\n" + TUNE_CALLS)
    assert with_numpy.returncode == 0, with_numpy.stderr
    assert json.loads(without.stdout) == json.loads(with_numpy.stdout)


def test_the_shipped_poisson_draws_are_numpys():
    import numpy as np

    from servebook.simulator.online import MAX_SIMULATED_REQUESTS, POISSON_DRAWS_FILE

    draws = json.loads(POISSON_DRAWS_FILE.read_text())["draws"]
    assert draws == np.random.default_rng(0).standard_exponential(MAX_SIMULATED_REQUESTS).tolist()
    # what OnlineWorkload draws with numpy: gamma(1, scale) is scale x that stream, digit for digit
    assert (np.random.default_rng(0).gamma(1.0, 1 / 7.3, size=500) == np.array(draws[:500]) * (1 / 7.3)).all()


@pytest.mark.parametrize("kwargs", [{"range_ratio": 0.5}, {"burstiness": 0.5}, {"seed": 3}])
def test_other_traffic_still_says_it_needs_numpy(kwargs):
    done = _run(BLOCK_NUMPY + "from servebook.simulator.online import OnlineWorkload\n"
                f"OnlineWorkload(2.0, 100, 50, **{kwargs!r}).requests()")
    assert done.returncode != 0
    assert "ServebookError" in done.stderr and "needs numpy" in done.stderr and "fixed lengths on seed 0" in done.stderr
