"""labs/tools/stage_newest_vllm.py: marker evaluation for the H200's Python, and its recorded manifest.

The resolution itself downloads wheels (a network); what it wrote for vLLM 0.34.0 is checked here for
the arithmetic the appendix on releases prints from it."""
import importlib.util
import json
import zipfile
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("stage_newest_vllm", ROOT / "labs" / "tools" / "stage_newest_vllm.py")
stage = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stage)
DRIFT = ROOT / "labs" / "results" / "vllm_drift"


def _wheel(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
                   + "".join(f"Requires-Dist: {line}\n" for line in lines))
    return path


def test_requires_evaluates_markers_for_cpython_312_on_x86_64_linux(tmp_path):
    wheel = _wheel(tmp_path, ['six>=1.16.0; python_version > "3.11"', 'pywin32; sys_platform == "win32"',
                              'llguidance<1.8; platform_machine == "x86_64"', 'protobuf==7.36.1; platform_machine == "s390x"',
                              'pytest; extra == "test"', "numpy"])
    assert [r.name for r in stage.requires(wheel, set())] == ["six", "llguidance", "numpy"]
    assert "pytest" in [r.name for r in stage.requires(wheel, {"test"})]


def test_manifest_arithmetic_and_substitutions():
    doc = json.loads((DRIFT / "h200_payload_newest_0.34.0.json").read_text())
    assert doc["carried_bytes"] == sum(c["bytes"] for c in doc["carried"].values())
    room = doc["call_bytes"] - doc["working_tree_bytes"]
    assert room > 0 and doc["calls_needed"] == -(-doc["carried_bytes"] // room)
    assert not doc["unresolved"]
    for sub in doc["substitutions"]:
        wanted = Version(sub["wanted"].split("==")[1])
        carried = Version(sub["carried"].split("==")[1])
        assert carried.major == wanted.major and carried > wanted, sub
    # what the image already has is not carried again at the same version
    image = {k.lower(): v for k, v in json.loads((DRIFT / "h200_image_packages.json").read_text())["packages"].items()}
    for name, c in doc["carried"].items():
        assert image.get(name) != c["wheel"].split("-")[1], name


def test_call_costs_are_positive_and_warm_calls_cost_less_than_a_start():
    costs = json.loads((DRIFT / "h200_call_costs.json").read_text())
    warm = [c["held_s_after"] - c["held_s_before"] for c in costs["warm_carry_calls"]]
    assert all(w > 0 for w in warm)
    assert max(warm) < costs["cold_start_call"]["held_s_after"]


def test_a_base_package_an_upgrade_breaks_is_carried_with_why():
    """The H200 try found the image's transformers rejects the huggingface-hub vLLM 0.34.0 needs; the
    resolver now carries transformers too, saying why."""
    doc = json.loads((DRIFT / "h200_payload_newest_0.34.0.json").read_text())
    replaced = {k: c for k, c in doc["carried"].items() if c.get("replaces_base")}
    assert "transformers" in replaced
    assert "huggingface" in replaced["transformers"]["replaces_base"]
    assert Version(replaced["transformers"]["wheel"].split("-")[1]) > Version(replaced["transformers"]["base_has"] or "0")


def test_the_recorded_try_supports_what_the_appendix_says():
    """Appendix: torch 2.14 ran, vLLM 0.34.0 imported, the image's cuDNN and transformers stopped it."""
    doc = json.loads((DRIFT / "h200_newest_attempt_2026-12-04.json").read_text())
    install, imports = (s["output"] for s in doc["steps"])
    assert "cuDNN version incompatibility" in install and "(9, 19, 0)" in install
    got = json.loads(imports)
    assert got["torch"].startswith("2.14.0") and got["round_trip"] == 8.0 and got["vllm"] == "0.34.0"
    assert "huggingface-hub" in got["vllm_error"]
    cudnn = json.loads((DRIFT / "h200_image_packages.json").read_text())["torch"]["cudnn"]
    assert cudnn == 91900   # the image's cuDNN 9.19, read before anything was installed
