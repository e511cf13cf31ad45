#!/usr/bin/env python3
"""Stage a newer vLLM for the lent H200: the wheels its image lacks, in pieces a device call can carry.

    python labs/tools/stage_newest_vllm.py 0.34.0 [--stage .gpu-stage-new] [--manifest FILE]

The H200 image (``labs/results/vllm_drift/h200_image_packages.json``, read there before anything was
installed) has torch 2.11.0+cu130 and its CUDA libraries; the 0.26.0 payload of ``shared/gpu`` adds
vLLM 0.26.0's Python dependencies. A newer vLLM pins a newer torch. This script resolves, by hand
and without installing, what the release needs on top of image + 0.26.0 payload:

1. vLLM's ``Requires-Dist`` (markers evaluated for CPython 3.12 on x86-64 Linux), then each
   downloaded wheel's own requirements, recursively;
2. a requirement the base already satisfies is not carried; one it does not is downloaded
   (``pip download --no-deps``, binary wheels for that platform);
3. a pin the registry does not serve (torch 2.14's ``nvidia-nccl-cu13==2.30.7``) is replaced by the
   newest release of the same major version it serves, and the substitution is written down;
4. the wheels are cut into pieces as large as fit beside the working tree, one folder per call.

It writes a manifest (JSON: every wheel, its size, why it is carried, the substitutions, the pieces)
and prints the device calls. Nothing is installed here; the GPU side runs ``install_newest_vllm.sh``
(``receive`` per piece, ``install`` with the last).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "labs" / "results" / "vllm_drift" / "h200_image_packages.json"
PAYLOAD_0260 = ROOT.parent / "shared" / "gpu" / "vllm-0.26.0"
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            "--abi", "abi3", "--abi", "none",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any"]
ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
       "platform_machine": "x86_64", "sys_platform": "linux", "platform_system": "Linux",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix"}
#: Bytes a call carries in all (64 MiB), less a MiB of slack.
CALL_BYTES = 63 * 2**20


def payload_packages() -> dict[str, str]:
    """``{name: version}`` of the 0.26.0 payload's packages (its dist-info folders)."""
    parts = sorted(PAYLOAD_0260.glob("vllm-core.tar.xz.part-*"))
    cat = subprocess.Popen(["cat", *map(str, parts)], stdout=subprocess.PIPE)
    listing = subprocess.run("xz -dc -T2 | tar t", shell=True, stdin=cat.stdout, capture_output=True, text=True).stdout
    out = {}
    for m in re.finditer(r"/([A-Za-z0-9_.]+)-([0-9][^/-]*)\.dist-info/METADATA", listing):
        out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def base_packages() -> dict[str, str]:
    image = json.loads(IMAGE.read_text())["packages"]
    base = {canonicalize_name(k): v for k, v in image.items()}
    base.update(payload_packages())
    base.pop("vllm", None)
    return base


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or any(req.marker.evaluate({**ENV, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def download(spec: str, folder: Path) -> Path | None:
    before = set(folder.glob("*.whl"))
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *PLATFORM, "-d", str(folder), spec],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    new = set(folder.glob("*.whl")) - before
    if new:
        return new.pop()
    name = canonicalize_name(re.split(r"[\[=<>!~ ;]", spec)[0])
    return next((p for p in folder.glob("*.whl") if canonicalize_name(p.name.split("-")[0]) == name), None)


def served_versions(name: str) -> list[Version]:
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name, *PLATFORM[:9]],
                          capture_output=True, text=True)
    m = re.search(r"Available versions: (.*)", proc.stdout)
    return sorted(Version(v.strip()) for v in m.group(1).split(",")) if m else []


def version_of(wheel_name: str) -> Version:
    return Version(wheel_name.split("-")[1])


def broken_base(base: dict[str, str], kept: dict[str, Requirement], carried: dict[str, dict],
                scratch: Path) -> list[tuple[Requirement, str]]:
    """Base packages the carried upgrades break: ``(requirement to carry instead, why)``.

    A kept base package (the image's transformers 5.17, say) has requirements of its own; when a
    carried upgrade no longer satisfies one (vLLM 0.34.0 carries huggingface-hub 2.x, transformers
    5.17 wants < 2.0; found on the H200 on 2026-12-04), the package is carried too, at the newest
    release its requirer allows.
    """
    out = []
    for name, wanted in kept.items():
        wheel = download(f"{name}=={base[name]}", scratch)
        if wheel is None:
            continue
        for req in requires(wheel, set()):
            dep = canonicalize_name(req.name)
            if dep in carried and not req.specifier.contains(version_of(carried[dep]["wheel"]), prereleases=True):
                out.append((wanted, f"the image's {name} {base[name]} requires {req}, which the carried "
                                    f"{carried[dep]['wheel'].split('-')[0]} {version_of(carried[dep]['wheel'])} breaks"))
                break
    return out


