#!/usr/bin/env bash
# Lab 9 (TP vs DP, labs/l9_tp_vs_dp.md) headless on a node with TWO GPUs (the lent `nvidia-h200-x2`);
# JSON results go to $OUT. A copy of run_labs_gpu.sh's runner for the one lab that needs two GPUs.
#
#   bash labs/tools/run_lab_l9_x2.sh plan        # print the plan below, run nothing
#   bash labs/tools/run_lab_l9_x2.sh check       # imports, GPU count, MoE kernels (about 20 s)
#   bash labs/tools/run_lab_l9_x2.sh dense       # Qwen3-32B:     TP=1, DP=2, TP=2
#   bash labs/tools/run_lab_l9_x2.sh moe         # Qwen3-30B-A3B: TP=1, DP=2, TP=2, TP=2+EP
#
# On the lent 2xH200 (see shared/gpu/README.md, kind `nvidia-h200-x2` for EVERY call, or the
# machine changes and the install is lost): install vLLM 0.26.0 with the "Steps" section's `run`
# calls INCLUDING the MoE payload (step 3, `.gpu-stage/c4` = vllm-moe.tar.xz.part-00: Qwen3-30B-A3B
# needs vllm._moe_C; without it the MoE run fails at start-up), then ONE `run` call per model,
# each at once after the previous one (the machine is given back 30 s after a call):
#
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_lab_l9_x2.sh dense
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_lab_l9_x2.sh moe
#
# (`check` takes ~20 s: run it with the install's last call, not beside `dense` or `moe`, which
# use the whole 600 s of a call.)
#
# Each model's lab is capped at LAB_TIMEOUT_S (580 s; a `run` call may last 600 s); inside it the
# lab skips a configuration that its own budget (LAB_PARAMS gpu l9 time_budget_s) cannot hold and
# saves its result after every configuration, so a cut-off run still returns what it measured.
# Files under $OUT: l9_tp_vs_dp_<model>_gpu.json (schema servebook.lab/1: GPUs, driver, vLLM
# version, config hash, every engine's flags and full log, per-request timings, the predictions)
# and l9_<target>.log (the lab's printed output). Copy the JSON files, unedited, to labs/results/labs/.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/labs/results/labs}
PY=${PY:-python3}
LAB_TIMEOUT_S=${LAB_TIMEOUT_S:-580}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export SERVEBOOK_LAB_PROFILE=gpu SERVEBOOK_LAB_RESULTS="$OUT" MPLBACKEND=Agg
export SERVEBOOK_ENGINE_LOCK=${SERVEBOOK_ENGINE_LOCK:-/tmp/servebook-vllm-engine.lock}
declare -A MODEL=([dense]=qwen3-32b [moe]=qwen3-30b-a3b)

plan() {
  cat <<'PLAN'
Expected on 2x H200 (NVLink) with vLLM 0.26.0, random weights, CUDA graphs; per configuration an
engine start (20-90 s; the DP replicas start together and reuse TP=1's compile cache), a warm-up,
8 single-stream requests (512 in / 32 out) and 256 requests at once (512 in / 128 out):
  dense  Qwen3-32B      TP=1, DP=2 (two pinned servers), TP=2                  ~6-8 min
  moe    Qwen3-30B-A3B  TP=1, DP=2, TP=2, TP=2 --enable-expert-parallel        ~8-9.5 min
         (the EP point is skipped, and the result says so, if the budget cannot hold it)
  install (core + moe payloads) ~3-4 min; total device time ~18-22 min of one 30-minute session.
PLAN
}

check() {
  "$PY" - <<'PY'
import sys, torch, vllm
import servebook.lab, servebook.lab.parallel
from servebook.lab import get_profile
from servebook.lab.parallel import visible_gpus
try:
    import vllm._moe_C_stable_libtorch  # noqa: F401
    moe = "loaded"
except ImportError:
    moe = "ABSENT: install the moe payload (shared/gpu/README.md step 3) before `moe`"
p = get_profile("gpu")
print("python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "GPUs (nvidia-smi)", visible_gpus(), "torch sees", torch.cuda.device_count(), "| MoE kernels:", moe)
print("profile", p.name, "catalogue GPU", p.gpu_name)
if visible_gpus() < 2:
    sys.exit("Lab 9 needs two GPUs: ask for the nvidia-h200-x2 kind")
PY
}

run_model() {
  local key=$1 model=${MODEL[$1]:-}
  if [ -z "$model" ]; then echo "unknown target '$key'; use plan check dense moe" >&2; return 2; fi
  mkdir -p "$OUT"
  echo "=== l9 $key ($model) start $(date -u +%FT%TZ)"
  local t0=$SECONDS
  SERVEBOOK_LAB_MODEL=$model timeout --signal=INT --kill-after=10 "$LAB_TIMEOUT_S" \
    "$PY" -m servebook.lab.run_notebook "$ROOT/labs/l9_tp_vs_dp.md" 2>&1 | tee "$OUT/l9_$key.log" \
    | grep -v "^\s*$" | tail -60
  local rc=${PIPESTATUS[0]}
  echo "=== l9 $key exit $rc after $((SECONDS - t0)) s; result: $(ls "$OUT/l9_tp_vs_dp_${model}_gpu.json" 2>/dev/null || echo MISSING)"
  return "$rc"
}

[ $# -eq 0 ] && { plan; exit 0; }
status=0
for arg in "$@"; do
  case "$arg" in
    plan) plan ;;
    check) check || status=1 ;;
    *) run_model "$arg" || status=1 ;;
  esac
done
exit $status
