#!/usr/bin/env bash
# Device side of labs/tools/stage_newest_vllm.py: receive its pieces, install the wheels, check the import.
#
#   bash labs/tools/install_newest_vllm.sh receive .gpu-stage-new/pNNN     # one call per piece, in order
#   bash labs/tools/install_newest_vllm.sh install                         # in the call of the last piece
#   source /tmp/vllm_newest/env.sh && python3 -c 'import vllm'             # then: labs as usual
#
# The newer vLLM goes into its own folder (/tmp/vllm_newest/site), first on PYTHONPATH, over the image
# and over vLLM 0.26.0's payload (install that first: labs/tools/gpu_stage.sh), whose Python
# dependencies the manifest counted as present. Nothing is downloaded (the machine has no network).
# `install` prints what a reader needs to judge the attempt: torch, its CUDA, NCCL and cuDNN as loaded,
# vLLM's version, and a CUDA tensor round trip; a failure prints the import error and exits 1.
set -euo pipefail
DEST=/tmp/vllm_newest
PIECES=/tmp/vllm_newest_pieces
case "${1:-}" in
  receive)
    shift; mkdir -p "$PIECES"
    for d in "$@"; do cp "$d"/piece.* "$PIECES"/; done
    echo "received: $(ls "$PIECES" | wc -l) pieces, $(du -sh "$PIECES" | cut -f1)"
    ;;
  install)
    t0=$(date +%s)
    mkdir -p "$DEST/wheels"
    cat "$PIECES"/piece.* | tar x -C "$DEST/wheels" && rm -rf "$PIECES"
    python3 -m pip install -q --no-deps --no-index --target "$DEST/site" "$DEST"/wheels/*.whl
    rm -rf "$DEST/wheels"
    base=${VLLM_BASE_SITE:-/tmp/vllm_offline/site}
    cat > "$DEST/env.sh" <<ENV
export PYTHONPATH=$DEST/site:$base\${PYTHONPATH:+:\$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0
export PATH=$DEST/site/bin:\$PATH
ENV
    echo "installed in $(( $(date +%s) - t0 )) s"
    # shellcheck disable=SC1091
    source "$DEST/env.sh"
    python3 - <<'PY'
import json, sys, time
t = time.time()
import torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
       "gpu": torch.cuda.get_device_name(0), "cuda_round_trip": float((torch.ones(4, device="cuda") * 2).sum().item())}
try:   # torch checks the cuDNN it finds against the one it was built with only when asked (2026-12-04: 9.19 < 9.24)
    out["cudnn"] = torch.backends.cudnn.version()
except RuntimeError as exc:
    out["cudnn_error"] = str(exc).split(". ")[0]
try:
    import vllm
    out["vllm"] = vllm.__version__
    from vllm import LLM  # noqa: F401  (imports transformers and the engine)
    out["vllm_llm_import"] = "ok"
except Exception as exc:  # noqa: BLE001  (what failed is the finding)
    out["vllm_import_error"] = f"{type(exc).__name__}: {exc}"
out["import_s"] = round(time.time() - t, 1)
print("NEWEST_VLLM " + json.dumps(out))
sys.exit(0 if out.get("vllm_llm_import") == "ok" else 1)
PY
    ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
