"""scripts/newest_vllm_payload.py reads a wheel's pins the way pip does (the download needs a network; not here)."""
from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("newest_vllm_payload", ROOT / "scripts" / "newest_vllm_payload.py")
payload = importlib.util.module_from_spec(spec)
spec.loader.exec_module(payload)


def _wheel(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm-9.9.9.dist-info/METADATA", "\n".join(["Metadata-Version: 2.1", "Name: vllm", *lines]))
    return path


def test_requirements_leave_out_extras_and_pins_are_exact(tmp_path):
    wheel = _wheel(tmp_path, ["Requires-Dist: torch==2.14.0", "Requires-Dist: ray>=2.9; extra == \"ray\"",
                              "Requires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == \"Linux\""])
    requires = payload._requires(wheel)
    assert requires == ["torch==2.14.0", 'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"']
    assert payload._pin(requires, "torch") == "2.14.0"
    assert payload._pin(requires, "torchvision") is None
    assert payload._pin(["torchaudio==2.11.0", "torch==2.14.0"], "torch") == "2.14.0"


def test_the_recorded_findings_say_what_blocks_the_newest_releases():
    for version in ("0.33.0", "0.34.0"):
        doc = json.loads((ROOT / "labs" / "results" / "vllm_drift" / f"h200_payload_{version}.json").read_text())
        assert doc["vllm_version"] == version and doc["h200_image_torch"].startswith("2.11.0")
        assert doc["torch_pin"] != "2.11.0"                        # a newer torch than the H200's image
        assert not doc["torch_with_cuda_libraries"]["resolves"]
        assert doc["chunks_for_vllm_and_torch_wheels"] == -(-(doc["vllm_wheel_bytes"] + doc["torch_wheel_bytes"])
                                                            // doc["chunk_bytes"])
