#!/usr/bin/env bash
# Run the GPU labs headless on one H100/H200 in the `gpu` profile; JSON results go to $OUT.
#
#   bash labs/tools/run_labs_gpu.sh plan          # print the plan below, run nothing
#   bash labs/tools/run_labs_gpu.sh check         # imports only (about 20 s)
#   bash labs/tools/run_labs_gpu.sh l1 [l2 ...]   # run these labs, one after another
#
# On the lent H200 (see shared/gpu/README.md): install vLLM 0.26.0 with the four `run` calls of
# its "Steps" section (core payload only: the labs use Llama-3.1-8B, no MoE), then ONE `run` call
# per lab, each at once after the previous one (the machine is given back 30 s after a call):
#
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l1
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l2
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l3
#   source /tmp/vllm_offline/env.sh && bash labs/tools/run_labs_gpu.sh l4
#
# Each lab is capped at 570 s (a `run` call may last 600 s). Files under $OUT:
# <lab>_gpu.json (schema servebook.lab/1, with GPU, driver, vLLM version, config hash, flags, date)
# and <lab>.log (the lab's printed output). Copy the JSON files, unedited, to labs/results/labs/.
# Model: SERVEBOOK_LAB_MODEL (default llama-3.1-8b, random weights, load_format=dummy: no
# download); SERVEBOOK_LAB_HF_MODEL=<hub repo> serves a real checkpoint on an online node.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-$ROOT/labs/results/labs}
PY=${PY:-python3}
LAB_TIMEOUT_S=${LAB_TIMEOUT_S:-570}
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export SERVEBOOK_LAB_PROFILE=gpu SERVEBOOK_LAB_RESULTS="$OUT" MPLBACKEND=Agg
export SERVEBOOK_ENGINE_LOCK=${SERVEBOOK_ENGINE_LOCK:-/tmp/servebook-vllm-engine.lock}
declare -A FILE=([l1]=l1_memory_budget [l2]=l2_paged_continuous [l3]=l3_preemption [l4]=l4_fp8_kv
                [l5]=l5_chunked_prefill [l6]=l6_prefix_caching [l7]=l7_speculative)

plan() {
  cat <<'PLAN'
Expected on one H200 with vLLM 0.26.0, Llama-3.1-8B shapes, random weights (estimates from the
recorded 20-90 s engine starts; every lab is capped at 570 s):
  l1 memory budget   4 LLM() starts with CUDA graphs (8192/0.9/auto, 32768/0.9/auto,
                     8192/0.5/auto, 8192/0.9/fp8) + 1 refused start          ~5-6.5 min
  l2 paged vs static 1 vllm serve (graphs) + bench 256 prompts (512 in/256 out, +-90%)
                     + HF transformers generate, batches of 32, same lengths  ~4-5 min
  l3 preemption      4 vllm serve, eager, max-num-seqs 16/48/128/256, 2048 blocks,
                     bench 512 prompts (512 in/128 out) at each               ~4-5 min
  l4 fp8 KV          2 vllm serve (graphs, utilisation 0.25), auto vs fp8,
                     bench 512 prompts (1024 in/256 out) each                 ~3.5-4.5 min
  l5 chunked prefill 4 vllm serve (graphs), budgets 128/256/1024 + chunking off,
                     32 decodes + one 8000-token prompt, 3 repeats each       ~5-7 min
  l6 prefix caching  2 vllm serve (graphs), 20,000-block pool, 128 + 96 token-id
                     requests each, offline 192 requests in two orders        ~5-6 min
  l7 speculative     train a 63M target / 6M draft pair (~1-2 min), then 5 LLM()
                     with CUDA graphs: n-gram, draft, untrained draft, schedule ~7-9 min
  total device time for l1-l4: about 17-21 min, plus ~3 min install (shared/gpu/README.md);
  l5-l7 add about 17-22 min: one 30-minute session cannot hold all seven.
  Lab 8 runs with `python -m servebook.batch.tactics --profile gpu`; Lab 9 (two GPUs) with
  labs/tools/run_lab_l9_x2.sh on the nvidia-h200-x2 kind.
PLAN
}

check() {
  "$PY" - <<'PY'
import sys, vllm, torch
import servebook.lab, servebook.commands.plan
from servebook.lab import get_profile
p = get_profile("gpu")
print("python", sys.version.split()[0], "vllm", vllm.__version__, "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("profile", p.name, p.model_id, "catalogue GPU", p.gpu_name, "model dir", p.model_dir())
PY
}

run_lab() {
  local key=$1 file=${FILE[$1]:-}
  if [ -z "$file" ]; then echo "unknown lab '$key'; use l1 l2 l3 l4 l5 l6 l7 plan check" >&2; return 2; fi
  mkdir -p "$OUT"
  echo "=== $key ($file) start $(date -u +%FT%TZ)"
  local t0=$SECONDS
  timeout --signal=INT --kill-after=20 "$LAB_TIMEOUT_S" \
    "$PY" -m servebook.lab.run_notebook "$ROOT/labs/$file.md" 2>&1 | tee "$OUT/$key.log" | grep -v "^\s*$" | tail -60
  local rc=${PIPESTATUS[0]}
  echo "=== $key exit $rc after $((SECONDS - t0)) s; result: $(ls "$OUT/${file}_gpu.json" 2>/dev/null || echo MISSING)"
  return "$rc"
}

[ $# -eq 0 ] && { plan; exit 0; }
status=0
for arg in "$@"; do
  case "$arg" in
    plan) plan ;;
    check) check || status=1 ;;
    *) run_lab "$arg" || status=1 ;;
  esac
done
exit $status
