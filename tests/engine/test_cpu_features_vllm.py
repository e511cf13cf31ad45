"""servebook's fp8-KV CPU probe gives the pinned vLLM's own answer on this machine.

``servebook.cpu_features`` reads CPU flags from /proc/cpuinfo instead of calling vLLM (the
check is private and needs torch). Here, in the vLLM environment, vLLM's own
``cpu_attn._get_attn_isa`` is asked to pick a kernel for an fp8 KV cache: it raises its
``NotImplementedError`` exactly when the probe says no. The torch functions it calls are
compared flag by flag too, so a torch release that changes what "AVX-512" means shows up here;
with those functions patched to False, vLLM raises the message the probe quotes and still picks a
kernel for a bf16 cache. No engine starts.
"""
from __future__ import annotations

import json

import pytest

from servebook.cpu_features import (AMX_FLAG, AVX512_FLAGS, FAKE_FLAGS_ENV, VLLM_ERROR, fp8_kv_cache_support,
                                    read_cpu_flags)

pytestmark = pytest.mark.vllm_env

ASK_VLLM = r"""
import json
import torch
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

out = {"avx512": torch.cpu._is_avx512_supported(), "amx": torch.cpu._is_amx_tile_supported()}
try:
    out["isa"] = _get_attn_isa(torch.bfloat16, 128, 64, "fp8")   # the tiny Llama's head size, CPU block
    out["error"] = None
except NotImplementedError as err:
    out["isa"], out["error"] = None, str(err)
# The same function on a CPU torch says has neither (what a CPU without AVX-512 or AMX gives it).
from unittest import mock
with mock.patch.object(torch.cpu, "_is_avx512_supported", lambda: False), \
        mock.patch.object(torch.cpu, "_is_amx_tile_supported", lambda: False):
    try:
        _get_attn_isa(torch.bfloat16, 128, 64, "fp8")
        out["error_without"] = None
    except NotImplementedError as err:
        out["error_without"] = str(err)
    out["isa_without_auto"] = _get_attn_isa(torch.bfloat16, 128, 64, "auto")   # bf16 KV still has a kernel
print("SERVEBOOK_FP8_ISA " + json.dumps(out))
"""


def test_probe_agrees_with_vllm_own_fp8_kv_check(vllm_probe, tmp_path, monkeypatch):
    monkeypatch.delenv(FAKE_FLAGS_ENV, raising=False)   # the real CPU on both sides
    proc = vllm_probe.run_source(tmp_path, ASK_VLLM)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SERVEBOOK_FP8_ISA "))
    vllm = json.loads(line.split(" ", 1)[1])
    probe = fp8_kv_cache_support()
    assert probe.ok == (vllm["error"] is None), (probe, vllm)
    if vllm["error"] is not None:
        assert vllm["error"] == VLLM_ERROR
    # Without AVX-512 and AMX vLLM stops with the message the probe quotes; a bf16 cache gets a kernel.
    assert vllm["error_without"] == VLLM_ERROR
    assert vllm["isa_without_auto"] == "vec"
    flags = set(read_cpu_flags() or ())
    assert vllm["avx512"] == (set(AVX512_FLAGS) <= flags)
    assert vllm["amx"] == (AMX_FLAG in flags)
