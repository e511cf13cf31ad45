"""The GPU numbers the step-time model needs, read from the hardware catalogue.

:func:`gpu_numbers` accepts a catalogue name (``"h200"``) or any object with the
attributes below (for example what :func:`servebook.hardware.get_gpu` returns),
and returns a :class:`GPUNumbers`. The model only ever reads peak figures from
here; how much of each peak a real engine reaches is *calibrated* from recorded
measurements (:mod:`servebook.perf.calibrate`), never assumed.
"""
from __future__ import annotations

from dataclasses import dataclass

from servebook.errors import UnknownGPUError


@dataclass(frozen=True)
class GPUNumbers:
    """Peak figures of one GPU.

    Attributes:
        name: catalogue name.
        memory_bytes: HBM capacity, bytes.
        hbm_bandwidth_bytes_per_s: peak HBM bandwidth, bytes/s.
        bf16_dense_flops: peak dense bf16 tensor throughput, FLOP/s (no sparsity).
        fp8_dense_flops: peak dense fp8 tensor throughput, FLOP/s (no sparsity).
        interconnect_bytes_per_s: NVLink bandwidth per GPU, all links, both directions,
            bytes/s (the catalogue's figure); an all-reduce sends at half of it.
    """

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_dense_flops: float
    fp8_dense_flops: float
    interconnect_bytes_per_s: float

    @property
    def link_bytes_per_s_each_way(self) -> float:
        """NVLink bandwidth in one direction, bytes/s (what a ring all-reduce step sends at)."""
        return self.interconnect_bytes_per_s / 2

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which bf16 work is compute-bound."""
        return self.bf16_dense_flops / self.hbm_bandwidth_bytes_per_s


_INTERCONNECT_NAMES = (
    "interconnect_bytes_per_s",
    "interconnect_bandwidth_bytes_per_s",
    "nvlink_bytes_per_s",
    "nvlink_bandwidth_bytes_per_s",
    "link_bandwidth_bytes_per_s",
)


def _from_object(obj) -> GPUNumbers:
    link = next((getattr(obj, n) for n in _INTERCONNECT_NAMES if getattr(obj, n, None)), 0.0)
    if not link:  # no NVLink: tensor parallelism goes over PCIe (both directions, like NVLink's figure)
        link = getattr(obj, "pcie_bytes_per_s", 0.0) or 0.0
    return GPUNumbers(
        name=str(getattr(obj, "name", "gpu")),
        memory_bytes=int(obj.memory_bytes),
        hbm_bandwidth_bytes_per_s=float(obj.hbm_bandwidth_bytes_per_s),
        bf16_dense_flops=float(obj.bf16_dense_flops),
        fp8_dense_flops=float(getattr(obj, "fp8_dense_flops", 0.0) or 2 * obj.bf16_dense_flops),
        interconnect_bytes_per_s=float(link),
    )


def gpu_numbers(gpu) -> GPUNumbers:
    """Peak numbers for ``gpu`` (a catalogue name, a GPUNumbers, or a catalogue entry).

    Raises:
        UnknownGPUError: the name is not in the catalogue (message lists the known ones).
    """
    if isinstance(gpu, GPUNumbers):
        return gpu
    if not isinstance(gpu, str):
        return _from_object(gpu)
    from servebook.hardware import get_gpu  # the shared GPU catalogue (data/gpus.toml)

    return _from_object(get_gpu(gpu))
