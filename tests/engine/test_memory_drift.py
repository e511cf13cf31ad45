"""Drift test: the CUDA-graph rule of servebook.memory holds in the installed vLLM (the pinned 0.27.1).

servebook subtracts a CUDA-graph estimate only for models on the V1 model runner
(:func:`servebook.memory.subtracts_cudagraph_estimate`). That rests on four facts of the
release, read here from vLLM itself (in the shared vLLM probe, vllm_probe.py; no engine, no GPU):

1. ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to on;
2. ``Worker.determine_available_memory`` subtracts the estimate it gets from the model runner;
3. the V2 model runner's ``profile_cudagraph_memory`` returns the constant 0;
4. the V2 runner is the default for non-MoE models and for the MoE architectures in
   ``DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES``, which must equal servebook's list.
"""
from __future__ import annotations

import json

import pytest

from servebook.memory import V2_RUNNER_MOE_ARCHITECTURES

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
all_returns = [n for n in ast.walk(v2) if isinstance(n, ast.Return)]
worker = ast.unparse(method_source("v1/worker/gpu_worker.py", "Worker", "determine_available_memory"))
default_v2 = inspect.getsource(config_vllm.VllmConfig._is_default_v2_model_runner_model)
print(json.dumps({
    "version": vllm.__version__,
    "estimate_default": bool(envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS),
    "v2_returns": returns, "v2_return_count": len(all_returns),
    "worker_subtracts": "- cudagraph_memory_estimate_applied" in worker
                        and "self.model_runner.profile_cudagraph_memory()" in worker,
    "moe_rule": "not model_config.is_moe" in default_v2,
    "v2_archs": sorted(config_vllm.DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES),
}))
'''


@pytest.fixture(scope="module")
def facts(vllm_probe, tmp_path_factory):
    out = vllm_probe.run_source(tmp_path_factory.mktemp("memory_drift"), PROBE)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pinned_release(facts):
    assert facts["version"].startswith("0.27.1")


def test_graph_estimate_is_on_by_default_and_subtracted(facts):
    assert facts["estimate_default"] is True
    assert facts["worker_subtracts"] is True


def test_v2_runner_estimates_zero(facts):
    assert facts["v2_returns"] == [0] and facts["v2_return_count"] == 1


def test_v2_runner_default_models_match_servebook(facts):
    assert facts["moe_rule"] is True
    assert set(facts["v2_archs"]) == set(V2_RUNNER_MOE_ARCHITECTURES)
