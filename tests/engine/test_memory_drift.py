"""Drift test: the CUDA-graph rule of servebook.memory against the installed vLLM (the pinned release).

servebook subtracts a CUDA-graph estimate only for models on the V1 model runner
(:func:`servebook.memory.subtracts_cudagraph_estimate`): vLLM 0.26.0's rule, the release of the H200
start-ups the memory model is fitted on. In 0.26.0 and 0.27.1 the V2 runner's
``profile_cudagraph_memory`` returned the constant 0 and V2 was the default for non-MoE models and an
allow-list of MoE architectures (``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``; servebook's
``V2_RUNNER_MOE_ARCHITECTURES`` is 0.26.0's list). vLLM 0.32.0 changed both, and servebook's budget does
not follow it yet (no 0.32.0 GPU start-up to fit the V2 estimate on; the releases appendix says so).
Read here from vLLM itself (in the shared vLLM probe, vllm_probe.py; no engine, no GPU):

1. ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to on, and
   ``Worker.determine_available_memory`` subtracts the estimate it gets from the model runner
   (both releases);
2. 0.32.0's V2 model runner estimates its graphs (``profile_cudagraph_memory`` profiles a capture
   instead of returning 0): what the book says 0.32.0 does;
3. 0.32.0 has no MoE allow-list: the V2 runner is the default unless a feature it lacks is configured.
"""
from __future__ import annotations

import json

import pytest

from servebook.vllm_rules import PINNED_VLLM

pytestmark = [pytest.mark.engine, pytest.mark.vllm_env]   # vLLM's Python, no engine start

PROBE = r'''
import ast, importlib.util, inspect, json, os, pathlib
os.environ.pop("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", None)
import vllm, vllm.envs as envs
from vllm.config import vllm as config_vllm
root = pathlib.Path(importlib.util.find_spec("vllm").origin).parent

def method_source(path, cls, name):
    tree = ast.parse((root / path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (cls is None or node.name == cls):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise SystemExit(f"{path}: {name} not found")

v2 = method_source("v1/worker/gpu/model_runner.py", None, "profile_cudagraph_memory")
returns = [n.value.value for n in ast.walk(v2) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)]
calls = sorted({n.func.id for n in ast.walk(v2) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)})
worker = ast.unparse(method_source("v1/worker/gpu_worker.py", "Worker", "determine_available_memory"))
print(json.dumps({
    "version": vllm.__version__,
    "estimate_default": bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS),
    "v2_constant_returns": returns, "v2_calls": calls,
    "worker_subtracts": "- cudagraph_memory_estimate_applied" in worker
                        and "self.model_runner.profile_cudagraph_memory()" in worker,
    "moe_allow_list": hasattr(config_vllm, "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES"),
    "v2_unless_unsupported": "_get_v2_model_runner_unsupported_features" in inspect.getsource(
        config_vllm.VllmConfig.use_v2_model_runner.fget),
}))
'''


@pytest.fixture(scope="module")
def facts(vllm_probe, tmp_path_factory):
    out = vllm_probe.run_source(tmp_path_factory.mktemp("memory_drift"), PROBE)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pinned_release(facts):
    assert facts["version"] == PINNED_VLLM


def test_graph_estimate_is_on_by_default_and_subtracted(facts):
    assert facts["estimate_default"] is True
    assert facts["worker_subtracts"] is True


def test_v2_runner_estimates_its_graphs_in_the_pinned_release(facts):
    # 0.26.0/0.27.1: `return 0` and nothing else; 0.32.0 hands the runner to a profiler
    assert facts["v2_constant_returns"] == [] and facts["v2_calls"] == ["_profile_cudagraph_memory"]


def test_v2_runner_is_the_default_without_an_moe_allow_list(facts):
    assert facts["moe_allow_list"] is False
    assert facts["v2_unless_unsupported"] is True
