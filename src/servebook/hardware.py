"""The GPU catalogue: memory, bandwidth, dense FLOP/s and interconnect of each GPU.

The numbers live in ``servebook/data/gpus.toml`` with their sources; this
module only reads and validates them. Units: bytes, bytes/s, FLOP/s.

FLOP/s are dense tensor-core peaks (datasheet "with sparsity" figures halved).
``memory_bytes`` is the total CUDA reports (``torch.cuda.mem_get_info``), the
number vLLM multiplies by ``gpu_memory_utilization``; where it was not measured
it is the datasheet capacity and ``memory_measured`` is False.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from servebook.errors import ServebookError, UnknownGPUError

try:  # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as _toml  # type: ignore[no-redef]

GIB = 2**30


@dataclass(frozen=True)
class GPU:
    """One GPU model.

    Attributes:
        name: canonical catalogue name, e.g. ``"H100-SXM-80GB"``.
        memory_bytes: total device memory as CUDA reports it, bytes (see module doc).
        memory_measured: True when ``memory_bytes`` was measured on the device.
        memory_datasheet_gb: capacity as marketed (the datasheet's "GB").
        memory_type: ``"HBM3"``, ``"GDDR6"``, ...
        hbm_bandwidth_bytes_per_s: peak device-memory bandwidth, bytes/s.
        bf16_dense_flops: dense BF16 tensor-core peak, FLOP/s.
        fp8_dense_flops: dense FP8 tensor-core peak, FLOP/s (0 if none).
        interconnect_bytes_per_s: NVLink bandwidth per GPU (all links, both directions), bytes/s;
            0 when the GPU has no NVLink.
        pcie_bytes_per_s: PCIe x16 bandwidth, both directions, bytes/s.
        compute_capability: CUDA compute capability, ``"major.minor"`` (NVIDIA's table); vLLM keys a few
            defaults on its major version (``is_device_capability_family``). Empty when not given.
        aliases: other names accepted by :func:`get_gpu`.
        sources: datasheet URLs and measurement notes.
    """

    name: str
    memory_bytes: int
    memory_measured: bool
    memory_datasheet_gb: float
    memory_type: str
    hbm_bandwidth_bytes_per_s: float
    bf16_dense_flops: float
    fp8_dense_flops: float
    interconnect_bytes_per_s: float
    pcie_bytes_per_s: float
    compute_capability: str = ""
    aliases: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    @property
    def memory_gib(self) -> float:
        """``memory_bytes`` in GiB (2**30 bytes)."""
        return self.memory_bytes / GIB

    @property
    def has_fp8(self) -> bool:
        """True when the GPU has FP8 tensor cores."""
        return self.fp8_dense_flops > 0

    @property
    def has_nvlink(self) -> bool:
        return self.interconnect_bytes_per_s > 0


_REQUIRED = (
    "name",
    "memory_bytes",
    "memory_measured",
    "memory_datasheet_gb",
    "memory_type",
    "hbm_bandwidth_bytes_per_s",
    "bf16_dense_flops",
    "fp8_dense_flops",
    "nvlink_bytes_per_s",
    "pcie_bytes_per_s",
    "sources",
)


def _normalise(name: str) -> str:
    """Case- and punctuation-insensitive key: "H100 SXM" -> "h100sxm"."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _parse(entry: dict) -> GPU:
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ServebookError(f"gpus.toml entry {entry.get('name', '?')!r} lacks {', '.join(missing)}.")
    gpu = GPU(
        name=entry["name"],
        memory_bytes=int(entry["memory_bytes"]),
        memory_measured=bool(entry["memory_measured"]),
        memory_datasheet_gb=float(entry["memory_datasheet_gb"]),
        memory_type=str(entry["memory_type"]),
        hbm_bandwidth_bytes_per_s=float(entry["hbm_bandwidth_bytes_per_s"]),
        bf16_dense_flops=float(entry["bf16_dense_flops"]),
        fp8_dense_flops=float(entry["fp8_dense_flops"]),
        interconnect_bytes_per_s=float(entry["nvlink_bytes_per_s"]),
        pcie_bytes_per_s=float(entry["pcie_bytes_per_s"]),
        compute_capability=str(entry.get("compute_capability", "")),
        aliases=tuple(entry.get("aliases", ())),
        sources=tuple(entry["sources"]),
    )
    positive = ("memory_bytes", "hbm_bandwidth_bytes_per_s", "bf16_dense_flops", "pcie_bytes_per_s")
    bad = [k for k in positive if getattr(gpu, k) <= 0]
    if bad or gpu.fp8_dense_flops < 0 or gpu.interconnect_bytes_per_s < 0 or not gpu.sources:
        raise ServebookError(f"gpus.toml entry {gpu.name!r} has non-positive or missing values: {bad or 'sources'}.")
    return gpu


@lru_cache(maxsize=1)
def _catalogue() -> tuple[dict[str, GPU], tuple[str, ...]]:
    text = resources.files("servebook").joinpath("data", "gpus.toml").read_text(encoding="utf-8")
    gpus = [_parse(e) for e in _toml.loads(text)["gpu"]]
    index: dict[str, GPU] = {}
    for gpu in gpus:
        for key in (gpu.name, *gpu.aliases):
            k = _normalise(key)
            if k in index and index[k] is not gpu:
                raise ServebookError(f"gpus.toml: name {key!r} is used by both {index[k].name} and {gpu.name}.")
            index[k] = gpu
    return index, tuple(g.name for g in gpus)


def gpu_names() -> list[str]:
    """Canonical names of the GPUs in the catalogue, in file order."""
    return list(_catalogue()[1])


def get_gpu(name: str | GPU) -> GPU:
    """Look up a GPU by canonical name or alias (case and punctuation ignored).

    ``get_gpu("H100")``, ``get_gpu("h100-sxm")`` and ``get_gpu("H100 SXM 80GB")``
    all return the H100 SXM entry; a leading "NVIDIA" (``torch.cuda.get_device_name()``'s
    "NVIDIA H200") is ignored. A :class:`GPU` is returned unchanged.

    Raises:
        UnknownGPUError: the name is not in the catalogue (the message lists the known names).
    """
    if isinstance(name, GPU):
        return name
    if not isinstance(name, str) or not name.strip():
        raise UnknownGPUError(f"GPU name must be a non-empty string, got {name!r}; known: {', '.join(gpu_names())}.")
    index, names = _catalogue()
    key = _normalise(name)
    gpu = index.get(key)
    if gpu is None and key.startswith("nvidia"):  # "NVIDIA H200", as nvidia-smi and torch name it
        gpu = index.get(key[len("nvidia"):])
    if gpu is None:
        raise UnknownGPUError(
            f"unknown GPU {name!r}; known GPUs: {', '.join(names)} "
            f"(aliases such as 'H100', 'h100-sxm', 'H200', 'A100' work too). "
            "To plan for another GPU, add it to servebook/data/gpus.toml with its datasheet source."
        )
    return gpu
