"""servebook: the companion library of the chapter "Serving with vLLM".

Modules (one concept each):
    model_spec   what a model is, as the calculators see it (dataclasses)
    hf_config    config.json -> ModelSpec, with parameter counts
    hardware     the GPU catalogue (data/gpus.toml)
    kv_cache     KV bytes per token, pages, blocks, capacity as vLLM computes them
    startup_log  parser for vLLM startup logs (0.26, 0.27, V0)
    memory       the memory budget: weights, activations, graphs, KV
    perf         step-time model (prefill, decode, speculation, fleet plans)
    simulator    discrete-event model of vLLM's scheduler
    lab          harness that starts real engines for the GPU labs
    commands/    the ``servebook`` CLI, one file per sub-command
"""
__version__ = "0.1.0"

#: The vLLM release the chapter describes; drift tests check against it.
PINNED_VLLM = "0.27.1"
#: The vLLM release that runs on the lent GPU (recorded GPU results say so).
GPU_LAB_VLLM = "0.26.0"
