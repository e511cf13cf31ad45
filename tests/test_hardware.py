"""GPU catalogue: lookup, aliases, errors, and the datasheet arithmetic behind each number."""
from __future__ import annotations

import pytest

from servebook.errors import ServebookError, UnknownGPUError
from servebook.hardware import GPU, get_gpu, gpu_names

GIB = 2**30
MIB = 2**20


def test_catalogue_has_the_gpus_the_book_plans_for():
    names = gpu_names()
    for expected in ("H100-SXM-80GB", "H100-NVL-94GB", "H200-SXM-141GB", "A100-SXM-80GB", "B200-180GB", "L40S-48GB"):
        assert expected in names


@pytest.mark.parametrize(
    "alias,canonical",
    [
        ("H100", "H100-SXM-80GB"),
        ("h100-sxm", "H100-SXM-80GB"),
        ("H100 SXM 80GB", "H100-SXM-80GB"),
        ("h100_nvl", "H100-NVL-94GB"),
        ("H200", "H200-SXM-141GB"),
        ("a100", "A100-SXM-80GB"),
        ("B200", "B200-180GB"),
        ("L40S", "L40S-48GB"),
    ],
)
def test_aliases_and_case(alias, canonical):
    assert get_gpu(alias).name == canonical


def test_gpu_objects_pass_through():
    gpu = get_gpu("h200")
    assert get_gpu(gpu) is gpu and isinstance(gpu, GPU)


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownGPUError) as err:
        get_gpu("RTX-9090")
    message = str(err.value)
    assert "RTX-9090" in message
    for name in gpu_names():
        assert name in message
    assert issubclass(UnknownGPUError, ServebookError)


@pytest.mark.parametrize("bad", ["", "   ", None, 80])
def test_bad_gpu_names(bad):
    with pytest.raises(UnknownGPUError):
        get_gpu(bad)


def test_hopper_dense_flops_are_half_the_datasheet_sparsity_figures():
    # H100/H200 SXM datasheets: BF16 1,979 TFLOPS and FP8 3,958 TFLOPS "with sparsity".
    for name in ("H100", "H200"):
        gpu = get_gpu(name)
        assert gpu.bf16_dense_flops == 1979e12 / 2
        assert gpu.fp8_dense_flops == 3958e12 / 2
    # H100 NVL datasheet: 1,671 / 3,341 TFLOPS with sparsity.
    nvl = get_gpu("h100-nvl")
    assert nvl.bf16_dense_flops == 1671e12 / 2 and nvl.fp8_dense_flops == 3341e12 / 2


def test_ampere_has_no_fp8_and_prints_dense_bf16():
    a100 = get_gpu("A100")
    assert a100.bf16_dense_flops == 312e12  # A100 datasheet: 312 TFLOPS BF16 (624 with sparsity)
    assert not a100.has_fp8 and a100.fp8_dense_flops == 0


def test_bandwidths_from_datasheets():
    assert get_gpu("H100").hbm_bandwidth_bytes_per_s == 3.35e12
    assert get_gpu("H200").hbm_bandwidth_bytes_per_s == 4.8e12
    assert get_gpu("A100").hbm_bandwidth_bytes_per_s == 2.039e12
    assert get_gpu("H100").interconnect_bytes_per_s == 900e9
    assert not get_gpu("L40S").has_nvlink and get_gpu("L40S").pcie_bytes_per_s > 0


def test_h200_memory_is_what_the_device_reported():
    h200 = get_gpu("H200")
    # Recorded on the lent H200: torch.cuda.mem_get_info() total 150,109,880,320 bytes;
    # nvidia-smi: 143771 MiB total, 616 MiB reserved by the driver.
    assert h200.memory_measured
    assert h200.memory_bytes == 150_109_880_320
    assert h200.memory_bytes < 143771 * MIB  # CUDA sees less than nvidia-smi's total
    assert abs((143771 * MIB - h200.memory_bytes) / MIB - 616) < 1  # ... by the reserved 616 MiB
    assert round(h200.memory_gib, 2) == 139.80
    assert h200.memory_gib < h200.memory_datasheet_gb  # and less than the marketed 141


def test_unmeasured_memory_is_the_datasheet_capacity_in_gib():
    for name in gpu_names():
        gpu = get_gpu(name)
        if not gpu.memory_measured:
            assert gpu.memory_bytes == gpu.memory_datasheet_gb * GIB


def test_every_entry_cites_a_source_and_is_positive():
    for name in gpu_names():
        gpu = get_gpu(name)
        assert any(s.startswith("https://") for s in gpu.sources)
        assert gpu.memory_bytes > 0 and gpu.hbm_bandwidth_bytes_per_s > 0 and gpu.bf16_dense_flops > 0
        assert gpu.fp8_dense_flops == 0 or gpu.fp8_dense_flops > gpu.bf16_dense_flops
