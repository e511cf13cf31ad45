"""servebook: the companion library of the chapter "Serving with vLLM".

The names a reader calls are re-exported here, flat (``from servebook import
make_plan``); each lives in one private-to-the-reader module that holds one
concept:

    model_spec    what a model is, as the calculators see it (dataclasses)
    hf_config     config.json -> ModelSpec, with parameter counts
    quant_schemes quantized checkpoints: the scheme a quantization_config names, its bytes, its kernels
                  by GPU (data/quant_schemes.toml)
    lora          LoRA adapter slots (--enable-lora) in the memory budget
    hardware      the GPU catalogue (data/gpus.toml)
    vllm_rules    vLLM 0.27.1's defaults and rules, one home each (cache, scheduler, parallel, compilation),
                  and the vLLM releases described (release: PINNED_VLLM, GPU_LAB_VLLM)
    kv_cache      KV bytes per token, pages, blocks, capacity as vLLM computes them (the logged
                  admission bound) and the requests that run at once (running_concurrency)
    startup_log   parser for vLLM startup logs (0.26, 0.27, V0)
    memory        the memory budget: weights, activations, graphs, KV
    memory_fit    fitting the memory coefficients on recorded start-ups (leave-one-out error)
    plan          one deployment: budget, KV capacity, recommended flags (``servebook plan``)
    live          the book's "Run live" calculators: JSON in, JSON out, no numpy (Pyodide in the browser)
    validation    the input checks every front door shares (CLI flags, live fields): one message per mistake
    perf          step-time model (prefill, decode, speculation, fleet plans)
    draft/        the draft chapter's arithmetic (6.5 memory, 6.22 fleet), kept to compare against
    simulator     discrete-event model of vLLM's scheduler
    lab/          the GPU labs: harness (real engines, measuring), recordings (reading results back),
                  analyses (one module per lab), e2e (the fleet model against real jobs)
    drills/       interview drills: model, exhibits, grading, rendering, calls
    reductions    sums, means, percentiles of floats with numpy's digits, without numpy (numpy is optional)
    records       where recorded lab results are (the one module that knows labs/results)
    figures       the chapter pages' figures, drawn at page width from data the page loaded
    figure_style  a page figure's style (width, 10-point text), shared by figures and the labs' plots
    shipped       paths of the data shipped in the package
    commands/     the ``servebook`` CLI, one file per sub-command

Import rule: ``commands`` (the CLI) imports the library; the library never
imports ``commands``, nor this package face; each layer imports only the layers below it
(tests/test_layout.py holds the order).
"""
# The public face, re-exported from the modules that hold each name. No module of the library
# imports this face (tests/test_layout.py): each imports the module that holds the name.
from servebook._version import __version__
from servebook.errors import DoesNotFitError, ServebookError
from servebook.hardware import get_gpu, gpu_names
from servebook.hf_config import load_model_spec, reference_model_ids
from servebook.lora import LoraSettings
from servebook.kv_cache import (
    capacity,
    default_async_scheduling,
    default_block_size,
    kv_cache_layout,
    running_concurrency,
)
from servebook.memory import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    MemoryBudget,
    memory_budget,
    vllm_batch_defaults,
)
from servebook.model_spec import ModelSpec
from servebook.plan import MAX_NUM_SEQS_FRACTION, Plan, make_plan
from servebook.startup_log import parse_startup_log, read_startup_log
from servebook.vllm_rules.release import GPU_LAB_VLLM, PINNED_VLLM

#: Names whose modules are imported on first use (PEP 562): the step-time model and the simulator
#: import numpy today, and ``import servebook`` (with make_plan, the memory budget and the KV
#: calculators) must also work where numpy is absent: in the browser, under Pyodide, for the book's
#: "Run live" calculators (servebook.live). Each name still comes from the module that holds it.
_LAZY = {
    "calibrated_coefficients": "servebook.perf",
    "decode_step": "servebook.perf",
    "gpu_numbers": "servebook.perf",
    "prefill_step": "servebook.perf",
    "LinearStepTime": "servebook.simulator",
    "RequestSpec": "servebook.simulator",
    "SchedulerConfig": "servebook.simulator",
    "simulate": "servebook.simulator",
    "synthetic_workload": "servebook.simulator",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'servebook' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "GPU_LAB_VLLM",
    "MAX_NUM_SEQS_FRACTION",
    "PINNED_VLLM",
    "DoesNotFitError",
    "LinearStepTime",
    "MemoryBudget",
    "ModelSpec",
    "Plan",
    "RequestSpec",
    "SchedulerConfig",
    "ServebookError",
    "calibrated_coefficients",
    "capacity",
    "decode_step",
    "default_async_scheduling",
    "default_block_size",
    "get_gpu",
    "gpu_names",
    "gpu_numbers",
    "kv_cache_layout",
    "load_model_spec",
    "make_plan",
    "memory_budget",
    "parse_startup_log",
    "prefill_step",
    "read_startup_log",
    "reference_model_ids",
    "LoraSettings",
    "running_concurrency",
    "simulate",
    "synthetic_workload",
    "vllm_batch_defaults",
]
