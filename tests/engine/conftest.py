"""Fixtures for the engine tests."""
from __future__ import annotations

import pytest

from vllm_probe import VllmProbe


@pytest.fixture(scope="session")
def vllm_probe():
    """The shared Python of the vLLM environment (see vllm_probe.py): ``import vllm`` once per session."""
    from servebook.engine_env import cpu_engine_env, vllm_python

    probe = VllmProbe(vllm_python(), env=cpu_engine_env(1))
    yield probe
    probe.close()
