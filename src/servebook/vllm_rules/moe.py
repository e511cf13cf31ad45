"""vLLM's switch that replaces an MoE layer's router by a simulated one.

``VLLM_MOE_ROUTING_SIMULATION_STRATEGY`` (``vllm/envs.py``; read by
``model_executor/layers/fused_moe/router/routing_simulator_router.py``): with ``uniform_random``
each token's top-k experts are drawn uniformly at random (``torch.randint`` per slot) in the fused-MoE
paths that select experts before the kernel. servebook's step model prices MoE layers under exactly
that routing; engines on random (dummy) weights otherwise route through their own random router, which
can send a batch's tokens to far fewer experts than a trained, load-balanced router would.
"""
from __future__ import annotations

#: The environment variable's name (vLLM reads it when the engine starts).
ROUTING_SIMULATION_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
#: The strategy that routes uniformly at random.
UNIFORM_ROUTING = "uniform_random"


def routes_uniformly(environment: dict | None) -> bool:
    """Whether an engine started with ``environment`` routed MoE tokens uniformly at random."""
    return str((environment or {}).get(ROUTING_SIMULATION_ENV, "")).lower() == UNIFORM_ROUTING
