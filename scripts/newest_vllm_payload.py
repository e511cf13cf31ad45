#!/usr/bin/env python3
"""What carrying a vLLM release to the lent H200 would take: wheel sizes and the pins that must resolve.

The H200's image has torch 2.11.0+cu130 and no network; vLLM 0.26.0 is the newest release built for
that torch, carried in 40 MiB chunks (see the GPU recipe in the README). A newer vLLM pins a newer
torch, whose CUDA libraries come as separate wheels. This script downloads (no install) the vLLM
wheel and the torch wheel it pins for Python 3.12 on x86-64 Linux, reads their metadata, asks pip
whether torch's own CUDA pins resolve from the registry, and writes what it found as JSON:

    python scripts/newest_vllm_payload.py 0.34.0 --out labs/results/vllm_drift/h200_payload_0.34.0.json

Nothing downloaded is kept (a temporary folder); only sizes and names are written.
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
            "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]
#: Bytes one call to the GPU machine can carry beside the working tree (the shared recipe's chunk size).
CHUNK_BYTES = 40 * 2**20


def _download(spec: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *PLATFORM, "-d", str(folder), spec],
                   check=True, capture_output=True, text=True)
    name = re.split(r"[=<>]", spec)[0].replace("-", "_")
    return next(p for p in folder.glob("*.whl") if p.name.lower().startswith(name.lower() + "-"))


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def _pin(requires: list[str], name: str) -> str | None:
    for r in requires:
        m = re.match(rf"{re.escape(name)}\s*==\s*([\w.+]+)", r)
        if m:
            return m.group(1)
    return None


def _resolve(spec: str, folder: Path) -> dict:
    """Whether pip resolves ``spec`` with all its dependencies for the H200's Python (no download kept)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", *PLATFORM, "-d", str(folder / "deps"), spec],
                          capture_output=True, text=True)
    missing = re.findall(r"No matching distribution found for ([^\s;]+)", proc.stderr)
    return {"resolves": proc.returncode == 0, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", help="the vLLM release, e.g. 0.34.0")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        vllm = _download(f"vllm=={args.version}", folder)
        vllm_requires = _requires(vllm)
        torch_version = _pin(vllm_requires, "torch")
        torch = _download(f"torch=={torch_version}", folder)
        torch_requires = _requires(torch)
        cuda_pins = [r.split(";")[0].strip() for r in torch_requires if r.startswith("nvidia-")]
        resolution = _resolve(f"torch=={torch_version}", folder)
        record = {
            "schema": "servebook.gpu_payload/1",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "vllm_version": args.version, "vllm_wheel_bytes": vllm.stat().st_size,
            "torch_pin": torch_version, "torch_wheel_bytes": torch.stat().st_size,
            "h200_image_torch": "2.11.0+cu130",
            "torch_cuda_pins": cuda_pins, "torch_with_cuda_libraries": resolution,
            "chunk_bytes": CHUNK_BYTES,
            "chunks_for_vllm_and_torch_wheels": -(-(vllm.stat().st_size + torch.stat().st_size) // CHUNK_BYTES),
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