def resolve(version: str, folder: Path) -> dict:
    base = base_packages()
    carried: dict[str, dict] = {}
    kept: dict[str, Requirement] = {}
    substitutions = []
    unresolved = []
    todo = [(Requirement(f"vllm=={version}"), "the release")]
    scratch = folder.parent / "base-metadata"
    scratch.mkdir(exist_ok=True)
    while True:
        _walk(todo, base, carried, kept, substitutions, unresolved, folder)
        todo = [(req, why) for req, why in broken_base(base, kept, carried, scratch)]
        for req, _ in todo:
            base.pop(canonicalize_name(req.name), None)
            kept.pop(canonicalize_name(req.name), None)
        if not todo:
            break
    return {"carried": carried, "substitutions": substitutions, "unresolved": unresolved}


def _walk(todo, base, carried, kept, substitutions, unresolved, folder) -> None:
    """Carry what ``todo`` needs and the base lacks, recursively (see the module docstring)."""
    while todo:
        req, why = todo.pop(0)
        name = canonicalize_name(req.name)
        if name in carried:
            continue
        have = base.get(name)
        if have is not None and (not req.specifier or req.specifier.contains(Version(have), prereleases=True)):
            if req.specifier:
                kept.setdefault(name, Requirement(f"{req.name}{req.specifier}"))
            continue
        spec = f"{req.name}{req.specifier}"
        wheel = download(spec, folder)
        if wheel is None and req.specifier:
            same_major = [v for v in served_versions(req.name)
                          if any(str(s.version).split(".")[0] == str(v.major) for s in req.specifier)]
            if same_major:
                wheel = download(f"{req.name}=={same_major[-1]}", folder)
                substitutions.append({"wanted": spec, "carried": f"{req.name}=={same_major[-1]}", "for": why,
                                      "why": "the registry does not serve the pinned release"})
        if wheel is None:
            unresolved.append({"requirement": spec, "for": why})
            continue
        carried[name] = {"wheel": wheel.name, "bytes": wheel.stat().st_size, "for": why,
                         "base_has": have}
        if why.startswith("the image's"):
            carried[name]["replaces_base"] = why
        for sub in requires(wheel, set(req.extras)):
            todo.append((sub, req.name))


def cut(folder: Path, stage: Path, tree_bytes: int) -> list[dict]:
    """Cut the wheels into pieces of at most ``CALL_BYTES - tree_bytes``: ``stage/pNN/piece.NN``."""
    room = CALL_BYTES - tree_bytes
    blob = stage / "blob.tar"
    subprocess.run(["tar", "cf", str(blob), "-C", str(folder), "."], check=True)
    size = blob.stat().st_size
    n = -(-size // room)
    subprocess.run(["split", "-n", str(n), "-d", "-a", "3", str(blob), str(stage / "piece.")], check=True)
    blob.unlink()
    pieces = []
    for i in range(n):
        d = stage / f"p{i:03d}"
        d.mkdir(exist_ok=True)
        src = stage / f"piece.{i:03d}"
        src.rename(d / src.name)
        pieces.append({"folder": str(d.relative_to(ROOT)), "bytes": (d / src.name).stat().st_size})
    return pieces


def tree_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True).stdout.split("\0")
    return sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("version")
    ap.add_argument("--stage", default=str(ROOT / ".gpu-stage-new"))
    ap.add_argument("--manifest", default=None)
    ap.add_argument("--no-cut", action="store_true", help="resolve and size only; cut no pieces")
    a = ap.parse_args()
    stage = Path(a.stage)
    wheels = stage / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = resolve(a.version, wheels)
    tree = tree_bytes()
    carried = sum(c["bytes"] for c in found["carried"].values())
    pieces = [] if a.no_cut else cut(wheels, stage, tree)
    doc = {"schema": "servebook.gpu_payload_newest/1", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "vllm_version": a.version, "base": "the H200 image (h200_image_packages.json) + shared/gpu's vLLM 0.26.0 payload",
           **found, "carried_bytes": carried, "working_tree_bytes": tree, "call_bytes": CALL_BYTES,
           "calls_needed": -(-carried // (CALL_BYTES - tree)), "pieces": pieces}
    text = json.dumps(doc, indent=1)
    (Path(a.manifest) if a.manifest else stage / "manifest.json").write_text(text)
    if pieces:
        print("device calls (after vLLM 0.26.0's payload, labs/tools/gpu_stage.sh), each sent the moment the last returns:")
        for i, p in enumerate(pieces):
            last = " && bash labs/tools/install_newest_vllm.sh install" if i == len(pieces) - 1 else ""
            print(f'  carry ["{p["folder"]}"]: bash labs/tools/install_newest_vllm.sh receive {p["folder"]}{last}')
    print(f"{len(found['carried'])} wheels, {carried / 2**20:.0f} MiB, {doc['calls_needed']} calls; "
          f"substitutions: {found['substitutions']}; unresolved: {found['unresolved']}")


if __name__ == "__main__":
    main()
